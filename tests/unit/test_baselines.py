"""The fixed orders readiness is credited against ([Note: sorted 1F1B], [Note: the best fixed order at equal memory],
[Note: fixed candidates and the budget])."""

from __future__ import annotations

import random

import pytest

from hints.errors import HintError
from hints.orders import builtin_hint, one_f_one_b_warmups, peak_in_flight, sorted_one_f_one_b
from hints.tasks import PipelineShape, Task
from hints.validate import validate_orders
from runtime.durations.variability import VariabilityModel, sample_durations
from runtime.sched.baselines import fitted_warmups, sorted_baselines, sorted_zero_bubble
from runtime.sched.budget import MemoryBudget
from runtime.sched.evaluate import builtin_candidates, compare, credit, planned_baseline
from runtime.sched.simulator import simulate
from runtime.tune.decide import tune
from runtime.tune.evaluator import Candidate, Evaluator, Objective
from runtime.tune.scenarios import from_model
from runtime.tune.search import Search, SearchConfig

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("chunks", [1, 2])
@pytest.mark.parametrize("lightest", [True, False])
def test_sorted_1f1b_is_1f1b_relabelled_by_cost(chunks, lightest):
    p, m = 4, 8
    costs = [random.Random(k).uniform(1, 5) for k in range(m)]
    name = "1f1b-light" if lightest else "1f1b-heavy"
    sorted_hint = builtin_hint(name, p, chunks, m, costs)
    plain = builtin_hint("1f1b" if chunks == 1 else "interleaved-1f1b", p, chunks, m)
    order = sorted(range(m), key=lambda mb: costs[mb] if lightest else -costs[mb])
    relabelled = tuple(tuple(Task(t.stage, t.kind, order[t.microbatch]) for t in rank) for rank in plain.orders)
    assert sorted_hint.orders == relabelled
    # The first microbatch every rank forwards is the lightest (heaviest) one; the memory is 1F1B's.
    assert sorted_hint.orders[0][0].microbatch == order[0]
    shape = sorted_hint.shape
    assert [peak_in_flight(o, shape) for o in sorted_hint.orders] == [peak_in_flight(o, shape) for o in plain.orders]
    # Without costs it is 1F1B itself.
    assert builtin_hint(name, p, chunks, m).orders == plain.orders


@pytest.mark.parametrize("chunks,budget", [(1, "2x"), (1, "3x"), (2, "2x"), (1, "7")])
def test_fitted_warmups_fill_each_ranks_budget_and_complete(chunks, budget):
    shape = PipelineShape(4, chunks, 8)
    slots = MemoryBudget.parse(budget).per_rank(shape)
    table = sample_durations(VariabilityModel(workload="vlm-mixed", jitter=0.1), shape, 3)
    costs = table.expected().microbatch_costs
    fitted = sorted_baselines(shape, costs, slots, budget)
    assert set(fitted) == {f"1f1b-light @{budget}", f"1f1b-heavy @{budget}"}
    for hint in fitted.values():
        validate_orders(hint.shape, hint.orders, hint.name)
        assert [peak_in_flight(o, hint.shape) for o in hint.orders] == [min(s, chunks * 8) for s in slots]
        simulate(hint, table, "fixed")  # completes in fixed order


def test_no_fitted_baseline_where_it_would_be_1f1b_itself_or_not_fit():
    shape = PipelineShape(4, 1, 8)
    assert sorted_baselines(shape, [1.0] * 8, MemoryBudget.parse("1f1b").per_rank(shape), "1f1b") == {}
    assert sorted_baselines(shape, [1.0] * 8, [2, 2, 2, 2], "2") == {}  # below 1F1B's peak on rank 0
    v_shape = PipelineShape(4, 2, 8, placement="v")
    assert sorted_baselines(v_shape, [1.0] * 8, [16] * 4, "16") == {}
    assert fitted_warmups(shape, [3, 100, 1, 8]) == [2, 7, 0, 7]


