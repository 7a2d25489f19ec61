"""Ctrl-C and SIGTERM on the long-running subcommands but `run` (tests/multiproc/test_faults.py signals its ranks):
`interrupted (SIG...)`, exit 130 / 143, no traceback, and what finished is kept.

Each test signals the command once it shows it is at work: a progress bar on its terminal (simulate, tune-hint:
a pseudo-terminal, as a user at a terminal sees it), or the first result it saved (bench). A signal before that
could land while the interpreter still imports, which is not what these tests are about.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.helpers.cli import OnATerminal, start_rrfp
from tests.helpers.processes import wait_for

SIGNALS = [(signal.SIGINT, 130), (signal.SIGTERM, 143)]


def _interrupt(process, signum, communicate=None) -> str:
    """Send ``signum`` as a terminal (SIGINT: the whole group) or a scheduler (SIGTERM: the process) would;
    the command's stderr once it ended (``communicate(timeout)``: how to wait for it, ``process.communicate`` by
    default)."""
    if signum == signal.SIGINT:
        os.killpg(process.pid, signum)  # Ctrl-C at the terminal: the whole foreground group
    else:
        process.send_signal(signum)
    sent = time.monotonic()
    _, stderr = (communicate or process.communicate)(timeout=60)
    assert time.monotonic() - sent < 30, "the command took more than 30 s to stop"
    return stderr


def _assert_interrupted(process, stderr: str, signum, code) -> None:
    assert process.returncode == code, stderr
    assert f"interrupted ({signal.Signals(signum).name})" in stderr
    assert "Traceback" not in stderr and "Fatal Python error" not in stderr and "internal error" not in stderr


@pytest.mark.parametrize("signum, code", SIGNALS)
def test_simulate_stops_cleanly(tmp_path, signum, code):
    # 16 stages x 2048 microbatches x the whole comparison: its bar shows after a few seconds of preparation, and
    # simulating takes about three times as long again (here), far past the signal
    terminal = OnATerminal(tmp_path, "simulate", "-p", "16", "-m", "2048", "--compare", "--workload", "vlm-mixed")
    try:
        terminal.wait_for("simulating", timeout=180)  # its progress bar: imports done, simulating
        process = terminal.process
        assert process.poll() is None, "the simulation ended before the signal"
        stderr = _interrupt(process, signum, terminal.communicate)
    finally:
        terminal.kill()
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
    try:
        stderr = _interrupt(process, signum)
    finally:
        process.kill()
    _assert_interrupted(process, stderr, signum, code)
    data = json.loads(results.read_text())
    assert data["interrupted"] is True and data["complete"] is False
    assert data["simulation"]["cells"], "the finished cell was lost"
    assert (out / "results.md").is_file() and (out / "benchmarks_section.md").is_file()


@pytest.mark.parametrize("signum, code", SIGNALS)
def test_ctrl_c_or_sigterm_keeps_the_best_found_and_writes_it(tmp_path, signum, code):
    terminal = OnATerminal(tmp_path, "tune-hint", "--workload", "multimodal", "-p", "4", "-m", "8", "--time-budget",
                           "600s", "--scenarios", "6", "--out", "cut")
    try:
        terminal.wait_for("best mean", timeout=120)  # its progress bar names the best found: well into the search
        terminal.process.send_signal(signum)
        _, stderr = terminal.communicate(timeout=120)
    finally:
        terminal.kill()
    process = terminal.process
    assert process.returncode == code, stderr
    assert "stopped early: wrote the best found so far" in stderr and "Traceback" not in stderr
    assert f"interrupted ({signal.Signals(signum).name})" in stderr
    report = json.loads((tmp_path / "cut" / "report.json").read_text())
    assert report["search"]["stopped"] == "interrupted"
    assert (tmp_path / "cut" / "job.toml").exists() and (tmp_path / "cut" / "hint.json").exists()


@pytest.mark.parametrize("local_rank, said", [(None, "interrupted (SIGTERM)\n"), ("0", "interrupted (SIGTERM)\n"),
                                              ("1", "")])
def test_under_torchrun_only_local_rank_0_says_it_was_interrupted(local_rank, said):
    """torchrun's ranks share a terminal: a rank it stops while starting (local rank 0 ended first, as on a wrong
    world size) must not print a stray 'interrupted' line; local rank 0 speaks for the node."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "LOCAL_RANK"}
    if local_rank is not None:
        env["LOCAL_RANK"] = local_rank
    code = ("from hints.errors import Interrupted\nfrom rrfp_cli.app import _exit_interrupted\n"
            "_exit_interrupted(Interrupted(15))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 143 and done.stderr == said, done
