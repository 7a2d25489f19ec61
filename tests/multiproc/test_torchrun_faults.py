"""Faults of `rrfp run` under torchrun, end to end: a rank killed outright is named as the root cause (rank, stage,
task, iteration) although torchrun's agent, not rrfp, holds the exit codes, and every finished iteration is kept.
The pieces without processes: tests/unit/test_diagnose_torchrun.py; the same faults under rrfp's own launcher:
tests/multiproc/test_faults.py.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from runtime.run.launch import free_port
from tests.helpers.cli import child_env
from tests.helpers.processes import alive, status, wait_for

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch.distributed.run") is None,
                                reason="torchrun (torch.distributed.run) is not available")

RANKS = 3
LONG_RUN = ("run", "--workload", "emulated", "-p", str(RANKS), "-m", "6", "--forward-time", "0.004", "--iters", "400")


def start_torchrun(cwd, *args: str) -> subprocess.Popen:
    """``torchrun --nproc-per-node 3 -m rrfp_cli ARGS`` in a session of its own."""
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(RANKS),
                             "--master-port", str(free_port()), "--monitor-interval", "0.1", "-m", "rrfp_cli", *args],
                            cwd=cwd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def stop_everything(process: subprocess.Popen, run) -> None:
    """Never leave torchrun or a rank behind (the agent starts each rank in a session of its own)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    for rank in range(RANKS):
        if (s := status(run, rank)) and alive(s["pid"]):
            os.kill(s["pid"], signal.SIGKILL)


@pytest.mark.parametrize("victim", [0, 1, 2])
def test_a_rank_killed_under_torchrun_is_the_root_cause_and_finished_iterations_are_kept(tmp_path, victim):
    run = tmp_path / "k"
    process = start_torchrun(tmp_path, *LONG_RUN, "--out", "k")
    try:
        killed = wait_for(lambda: (s := status(run, victim)) and s["iteration"] is not None and s["iteration"] >= 2
                          and s, timeout=120, what=f"rank {victim} in iteration 2")
        named = [Path(f"/proc/{status(run, rank)['pid']}/comm").read_text() for rank in range(RANKS)]
        os.kill(killed["pid"], signal.SIGKILL)
        _, stderr = process.communicate(timeout=90)
    finally:
        stop_everything(process, run)
    assert process.returncode != 0, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr  # rank 0 reports, or rank 1 when rank 0 died; the others write to logs/
    cause = re.fullmatch(rf"error: run failed: rank {victim} \(stage {victim}\) died without a report "
                         rf"((during|after) {victim}[FB]\d+,|in) iteration (\d+) of job ready-1f1b@1f1b "
                         r"\(killed or crashed; torchrun's summary gives its exit code\)", errors[0])
    assert cause and int(cause.group(3)) >= 2, stderr
    kept = pl.read_parquet(run / "metrics.parquet")
    assert kept.height >= 2 and f"kept {kept.height} completed iterations of ready-1f1b@1f1b" in stderr
    assert kept["iteration"].to_list() == list(range(kept.height))
    assert "internal error" not in stderr and "interrupted" not in stderr
    assert named == [f"rrfp rank {rank}\n" for rank in range(RANKS)]  # what ps -e and top show


def test_a_wrong_world_size_is_one_error_line(tmp_path):
    """Every rank finds the mismatch; local rank 0 says it, the others exit with the same code quietly. torchrun's
    own summary of the failed ranks (its ChildFailedError traceback) follows, which rrfp cannot turn off."""
    process = start_torchrun(tmp_path, "run", "--workload", "emulated", "--stages", "2", "--iters", "1", "--out", "w")
    try:
        _, stderr = process.communicate(timeout=120)
    finally:
        stop_everything(process, tmp_path / "w")
    assert process.returncode != 0
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert errors == ["error: --ranks: torchrun started 3 processes but 2 pipeline ranks x tp 1 x dp 1 need 2; use "
                      "--nproc-per-node (x nodes) = 2"], stderr
    assert "interrupted" not in stderr and "Traceback" not in stderr.split("error: ")[0]
    assert not (tmp_path / "w").exists()  # nothing written


def test_a_process_the_rank_forks_does_not_keep_its_status_lock(tmp_path):
    """A data loader's forked workers outlive their rank by seconds: they must not hold its lock meanwhile."""
    from runtime.run.health import StatusBoard

    path = tmp_path / "status" / "rank0"
    board = StatusBoard(path)
    child = os.fork()
    if child == 0:  # the forked worker: lives on after its rank
        time.sleep(30)
        os._exit(0)
    try:
        board.close()  # the rank ends
        wait_for(lambda: StatusBoard.ended(path), timeout=5, what="the lock to go with the rank")  # the child runs
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
