"""rrfp tune-hint on real runs: from a run's trace to hint.json, job.toml and the report, that job run, and --check
on it (looping and V placement); bad input against a real trace; and the search's worker processes (--jobs)
give the same answer every time. The command's other sources: tests/inproc/test_tune_cli.py."""

from __future__ import annotations

import json

import pytest

from hints.tasks import PipelineShape
from runtime.durations.variability import VariabilityModel
from runtime.tune.decide import tune
from runtime.tune.evaluator import Objective
from runtime.tune.scenarios import from_model
from tests.helpers.cli import one_error_line, run_cli
from tests.helpers.warm import run_warm


def test_same_seed_same_result_and_jobs_are_deterministic():
    shape = PipelineShape(4, 1, 8)
    scenarios = from_model(VariabilityModel(workload="multimodal", jitter=0.1), shape, 8, 8, seed=1)

    def run(jobs):
        outcome = tune(scenarios, "ready", "1f1b", Objective.parse("p90"), evaluations=5208, jobs=jobs, seed=5)
        best = outcome.search.best
        return best.candidate.name, best.value, (best.candidate.hint.orders if best.candidate.hint else None), \
            outcome.search.simulations

    assert run(1) == run(1)
    assert run(2) == run(2)


def test_a_search_with_workers_cut_by_the_clock_is_reproduced_by_its_evaluations():
    # [Note: two budgets]: with --jobs 2 a job in flight when the clock runs out is abandoned (and a job may run in
    # parts on both workers); what was kept is exactly what --evaluations S keeps.
    scenarios = from_model(VariabilityModel(workload="multimodal", jitter=0.1), PipelineShape(4, 1, 8), 8, 8, seed=1)
    timed = tune(scenarios, "ready", "1f1b", Objective.parse("mean"), time_budget=1.5, jobs=2, seed=2)
    assert timed.search.stopped == "time budget"
    again = tune(scenarios, "ready", "1f1b", Objective.parse("mean"), evaluations=timed.search.simulations, jobs=2,
                 seed=2)
    assert again.search.stopped == "evaluations"
    found = [[(s.candidate.name, s.candidate.rule, s.value) for s in o.search.scored] + o.search.trace
             for o in (timed, again)]
    assert found[0] == found[1]


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tune")
    result = run_warm(root, "run", "--workload", "emulated", "--emulate", "multimodal", "--stages", "3",
                      "--microbatches", "6", "--iters", "5", "--forward-time", "0.004", "--jitter", "0.1",
                      "--hint", "1f1b", "--out", "r", "--json")
    assert result.returncode == 0, result.stderr
    return root, root / "r"


def test_tune_hint_from_a_run_writes_everything_and_checks(traced_run):
    root, run = traced_run
    result = run_cli(root, "tune-hint", str(run), "--out", "tuned", "--time-budget", "3s", "--scenarios", "8",
                     "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    out = root / "tuned"
    assert sorted(p.name for p in out.iterdir()) == ["hint.json", "job.toml", "report.json", "report.md"]
    assert not [p for p in root.iterdir() if p.name.startswith(".tuned.")]  # no staging left behind
    assert data["replay"]["errors"] and abs(data["replay"]["median_error"]) < 0.15
    for key, gain in data["prediction"].items():  # ranges widened by the replay error ([Note: predicted ranges])
        if key.startswith("gain_"):
            assert gain["range"][0] <= gain["p10"] and gain["range"][1] >= gain["p90"]
    assert data["scenarios"]["tuning"] == 8 and data["verdict"]["reason"]
    report = (out / "report.md").read_text()
    assert "## Verdict" in report and "## Candidates" in report
    # job.toml is a config rrfp run takes as it is (the hint file beside it is found)
    from runtime.config import build_config, load_toml

    config = build_config(load_toml(out / "job.toml"), {})
    assert (config.ranks, config.microbatches, config.workload) == (3, 6, "emulated")
    rerun = run_warm(root, "run", "--config", str(out / "job.toml"), "--iters", "3", "--out", "again", "--json")
    assert rerun.returncode == 0, rerun.stderr
    checked = run_cli(root, "tune-hint", "--check", "again", "--report", str(out / "report.json"), "--json")
    verdict = json.loads(checked.stdout)
    assert checked.returncode == (0 if verdict["passed"] else 3), checked.stderr  # 3: outside the range
    assert "within_predicted_range" in verdict and verdict["measured_makespan_s"] > 0
    assert verdict["predicted_gain_range"] == pytest.approx(data["prediction"]["gain_over_traced_hint"]["range"])


def test_tune_hint_bad_input(traced_run, tmp_path):
    root, run = traced_run
    cases = [
        (["tune-hint", str(run), "--out", "x", "-p", "4", "-m", "6"], "was asked"),
        (["tune-hint", str(run), "--out", "x", "-p", "4"], "--ranks: the trace is of"),  # one flag alone too
        (["tune-hint", str(run), "--out", "/proc/x"], "cannot write in /proc"),  # before the search, not after
        (["tune-hint", str(run), "--out", "x", "--time-budget", "0"], "--time-budget"),
        (["tune-hint", str(run), "--out", str(run)], "already exists"),
        (["tune-hint", "--out", "x"], "give one source"),
        (["tune-hint", str(run), "--workload", "uniform", "-p", "3", "-m", "6", "--out", "x"], "give one source"),
        (["tune-hint", "--durations", "d.csv", "--out", "x"], "--ranks and --microbatches"),
        (["tune-hint", "--check", str(run)], "go together"),
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    cases.append((["tune-hint", str(empty), "--out", "x"], "holds no trace"))
    for args, message in cases:
        line = one_error_line(run_cli(tmp_path, *args))
        assert message in line, line
        assert not (tmp_path / "x").exists()


def test_tune_hint_closes_the_loop_for_a_v_placement_run(tmp_path):
    # run (zbv, V) -> tune-hint on its trace -> rrfp run --config -> --check, all in V placement.
    base = run_warm(tmp_path, "run", "--workload", "emulated", "--emulate", "multimodal", "--stages", "2",
                    "--microbatches", "6", "--iters", "5", "--forward-time", "0.004", "--jitter", "0.1",
                    "--hint", "zbv", "--out", "r", "--json")
    assert base.returncode == 0, base.stderr
    result = run_cli(tmp_path, "tune-hint", "r", "--out", "tuned", "--time-budget", "3s", "--scenarios", "8",
                     "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["shape"]["placement"] == "v" and data["shape"]["chunks"] == 2
    families = {row["family"] for row in data["rows"]}
    assert "parametric" not in families  # the 1F1B family places stages looping: not searched under V
    assert 'placement = "v"' in (tmp_path / "tuned" / "job.toml").read_text()
    report = (tmp_path / "tuned" / "report.md").read_text()
    assert "Placement: v" in report and "fixed zbv" in report
    rerun = run_warm(tmp_path, "run", "--config", "tuned/job.toml", "--iters", "3", "--out", "again", "--json")
    assert rerun.returncode == 0, rerun.stderr
    checked = run_cli(tmp_path, "tune-hint", "--check", "again", "--report", "tuned/report.json", "--json")
    verdict = json.loads(checked.stdout)
    assert checked.returncode == (0 if verdict["passed"] else 3), checked.stderr  # 3: outside the range
    assert verdict["measured_makespan_s"] > 0
