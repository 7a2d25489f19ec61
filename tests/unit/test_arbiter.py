"""Arbiter policies, memory budgets and decision records."""

from __future__ import annotations

import pytest

from hints.deps import TaskGraph
from hints.errors import HintError, UserError
from hints.orders import builtin_hint, peak_in_flight
from hints.tasks import PipelineShape, Task
from runtime.sched.budget import MemoryBudget, one_f_one_b_bounds
from runtime.sched.rules import Policy, make_arbiter
from runtime.sched.simulator import simulate
from tests.helpers.schedules import hint_from_text, unit_durations


@pytest.mark.parametrize("text,factor,slots", [("1f1b", 1.0, None), ("2x", 2.0, None), ("1.5X", 1.5, None),
                                               ("6", None, 6), (" 1F1B ", 1.0, None)])
def test_budget_parse(text, factor, slots):
    budget = MemoryBudget.parse(text)
    assert (budget.factor, budget.slots) == (factor, slots)


@pytest.mark.parametrize("text", ["lots", "-3", "0.5x", "", "2y"])
def test_budget_parse_rejects(text):
    with pytest.raises(UserError) as caught:
        MemoryBudget.parse(text)
    assert caught.value.where == "`memory_budget`"  # the library's name for it; the CLI shows --memory-budget


@pytest.mark.parametrize("p,v,m", [(4, 1, 8), (4, 1, 2), (8, 1, 32), (4, 2, 8), (4, 2, 12), (3, 3, 6), (2, 2, 1)])
def test_1f1b_bound_is_the_baseline_orders_peak(p, v, m):
    hint = builtin_hint("1f1b" if v == 1 else "interleaved-1f1b", p, v, m)
    peaks = [peak_in_flight(order, hint.shape) for order in hint.orders]
    assert one_f_one_b_bounds(hint.shape) == peaks


@pytest.mark.parametrize("p,m", [(4, 8), (4, 3), (8, 32), (2, 1), (3, 5), (1, 4)])
def test_1f1b_bound_under_v_is_zbvs_peak(p, m):
    # [Note: placement]: the baseline of a V shape is ZB-V; its peak in fixed order is the budget, and
    # once m >= 2p - 1 it is 2p on every rank (1F1B's p microbatches of a 1/p stage, in half chunks).
    hint = builtin_hint("zbv", p, 2, m)
    graph = TaskGraph.build(hint.shape)
    peaks = simulate(hint, unit_durations(graph), "fixed", graph=graph).peak_in_flight
    assert one_f_one_b_bounds(hint.shape) == peaks == MemoryBudget.parse("1f1b").per_rank(hint.shape)
    if m >= 2 * p - 1:
        assert peaks == [2 * p] * p


