"""rrfp tune-hint's pieces, pure: objectives, cost-ranked hints, scenarios, the evaluator, predicted ranges. The
whole search: tests/inproc/test_tune_search.py. The command: tests/inproc/test_tune_cli.py (on models and built
traces), tests/multiproc/test_tune.py (on real runs, and the search's worker processes), tests/cli/test_signals.py
(Ctrl-C keeps the best found)."""

from __future__ import annotations

import json
import random

import pytest

from hints.costs import CostModel
from hints.errors import HintError
from hints.files.hint_json import hint_from_json, hint_to_json
from hints.orders import as_cost_ranked, builtin_hint, heaviest_first, resolve_cost_ranked
from hints.tasks import PipelineShape
from runtime.durations.variability import VariabilityModel, sample_durations
from runtime.sched.budget import MemoryBudget
from runtime.tune.evaluator import Evaluator, Objective, paired_bootstrap
from runtime.tune.scenarios import bootstrap, from_model, from_recorded

# -- objectives and intervals -----------------------------------------------------------------------


def test_objectives():
    values = [float(v) for v in range(1, 11)]
    assert Objective.parse("mean")(values) == 5.5
    assert Objective.parse("p90")(values) == pytest.approx(9.1)
    assert Objective.parse("cvar:0.8")(values) == pytest.approx(9.5)  # mean of the worst 20%: 9 and 10
    for bad in ("median", "p0", "p100", "cvar:1", "cvar:x"):
        with pytest.raises(Exception, match="`objective`"):
            Objective.parse(bad)


def test_paired_bootstrap_sees_a_sure_gain_and_no_gain():
    rng = random.Random(0)
    base = [1.0 + rng.random() for _ in range(40)]
    better = [b * 0.95 for b in base]
    interval = paired_bootstrap(base, better)
    assert interval.above_zero() and interval.estimate == pytest.approx(0.05)
    noisy = [b * (1 + rng.uniform(-0.05, 0.05)) for b in base]
    assert not paired_bootstrap(base, noisy).above_zero() or paired_bootstrap(base, noisy).low < 0.01


# -- cost-ranked hints ([Note: cost-ranked hints]) -------------------------------------------------------


def test_cost_ranked_slots_become_this_iterations_microbatches():
    gpipe = builtin_hint("gpipe", 2, 1, 4)
    costs = [1.0, 5.0, 3.0, 5.0]
    assert heaviest_first(costs) == [1, 3, 2, 0]
    ranked = as_cost_ranked(gpipe, [4.0, 3.0, 2.0, 1.0])  # slot k = microbatch k of gpipe's order
    assert ranked.cost_ranked and ranked.orders == gpipe.orders
    resolved = resolve_cost_ranked(ranked, costs)
    # gpipe in slot order is breadth-first with the heaviest microbatch first in both passes: bfw.
    assert resolved.orders == builtin_hint("bfw", 2, 1, 4, costs=costs).orders
    assert resolve_cost_ranked(gpipe, costs) is gpipe  # an index hint stays as it is


def test_hint_file_v2_round_trip_and_v1_still_loads():
    model = CostModel(2, {"0F": (0.001, 1e-5, 0.0), "0B": (0.002, 2e-5, 0.0), "1F": (0.001, 0.0, 1e-3),
                          "1B": (0.002, 0.0, 2e-3)})
    ranked = as_cost_ranked(builtin_hint("1f1b", 2, 1, 3), [3.0, 2.0, 1.0], "tuned", model)
    data = hint_to_json(ranked)
    assert data["format"] == "rrfp-hint/2" and data["microbatches"] == "cost-ranked"
    back = hint_from_json(json.loads(json.dumps(data)), "t.json")
    assert back.orders == ranked.orders and back.cost_ranked and back.cost_model == model
    assert model.microbatch_costs([{"tokens": 100, "images": 1}]) == [pytest.approx(0.006 + 3e-3 + 3e-3)]
    plain = hint_to_json(builtin_hint("1f1b", 2, 1, 3))
    assert plain["format"] == "rrfp-hint/1" and "microbatches" not in plain
    assert not hint_from_json(plain, "p.json").cost_ranked


@pytest.mark.parametrize("change,message", [
    ({"microbatches": "random"}, "'microbatches' is 'random'"),
    ({"cost_model": {"stages": 2, "coefficients": {"0F": [1, 2, 3]}}}, "only goes with"),
    ({"microbatches": "cost-ranked", "cost_model": {"stages": 3, "coefficients": {"0F": [1, 2, 3], "1F": [1, 2, 3],
                                                                                  "2F": [1, 2, 3]}}},
     "covers 3 model stages"),
    ({"microbatches": "cost-ranked", "cost_model": {"stages": 2, "coefficients": {"0F": [1, 2]}}},
     "three finite numbers"),
])
def test_hint_file_v2_errors(change, message):
    data = {**hint_to_json(builtin_hint("1f1b", 2, 1, 3)), "format": "rrfp-hint/2", **change}
    with pytest.raises(HintError, match=message):
        hint_from_json(data, "bad.json")
    with pytest.raises(HintError, match="unknown key 'microbatches'"):  # /1 files cannot use /2 keys
        hint_from_json({**hint_to_json(builtin_hint("1f1b", 2, 1, 3)), "microbatches": "index"}, "old.json")


# -- scenarios ([Note: scenario bootstrap]) -------------------------------------------------------------------


