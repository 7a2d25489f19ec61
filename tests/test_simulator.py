"""Simulator: analytic makespans, event semantics, golden numbers, deadlock reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hints.orders import BUILTIN_HINTS, builtin_hint
from hints.errors import HintError
from runtime.deps import TaskGraph
from runtime.simulator import ScheduleDeadlock, check_completes, simulate
from runtime.variability import VariabilityModel, sample_durations
from tests.conftest import hint_from_text, unit_durations

GOLDEN = Path(__file__).parent / "golden"


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
