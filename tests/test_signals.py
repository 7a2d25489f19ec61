"""Ctrl-C and SIGTERM on the long-running subcommands other than `run` and `tune-hint` (tested in
test_faults.py and test_tune.py): `interrupted (SIG...)`, exit 130 / 143, no traceback, and what
finished is kept."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.helpers.cli import start_rrfp
from tests.helpers.processes import wait_for

SIGNALS = [(signal.SIGINT, 130), (signal.SIGTERM, 143)]


def _interrupt(process, signum) -> str:
    """Send ``signum`` as a terminal (SIGINT: the whole group) or a scheduler (SIGTERM: the process) would;
    the command's stderr once it ended."""
    try:
        if signum == signal.SIGINT:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
        sent = time.monotonic()
        _, stderr = process.communicate(timeout=60)
        assert time.monotonic() - sent < 30, "the command took more than 30 s to stop"
    finally:
        process.kill()
    return stderr


def _assert_interrupted(process, stderr: str, signum, code) -> None:
    assert process.returncode == code, stderr
    assert f"interrupted ({signal.Signals(signum).name})" in stderr
    assert "Traceback" not in stderr and "Fatal Python error" not in stderr and "internal error" not in stderr


@pytest.mark.parametrize("signum, code", SIGNALS)
def test_simulate_stops_cleanly(tmp_path, signum, code):
    # 128 stages x 2048 microbatches x the whole comparison: minutes, far past the signal
    process = start_rrfp(tmp_path, "simulate", "-p", "128", "-m", "2048", "--compare", "--workload", "vlm-mixed")
    time.sleep(4.0)  # imports done, simulating
    assert process.poll() is None, "the simulation ended before the signal"
    stderr = _interrupt(process, signum)
    _assert_interrupted(process, stderr, signum, code)


@pytest.mark.parametrize("signum, code", SIGNALS)
def test_bench_stops_cleanly_and_keeps_the_finished_cells(tmp_path, signum, code):
    out = tmp_path / "b"
    process = start_rrfp(tmp_path, "bench", "--out", "b", "--no-real", "--no-external", "--workloads", "uniform",
                         "--ranks", "8,128", "--seeds", "1", "--tune-seconds", "0")
    results = out / "results.json"

    def first_cell_saved():
        try:
            data = json.loads(results.read_text())
        except (OSError, ValueError):  # not written yet, or (never: atomic) half-written
            return False
        return bool(data.get("simulation", {}).get("cells"))

    wait_for(first_cell_saved, timeout=240, what="the first finished cell in results.json")
    assert process.poll() is None, "the suite ended before the signal"
    stderr = _interrupt(process, signum)
    _assert_interrupted(process, stderr, signum, code)
    data = json.loads(results.read_text())
    assert data["interrupted"] is True and data["complete"] is False
    assert data["simulation"]["cells"], "the finished cell was lost"
    assert (out / "results.md").is_file() and (out / "benchmarks_section.md").is_file()
