"""`rrfp run` end to end on real ranks: outputs, config files, --compare, V placement, an empty --out, presets, faults
that must not hang, torchrun. What it refuses before any rank starts: tests/inproc/test_run_args.py.

Runs whose outputs several tests read are module fixtures; each says which tests read it.
"""

from __future__ import annotations

import json
import time

import polars as pl
import pytest

from runtime.durations.presets import PRESETS
from tests.helpers.cli import one_error_line, run_cli, run_rrfp
from tests.helpers.processes import live_ranks
from tests.helpers.trace_compare import assert_same_both_ways, compiled_built
from tests.helpers.warm import run_warm


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    """A gpt run of 3 iterations configured by a TOML file (policy fixed, budget 2x) whose --policy flag wins:
    the folder it ran in (the run is "r" there) and its --json result. Read by the next two tests."""
    root = tmp_path_factory.mktemp("gpt")
    (root / "run.toml").write_text('workload = "gpt"\nstages = 2\nmicrobatches = 4\niters = 3\n'
                                   'memory-budget = "2x"\npolicy = "fixed"\n')
    return root, run_warm(root, "run", "--config", "run.toml", "--policy", "ready", "--out", "r", "--json")


def test_run_writes_config_metrics_and_rank_logs(gpt_run):
    tmp_path, result = gpt_run
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    job = data["jobs"][0]
    assert job["iterations"] == 3 and job["loss_last"] < job["loss_first"]
    run = tmp_path / "r"
    config = json.loads((run / "config.json").read_text())
    assert config["ranks"] == 2 and config["microbatches"] == 4 and config["policy"] == "ready"
    metrics = pl.read_parquet(run / "metrics.parquet")
    for column in ("iteration", "loss", "wall_seconds", "throughput", "idle_fraction", "busy_seconds"):
        assert column in metrics.columns
    assert metrics.height == 3
    assert len(metrics["idle_fraction"][0]) == 2  # one per rank
    assert (run / "logs" / "rank1.log").exists()  # rank 1's output went to a file


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """``--compare`` of ready zb at 2x with fixed 1f1b and fixed zb, on the emulated model of the vlm-mixed preset:
    the folder it ran in (the run is "c" there) and its --json result. Read by the next two tests."""
    root = tmp_path_factory.mktemp("compare")
    return root, run_warm(root, "run", "--workload", "emulated", "--emulate", "vlm-mixed", "--stages", "2",
                          "--microbatches", "4", "--iters", "2", "--forward-time", "0.004", "--hint", "zb",
                          "--memory-budget", "2x", "--compare", "--out", "c", "--json")


def test_compare_runs_fixed_then_ready(compared):
    tmp_path, result = compared
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [j["job"] for j in data["jobs"]] == ["fixed-1f1b", "fixed-zb", "ready-zb@2x"]
    steps = [j["median_wall_seconds"] for j in data["jobs"]]
    assert data["speedup"] == steps[0] / steps[2]
    assert data["speedup_vs_fixed_hint"] == steps[1] / steps[2]
    peaks = [j["peak_in_flight"] for j in data["jobs"]]
    assert data["vs_fixed_hint_at_equal_memory"] == (peaks[2] <= peaks[1])  # zb@2x holds 2x the 1F1B bound
    assert (tmp_path / "c" / "fixed-1f1b" / "metrics.parquet").exists()
    assert (tmp_path / "c" / "ready-zb@2x" / "durations.parquet").exists()