def test_credit_picks_the_fastest_fixed_and_ready_rows_within_the_budget():
    shape = PipelineShape(8, 1, 32)
    table = sample_durations(VariabilityModel(workload="vlm-mixed", jitter=0.1), shape, 0)
    budget = MemoryBudget.parse("2x")
    comparison = compare(builtin_candidates(shape, table, budget), table, budget)
    within = [r for r in comparison.rows if r.within_budget]
    got = comparison.credit
    assert got.best_fixed.makespan == min(r.makespan for r in within if r.rule == "fixed")
    assert got.best_ready.makespan == min(r.makespan for r in within if r.rule != "fixed")
    assert got.best_fixed.within_budget and got.best_fixed.rule == "fixed"
    # gpipe, bf, bfw hold every microbatch in fixed order: never the best fixed order at 2x.
    assert got.best_fixed.hint not in ("gpipe", "bf", "bfw")
    assert got.readiness == pytest.approx(got.best_fixed.makespan / got.best_ready.makespan)
    assert credit([]).readiness is None


def test_a_fixed_candidate_over_the_budget_is_scored_but_never_chosen():
    shape = PipelineShape(4, 1, 16)
    model = VariabilityModel(workload="vlm-mixed", jitter=0.1)
    scenarios = from_model(model, shape, 6, 4, 0)
    evaluator = Evaluator(scenarios, MemoryBudget.parse("1f1b"))
    gpipe = Candidate("gpipe", "built-in", "fixed", builtin_hint("gpipe", 4, 1, 16))
    light = Candidate("1f1b-light", "built-in", "fixed", builtin="1f1b-light")
    assert not evaluator.fits(gpipe) and evaluator.fits(light)
    assert evaluator.fits(Candidate("gpipe", "built-in", "greedy", builtin_hint("gpipe", 4, 1, 16)))
    outcome = tune(scenarios, "fixed", "1f1b", Objective.parse("mean"), 1.0)
    chosen = outcome.verdict.chosen.candidate
    assert outcome.evaluator.fits(chosen)
    slots = outcome.evaluator.slots
    assert all(peak <= slot for peak, slot in zip(outcome.evaluator.peak_in_flight(chosen), slots))
    # gpipe in fixed order ranks after every fitting candidate, whatever its makespan; the baseline never does.
    search = Search(evaluator, SearchConfig(Objective.parse("mean"), ("fixed",), 10))
    assert search._value(gpipe, [0.001]) == float("inf")
    assert search._value(light, [0.001]) == 0.001
    baseline = Candidate("gpipe", "baseline", "fixed", builtin_hint("gpipe", 4, 1, 16))
    assert search._value(baseline, [0.001]) == 0.001


@pytest.mark.parametrize("chunks,placement,budget", [(1, "looping", "1f1b"), (1, "looping", "2x"),
                                                     (2, "looping", "1f1b"), (2, "v", "1f1b"), (1, "looping", "6")])
def test_a_planned_order_keeps_to_its_budget_whatever_the_durations(chunks, placement, budget):
    """[Note: planned orders]: the plan is made on the expected durations; fixed, it holds what the plan held on
    every rank (within the budget) on any realized table, and on the expected one it takes the plan's time."""
    shape = PipelineShape(4, chunks, 8, placement=placement)
    model = VariabilityModel(workload="vlm-mixed", jitter=0.1)
    table = sample_durations(model, shape, 3)
    memory = MemoryBudget.parse(budget)
    slots = memory.per_rank(shape)
    plan = planned_baseline(shape, table, memory)
    assert plan.name == f"planned @{budget}"
    assert plan.provenance["from"] in ("cp", "zb-light") and plan.shape.split_backward
    validate_orders(plan.shape, plan.orders, plan.name)
    expected = simulate(plan, table.expected(), "fixed")
    assert expected.makespan <= plan.provenance["planned_makespan"] + 1e-9
    for seed in (3, 4, 5):  # other iterations of the same workload: other realized durations, the same memory
        realized = simulate(plan, sample_durations(model, shape, seed), "fixed")
        assert all(peak <= slot for peak, slot in zip(realized.peak_in_flight, slots))
        assert realized.peak_in_flight == expected.peak_in_flight