def test_bootstrap_resamples_whole_microbatches_and_latencies_per_stage():
    shape = PipelineShape(3, 1, 6)
    model = VariabilityModel(workload="multimodal", jitter=0.3, comm_latency=0.001, comm_jitter=0.5)
    pool = [(t, t.expected()) for t in (sample_durations(model, shape, s) for s in range(3))]
    table, expected = bootstrap(shape, pool, random.Random(1))
    columns = {tuple(t.forward[k][i] for k in range(3)) + tuple(t.backward[k][i] for k in range(3))
               for t, _ in pool for i in range(6)}
    for i in range(6):  # every new microbatch is one recorded microbatch, on every stage together
        assert tuple(table.forward[k][i] for k in range(3)) + tuple(table.backward[k][i] for k in range(3)) in columns
    for k in range(3):
        recorded = {t.send_forward[k][i] for t, _ in pool for i in range(6)}
        assert set(table.send_forward[k]) <= recorded
    assert table.expected() is expected and table.microbatch_features() is not None


def test_holdout_takes_the_last_iterations():
    shape = PipelineShape(2, 1, 4)
    tables = [sample_durations(VariabilityModel(workload="language"), shape, s) for s in range(10)]
    recorded = [(i, t, t.expected()) for i, t in enumerate(tables)]
    scenarios = from_recorded(shape, recorded, 0.3, 5, 5, seed=0, source="test")
    assert scenarios.recorded == list(range(7)) and scenarios.recorded_holdout == [7, 8, 9]
    model_set = from_model(VariabilityModel(), shape, 3, 2, seed=4)
    names = [s.name for s in model_set.tuning + model_set.holdout]
    assert len(set(names)) == 5  # tuning and held-out seeds never overlap


# -- the evaluator -------------------------------------------------------------------------------------------------


def test_evaluator_scores_cost_ranked_candidates_per_scenario():
    from runtime.tune.evaluator import Candidate

    shape = PipelineShape(2, 1, 4)
    scenarios = from_model(VariabilityModel(workload="multimodal"), shape, 3, 1, seed=0)
    evaluator = Evaluator(scenarios, MemoryBudget.parse("1f1b"))
    ranked = as_cost_ranked(builtin_hint("bf", 2, 1, 4), [4.0, 3.0, 2.0, 1.0], "bf heaviest first")
    candidate = Candidate(ranked.name, "cost classes", "greedy", ranked)
    for index, scenario in enumerate(scenarios.tuning):
        hint = evaluator.hint_for(candidate, "tuning", index)
        costs = scenario.expected.microbatch_costs
        assert [t.microbatch for t in hint.orders[0][:4]] == heaviest_first(costs)


def test_an_evaluator_at_another_budget_shares_what_the_budget_does_not_change():
    from runtime.tune.evaluator import Candidate

    shape = PipelineShape(4, 1, 8)
    scenarios = from_model(VariabilityModel(workload="language", jitter=0.1), shape, 2, 2, seed=0)
    tight = Evaluator(scenarios, MemoryBudget.parse("1f1b"))
    tight.price_bounds()
    wide = tight.at_budget(MemoryBudget.parse("2x"))
    fresh = Evaluator(scenarios, MemoryBudget.parse("2x"))
    assert wide.slots == fresh.slots and wide.slots != tight.slots
    assert wide._bounds is tight._bounds and wide._arrays is tight._arrays and wide._graphs is tight._graphs
    ready = Candidate("1f1b", "built-in", "lookahead", builtin="1f1b")
    assert wide.makespans(ready, "holdout") == fresh.makespans(ready, "holdout")
    assert wide.makespans(ready, "holdout") != tight.makespans(ready, "holdout")  # the budget itself is not shared
    assert wide.bounds(ready, "holdout", 1) == fresh.bounds(ready, "holdout", 1)


# -- what the report predicts ----------------------------------------------------------------------------------


def test_predicted_ranges_add_the_simulators_measured_error():
    from runtime.tune.decide import _prediction, gain_range

    chosen = [0.8 + 0.01 * k for k in range(11)]  # p10 0.81, p90 0.89
    reference = [1.0] * 11
    bare = _prediction(chosen, {"over_x": reference})
    assert gain_range(bare["gain_over_x"]) == (bare["gain_over_x"]["p10"], bare["gain_over_x"]["p90"])
    assert bare["makespan_range"] == pytest.approx([0.81, 0.89])
    # The simulator read 2% under and 1% over the measured steps: a run measures replayed / (1 + e).
    errors = [-0.02, 0.0, 0.01]
    widened = _prediction(chosen, {"over_x": reference}, errors)
    assert widened["makespan_range"] == pytest.approx([0.81 / 1.01, 0.89 / 0.98])
    assert widened["makespan_scenarios_range"] == pytest.approx([0.81, 0.89])
    gain = widened["gain_over_x"]
    margin = 2 * 0.02 * (1 - gain["estimate"])  # the largest deviation from the median error is 2%
    assert gain_range(gain) == pytest.approx((gain["p10"] - margin, gain["p90"] + margin))
    # A bias the same in every iteration cancels in a gain: no margin.
    biased = _prediction(chosen, {"over_x": reference}, [0.03, 0.03, 0.03])["gain_over_x"]
    assert gain_range(biased) == pytest.approx((biased["p10"], biased["p90"]))
    # Reports written before the range existed still check against p10..p90.
    assert gain_range({"p10": 0.1, "p90": 0.2}) == (0.1, 0.2)