def test_compare_of_a_cost_ordered_hint_runs_the_fixed_orders_a_user_could_run_without_readiness(tmp_path):
    """``--compare`` of ready ``bfw`` within 1F1B's memory also runs 1F1B sorted by the same known costs and the
    order planned on them within the budget, both fixed; the credit line is against the faster of the two, and
    the planned order keeps to the budget in fixed order ([Note: planned orders] in runtime.sched.baselines)."""
    result = run_warm(tmp_path, "run", "--workload", "emulated", "--emulate", "vlm-mixed", "--stages", "2",
                      "--microbatches", "4", "--iters", "2", "--forward-time", "0.004", "--hint", "bfw",
                      "--memory-budget", "1f1b", "--compare", "--out", "b", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    jobs = {j["job"]: j for j in data["jobs"]}
    assert list(jobs) == ["fixed-1f1b", "fixed-1f1b-light", "fixed-planned@1f1b", "fixed-bfw", "ready-bfw@1f1b"]
    best = min(("fixed-1f1b-light", "fixed-planned@1f1b"), key=lambda name: jobs[name]["median_wall_seconds"])
    assert data["best_fixed_job"] == best
    assert data["speedup_vs_best_fixed"] == jobs[best]["median_wall_seconds"] / jobs["ready-bfw@1f1b"][
        "median_wall_seconds"]
    assert jobs["fixed-planned@1f1b"]["peak_in_flight"] <= 2  # 1F1B's budget on 2 stages: 2 on rank 0
    config = json.loads((tmp_path / "b" / "fixed-planned@1f1b" / "config.json").read_text())
    assert (config["hint"], config["policy"], config["memory_budget"]) == ("planned", "fixed", "1f1b")


def test_emulated_run_with_a_preset(compared):
    tmp_path, result = compared
    assert result.returncode == 0, result.stderr
    for job in ("fixed-1f1b", "fixed-zb", "ready-zb@2x"):
        config = json.loads((tmp_path / "c" / job / "config.json").read_text())
        assert config["emulate"] == "vlm-mixed"
        assert config["samples"] == PRESETS["vlm-mixed"].samples  # the simulated preset's microbatches


def test_v_placement_run_compare_and_traces(tmp_path):
    # zbv runs in a V with 2 chunks by default; --compare's baseline keeps the placement (fixed zbv, so the
    # baseline and the same hint in fixed order are one job), and the traces say V all the way to the replay.
    result = run_warm(tmp_path, "run", "--workload", "emulated", "--stages", "2", "--microbatches", "4", "--iters",
                      "2", "--forward-time", "0.004", "--hint", "zbv", "--compare", "--out", "v", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [j["job"] for j in data["jobs"]] == ["fixed-zbv", "ready-zbv@1f1b"]
    assert json.loads((tmp_path / "v" / "ready-zbv@1f1b" / "config.json").read_text())["placement"] is None
    summary = run_cli(tmp_path, "trace", "summary", "v/ready-zbv@1f1b", "--json")
    assert summary.returncode == 0, summary.stderr
    assert json.loads(summary.stdout)["shape"] == "2 ranks x 2 chunks (V), 4 microbatches, split backward"
    export = run_cli(tmp_path, "trace", "export", "v/ready-zbv@1f1b", "--durations", "d.csv", "--json")
    assert export.returncode == 0, export.stderr
    replay = json.loads(export.stdout)["durations"]["replay"]
    assert "--placement v" in replay and "--hint zbv" in replay
    replayed = run_cli(tmp_path, *replay.split()[1:], "--json")  # the printed command runs as printed
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["shape"]["placement"] == "v"
    sensitivity = run_cli(tmp_path, "trace", "sensitivity", "v/ready-zbv@1f1b", "--json")
    assert sensitivity.returncode == 0, sensitivity.stderr
    assert json.loads(sensitivity.stdout)["baseline"] == "zbv fixed"
    tuned = one_error_line(run_cli(tmp_path, "tune-hint", "v/ready-zbv@1f1b", "--placement", "looping",
                                   "--out", "t"))
    assert "--placement: the trace is of 2 ranks x 2 chunks (V)" in tuned and "looping was asked" in tuned


@pytest.fixture(scope="module")
def into_an_empty_out(tmp_path_factory):
    """A gpt run with human output whose --out names a directory that exists and is empty: the folder it ran in
    (the run is "h" there) and its result. Read by the next two tests."""
    root = tmp_path_factory.mktemp("human")
    (root / "h").mkdir()
    return root, run_warm(root, "run", "--workload", "gpt", "--stages", "2", "--microbatches", "4", "--iters", "2",
                          "--out", "h")


def test_human_output_has_a_summary(into_an_empty_out):
    tmp_path, result = into_an_empty_out
    assert result.returncode == 0, result.stderr
    assert "ready-1f1b@1f1b" in result.stdout and "tokens/s" in result.stdout
    # the summary table: the job's column, and a value in it for each row
    rows = {cells[0]: cells[1:] for line in result.stdout.splitlines() if line.startswith("│")
            for cells in [[cell.strip() for cell in line.strip("│").split("│")]]}
    assert rows["iterations"] == ["2"] and rows["median throughput"][0].endswith(" tokens/s")
    assert float(rows["last loss"][0]) > 0 and all(len(values) == 1 and values[0] for values in rows.values()), rows


def test_an_empty_out_directory_is_accepted_and_used(into_an_empty_out):
    """The run of an empty --out is not refused (tests/inproc/test_run_args.py: one that holds files is), and
    writes its outputs there."""
    tmp_path, result = into_an_empty_out
    assert result.returncode == 0, result.stderr
    run = tmp_path / "h"
    assert json.loads((run / "config.json").read_text())["out"] == "h"
    assert pl.read_parquet(run / "metrics.parquet")["iteration"].to_list() == [0, 1]
    assert (run / "trace.pftrace").exists() and (run / "logs" / "rank1.log").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h"]  # nothing written beside it


def test_config_file_and_flags_win(gpt_run):
    tmp_path, result = gpt_run
    assert result.returncode == 0, result.stderr
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["policy"] == "ready" and config["memory_budget"] == "2x" and config["iters"] == 3


def test_a_failing_rank_stops_everyone_and_is_named(tmp_path):
    began = time.monotonic()
    result = run_warm(tmp_path, "run", "--workload", "gpt", "--stages", "3", "--microbatches", "4", "--iters", "2",
                  "--fail-at", "1F2", "--out", "f")
    assert result.returncode == 1
    assert "error: run failed: rank 1 in task 1F2" in result.stderr
    assert "injected failure in task 1F2 of iteration 0" in result.stderr
    assert "last decisions:" in result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - began < 60
    assert live_ranks(tmp_path / "f") == []  # no orphans


def test_a_hanging_rank_is_reported_by_the_watchdog(tmp_path):
    began = time.monotonic()
    result = run_warm(tmp_path, "run", "--workload", "gpt", "--stages", "3", "--microbatches", "4", "--iters", "2",
                  "--hang-at", "1B1", "--timeout", "2", "--out", "h")
    assert result.returncode == 1
    assert "rank 1 in task 1B1" in result.stderr and "stalled: no progress" in result.stderr
    assert "waiting for:" in result.stderr
    assert time.monotonic() - began < 60
    assert live_ranks(tmp_path / "h") == []
    reports = sorted(p.name for p in (tmp_path / "h" / "failures").iterdir())
    assert "rank1-stall.json" in reports
    stall = json.loads((tmp_path / "h" / "failures" / "rank0-stall.json").read_text())
    assert "ready" in stall and "waiting_for" in stall


def test_joins_a_torchrun_job(tmp_path):
    from runtime.run.launch import free_port

    done = run_rrfp(tmp_path, "--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "rrfp_cli", "run",
                    "--workload", "gpt", "--stages", "2", "--microbatches", "4", "--iters", "2", "--out", "tr",
                    "--json", module=("-m", "torch.distributed.run"))
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)  # only rank 0 reports
    assert data["jobs"][0]["iterations"] == 2
    assert (tmp_path / "tr" / "metrics.parquet").exists() and (tmp_path / "tr" / "trace.pftrace").exists()


def test_auto_policy_records_each_iterations_rule_and_trains_alike(tmp_path, monkeypatch):
    """--policy auto ([Note: the auto policy] in runtime.sched.auto) on the emulated model with unknown variability:
    every iteration's rule and why in metrics and on the trace's iteration slices, the summary counts them, and
    the losses are those of the ready run (the order does not change what is computed)."""
    args = ("run", "--workload", "emulated", "--emulate", "sft-chat", "--stages", "2", "--microbatches", "4",
            "--iters", "4", "--forward-time", "0.003", "--unknown", "moe=1.5,cost-error=0.2", "--json")
    auto = run_warm(tmp_path, *args, "--policy", "auto", "--out", "a")
    assert auto.returncode == 0, auto.stderr
    ready = run_warm(tmp_path, *args, "--policy", "ready", "--out", "r")
    assert ready.returncode == 0, ready.stderr
    metrics = pl.read_parquet(tmp_path / "a" / "metrics.parquet")
    decisions = metrics.get_column("policy").to_list()
    assert [d["iteration"] for d in decisions] == [0, 1, 2, 3]
    assert decisions[0]["rule"] == "lookahead" and decisions[0]["reason"] == "nothing observed yet"
    assert all(d["rule"] in ("fixed", "lookahead") and d["reason"] for d in decisions)
    assert decisions[2]["predicted_ready_s"] > 0 and decisions[2]["predicted_fixed_s"] > 0  # iteration 1 replayed
    losses = pl.read_parquet(tmp_path / "r" / "metrics.parquet").get_column("loss").to_list()
    assert metrics.get_column("loss").to_list() == pytest.approx(losses, rel=1e-6)
    summary = json.loads(run_cli(tmp_path, "trace", "summary", "a", "--iterations", "0:4", "--json").stdout)
    labels = {"fixed": "fixed", "lookahead": "ready+la"}
    assert summary["auto"]["rules"] == [labels[d["rule"]] for d in decisions]
    assert summary["auto"]["switches"] == sum(1 for a, b in zip(decisions, decisions[1:]) if a["rule"] != b["rule"])
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["policy"] == "auto" and config["unknown"] == "moe=1.5,cost-error=0.2"
    if compiled_built():  # the iteration slices' rule and why, read by the compiled walk as by the Python one
        assert_same_both_ways(tmp_path / "a", monkeypatch)