def test_v_placement_graph():
    # Rank r holds stages r and 2p-1-r. The turn (stages 3 and 4) is on rank 3 and hands off without a
    # message; stage 7, whose backward needs no gradient (the loss), is on rank 0; the chunk-0 forwards
    # (stages 0..3) are the admissions on both placements.
    shape = PipelineShape(4, 2, 2, placement="v")
    assert [shape.stages_of_rank(r) for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert [shape.rank_of(k) for k in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    graph = TaskGraph.build(shape)
    tid = lambda text: graph.tid(Task.parse(text))  # noqa: E731
    assert tid("4F0") in graph.local_consumers[tid("3F0")] and not graph.remote_consumers[tid("3F0")]
    assert tid("3B0") in graph.local_consumers[tid("4B0")]
    assert graph.remote_consumers[tid("4F0")] == (tid("5F0"),) and graph.rank[tid("5F0")] == 2
    assert graph.rank[tid("7B0")] == 0 and graph.prereq_count[tid("7B0")] == 1
    assert [graph.tasks[t] for t in range(len(graph)) if graph.admits[t]] == \
        [Task.parse(f"{k}F{i}") for k in range(4) for i in range(2)]
    assert graph.links() == {(0, 1), (1, 2), (2, 3), (3, 2), (2, 1), (1, 0)}
    assert [graph.tasks[t] for t in range(len(graph))] == list(shape.tasks())


def test_budget_per_rank_and_floor():
    shape = PipelineShape(4, 1, 8)
    assert MemoryBudget.parse("1f1b").per_rank(shape) == [4, 3, 2, 1]
    assert MemoryBudget.parse("2x").per_rank(shape) == [8, 6, 4, 2]
    assert MemoryBudget.parse("5").per_rank(shape) == [5, 5, 5, 5]
    assert MemoryBudget.parse("100").per_rank(shape) == [100] * 4  # explicit slots are not capped
    # Capped at m*v: more slots than tasks cannot be used.
    assert MemoryBudget.parse("4x").per_rank(PipelineShape(4, 1, 3)) == [3, 3, 3, 3]
    with pytest.raises(UserError, match="below the smallest that can complete"):
        MemoryBudget.parse("1").per_rank(PipelineShape(2, 2, 4))


def arbiter_for(hint, rank, policy, budget=None, record=True):
    graph = TaskGraph.build(hint.shape)
    return graph, make_arbiter(policy, graph, rank, hint.orders[rank], budget, record)


def test_fixed_only_runs_the_head():
    hint = builtin_hint("1f1b", 2, 1, 3)  # rank 1: 1F0 1B0 1F1 1B1 1F2 1B2
    graph, arbiter = arbiter_for(hint, 1, "fixed")
    assert arbiter.choose() is None  # 1F0 waits for 0F0
    arbiter.available(graph.tid(Task.parse("0F1")))  # 1F1 is input-ready, but it is not the head
    assert arbiter.choose() is None
    arbiter.available(graph.tid(Task.parse("0F0")))
    assert graph.tasks[arbiter.choose()] == Task.parse("1F0")


def test_ready_picks_the_lowest_hint_rank_and_records_the_skip():
    hint = builtin_hint("1f1b", 2, 1, 3)
    graph, arbiter = arbiter_for(hint, 1, "ready", budget=3)
    arbiter.available(graph.tid(Task.parse("0F1")))
    arbiter.available(graph.tid(Task.parse("0F2")))
    chosen = arbiter.choose(now=1.5)
    assert graph.tasks[chosen] == Task.parse("1F1")
    decision = arbiter.decisions[-1]
    assert decision.time == 1.5 and decision.rank == 1
    assert decision.head == Task.parse("1F0")  # skipped: its input has not arrived
    assert [str(t) for t, _ in decision.ready] == ["1F1", "1F2"]
    assert decision.hint_position == 2 and decision.in_flight == 1


def test_ready_holds_back_admissions_over_budget():
    hint = builtin_hint("gpipe", 1, 1, 4)  # one rank: 0F0..0F3 0B0..0B3, all forwards ready at once
    graph, arbiter = arbiter_for(hint, 0, "ready", budget=2)
    first, second = arbiter.choose(), arbiter.choose()
    assert arbiter.choose() is None  # two microbatches in flight, budget 2
    arbiter.finish(first)
    arbiter.finish(second)  # the forwards ended; the loss is local with one stage, so 0B0, 0B1 are ready
    chosen = arbiter.choose()
    assert str(graph.tasks[chosen]) == "0B0"  # 0F2 ranks better (2 < 4) but the budget is full
    decision = arbiter.decisions[-1]
    assert [str(t) for t in decision.held_back] == ["0F2", "0F3"]
    assert decision.head == graph.tasks[graph.tid(Task.parse("0F2"))]
    arbiter.finish(chosen)  # frees a slot
    assert str(graph.tasks[arbiter.choose()]) == "0F2"
    assert arbiter.peak_in_flight == 2


def test_reservation_admits_only_whole_microbatches():
    # One rank, 2 chunks: each microbatch needs 2 slots on this rank.
    hint = builtin_hint("bf", 1, 2, 4)
    graph, arbiter = arbiter_for(hint, 0, "ready", budget=3)
    tid = arbiter.choose()  # 0F0 admitted: reserves 2
    assert str(graph.tasks[tid]) == "0F0"
    # 0F1 is ready too, but 2 + 2 > 3: held back although only one slot is in use.
    assert arbiter.choose() is None
    assert [str(t) for t in arbiter.ready_tasks()] == ["0F1", "0F2", "0F3"]
    arbiter.finish(tid)  # 1F0 (stage 1 = chunk 1, same rank) becomes ready and uses its reserved slot
    assert str(graph.tasks[arbiter.choose()]) == "1F0"
    assert arbiter.in_flight == 2 and arbiter.reserved == 2


def test_waiting_on_names_missing_inputs():
    hint = builtin_hint("1f1b", 2, 1, 2)
    graph, arbiter = arbiter_for(hint, 0, "fixed")
    arbiter.finish(arbiter.choose())  # 0F0
    arbiter.finish(arbiter.choose())  # 0F1
    waiting = dict((str(t), [str(n) for n in needs]) for t, needs in arbiter.waiting_on())
    assert waiting["0B0"] == ["1B0"]


def test_ready_needs_a_budget():
    hint = builtin_hint("1f1b", 2, 1, 2)
    graph = TaskGraph.build(hint.shape)
    with pytest.raises(ValueError):
        make_arbiter(Policy.READY, graph, 0, hint.orders[0], None)


def test_decision_records_cover_every_task():
    hint = builtin_hint("interleaved-1f1b", 2, 2, 4)
    graph = TaskGraph.build(hint.shape)
    for policy in ("fixed", "ready"):
        result = simulate(hint, unit_durations(graph), policy, record=True, graph=graph)
        assert len(result.decisions) == len(graph)
        for decision in result.decisions:
            assert decision.chosen in {t for t, _ in decision.ready}
            if policy == "fixed":
                assert decision.head is None


def test_builtin_requirements_are_clear():
    with pytest.raises(HintError, match="interleaved-1f1b"):
        builtin_hint("1f1b", 4, 2, 8)
    with pytest.raises(HintError, match="`chunks` >= 2"):
        builtin_hint("interleaved-1f1b", 4, 1, 8)
    with pytest.raises(HintError, match="multiple of 2"):
        builtin_hint("interleaved-1f1b", 4, 2, 9)
    with pytest.raises(HintError, match="unknown hint 'nope'"):
        builtin_hint("nope", 4, 1, 8)


def test_bfw_puts_heavy_microbatches_first():
    hint = builtin_hint("bfw", 2, 1, 4, costs=[1.0, 5.0, 3.0, 5.0])
    assert [str(t) for t in hint.orders[0]] == ["0F1", "0F3", "0F2", "0F0", "0B1", "0B3", "0B2", "0B0"]
    assert hint.provenance["costs"] == [1.0, 5.0, 3.0, 5.0]
    plain = builtin_hint("bfw", 2, 1, 4)
    assert [t.microbatch for t in plain.orders[0][:4]] == [0, 1, 2, 3]


def test_hint_from_text_helper_shape():
    hint = hint_from_text([["0F0", "0B0"], ["1F0", "1B0"]])
    assert hint.shape == PipelineShape(2, 1, 1)


# -- lookahead ([Note: lookahead admission]) -------------------------------------------------------


def middle_rank_at_the_decision(budget: int = 2, estimate_b: float = 2.0, estimate_f: float = 1.0,
                                backward_ready: bool = True):
    """Rank 1 of 1F1B on 3 ranks, 4 microbatches (1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3), just after 1B0 ended.

    Its head is 1F2, whose input 0F2 has not arrived; 1B1 is ready.
    """
    hint = builtin_hint("1f1b", 3, 1, 4)
    graph = TaskGraph.build(hint.shape)
    tid = lambda text: graph.tid(Task.parse(text))  # noqa: E731
    estimates = [estimate_f if graph.is_forward[t] else estimate_b for t in range(len(graph))]
    arbiter = make_arbiter("lookahead", graph, 1, hint.orders[1], budget, record=True, estimates=estimates)
    for producer, expected in (("0F0", "1F0"), ("0F1", "1F1"), ("2B0", "1B0")):
        arbiter.available(tid(producer))
        chosen = arbiter.choose(now=0.0)
        assert str(graph.tasks[chosen]) == expected
        arbiter.finish(chosen)
    if backward_ready:
        arbiter.available(tid("2B1"))
    return graph, arbiter, tid


def test_lookahead_waits_for_a_forward_already_on_its_way():
    graph, arbiter, tid = middle_rank_at_the_decision()
    arbiter.expect(tid("0F2"), 10.5)  # 0F2 started: 1F2's input arrives at 10.5
    assert arbiter.choose(now=10.0) is None  # 1B1 (2 s) would still run at 10.5
    assert arbiter.next_wakeup() is None  # firm: only the arrival can change the answer
    assert arbiter.choose(now=11.0) is None  # late, but its producer runs: keep waiting
    arbiter.available(tid("0F2"))
    assert str(graph.tasks[arbiter.choose(now=11.2)]) == "1F2"
    assert str(graph.tasks[arbiter.choose(now=11.2)]) == "1B1"


def test_lookahead_runs_a_backward_that_ends_before_the_forward_arrives():
    graph, arbiter, tid = middle_rank_at_the_decision(estimate_b=0.4)
    arbiter.expect(tid("0F2"), 10.5)
    assert str(graph.tasks[arbiter.choose(now=10.0)]) == "1B1"
    assert arbiter.decisions[-1].head == Task.parse("1F2") and arbiter.decisions[-1].deferred is None


def test_lookahead_without_a_prediction_is_greedy():
    graph, arbiter, tid = middle_rank_at_the_decision()
    assert str(graph.tasks[arbiter.choose(now=10.0)]) == "1B1"  # 0F2 has not started: no check


def test_lookahead_relayed_prediction_expires_at_its_time():
    graph, arbiter, tid = middle_rank_at_the_decision()
    arbiter.expect(tid("0F2"), 10.5, started=False)  # only 0F2's own input is on its way
    assert arbiter.choose(now=10.0) is None
    assert arbiter.next_wakeup() == 10.5
    assert str(graph.tasks[arbiter.choose(now=10.5)]) == "1B1"  # the hope failed: stand aside


def test_lookahead_runs_another_task_that_fits_and_records_the_deferral():
    graph, arbiter, tid = middle_rank_at_the_decision(budget=3, estimate_f=0.3)
    arbiter.available(tid("0F3"))  # 1F3 is ready (budget 3 admits it), ranked after 1B1
    arbiter.expect(tid("0F2"), 10.5)
    chosen = arbiter.choose(now=10.0)
    assert str(graph.tasks[chosen]) == "1F3"
    decision = arbiter.decisions[-1]
    assert decision.deferred == Task.parse("1B1") and decision.head == Task.parse("1F2")
    assert [str(t) for t, _ in decision.ready] == ["1B1", "1F3"]


def test_lookahead_stands_aside_when_the_forward_would_not_fit_the_budget():
    graph, arbiter, tid = middle_rank_at_the_decision(budget=2, backward_ready=False)
    arbiter.available(tid("0F3"))
    assert str(graph.tasks[arbiter.choose(now=0.0)]) == "1F3"  # admitted out of order: 2 in flight now
    arbiter.available(tid("2B1"))
    arbiter.expect(tid("0F2"), 10.5)
    # 1F2 could not start on arrival (the budget is full), and only 1B1 frees a slot: no waiting.
    assert str(graph.tasks[arbiter.choose(now=10.0)]) == "1B1"


@pytest.mark.parametrize("budget,waits", [(3, True), (4, False)])
def test_lookahead_guards_a_forward_head_against_a_forward_only_where_memory_binds(budget, waits):
    # 0F3 arrived before 0F2 (started: 1F2's input arrives at 10.5), so 1F3 is the best ready task. Under the
    # reservation rule with 3 slots for 4 microbatches memory binds, and 1F3 (1 s) waits for 1F2; with 4 slots
    # nothing is ever held back for memory, and readiness runs ahead.
    graph, arbiter, tid = middle_rank_at_the_decision(budget=budget, backward_ready=False)
    arbiter.available(tid("0F3"))
    arbiter.expect(tid("0F2"), 10.5)
    chosen = arbiter.choose(now=10.0)
    if waits:
        assert chosen is None and arbiter.next_wakeup() is None
        arbiter.available(tid("0F2"))
        assert str(graph.tasks[arbiter.choose(now=10.5)]) == "1F2"
    else:
        assert str(graph.tasks[chosen]) == "1F3"


def test_lookahead_needs_estimates():
    hint = builtin_hint("1f1b", 2, 1, 2)
    graph = TaskGraph.build(hint.shape)
    with pytest.raises(ValueError, match="estimates"):
        make_arbiter("lookahead", graph, 0, hint.orders[0], 2)


def test_rules_from_policy_and_lookahead():
    from runtime.sched.rules import RULES, as_rule, rule_for

    assert rule_for("ready").name == "lookahead"  # the default
    assert rule_for("ready", lookahead=False).name == "greedy"
    assert rule_for("fixed").name == "fixed"
    with pytest.raises(UserError, match="`policy` ready"):
        rule_for("fixed", lookahead=True)
    with pytest.raises(UserError, match="not a policy"):
        rule_for("eager")
    assert as_rule("ready") is RULES["greedy"]  # the library's plain reading
    assert {r.name: (r.uses_budget, r.exact_order) for r in RULES.values()} == {
        "fixed": (False, True), "greedy": (True, False), "lookahead": (True, False)}


def test_running_means_estimate_per_stage_and_kind():
    from runtime.exec.forecast import RunningMeans

    graph = TaskGraph.build(PipelineShape(2, 1, 4))
    means = RunningMeans(graph)
    f0, f1 = graph.tid(Task.parse("0F0")), graph.tid(Task.parse("0F3"))
    assert means[f0] is None
    means.add(f0, 1.0)
    means.add(f1, 3.0)
    assert means[graph.tid(Task.parse("0F2"))] == 2.0  # every microbatch of 0F shares the mean
    assert means[graph.tid(Task.parse("0B0"))] is None


def zb_middle_rank_waiting_for_an_input_gradient(budget: int = 4, estimate_w: float = 1.0, estimate_f: float = 1.0):
    """Rank 1 of ZB on 3 ranks, 6 microbatches (1F0 1F1 1I0 1F2 1I1 1W0 1F3 1I2 1W1 1F4 ...), just after 1F2
    ended, under the reservation rule.

    Its head is 1I1, a backward whose input gradient 2I1 has not arrived; 1W0 is ready.
    """
    hint = builtin_hint("zb", 3, 1, 6)
    graph = TaskGraph.build(hint.shape)
    tid = lambda text: graph.tid(Task.parse(text))  # noqa: E731
    per_kind = {"F": estimate_f, "I": 1.0, "W": estimate_w}
    estimates = [per_kind[graph.tasks[t].kind.value] for t in range(len(graph))]
    arbiter = make_arbiter("lookahead", graph, 1, hint.orders[1], budget, record=True, estimates=estimates)
    for producer, expected in (("0F0", "1F0"), ("0F1", "1F1"), ("2I0", "1I0"), ("0F2", "1F2")):
        arbiter.available(tid(producer))
        chosen = arbiter.choose(now=0.0)
        assert str(graph.tasks[chosen]) == expected
        arbiter.finish(chosen)
    assert [str(t) for t in arbiter.ready_tasks()] == ["1W0"]
    return graph, arbiter, tid


def test_lookahead_waits_for_an_input_gradient_already_on_its_way():
    # A backward head is guarded like a forward one: 2I1 started, so 1I1's input arrives at 10.5, and 1W0
    # (1 s) would still run then.
    graph, arbiter, tid = zb_middle_rank_waiting_for_an_input_gradient()
    arbiter.expect(tid("2I1"), 10.5)
    assert arbiter.choose(now=10.0) is None
    assert arbiter.next_wakeup() is None  # firm: only the arrival can change the answer
    assert arbiter.choose(now=11.0) is None  # late, but its producer runs: keep waiting
    arbiter.available(tid("2I1"))
    assert str(graph.tasks[arbiter.choose(now=11.2)]) == "1I1"
    decision = arbiter.decisions[-1]
    assert decision.head is None and decision.deferred is None  # the head itself ran


def test_lookahead_defers_a_weight_gradient_to_what_ends_in_time():
    graph, arbiter, tid = zb_middle_rank_waiting_for_an_input_gradient(estimate_f=0.3)
    arbiter.available(tid("0F3"))  # 1F3 is ready too (budget 4 admits it), ranked after 1W0
    arbiter.expect(tid("2I1"), 10.5)
    chosen = arbiter.choose(now=10.0)
    assert str(graph.tasks[chosen]) == "1F3"  # ends at 10.3, before 1I1's input
    decision = arbiter.decisions[-1]
    assert decision.deferred == Task.parse("1W0") and decision.head == Task.parse("1I1")
    arbiter.finish(chosen)
    assert arbiter.choose(now=10.3) is None  # 1W0 would still run at 10.5


def test_lookahead_runs_what_ends_before_the_input_gradient_arrives():
    graph, arbiter, tid = zb_middle_rank_waiting_for_an_input_gradient(estimate_w=0.4)
    arbiter.expect(tid("2I1"), 10.5)
    assert str(graph.tasks[arbiter.choose(now=10.0)]) == "1W0"
    assert arbiter.decisions[-1].head == Task.parse("1I1") and arbiter.decisions[-1].deferred is None


def test_lookahead_relayed_input_gradient_expires_and_no_prediction_is_greedy():
    graph, arbiter, tid = zb_middle_rank_waiting_for_an_input_gradient()
    assert str(graph.tasks[arbiter.choose(now=10.0)]) == "1W0"  # 2I1 has not started: no check
    graph, arbiter, tid = zb_middle_rank_waiting_for_an_input_gradient()
    arbiter.expect(tid("2I1"), 10.5, started=False)  # only 2I1's own input gradient is on its way
    assert arbiter.choose(now=10.0) is None
    assert arbiter.next_wakeup() == 10.5
    assert str(graph.tasks[arbiter.choose(now=10.5)]) == "1W0"  # the hope failed: stand aside


def test_lookahead_never_starts_what_greedy_holds_back_for_memory():
    # Budget 3 is full after 1F2 (1F0, 1F1 and 1F2 in flight, 1W0 not run): 1F3, though it would end in
    # time, is no candidate, so the rank waits for 1I1's input rather than admit it.
    graph, arbiter, tid = zb_middle_rank_waiting_for_an_input_gradient(budget=3, estimate_f=0.3)
    arbiter.available(tid("0F3"))
    arbiter.expect(tid("2I1"), 10.5)
    assert arbiter.choose(now=10.0) is None
    assert arbiter.decisions[-1].chosen == Task.parse("1F2")  # nothing new was recorded


@pytest.mark.parametrize("budget,safe,waits", [
    (3, False, True),  # the reservation rule: the hint's plan is not known to keep within the budget
    (3, True, False),  # the plan (1F1B's peak here is 2) leaves a slot: readiness may run ahead
    (2, True, None),  # the plan fills the budget: 1F2 cannot start at all (2 in flight)
    (6, False, False),  # the budget holds every microbatch: nothing is ever held back for memory
])
def test_lookahead_guards_a_backward_head_against_a_forward_only_where_memory_binds(budget, safe, waits):
    # Rank 1 of 1F1B on 3 ranks, 6 microbatches (1F0 1F1 1B0 1F2 ...) after 1F1: the head 1B0 waits for 2B0,
    # which started (its input gradient arrives at 10.5); 1F2 (1 s) is ready.
    hint = builtin_hint("1f1b", 3, 1, 6)
    graph = TaskGraph.build(hint.shape)
    tid = lambda text: graph.tid(Task.parse(text))  # noqa: E731
    estimates = [1.0 if graph.is_forward[t] else 2.0 for t in range(len(graph))]
    arbiter = make_arbiter("lookahead", graph, 1, hint.orders[1], budget, estimates=estimates, safe=safe)
    for producer in ("0F0", "0F1"):
        arbiter.available(tid(producer))
        arbiter.finish(arbiter.choose(now=0.0))
    arbiter.available(tid("0F2"))
    arbiter.expect(tid("2B0"), 10.5)
    chosen = arbiter.choose(now=10.0)
    if waits is None:
        assert chosen is None and arbiter.ready_tasks() == [Task.parse("1F2")]  # held back for memory
    elif waits:
        assert chosen is None and arbiter.next_wakeup() is None
        arbiter.available(tid("2B0"))
        assert str(graph.tasks[arbiter.choose(now=10.5)]) == "1B0"
    else:
        assert str(graph.tasks[chosen]) == "1F2"


def test_lookahead_lets_a_backward_go_ahead_of_a_backward_head():
    # Rank 1 of 1F1B on 3 ranks (1F0 1F1 1B0 1F2 1B1 ...): 1F2 ran ahead (budget 3), and 2B1 arrived before
    # 2B0 (started: 1B0's input gradient arrives at 10.5). 1B1 (2 s) feeds the same backward chain upstream
    # and frees memory as 1B0 would: it runs, where a W or (memory binding) a forward would wait.
    hint = builtin_hint("1f1b", 3, 1, 4)
    graph = TaskGraph.build(hint.shape)
    tid = lambda text: graph.tid(Task.parse(text))  # noqa: E731
    estimates = [1.0 if graph.is_forward[t] else 2.0 for t in range(len(graph))]
    arbiter = make_arbiter("lookahead", graph, 1, hint.orders[1], 3, estimates=estimates)
    for producer, expected in (("0F0", "1F0"), ("0F1", "1F1"), ("0F2", "1F2")):
        arbiter.available(tid(producer))
        chosen = arbiter.choose(now=0.0)
        assert str(graph.tasks[chosen]) == expected
        arbiter.finish(chosen)
    arbiter.expect(tid("2B0"), 10.5)
    arbiter.available(tid("2B1"))
    assert str(graph.tasks[arbiter.choose(now=10.0)]) == "1B1"


def test_forecast_notices_follow_backwards_too():
    # The runtime's side ([Note: lookahead admission], runtime.exec.forecast): a forward notifies the next
    # rank, a backward the previous one; a weight gradient sends nothing, a short task neither; a firm
    # notice about an input gradient reaches the arbiter and is relayed one hop further up.
    from types import SimpleNamespace

    from runtime.exec.forecast import MIN_NOTICE_SECONDS, ArrivalForecast

    class Sent(list):
        def notify(self, dst, iteration, producer, remaining, firm):
            self.append((dst, str(producer), round(remaining, 9), firm))

    class Expected:
        def __init__(self):
            self.calls = []

        def expect(self, producer, eta, started=True):
            self.calls.append((str(graph.tasks[producer]), round(eta, 9), started))

    graph = TaskGraph.build(PipelineShape(3, 1, 4, True))
    tid = lambda text: graph.tid(Task.parse(text))  # noqa: E731
    data_consumer = [None] * len(graph)  # as the executor builds it: the consumer on another stage
    for t, task in enumerate(graph.tasks):
        for consumer in graph.local_consumers[t] + graph.remote_consumers[t]:
            if graph.tasks[consumer].stage != task.stage:
                data_consumer[t] = consumer
    sent, arbiter = Sent(), Expected()
    forecast = ArrivalForecast(1, graph, sent, data_consumer)
    forecast.begin(0, arbiter)
    for text in ("1F0", "1I0", "1W0"):
        forecast.started(tid(text))  # no estimates yet: nothing is sent
        forecast.finished(tid(text), 0.010)
    forecast.started(tid("1F1"))
    forecast.started(tid("1I1"))
    forecast.started(tid("1W1"))
    assert sent == [(2, "1F1", 0.010, True), (0, "1I1", 0.010, True)]
    sent.clear()
    notice = SimpleNamespace(src=2, producer=Task.parse("2I2"), remaining=0.004, firm=True, arrived_ns=5_000_000_000)
    forecast.notice(notice, now=5.001)
    assert arbiter.calls == [("2I2", 5.004, True)]  # no latency measured yet
    assert sent == [(0, "1I2", 0.013, False)]  # 1I2 sends at 5.004 + its estimate: in 0.003 + 0.010 s
    short = ArrivalForecast(1, graph, sent, data_consumer)
    short.begin(0, arbiter)
    short.finished(tid("1I0"), MIN_NOTICE_SECONDS / 2)
    short.started(tid("1I1"))
    short.notice(notice, now=5.001)
    assert sent == [(0, "1I2", 0.013, False)]  # [Note: short tasks send no notices]: nothing more
