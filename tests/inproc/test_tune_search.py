"""The tuner's search end to end on model scenarios: where there is nothing to tune it keeps a built-in, around a
slow rank or a heavy first stage it finds better than every built-in, on held-out scenarios it is never slower
than fixed 1F1B, and --memory-budget auto gives a Pareto table. Pure (no processes), but each runs the whole
search, thousands of simulations: seconds, not milliseconds, which is why they are not in tests/unit (whose
test_tune.py has the search's pieces). Each gives its search a work budget (``evaluations``), never seconds, so
its result is the same on every machine."""

from __future__ import annotations

import pytest

from hints.tasks import PipelineShape
from runtime.durations.variability import VariabilityModel, sample_durations
from runtime.sched.budget import MemoryBudget
from runtime.tune.decide import tune
from runtime.tune.evaluator import Evaluator, Objective
from runtime.tune.scenarios import from_model, from_recorded


def _slow_rank_scenarios(shape: PipelineShape, slow_rank: int, factor: float, count: int) -> object:
    """Sequences of variable length (the language model) on a pipeline whose rank ``slow_rank`` runs its
    forwards ``factor`` times slower (say, an older GPU, or a stage that recomputes)."""
    model = VariabilityModel(workload="language", jitter=0.05)
    recorded = []
    for seed in range(count):
        table = sample_durations(model, shape, seed)
        for stage in shape.stages_of_rank(slow_rank):
            table.forward[stage] = [value * factor for value in table.forward[stage]]
        recorded.append((seed, table, table.expected()))
    return from_recorded(shape, recorded, 0.3, 12, 12, seed=0, source="slow rank")


def _builtin_values(outcome) -> dict[str, float]:
    return {s.candidate.label: s.value for s in outcome.search.scored if s.candidate.family == "built-in"}


def test_uniform_durations_leave_nothing_to_tune():
    # No variability at all: the textbook orders are as good as it gets and tune-hint keeps a built-in.
    shape = PipelineShape(4, 1, 8)
    scenarios = from_model(VariabilityModel(), shape, 6, 6, seed=0)
    outcome = tune(scenarios, "ready", "1f1b", Objective.parse("mean"), evaluations=5208)
    assert not outcome.verdict.tuned_kept
    assert outcome.verdict.chosen.candidate.family in ("built-in", "baseline")
    best_builtin = min(_builtin_values(outcome).values())
    assert outcome.verdict.chosen.value == pytest.approx(best_builtin)


def test_a_slow_rank_is_tuned_around_better_than_every_builtin():
    shape = PipelineShape(4, 1, 8)
    outcome = tune(_slow_rank_scenarios(shape, slow_rank=0, factor=2.0, count=14), "ready", "1f1b",
                   Objective.parse("mean"), evaluations=10416, seed=0)
    best = outcome.search.best
    assert best.candidate.family not in ("built-in", "baseline")
    assert best.value < min(_builtin_values(outcome).values()) * 0.99  # measured: 3.6% better


def test_heavy_first_stage_multimodal_is_tuned_better_than_every_builtin():
    shape = PipelineShape(4, 1, 8)
    model = VariabilityModel(workload="multimodal", vision_stages=1, images_mean=3.0, jitter=0.05)
    outcome = tune(from_model(model, shape, 16, 16, seed=0), "ready", "1f1b", Objective.parse("mean"),
                   evaluations=10416, seed=0)
    assert outcome.search.best.candidate.family not in ("built-in", "baseline")
    assert outcome.search.best.value < min(_builtin_values(outcome).values()) * 0.99  # measured: 5.4% better


def test_never_slower_than_fixed_1f1b_on_held_out_scenarios_at_the_1f1b_budget():
    shape = PipelineShape(4, 1, 8)
    for workload in ("language", "multimodal"):
        outcome = tune(from_model(VariabilityModel(workload=workload, jitter=0.1), shape, 8, 8, seed=3), "ready",
                       "1f1b", Objective.parse("mean"), evaluations=5208)
        held = outcome.verdict.holdout
        assert Objective.parse("mean")(held["chosen"]) <= Objective.parse("mean")(held["fixed 1F1B"]) + 1e-12


def test_memory_auto_gives_a_pareto_table():
    shape = PipelineShape(4, 1, 8)
    scenarios = from_model(VariabilityModel(workload="language", jitter=0.1), shape, 6, 6, seed=0)
    outcome = tune(scenarios, "ready", "auto", Objective.parse("mean"), evaluations=2604)
    budgets = [row["budget"] for row in outcome.pareto]
    assert budgets[0] == "1f1b" and len(budgets) >= 4
    chosen = [row for row in outcome.pareto if row["chosen"]]
    assert len(chosen) == 1 and outcome.budget == chosen[0]["budget"]
    best = min(row["objective"] for row in outcome.pareto)
    assert chosen[0]["objective"] <= best * 1.01  # the smallest budget within 1% of the best
    smaller = [row for row in outcome.pareto if row["max_slots"] < chosen[0]["max_slots"]]
    assert all(row["objective"] > best * 1.01 for row in smaller)
    # The verdict is judged at the chosen budget, by an evaluator that shares the search's graphs, arrays and lower
    # bounds (Evaluator.at_budget) and scores as a fresh one at that budget does.
    evaluator = outcome.evaluator
    assert str(evaluator.budget) == outcome.budget and evaluator.slots == chosen[0]["slots"]
    fresh = Evaluator(scenarios, MemoryBudget.parse(outcome.budget))
    candidate = outcome.verdict.chosen.candidate
    assert evaluator.makespans(candidate, "holdout") == fresh.makespans(candidate, "holdout")
    assert evaluator.bounds(candidate, "holdout", 1) == fresh.bounds(candidate, "holdout", 1)


@pytest.mark.parametrize("budget", ["1f1b", "auto"])
def test_an_interrupt_before_anything_is_scored_ends_the_tuning_as_an_interrupt(monkeypatch, budget):
    """Ctrl-C (or SIGTERM) before the first candidate is scored leaves nothing to keep: the interrupt itself goes
    up (the CLI's exit 130 / 143), never an IndexError from an empty ranking."""
    from runtime.tune.search import Search

    def interrupted(self, candidates):
        raise KeyboardInterrupt

    monkeypatch.setattr(Search, "score_all", interrupted)
    scenarios = from_model(VariabilityModel(), PipelineShape(2, 1, 4), 2, 2, seed=0)
    with pytest.raises(KeyboardInterrupt):
        tune(scenarios, "ready", budget, Objective.parse("mean"), evaluations=100)
