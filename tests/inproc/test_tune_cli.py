"""rrfp tune-hint in this process, on a workload model (looping and V) and on a trace without a usable iteration;
and a cost-ranked hint resolved per iteration by rrfp run's plan and by rrfp simulate."""

from __future__ import annotations

import json

import pytest

from hints.orders import as_cost_ranked, builtin_hint
from hints.tasks import PipelineShape
from runtime.durations.variability import VariabilityModel, sample_durations
from tests.helpers.cli import one_error_line, run_cli
from tests.helpers.trace_builder import ONE_F_ONE_B, build_run


def test_tune_hint_needs_a_traced_iteration_after_the_first(tmp_path):
    # a run that traced iteration 0 only (start-up, which tuning leaves out), written by the real recorder
    build_run(tmp_path / "one", **ONE_F_ONE_B)
    line = one_error_line(run_cli(tmp_path, "tune-hint", "one", "--out", "x"))
    assert "no complete traced iteration after dropping iteration 0" in line
    assert not (tmp_path / "x").exists()


def test_tune_hint_on_a_workload_model(tmp_path):
    result = run_cli(tmp_path, "tune-hint", "--workload", "multimodal", "-p", "4", "-m", "8", "--jitter", "0.1",
                     "--out", "m", "--time-budget", "2s", "--scenarios", "6", "--memory-budget", "2x", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    toml = (tmp_path / "m" / "job.toml").read_text()
    assert 'workload = "emulated"' in toml and 'emulate = "multimodal"' in toml and 'memory-budget = "2x"' in toml
    assert "samples = 4" in toml  # the tuned model's microbatches, not rrfp run's default of 2
    assert data["memory_budget"] == "2x"
    chosen = data["rows"][0]
    assert chosen["row"] == "written out" and chosen["holdout"]["mean"] > 0
    for row in data["rows"]:  # [Note: bound per hint family]: each row over its family's bound and the universal one
        assert 1.0 <= row["makespan_over_bound"] <= row["makespan_over_universal_bound"] + 1e-12
        assert row["bound_family"] in ("full-backward", "split") or row["bound_family"].startswith("split except")
    assert "| /bound |" in (tmp_path / "m" / "report.md").read_text()


def test_tune_hint_on_a_v_workload_model_searches_v_orders_only(tmp_path):
    result = run_cli(tmp_path, "tune-hint", "--workload", "multimodal", "-p", "4", "-m", "8", "--placement", "v",
                     "--jitter", "0.1", "--out", "m", "--time-budget", "2s", "--scenarios", "6", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["shape"]["placement"] == "v" and data["shape"]["chunks"] == 2
    hint = json.loads((tmp_path / "m" / "hint.json").read_text())  # written whatever was chosen
    assert hint["placement"] == "v" and hint["shape"]["chunks"] == 2
    # at the 1f1b budget nothing written out is slower than fixed ZB-V, the V baseline
    rows = {row["row"]: row for row in data["rows"]}
    assert rows["written out"]["holdout"]["mean"] <= rows["best baseline"]["holdout"]["mean"] * (1 + 1e-12)


def test_rrfp_run_and_simulate_resolve_a_cost_ranked_hint_per_iteration(tmp_path):
    import torch

    from hints.files.hint_json import save_hint
    from runtime.config import RunConfig, run_shape
    from runtime.run.plan import HintPlan
    from runtime.workloads.make import make_workload

    ranked = as_cost_ranked(builtin_hint("gpipe", 2, 1, 6), [6.0, 5.0, 4.0, 3.0, 2.0, 1.0], "gpipe by cost")
    save_hint(ranked, tmp_path / "ranked.json")
    config = RunConfig(workload="emulated", emulate="multimodal", ranks=2, microbatches=6,
                       hint=str(tmp_path / "ranked.json"))
    workload = make_workload(config, run_shape(config), torch.device("cpu"))
    plan = HintPlan(config, workload)
    bfw_plan = HintPlan(RunConfig(workload="emulated", emulate="multimodal", ranks=2, microbatches=6, hint="bfw"),
                        workload)
    for iteration in range(3):
        costs = workload.expected(iteration).microbatch_costs
        assert len(set(costs)) > 1  # the multimodal model's microbatches differ
        assert plan.for_iteration(iteration).orders == builtin_hint("bfw", 2, 1, 6, costs=costs).orders
        assert bfw_plan.for_iteration(iteration).orders == builtin_hint("bfw", 2, 1, 6, costs=costs).orders
    data = json.loads(run_cli(tmp_path, "simulate", "--hint", "ranked.json", "--workload", "multimodal",
                              "--policy", "fixed", "--json").stdout)
    table = sample_durations(VariabilityModel(workload="multimodal"), PipelineShape(2, 1, 6), 0)
    from runtime.sched.simulator import simulate

    bfw = builtin_hint("bfw", 2, 1, 6, costs=table.expected().microbatch_costs)
    assert data["makespan"] == pytest.approx(simulate(bfw, table, "fixed").makespan)
