"""`rrfp run` without a terminal (CI logs, batch jobs) says where it writes at once and prints a line per
iteration as it goes, flushed; in --json mode nothing but the JSON (runtime/run/progress.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

from tests.helpers.cli import run_rrfp, start_rrfp

LONG_RUN = ("run", "--workload", "emulated", "-p", "3", "-m", "6", "--forward-time", "0.004", "--iters", "400")
ITERATION = re.compile(r"ready-1f1b@1f1b: iteration (\d+)  step [0-9.]+ ms  loss [0-9.]+  [0-9,]+ samples/s")


def test_a_run_into_a_pipe_prints_its_directory_and_a_line_per_iteration_as_it_goes(tmp_path):
    process = start_rrfp(tmp_path, *LONG_RUN, "--out", "i")  # stderr: a pipe
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 180
        while sum(bool(ITERATION.fullmatch(line.rstrip("\n"))) for line in lines) < 3:
            assert process.poll() is None, f"the run ended first: {''.join(lines)}"
            assert time.monotonic() < deadline, f"no three iteration lines within 180 s: {''.join(lines)}"
            time.sleep(0.05)
        assert process.poll() is None  # seen while it runs: flushed as each iteration ends, not at the end
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=60)
    finally:
        process.kill()
    reader.join(timeout=10)
    assert lines[:2] == ["rrfp run -> i\n", "ready-1f1b@1f1b: 400 iterations -> i\n"], lines[:3]
    numbers = [int(m.group(1)) for line in lines if (m := ITERATION.fullmatch(line.rstrip("\n")))]
    assert numbers == list(range(len(numbers))) and len(numbers) >= 3


def test_json_mode_prints_only_the_json(tmp_path):
    done = run_rrfp(tmp_path, "run", "--workload", "emulated", "-p", "2", "-m", "4", "--forward-time", "0.002",
                    "--iters", "2", "--out", "j", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["jobs"][0]["iterations"] == 2
    assert "iteration" not in done.stderr and "rrfp run ->" not in done.stderr
