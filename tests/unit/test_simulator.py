"""Simulator: analytic makespans, event semantics, golden numbers, deadlock reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hints.deps import TaskGraph
from hints.errors import HintError, UserError
from hints.orders import BUILTIN_HINTS, builtin_hint
from hints.tasks import Kind, Task
from runtime.durations.variability import VariabilityModel, sample_durations
from runtime.sched.results import ScheduleDeadlock
from runtime.sched.simulator import check_completes, simulate
from tests.helpers.schedules import hint_from_text, unit_durations

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def run(hint, policy="fixed", budget=None, **unit):
    graph = TaskGraph.build(hint.shape)
    return simulate(hint, unit_durations(graph, **unit), policy, budget, graph=graph)


# -- analytic ----------------------------------------------------------------

SHAPES = [(1, 1), (2, 1), (2, 5), (4, 4), (4, 8), (8, 32), (5, 3), (3, 17)]


@pytest.mark.parametrize("name", ["1f1b", "gpipe"])
@pytest.mark.parametrize("p,m", SHAPES)
def test_uniform_makespan_is_m_plus_p_minus_1_times_f_plus_b(name, p, m):
    # F = 1, B = 2, no latency: every rank does m*(F+B) work and the pipeline
    # fill plus drain add (p-1)*(F+B): makespan (m+p-1)*3, bubble (p-1)/(m+p-1).
    result = run(builtin_hint(name, p, 1, m))
    assert result.makespan == (m + p - 1) * 3
    assert result.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8), (4, 2, 16), (4, 4, 8), (8, 2, 16), (3, 3, 6)])
def test_interleaving_divides_the_fill_drain_bubble_by_v(p, v, m):
    # Megatron (Narayanan et al. 2021): with v chunks per rank, each costing
    # 1/v of the rank's work (F = 1/v, B = 2/v), fill+drain shrink from (p-1)*3
    # to (p-1)*3/v when m is a multiple of p. Bubble = (p-1) / (v*m + p - 1).
    result = run(builtin_hint("interleaved-1f1b", p, v, m), f=1 / v, b=2 / v)
    assert result.makespan == pytest.approx(3 * m + 3 * (p - 1) / v, abs=1e-9)
    assert result.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-9)


@pytest.mark.parametrize("p,m", [(2, 4), (3, 5), (4, 8), (8, 32)])
def test_zero_bubble_h1_bubble(p, m):
    # ZB-H1 (Qi et al. 2023): with F = I = W = 1 the bubble is (p-1)*(F + I - W),
    # one third of 1F1B's (p-1)*(F + I + W).
    result = run(builtin_hint("zb", p, 1, m), f=1.0, b=2.0, w=1.0)
    assert result.makespan == 3 * m + (p - 1)
    assert run(builtin_hint("1f1b", p, 1, m)).makespan == 3 * (m + p - 1)


@pytest.mark.parametrize("p,m", [(1, 3), (2, 3), (3, 5), (4, 8), (4, 16), (8, 15), (8, 32)])
def test_zero_bubble_v(p, m):
    # ZB-V (Qi et al., "Pipeline Parallelism with Controllable Memory", 2024; torch's ScheduleZBVZeroBubble):
    # with F = I = W = 1 per chunk and m >= 2p-1 no rank is ever idle between its first task (rank r starts
    # when microbatch 0 reaches stage r, at r) and its last: 6m busy units each, so the makespan is
    # 6m + p - 1. Its activation memory is 1F1B's, p microbatches of a 1/p stage: 2p half-size chunks
    # in flight on every rank.
    hint = builtin_hint("zbv", p, 2, m)
    result = run(hint, f=1.0, b=2.0, w=1.0)
    assert result.makespan == 6 * m + p - 1
    for rank in range(p):
        tids = result.executed[rank]
        assert min(result.start[t] for t in tids) == rank
        assert max(result.end[t] for t in tids) - rank == result.busy[rank] == 6 * m
    assert result.peak_in_flight == [2 * p] * p


def dualpipe_semantics(graph, actions, compute, transfer):
    """Latencies that make the simulator run torch's DualPipeV actions as DeepSeek's runtime does
    ([Note: DualPipeV as rrfp tasks]): an overlapped F&B pair's outputs leave together at the pair's end
    (its forward's message waits for the backward), and a full B's input gradient leaves at its end (the
    I that rrfp made of it waits for its W)."""
    transfer = list(transfer)
    for rank_actions in actions:
        for action in filter(None, rank_actions):
            parts = action.sub_actions or (action,)
            for part in parts:
                if part.computation_type.value == "B":  # became I then W: the gradient leaves after W
                    stage, mb = part.stage_index, part.microbatch_index
                    transfer[graph.tid(Task(stage, Kind.BACKWARD_INPUT, mb))] += \
                        compute[graph.tid(Task(stage, Kind.BACKWARD_WEIGHT, mb))]
            if len(parts) == 2:  # the forward's activation leaves with the backward (I + W)
                forward, backward = parts
                assert (forward.computation_type.value, backward.computation_type.value) == ("F", "B")
                tid = graph.tid(Task(forward.stage_index, Kind.FORWARD, forward.microbatch_index))
                transfer[tid] += sum(compute[graph.tid(Task(backward.stage_index, kind, backward.microbatch_index))]
                                     for kind in (Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT))
    return compute, transfer


@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 8), (4, 16), (8, 16), (8, 32)])
def test_dualpipev_bubble_and_memory(p, m):
    # DeepSeek's DualPipe README: DualPipeV on p devices (PP = 2p stages) has a bubble of
    # (PP/2 - 1)(F&B + B - 3W) and PP + 1 chunk activations per device. rrfp runs an overlapped pair one
    # task after the other, so F&B = F + B; with F = 1, B = 2, W = 1 per chunk every device works
    # 2m(F + B) = 6m, and the makespan is 6m + (p - 1)(F + B + B - 3W) = 6m + 2(p - 1) under DualPipe's
    # semantics. As rrfp tasks (the activation and input gradient leave as soon as F and I end) the same
    # order keeps every rank busy like ZB-V: 6m + p - 1.
    pytest.importorskip("torch")
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    from hints.files.torch_import import import_torch_schedule

    hint = import_torch_schedule("DualPipeV", p, m)
    graph = TaskGraph.build(hint.shape)
    compute, transfer = unit_durations(graph, f=1.0, b=2.0, w=1.0)
    as_rrfp = simulate(hint, (compute, transfer), "fixed", graph=graph)
    assert as_rrfp.makespan == 6 * m + p - 1
    assert as_rrfp.peak_in_flight == [2 * p + 1] * p
    actions = get_schedule_ops("DualPipeV", p, m, 2)
    as_dualpipe = simulate(hint, dualpipe_semantics(graph, actions, compute, transfer), "fixed", graph=graph)
    f, b, w = 1.0, 2.0, 1.0
    assert as_dualpipe.makespan == 2 * m * (f + b) + (p - 1) * ((f + b) + b - 3 * w)
    assert as_dualpipe.peak_in_flight == [2 * p + 1] * p


def test_latency_adds_per_hop_in_fill_and_drain():
    # One microbatch through p ranks: p forwards, p backwards, 2*(p-1) hops.
    p, latency = 4, 0.25
    result = run(builtin_hint("1f1b", p, 1, 1), latency=latency)
    assert result.makespan == pytest.approx(p * 3 + 2 * (p - 1) * latency)


def test_fixed_runs_exactly_the_hint_order():
    for name in BUILTIN_HINTS:
        try:
            hint = builtin_hint(name, 3, 2, 6)
        except HintError:
            continue
        result = run(hint)
        for rank in range(3):
            assert tuple(result.executed_tasks(rank)) == hint.orders[rank]


# -- event semantics -----------------------------------------------------------


def test_events_of_one_instant_are_applied_before_deciding():
    # Rank 0's 0F1 ends at t=4, the instant 1B0's gradient arrives. Deciding on
    # the end alone would start 0F2 (ready since t=0); applying both events
    # first lets the better-ranked 0B0 run.
    hint = hint_from_text([["0F0", "0F1", "0B0", "0F2", "0B1", "0B2"],
                           ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2"]])
    graph = TaskGraph.build(hint.shape)
    compute, transfer = unit_durations(graph)
    compute[graph.tid(hint.orders[0][1])] = 3.0  # 0F1 runs 1..4
    result = simulate(hint, (compute, transfer), "ready", [3, 3], graph=graph)
    executed = [str(t) for t in result.executed_tasks(0)]
    assert executed[:3] == ["0F0", "0F1", "0B0"]
    assert result.start[graph.tid(hint.orders[0][2])] == 4.0


def test_a_rank_decides_when_a_task_arrives_while_idle():
    hint = builtin_hint("1f1b", 2, 1, 1)
    result = run(hint, latency=0.5)
    graph = result.graph
    # 1F0 starts when 0F0's activation lands: 1 + 0.5.
    assert result.start[graph.tid(hint.orders[1][0])] == 1.5


def test_one_task_at_a_time_per_rank():
    model = VariabilityModel(workload="multimodal", jitter=0.3, comm_latency=0.001)
    hint = builtin_hint("zb", 4, 2, 8)
    result = simulate(hint, sample_durations(model, hint.shape, 3), "ready", None)
    for rank in range(4):
        tids = result.executed[rank]
        for before, after in zip(tids, tids[1:]):
            assert result.end[before] <= result.start[after]


# -- golden numbers ------------------------------------------------------------


def test_golden_orders():
    from tests.golden.make_golden import builtin_orders

    assert builtin_orders() == json.loads((GOLDEN / "builtin_orders.json").read_text())


def test_golden_makespans():
    from tests.golden.make_golden import sim_makespans

    golden = json.loads((GOLDEN / "sim_makespans.json").read_text())
    fresh = sim_makespans()
    assert fresh.keys() == golden.keys()
    for key, value in golden.items():
        assert fresh[key]["makespan"] == pytest.approx(value["makespan"], rel=1e-12), key
        assert fresh[key]["bubble_fraction"] == pytest.approx(value["bubble_fraction"], rel=1e-9), key


# -- deadlock ------------------------------------------------------------------


def test_fixed_deadlock_is_reported_with_a_grid():
    hint = hint_from_text([["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]], name="crossed")
    with pytest.raises(ScheduleDeadlock) as caught:
        check_completes(hint)
    err = caught.value
    assert "cannot complete under the fixed policy" in str(err)
    assert "hint crossed" in str(err)
    assert ">0B0?<" in err.details and ">1F1?<" in err.details
    assert "rank 1 waits at step 0 for 1F1, which needs 0F1 (rank 0)" in err.details


def test_ready_runs_a_hint_that_fixed_cannot():
    hint = hint_from_text([["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]])
    result = run(hint, "ready", [2, 2])
    assert sorted(map(str, result.executed_tasks(1))) == ["1B0", "1B1", "1F0", "1F1"]


@pytest.mark.parametrize("hint_name,chunks,placement", [("1f1b", 1, "looping"), ("zb", 1, "looping"),
                                                        ("interleaved-1f1b", 2, "looping"), ("zbv", 2, "v"),
                                                        ("cp", 1, "looping")])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_inlined_predictions_give_what_the_method_calls_give(hint_name, chunks, placement, seed):
    # [Note: inlined predictions]: the simulator writes a lookahead arbiter's predictions inline; an
    # arbiter without prediction_slots gets the method calls. Both must give the same run, decision by decision.
    from dataclasses import replace

    from runtime.sched.arbiter import LookaheadArbiter
    from runtime.sched.evaluate import resolve
    from runtime.sched.rules import RULES

    class ByCalls(LookaheadArbiter):
        prediction_slots = None  # the simulator falls back to expect_consumer / expect_consumer_relayed

    model = VariabilityModel(workload="multimodal", jitter=0.3, comm_latency=0.002, straggler_prob=0.05)
    table = sample_durations(model, resolve("1f1b" if chunks == 1 else "zbv" if placement == "v"
                                            else "interleaved-1f1b", 4, chunks, 12).shape, seed)
    hint = resolve(hint_name, 4, chunks, 12, table, placement)
    inlined = simulate(hint, table, "lookahead", record=True)
    by_calls = simulate(hint, table, replace(RULES["lookahead"], arbiter=ByCalls), record=True)
    assert inlined.makespan == by_calls.makespan and inlined.executed == by_calls.executed
    assert inlined.decisions == by_calls.decisions
    if seed == 0:  # the predictions matter here: the lookahead run is not greedy's
        assert inlined.executed != simulate(hint, table, "greedy").executed


def test_a_backward_start_predicts_its_input_gradient_and_ready_stops_losing():
    # [Note: lookahead admission], a backward head: ZB on pretrain-packed (8 ranks, 32 microbatches, the
    # never-lose grid's seed 0) at ZB's own fixed peak loses to its fixed order when only forwards are
    # predicted (ranks skip an I whose input gradient is on its way to run a W or a forward). With backward
    # predictions the rank waits for the I, and ready matches or beats the fixed order.
    from dataclasses import replace

    from hints.orders import peak_in_flight
    from runtime.sched.arbiter import LookaheadArbiter
    from runtime.sched.evaluate import resolve
    from runtime.sched.rules import RULES

    class ForwardsOnly(LookaheadArbiter):
        prediction_slots = None  # the simulator calls expect_consumer / expect_consumer_relayed

        def expect_consumer(self, consumer, eta):
            if self._is_forward[consumer]:
                super().expect_consumer(consumer, eta)

        def expect_consumer_relayed(self, consumer, eta):
            if self._is_forward[consumer]:
                super().expect_consumer_relayed(consumer, eta)

    model = VariabilityModel(workload="pretrain-packed", jitter=0.1)
    table = sample_durations(model, resolve("zb", 8, 1, 32).shape.with_split(False), 0)
    hint = resolve("zb", 8, 1, 32, table)
    peaks = [peak_in_flight(order, hint.shape) for order in hint.orders]
    fixed = simulate(hint, table, "fixed")
    ready = simulate(hint, table, "lookahead", peaks)
    forwards_only = simulate(hint, table, replace(RULES["lookahead"], arbiter=ForwardsOnly), peaks)
    assert forwards_only.makespan > fixed.makespan * 1.005
    assert ready.makespan <= fixed.makespan
    assert all(ready.peak_in_flight[r] <= peaks[r] for r in range(8))


# -- blocking p2p ([Note: blocking p2p]) -------------------------------------------


def blocking(hint, **unit):
    graph = TaskGraph.build(hint.shape)
    return simulate(hint, unit_durations(graph, **unit), "fixed", graph=graph, p2p="blocking")


@pytest.mark.parametrize("p,m", SHAPES)
def test_blocking_1f1b_equals_async_with_uniform_durations_and_no_latency(p, m):
    # Megatron's 1F1B is built so that, with equal tasks and free messages, no rank waits for a
    # neighbour to post: the blocking makespan is async's (m + p - 1) * 3, start for start.
    hint = builtin_hint("1f1b", p, 1, m)
    result = blocking(hint)
    assert result.makespan == (m + p - 1) * 3
    assert list(result.start) == list(run(hint).start)
    assert result.p2p == "blocking" and result.to_json()["p2p"] == "blocking"


def test_blocking_is_strictly_slower_in_a_hand_computed_case():
    # 1F1B, p = 2, m = 2, F = 1, B = 2, every message 0.5 s.
    # async:    rank 0 0F0 0-1, 0F1 1-2, 0B0 5-7 (1B0 ends 4.5, + 0.5), 0B1 8-10; makespan 10.
    # blocking: rank 0 waits after 0F0 until 1F0's receive takes it (posted at 0): 1.5, so 0F1 runs
    #           1.5-2.5. Rank 1 runs 1F0 1.5-2.5 and 1B0 2.5-4.5, and posts 1F1's receive only then:
    #           the activation that async delivered at 2.5 moves at 4.5 and lands at 5.0, so 1F1 runs
    #           5-6 (async: 4.5-5.5) and 1B1 6-8; its gradient reaches rank 0 at 8.5: 0B1 8.5-10.5.
    hint = builtin_hint("1f1b", 2, 1, 2)
    assert run(hint, latency=0.5).makespan == 10.0
    result = blocking(hint, latency=0.5)
    assert result.makespan == 10.5
    starts = {str(task): result.start[tid] for tid, task in enumerate(result.graph.tasks)}
    assert starts == {"0F0": 0.0, "0F1": 1.5, "0B0": 5.0, "0B1": 8.5, "1F0": 1.5, "1B0": 2.5, "1F1": 5.0,
                      "1B1": 6.0}


def test_blocking_deadlock_is_reported_not_hung():
    # Completes with buffered links (rank 1 runs 1F1 first, whatever order 0F0 arrived in), but under
    # blocking p2p rank 0's send of 0F0 waits for rank 1 to reach 1F0, which follows 1F1, whose input
    # rank 0 sends only after that wait.
    hint = hint_from_text([["0F0", "0F1", "0B0", "0B1"], ["1F1", "1F0", "1B0", "1B1"]], name="swapped")
    check_completes(hint)
    with pytest.raises(ScheduleDeadlock) as caught:
        check_completes(hint, p2p="blocking")
    err = caught.value
    assert "cannot complete with blocking p2p" in str(err) and "hint swapped" in str(err)
    assert ">0F1?<" in err.details and ">1F1?<" in err.details
    assert "rank 0 waits at step 1 for 0F1: rank 1 to post its receive of 0F0 (before 1F0, after 1F1)" \
        in err.details
    assert "rank 1 waits at step 0 for 1F1: its input 0F1 (rank 0)" in err.details


def test_blocking_interleaved_1f1b_is_refused_as_a_deadlock():
    # Megatron's interleaved schedule pairs a forward with a backward between two communication points
    # and receives a step ahead; every task as its own step (what rrfp models) deadlocks it.
    with pytest.raises(ScheduleDeadlock, match="cannot complete with blocking p2p"):
        check_completes(builtin_hint("interleaved-1f1b", 4, 2, 8), p2p="blocking")


def test_blocking_is_refused_under_the_ready_policy():
    hint = builtin_hint("1f1b", 2, 1, 4)
    graph = TaskGraph.build(hint.shape)
    for rule in ("ready", "greedy", "lookahead"):
        with pytest.raises(UserError, match="`p2p`: blocking applies to `policy` fixed only"):
            simulate(hint, unit_durations(graph), rule, graph=graph, p2p="blocking")
    with pytest.raises(UserError, match="'eager' is not one of async, blocking"):
        simulate(hint, unit_durations(graph), "fixed", graph=graph, p2p="eager")
