"""`rrfp run` end to end: outputs, config files, bad input before launch, faults that must not hang."""

from __future__ import annotations

import json
import time

import polars as pl
import pytest

from tests.helpers.cli import one_error_line, run_rrfp
from tests.helpers.processes import live_ranks


def test_run_writes_config_metrics_and_rank_logs(tmp_path):
    result = run_rrfp(tmp_path, "run", "--workload", "gpt", "--stages", "2", "--microbatches", "4", "--iters", "3",
                  "--out", "r", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    job = data["jobs"][0]
    assert job["iterations"] == 3 and job["loss_last"] < job["loss_first"]
    run = tmp_path / "r"
    config = json.loads((run / "config.json").read_text())
    assert config["stages"] == 2 and config["microbatches"] == 4 and config["policy"] == "ready"
    metrics = pl.read_parquet(run / "metrics.parquet")
    for column in ("iteration", "loss", "wall_seconds", "throughput", "idle_fraction", "busy_seconds"):
        assert column in metrics.columns
    assert metrics.height == 3
    assert len(metrics["idle_fraction"][0]) == 2  # one per rank
    assert (run / "logs" / "rank1.log").exists()  # rank 1's output went to a file


def test_compare_runs_fixed_then_ready(tmp_path):
    result = run_rrfp(tmp_path, "run", "--workload", "emulated", "--stages", "2", "--microbatches", "4", "--iters", "2",
                  "--forward-time", "0.004", "--hint", "zb", "--memory-budget", "2x", "--compare", "--out", "c",
                  "--json")
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


def test_v_placement_run_compare_and_traces(tmp_path):
    # zbv runs in a V with 2 chunks by default; --compare's baseline keeps the placement (fixed zbv, so the
    # baseline and the same hint in fixed order are one job), and the traces say V all the way to the replay.
    result = run_rrfp(tmp_path, "run", "--workload", "emulated", "--stages", "2", "--microbatches", "4", "--iters",
                      "2", "--forward-time", "0.004", "--hint", "zbv", "--compare", "--out", "v", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [j["job"] for j in data["jobs"]] == ["fixed-zbv", "ready-zbv@1f1b"]
    assert json.loads((tmp_path / "v" / "ready-zbv@1f1b" / "config.json").read_text())["placement"] is None
    summary = run_rrfp(tmp_path, "trace", "summary", "v/ready-zbv@1f1b", "--json")
    assert summary.returncode == 0, summary.stderr
    assert json.loads(summary.stdout)["shape"] == "2 ranks x 2 chunks (V), 4 microbatches, split backward"
    export = run_rrfp(tmp_path, "trace", "export", "v/ready-zbv@1f1b", "--durations", "d.csv", "--json")
    assert export.returncode == 0, export.stderr
    replay = json.loads(export.stdout)["durations"]["replay"]
    assert "--placement v" in replay and "--hint zbv" in replay
    replayed = run_rrfp(tmp_path, *replay.split()[1:], "--json")  # the printed command runs as printed
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["shape"]["placement"] == "v"
    sensitivity = run_rrfp(tmp_path, "trace", "sensitivity", "v/ready-zbv@1f1b", "--json")
    assert sensitivity.returncode == 0, sensitivity.stderr
    assert json.loads(sensitivity.stdout)["baseline"] == "zbv fixed"
    tuned = one_error_line(run_rrfp(tmp_path, "tune-hint", "v/ready-zbv@1f1b", "--placement", "looping",
                                    "--out", "t"))
    assert "--placement: the trace is of 2 ranks x 2 chunks (V)" in tuned and "looping was asked" in tuned


def test_human_output_has_a_summary(tmp_path):
    result = run_rrfp(tmp_path, "run", "--workload", "gpt", "--stages", "2", "--microbatches", "4", "--iters", "2",
                  "--out", "h")
    assert result.returncode == 0, result.stderr
    assert "ready-1f1b@1f1b" in result.stdout and "tokens/s" in result.stdout


def test_config_file_and_flags_win(tmp_path):
    (tmp_path / "run.toml").write_text('workload = "gpt"\nstages = 2\nmicrobatches = 4\niters = 1\n'
                                       'memory-budget = "2x"\npolicy = "fixed"\n')
    result = run_rrfp(tmp_path, "run", "--config", "run.toml", "--policy", "ready", "--out", "t", "--json")
    assert result.returncode == 0, result.stderr
    config = json.loads((tmp_path / "t" / "config.json").read_text())
    assert config["policy"] == "ready" and config["memory_budget"] == "2x" and config["iters"] == 1


def test_config_file_lookahead_and_bad_value(tmp_path):
    from runtime.config import build_config, load_toml

    (tmp_path / "la.toml").write_text('lookahead = "off"\nhint = "zb"\n')
    config = build_config(load_toml(tmp_path / "la.toml"), {})
    assert config.lookahead is False and config.rule().name == "greedy"
    (tmp_path / "bad.toml").write_text('lookahead = "sometimes"\n')
    line = one_error_line(run_rrfp(tmp_path, "run", "--config", "bad.toml", "--out", "x"))
    assert "--lookahead: must be on, off, true or false" in line


@pytest.mark.parametrize("args,message", [
    (["--tp", "3"], "error: --tp: 3 does not divide the model's 4 attention heads (--heads)"),
    (["--workload", "emulated", "--tp", "3"], "error: --tp: 3 does not divide the emulated layer's 32 features"),
    (["--tp", "0"], "error: --tp: must be a whole number >= 1, got 0"),
    (["--dp", "0"], "error: --dp: must be a whole number >= 1, got 0"),
    (["--tp", "2", "--dp", "2", "--nproc", "4"], "error: --nproc: 4 processes cannot run 2 stages x tp 2 x dp 2 = 8"),
    (["--workload", "examples.llama_pipeline:build", "--dp", "2"],
     "error: --dp: a model of your own (package.module:factory) runs pipeline-parallel only"),
    (["--chunks", "2", "--hint", "interleaved-1f1b", "--microbatches", "5"], "must be a multiple of 2"),
    (["--hint", "nope"], "unknown hint 'nope'"),
    (["--chunks", "2", "--memory-budget", "1"], "below the smallest that can complete"),
    (["--workload", "video"], "error: --workload: 'video' is not one of gpt, multimodal, emulated"),
    (["--delay", "1B0"], "error: --delay: '1B0' is not TASK=SECONDS"),
    (["--fail-at", "zz"], "error: --fail-at: 'zz' is not a task"),
    (["--policy", "fixed", "--lookahead", "on"], "error: --lookahead: applies to --policy ready only"),
    (["--policy", "fixed", "--memory-budget", "abc"], "error: --memory-budget: 'abc' is not a budget"),
    (["--fail-at", "9F0"], "error: --fail-at: 9F0 is not a task of this run (2 ranks x 1 chunks, 8 microbatches)"),
    (["--hang-at", "0I1"], "error: --hang-at: 0I1 is not a task of this run"),  # 1f1b does not split B
    (["--hint", "zbv", "--chunks", "3"], "error: shape placement: V placement puts two chunks on each rank"),
    (["--placement", "v", "--chunks", "1"], "so it needs 2p = 4 stages; got 1 chunk(s) per rank, an odd number"),
    (["--hint", "zb", "--placement", "v"], "zb places stages in a loop (stage k on rank k % p); it has no v order"),
    (["--placement", "w"], "error: --placement: 'w' is not one of looping, v"),
    (["--delay", "9B0=0.1"], "error: --delay: 9B0 is not a task of this run"),
    (["--fail-at", "1F0@7", "--iters", "2"], "error: --fail-at: '1F0@7' is never reached: the run has 2 iterations"),
    (["--trace-iters", "10:20", "--iters", "2"], "error: --trace-iters: '10:20' traces nothing: the run has 2"),
    (["--device", "cuda"], "error: --device: cuda needs CUDA, which this machine does not have"),
    (["--backend", "nccl"], "error: --backend: nccl needs CUDA, which this machine does not have"),
])
def test_bad_input_fails_before_any_rank_starts(tmp_path, args, message):
    if "CUDA" in message:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    began = time.monotonic()
    line = one_error_line(run_rrfp(tmp_path, "run", "--stages", "2", *args, "--out", "x"))
    assert message in line
    assert time.monotonic() - began < 20
    assert not (tmp_path / "x").exists()  # nothing started, nothing written


@pytest.mark.parametrize("address, message", [
    ("not-a-host", "error: RRFP_SOCKET_ADDR: 'not-a-host': "),
    ("192.0.2.1", "error: RRFP_SOCKET_ADDR: cannot listen on 192.0.2.1 (from RRFP_SOCKET_ADDR): "),  # TEST-NET-1
])
def test_a_socket_address_this_host_cannot_listen_on_fails_before_any_rank_starts(tmp_path, monkeypatch, address,
                                                                                  message):
    monkeypatch.setenv("RRFP_SOCKET_ADDR", address)
    assert one_error_line(run_rrfp(tmp_path, "run", "--stages", "2", "--out", "x")).startswith(message)
    assert not (tmp_path / "x").exists()


def test_bad_config_file(tmp_path):
    (tmp_path / "bad.toml").write_text('stages = 2\nmicro-batches = 4\n')
    line = one_error_line(run_rrfp(tmp_path, "run", "--config", "bad.toml"))
    assert "unknown key 'micro-batches'; did you mean 'microbatches'?" in line
    (tmp_path / "worse.toml").write_text('stages = \n')
    assert "not valid TOML" in one_error_line(run_rrfp(tmp_path, "run", "--config", "worse.toml"))


@pytest.mark.parametrize("text, message", [
    ("hint = 5", "error: --hint: must be a string, got 5"),
    ('hint = ["1f1b"]', "error: --hint: must be a string, got ['1f1b']"),
    ("out = 5", "error: --out: must be a string, got 5"),
    ('memory-budget = ["2x"]', "error: --memory-budget: must be 1f1b, a multiple such as 2x, or slots"),
])
def test_config_values_of_the_wrong_type(tmp_path, text, message):
    (tmp_path / "job.toml").write_text(text + "\n")
    assert message in one_error_line(run_rrfp(tmp_path, "run", "--config", "job.toml"))
    assert not (tmp_path / "runs").exists()


def test_config_file_that_is_a_directory_and_out_that_cannot_be_made(tmp_path):
    assert one_error_line(run_rrfp(tmp_path, "run", "--config", ".")) == "error: .: is a directory, not a TOML file"
    (tmp_path / "afile").write_text("")
    line = one_error_line(run_rrfp(tmp_path, "run", "--out", "afile/run"))
    assert line == "error: --out: cannot create afile/run: Not a directory"


def test_hint_file_of_another_shape(tmp_path):
    assert run_rrfp(tmp_path, "hints", "export", "1f1b", "-p", "2", "-m", "8", "--out", "h.json").returncode == 0
    line = one_error_line(run_rrfp(tmp_path, "run", "--stages", "2", "--microbatches", "4", "--hint", "h.json"))
    assert "the file is for microbatches 8 but --microbatches 4 was asked" in line


def test_a_failing_rank_stops_everyone_and_is_named(tmp_path):
    began = time.monotonic()
    result = run_rrfp(tmp_path, "run", "--workload", "gpt", "--stages", "3", "--microbatches", "4", "--iters", "2",
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
    result = run_rrfp(tmp_path, "run", "--workload", "gpt", "--stages", "3", "--microbatches", "4", "--iters", "2",
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
