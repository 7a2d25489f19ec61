"""Arbiter policies, memory budgets and decision records."""

from __future__ import annotations

import pytest

from hints.errors import HintError, UserError
from hints.orders import builtin_hint, peak_in_flight
from hints.tasks import PipelineShape, Task
from runtime.arbiter import MemoryBudget, Policy, make_arbiter, one_f_one_b_bounds
from runtime.deps import TaskGraph
from runtime.simulator import simulate
from tests.conftest import hint_from_text, unit_durations


@pytest.mark.parametrize("text,factor,slots", [("1f1b", 1.0, None), ("2x", 2.0, None), ("1.5X", 1.5, None),
                                               ("6", None, 6), (" 1F1B ", 1.0, None)])
def test_budget_parse(text, factor, slots):
    budget = MemoryBudget.parse(text)
    assert (budget.factor, budget.slots) == (factor, slots)


@pytest.mark.parametrize("text", ["lots", "-3", "0.5x", "", "2y"])
def test_budget_parse_rejects(text):
    with pytest.raises(UserError) as caught:
        MemoryBudget.parse(text)
    assert caught.value.where == "--memory-budget"


@pytest.mark.parametrize("p,v,m", [(4, 1, 8), (4, 1, 2), (8, 1, 32), (4, 2, 8), (4, 2, 12), (3, 3, 6), (2, 2, 1)])
def test_1f1b_bound_is_the_baseline_orders_peak(p, v, m):
    hint = builtin_hint("1f1b" if v == 1 else "interleaved-1f1b", p, v, m)
    peaks = [peak_in_flight(order, hint.shape.final_backward) for order in hint.orders]
    assert one_f_one_b_bounds(hint.shape) == peaks


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
    assert decision.hint_rank == 2 and decision.in_flight == 1


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
    with pytest.raises(HintError, match="--chunks >= 2"):
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
