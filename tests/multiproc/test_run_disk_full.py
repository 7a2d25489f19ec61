"""`rrfp run` on a disk that fills up as it runs, end to end on real ranks (a small tmpfs; skipped where mounting
one is not permitted): one line naming the disk, what was kept, exit 1, no traceback, no finished iteration lost
([Note: a full disk under rrfp run] in rrfp_cli/cmd_run.py; the pieces: tests/inproc/test_run_disk_full.py)."""

from __future__ import annotations

import re

import polars as pl

from runtime.run.metrics import logged_rows
from tests.helpers.cli import run_rrfp
from tests.helpers.disk import full_tmpfs


def test_a_disk_that_fills_up_ends_the_run_with_one_line_naming_it(tmp_path):
    with full_tmpfs(tmp_path / "disk", free_kib=76) as disk:
        done = run_rrfp(tmp_path, "run", "--workload", "emulated", "-p", "3", "-m", "6", "--forward-time", "0.004",
                        "--iters", "200", "--out", str(disk / "r"), timeout=240)
        run = disk / "r"
        lines = [line for line in done.stderr.splitlines() if not line.startswith("ready-1f1b@1f1b: ")]
        assert done.returncode == 1, done.stderr
        assert lines[0] == f"rrfp run -> {run}", done.stderr  # then a progress line per iteration, left out here
        assert re.fullmatch(rf"error: run failed: cannot write {re.escape(str(run))}\S*: the disk is full "
                            rf"\(file system at {re.escape(str(disk))}, [0-9.]+ \S+ free\)", lines[1]), done.stderr
        for noise in ("Traceback", "trace write failed", "internal error", "Fatal Python error", "SIGBUS"):
            assert noise not in done.stderr
        kept = re.fullmatch(rf"kept (\d+) completed iterations? of ready-1f1b@1f1b in {re.escape(str(run))} "
                            rf"\((metrics\.jsonl|metrics\.parquet)(, .*)?\)", lines[2])
        assert kept and len(lines) == 3, done.stderr
        rows = (logged_rows(run) if kept.group(2) == "metrics.jsonl"
                else pl.read_parquet(run / "metrics.parquet").to_dicts())
        assert len(rows) == int(kept.group(1)) >= 1
        assert [row["iteration"] for row in rows] == list(range(len(rows)))  # every finished iteration, in order
        assert not [p for p in run.rglob("*.tmp")], "a half-written output was left"
