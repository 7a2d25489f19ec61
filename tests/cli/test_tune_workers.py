"""tune-hint's worker processes end without a word on every exit ([Note: workers that stop quietly] in
runtime/tune/search.py): a normal end, a time budget that ends in the middle of a job, a work budget, Ctrl-C
and SIGTERM, with ``--jobs 1`` and ``--jobs 2``; no worker outlives the command. An error inside a worker:
tests/inproc/test_tune_budget.py. And the time budget of ``--target torch``, which imports torch, as a user's
fresh process does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers.cli import OnATerminal, run_rrfp, start_rrfp

MODEL = ("tune-hint", "--workload", "multimodal", "-p", "4", "-m", "8", "--jitter", "0.1", "--scenarios", "6")


def _quiet(stderr: str) -> None:
    for word in ("Traceback", "ForkPoolWorker", "Interrupted", "internal error"):
        assert word not in stderr, stderr


def _session_gone(pid: int, timeout: float = 10.0) -> bool:
    """Whether every process of the session ``pid`` led (the command and its workers) has ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("budget, stopped", [(("--time-budget", "2s"), "time budget"),
                                             (("--evaluations", "400"), "evaluations")])
def test_a_search_that_ends_on_its_budget_prints_no_traceback(tmp_path, jobs, budget, stopped):
    # Before: --jobs 2 printed 'Process ForkPoolWorker-1: Traceback ... Interrupted: SIGTERM' once per worker.
    done = run_rrfp(tmp_path, *MODEL, *budget, "--jobs", str(jobs), "--out", "t", timeout=120)
    assert done.returncode == 0, done.stderr
    _quiet(done.stderr)
    assert json.loads((tmp_path / "t" / "report.json").read_text())["search"]["stopped"] == stopped


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_keeps_the_best_found_and_ends_every_worker_quietly(tmp_path, jobs, signum, code):
    terminal = OnATerminal(tmp_path, *MODEL, "--time-budget", "600s", "--jobs", str(jobs), "--out", "cut")
    try:
        terminal.wait_for("best mean", timeout=120)  # its progress bar names the best found: the search is on
        if signum == signal.SIGINT:
            os.killpg(terminal.process.pid, signum)  # Ctrl-C at a terminal: the workers get it too
        else:
            terminal.process.send_signal(signum)  # a scheduler: the command alone
        _, stderr = terminal.communicate(timeout=60)
        assert _session_gone(terminal.process.pid), "a worker outlived the command"
    finally:
        terminal.kill()
    assert terminal.process.returncode == code, stderr
    assert f"interrupted ({signal.Signals(signum).name})" in stderr
    assert "stopped early: wrote the best found so far" in stderr
    _quiet(stderr.replace(f"interrupted ({signal.Signals(signum).name})", ""))
    report = json.loads((tmp_path / "cut" / "report.json").read_text())
    assert report["search"]["stopped"] == "interrupted" and report["search"]["jobs"] == jobs


def test_target_torch_imports_torch_inside_its_time_budget(tmp_path):
    # schedule.csv is checked by torch's lowering, and importing torch takes seconds: it used to happen after the
    # search had spent the whole budget (the outputs came 2.8 s late for 3 s here). The outputs are timed as they
    # appear (the directory is renamed into place whole), not at exit, which unloading torch makes later still.
    began = time.monotonic()
    process = start_rrfp(tmp_path, *MODEL, "--target", "torch", "--time-budget", "3s", "--out", "t")
    try:
        while not (tmp_path / "t" / "schedule.csv").exists():
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() - began < 60
            time.sleep(0.02)
        written = time.monotonic() - began
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    # The budget, or the import when that alone takes longer (4.6 s on a slow 2-core VM: nothing can keep 3 s
    # then), plus the interpreter's start-up and the files (up to 1.5 s on a loaded machine). The import after
    # the search made it budget + import: 5.8 s where importing took 2.5 s.
    importing = _import_seconds()
    assert written <= max(3.0, importing + 1.0) + 1.5, (written, importing)
    _quiet(stderr)


def _import_seconds() -> float:
    """How long a fresh interpreter takes here, now, to import what the CSV's check imports."""
    began = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch.distributed.pipelining.schedules"], check=True,
                   capture_output=True)
    return time.monotonic() - began
