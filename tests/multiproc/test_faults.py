"""Every failure of `rrfp run` ends in a clear answer and keeps what finished, end to end on real ranks (3
processes, emulated workload with millisecond tasks): killed ranks, SIGINT/SIGTERM, a failure in the middle of a
run (its trace still merges), torchrun. The pieces (watchdog, status board, diagnosis, metrics log, run
directories) without processes: tests/unit/test_faults.py; stalls and a failing rank in gpt runs:
tests/multiproc/test_run.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import polars as pl
import pytest

from profiler.analysis.bubbles import BUBBLE_COLUMNS
from profiler.trace.reader import read_trace
from runtime.run.launch import free_port
from tests.helpers.cli import run_cli, run_rrfp, start_rrfp
from tests.helpers.processes import alive, metrics_lines, status, wait_for
from tests.helpers.warm import run_warm

LONG_RUN = ("run", "--workload", "emulated", "-p", "3", "-m", "6", "--forward-time", "0.004", "--iters", "400")


# -- end to end ----------------------------------------------------------------------------------------


def test_a_rank_killed_by_sigkill_is_the_root_cause_and_finished_iterations_are_kept(tmp_path):
    run = tmp_path / "k"
    process = start_rrfp(tmp_path, *LONG_RUN, "--out", "k")
    try:
        victim = wait_for(lambda: (s := status(run, 2)) and s["iteration"] is not None and s["iteration"] >= 2 and s,
                          what="rank 2 in iteration 2")
        os.kill(victim["pid"], signal.SIGKILL)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 1, stderr
    first = next(line for line in stderr.splitlines() if line.startswith("error:"))  # after the progress lines
    assert first.startswith("error: run failed: rank 2 (stage 2) was killed by SIGKILL"), stderr
    assert " iteration " in first and "of job ready-1f1b@1f1b" in first
    assert "Traceback" not in stderr
    kept = pl.read_parquet(run / "metrics.parquet")
    assert kept.height >= 2 and f"kept {kept.height} completed iterations of ready-1f1b@1f1b" in stderr
    assert kept["iteration"].to_list() == list(range(kept.height))


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupts_stop_every_rank_within_5_s_and_keep_what_finished(tmp_path, signum, code):
    run = tmp_path / "i"
    process = start_rrfp(tmp_path, *LONG_RUN, "--out", "i")
    try:
        wait_for(lambda: metrics_lines(run) >= 2, what="two finished iterations")
        ranks = [status(run, r)["pid"] for r in range(3)]
        if signum == signal.SIGINT:
            os.killpg(process.pid, signum)  # Ctrl-C: the whole foreground group, ranks included
        else:
            process.send_signal(signum)  # a scheduler's SIGTERM: the launcher only
        sent = time.monotonic()
        wait_for(lambda: not any(map(alive, ranks)), timeout=5.0, what="every rank to stop")
        assert time.monotonic() - sent < 5.0
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == code, stderr
    assert f"interrupted ({signal.Signals(signum).name})" in stderr
    assert "Traceback" not in stderr and "Fatal Python error" not in stderr
    kept = pl.read_parquet(run / "metrics.parquet")
    assert kept.height >= 2 and f"kept {kept.height} completed iterations" in stderr
    assert json.loads((run / "config.json").read_text())["iters"] == 400
    summary = run_cli(tmp_path, "trace", "summary", "i", "--json")
    assert summary.returncode == 0, summary.stderr
    # the kept iterations are in the trace too (iteration 0 left out by default), each of all 3 ranks
    traced = json.loads(summary.stdout)
    assert set(range(1, kept.height)) <= set(traced["iteration_numbers"]) and traced["ranks"] == 3


@pytest.fixture(scope="module")
def failed_at_iteration_2(tmp_path_factory):
    """A run of 4 iterations whose rank 1 fails in task 1F2 of iteration 2: the folder it ran in (the run is "f"
    there) and its result. The tests below only read what it left (one copies it first)."""
    root = tmp_path_factory.mktemp("failed")
    result = run_warm(root, "run", "--workload", "emulated", "-p", "3", "-m", "6", "--forward-time", "0.002",
                      "--iters", "4", "--fail-at", "1F2@2", "--out", "f")
    return root, result


def test_a_failure_at_iteration_2_keeps_iterations_0_and_1(failed_at_iteration_2):
    tmp_path, result = failed_at_iteration_2
    assert result.returncode == 1
    assert "rank 1 in task 1F2 (iteration 2 of job ready-1f1b@1f1b) failed" in result.stderr
    assert "kept 2 completed iterations of ready-1f1b@1f1b in f (metrics.parquet, trace.pftrace)" in result.stderr
    assert pl.read_parquet(tmp_path / "f" / "metrics.parquet")["iteration"].to_list() == [0, 1]
    assert (tmp_path / "f" / "config.json").exists() and (tmp_path / "f" / "durations.parquet").exists()
    bubbles = run_cli(tmp_path, "trace", "bubbles", "f", "--json")
    assert bubbles.returncode == 0, bubbles.stderr
    # what was kept analyses as a whole run: every rank, and each one's time all in one category or another
    rows = json.loads(bubbles.stdout)["rows"]
    assert [row["rank"] for row in rows] == ["0", "1", "2", "all"]
    for row in rows:
        assert row["busy_ns"] + sum(row[column] for column in BUBBLE_COLUMNS) == row["makespan_ns"] > 0, row


def test_crashed_run_keeps_finished_iterations_and_merges(failed_at_iteration_2, tmp_path):
    root, result = failed_at_iteration_2
    assert result.returncode == 1
    run = tmp_path / "crash"
    shutil.copytree(root / "f", run)  # the other test reads the run as it was left
    (run / "trace.pftrace").unlink(missing_ok=True)  # as a run killed before it could merge leaves it
    summary = run_cli(tmp_path, "trace", "summary", str(run), "--json")
    assert summary.returncode == 0, summary.stderr
    assert any("not merged" in w for w in json.loads(summary.stdout)["warnings"])
    merged = run_cli(tmp_path, "trace", "merge", str(run))
    assert merged.returncode == 0 and (run / "trace.pftrace").exists()
    frames = read_trace(run)
    assert sorted(frames.tasks.get_column("iteration").unique().to_list()) == [0, 1]  # the finished ones


def test_torchrun_world_size_is_checked(tmp_path):
    result = run_rrfp(tmp_path, "--nproc-per-node", "3", "--master-port", str(free_port()), "-m", "rrfp_cli", "run",
                      "--workload", "emulated", "--stages", "2", "--iters", "1", "--out", "w",
                      module=("-m", "torch.distributed.run"))
    assert result.returncode != 0
    assert ("error: --ranks: torchrun started 3 processes but 2 pipeline ranks x tp 1 x dp 1 need 2" in result.stderr)
    assert "internal error" not in result.stderr


def test_a_failure_under_torchrun_names_its_root_cause(tmp_path):
    result = run_rrfp(tmp_path, "--nproc-per-node", "3", "--master-port", str(free_port()), "-m", "rrfp_cli", "run",
                      "--workload", "emulated", "--stages", "3", "-m", "6", "--forward-time", "0.002", "--iters", "3",
                      "--fail-at", "1F2@1", "--out", "t", module=("-m", "torch.distributed.run"))
    assert result.returncode != 0
    assert "error: run failed: rank 1 in task 1F2 (iteration 1 of job ready-1f1b@1f1b) failed" in result.stderr
    assert "internal error" not in result.stderr
    assert pl.read_parquet(tmp_path / "t" / "metrics.parquet").height == 1


# -- the pieces ----------------------------------------------------------------------------------------