def test_the_planned_order_is_a_fixed_baseline_readiness_is_credited_against():
    shape = PipelineShape(8, 1, 32)
    table = sample_durations(VariabilityModel(workload="sft-chat", jitter=0.1), shape, 0)
    budget = MemoryBudget.parse("1f1b")
    comparison = compare(builtin_candidates(shape, table, budget), table, budget, rules=("fixed", "lookahead"))
    planned = comparison.row("planned @1f1b", "fixed")
    assert planned is not None and planned.within_budget
    sorted_fixed = min(comparison.row(name, "fixed").makespan for name in ("1f1b-light", "1f1b-heavy"))
    assert planned.makespan < sorted_fixed  # the split backward, planned within 1F1B's memory
    got = comparison.credit
    assert got.best_fixed.makespan <= planned.makespan
    # cp in fixed order holds every microbatch: only its ready run keeps to 1F1B's memory, and the planned order
    # is what that run looks like when it is planned before the iteration.
    assert not comparison.row("cp", "fixed").within_budget


def test_the_planned_hint_resolves_per_table_and_keeps_the_first_shape():
    """``--hint planned`` ([Note: planned orders]): resolve plans at the budget given (1F1B's by default); a run
    passes its first iteration's shape (``split``) so later plans keep it."""
    from runtime.sched.evaluate import resolve

    shape = PipelineShape(4, 1, 8)
    model = VariabilityModel(workload="multimodal", jitter=0.1)
    tables = [sample_durations(model, shape, seed) for seed in (0, 1, 2)]
    two = MemoryBudget.parse("2x")
    first = resolve("planned", 4, 1, 8, tables[0], budget=two)
    assert first.orders == planned_baseline(shape, tables[0], two).orders and first.name == "planned @2x"
    assert resolve("planned", 4, 1, 8, tables[0]).name == "planned @1f1b"
    for table in tables[1:]:
        later = resolve("planned", 4, 1, 8, table, split=first.shape, budget=two)
        assert later.shape == first.shape
        validate_orders(later.shape, later.orders, later.name)
    uniform = resolve("planned", 4, 1, 8)  # no table: uniform durations, as cp
    assert uniform.shape.split_backward


def test_sorted_zero_bubble_is_zb_relabelled_lightest_first():
    p, m = 4, 8
    costs = [random.Random(k).uniform(1, 5) for k in range(m)]
    plain = builtin_hint("zb", p, 1, m)
    got = sorted_zero_bubble(plain.shape, costs)
    order = sorted(range(m), key=lambda mb: costs[mb])
    assert got.orders == tuple(tuple(Task(t.stage, t.kind, order[t.microbatch]) for t in rank)
                               for rank in plain.orders)
    assert got.shape == plain.shape


def test_warmups_of_1f1b():
    assert one_f_one_b_warmups(4, 1, 8) == [3, 2, 1, 0]
    assert one_f_one_b_warmups(4, 2, 8) == [10, 8, 6, 4]
    with pytest.raises(HintError, match="one cost per microbatch"):
        sorted_one_f_one_b(4, 1, 8, [1.0] * 7)


def test_run_compare_adds_the_sorted_1f1b_for_hints_that_order_by_cost():
    from rrfp_cli.cmd_run import _orders_by_cost
    from runtime.config import RunConfig

    def config(**changes):
        return RunConfig(**{"workload": "emulated", "ranks": 4, "microbatches": 8, **changes})

    assert _orders_by_cost(config(hint="bfw")) and _orders_by_cost(config(hint="cp"))
    assert not _orders_by_cost(config(hint="1f1b")) and not _orders_by_cost(config(hint="zb"))
    assert not _orders_by_cost(config(hint="1f1b-light"))  # it is that order already
    assert not _orders_by_cost(config(hint="bfw", placement="v"))  # the 1F1B family places stages looping
