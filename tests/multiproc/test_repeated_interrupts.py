"""A repeated interrupt of `rrfp run` keeps what one interrupt keeps ([Note: one interrupt, one shutdown] in
runtime/run/launch.py): a second Ctrl-C, a burst of them, or SIGTERM after Ctrl-C, at any point of the shutdown,
end in exit 130 with metrics.parquet, the merged trace and the "kept ..." line (one interrupt:
tests/multiproc/test_faults.py; the handlers alone: tests/inproc/test_run_interrupts.py)."""

from __future__ import annotations

import os
import signal
import time

import polars as pl
import pytest

from tests.helpers.cli import start_rrfp
from tests.helpers.processes import metrics_lines, wait_for

LONG_RUN = ("run", "--workload", "emulated", "-p", "3", "-m", "6", "--forward-time", "0.004", "--iters", "400")

# (signal, seconds after the one before): Ctrl-C goes to the whole foreground group (ranks included), SIGTERM
# to the launcher only. The two Ctrl-C 0.5 s apart (before the fix: killed by the second SIGINT as it
# exited), and a burst that lands while the launcher turns metrics.jsonl into metrics.parquet (before: no
# metrics.parquet, no merged trace, no "kept" line).
SEQUENCES = {
    "two-ctrl-c-0.5s-apart": [(signal.SIGINT, 0.0), (signal.SIGINT, 0.5)],
    "ctrl-c-burst-and-sigterm": [(signal.SIGINT, 0.0), (signal.SIGINT, 0.1), (signal.SIGTERM, 0.1),
                                 (signal.SIGINT, 0.1), (signal.SIGINT, 0.3), (signal.SIGINT, 0.5)],
}


@pytest.mark.parametrize("sequence", SEQUENCES.values(), ids=SEQUENCES.keys())
def test_a_repeated_interrupt_keeps_what_one_keeps(tmp_path, sequence):
    run = tmp_path / "i"
    process = start_rrfp(tmp_path, *LONG_RUN, "--out", "i")
    try:
        wait_for(lambda: metrics_lines(run) >= 2, what="two finished iterations")
        for signum, after in sequence:
            time.sleep(after)
            if process.poll() is not None:
                break
            if signum == signal.SIGINT:
                os.killpg(process.pid, signum)
            else:
                process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "interrupted (SIGINT)", stderr
    assert "Traceback" not in stderr and "internal error" not in stderr
    assert (run / "metrics.parquet").is_file(), f"{sorted(p.name for p in run.iterdir())}\n{stderr}"
    kept = pl.read_parquet(run / "metrics.parquet")
    assert kept.height >= 2 and kept["iteration"].to_list() == list(range(kept.height))
    assert f"kept {kept.height} completed iterations of ready-1f1b@1f1b in i (metrics.parquet, trace.pftrace)" \
        in stderr
    assert (run / "trace.pftrace").stat().st_size > 0
    assert not (run / "metrics.jsonl").exists()
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")], "a half-written output was left"
