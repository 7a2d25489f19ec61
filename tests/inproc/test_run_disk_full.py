"""`rrfp run` on a disk that refuses its outputs ([Note: a full disk under rrfp run] in rrfp_cli/cmd_run.py): one
line naming the disk, what was kept, exit 1, no traceback, no finished iteration lost. Each piece with an injected
ENOSPC, and on a real full disk (a small tmpfs: skipped where mounting one is not permitted). End to end on real
ranks: tests/multiproc/test_run_disk_full.py.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hints.outputs import DiskError
from hints.tasks import Task
from profiler.trace.recorder import TraceRecorder
from profiler.trace.schema import complete_packets
from runtime.config import RunConfig
from runtime.exec.recording import RecorderSetup, TaskSpan
from runtime.run.health import StatusBoard
from runtime.run.metrics import MetricsLog, logged_rows, salvage_metrics
from tests.helpers.cli import REPO, child_env, run_cli
from tests.helpers.disk import full_tmpfs, take_the_rest

ROW = {"iteration": 0, "loss": 1.0, "wall_seconds": 0.1, "makespan_seconds": 0.1, "throughput": 1.0,
       "unit": "samples/s", "busy_seconds": [0.1, 0.1], "idle_fraction": [0.0, 0.0], "peak_in_flight": [1, 1]}


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


# -- status files: ENOSPC when created, not a SIGBUS at the first store ----------------------------------------------


def test_a_status_file_on_a_full_disk_is_a_disk_error_at_creation(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "posix_fallocate", _enospc)
    with pytest.raises(DiskError, match=r"cannot write .*status/rank0: the disk is full \(file system at "):
        StatusBoard(tmp_path / "status" / "rank0")


def test_a_status_file_on_a_real_full_disk_is_no_sigbus(tmp_path):
    with full_tmpfs(tmp_path / "disk", free_kib=0) as disk:
        # a process of its own: before the fix the first store into the map was a SIGBUS, fatal to pytest too
        code = ("import sys; from pathlib import Path; from runtime.run.health import StatusBoard\n"
                "try:\n    StatusBoard(Path(sys.argv[1]))\nexcept Exception as err:\n"
                "    print(type(err).__name__, err); sys.exit(3)\n")
        done = subprocess.run([sys.executable, "-c", code, str(disk / "status" / "rank0")], cwd=REPO,
                              env=child_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, (done.returncode, done.stderr[-2000:])
    assert done.stdout.startswith("DiskError cannot write") and "the disk is full" in done.stdout


# -- metrics.jsonl: every row appended stays; a refused one is a DiskError ---------------------------------------------


def test_a_refused_metrics_row_is_a_disk_error_and_the_rows_before_stay(tmp_path):
    log = MetricsLog(tmp_path)
    for iteration in range(3):
        log.append({**ROW, "iteration": iteration})
    log.handle.write = _enospc  # the disk fills before iteration 3's row
    with pytest.raises(DiskError, match=r"cannot write .*metrics\.jsonl: the disk is full"):
        log.append({**ROW, "iteration": 3})
    assert [row["iteration"] for row in logged_rows(tmp_path)] == [0, 1, 2]


def test_on_a_real_full_disk_metrics_jsonl_keeps_every_row_appended(tmp_path):
    with full_tmpfs(tmp_path / "disk", free_kib=8) as disk:
        log = MetricsLog(disk)
        appended = 0
        with pytest.raises(DiskError, match="the disk is full"):
            for iteration in range(10_000):
                log.append({**ROW, "iteration": iteration, "note": "x" * 200})
                appended += 1
        assert appended > 0 and [row["iteration"] for row in logged_rows(disk)] == list(range(appended))
        # no room for metrics.parquet either: the log stays as it is, nothing half-written beside it
        with pytest.raises(DiskError):
            salvage_metrics(disk)
        assert len(logged_rows(disk)) == appended and not (disk / "metrics.parquet").exists()
        assert sorted(p.name for p in disk.iterdir()) == ["filler", "metrics.jsonl"]


# -- the trace writer: one DiskError at the next iteration, no message per iteration, whole iterations on disk --------


def _recorder(out_dir: Path) -> TraceRecorder:
    config = RunConfig(workload="emulated", ranks=2, microbatches=2)
    return TraceRecorder(RecorderSetup(0, 2, str(out_dir), "job", config, torch.device("cpu"), 0, 0, None))


def _iteration(recorder: TraceRecorder, iteration: int, tasks: int = 4) -> None:
    start = (iteration + 1) * 10**9
    recorder.begin_iteration(iteration, start, (Task.parse("0F0"),))
    for n in range(tasks):
        recorder.task_finished(TaskSpan(iteration, Task.parse(f"0F{n % 2}"), start + n * 1000, start + n * 1000 + 500,
                                        0, {"units": 1}))
    recorder.end_iteration(iteration, start + tasks * 1000, [])


def test_a_refused_trace_stops_the_rank_at_its_next_iteration_without_a_message_each(tmp_path, capsys):
    recorder = _recorder(tmp_path)
    _iteration(recorder, 0)
    recorder._writer.write_iteration = _enospc  # from iteration 1 on, the disk is full
    _iteration(recorder, 1)
    recorder._thread.join(timeout=0.5)  # let the writer meet it (it is still running: no sentinel yet)
    with pytest.raises(DiskError, match=r"cannot write .*trace/rank0\.pftrace: the disk is full"):
        for iteration in range(2, 50):
            _iteration(recorder, iteration)
    recorder.close()  # raised once already: closing does not raise it again
    assert "trace write failed" not in capsys.readouterr().err


def test_a_trace_refused_by_a_real_full_disk_ends_with_whole_iterations(tmp_path, capsys):
    with full_tmpfs(tmp_path / "disk", free_kib=12) as disk:
        recorder = _recorder(disk)
        with pytest.raises(DiskError, match="the disk is full"):
            for iteration in range(10_000):
                _iteration(recorder, iteration, tasks=40)
                recorder._thread.join(timeout=0.01)
        recorder.close()
        data = (disk / "trace" / "rank0.pftrace").read_bytes()
    length, count, stopped = complete_packets(data)
    assert count > 0 and length == len(data) and stopped is None, "a packet was cut short"
    assert "Traceback" not in capsys.readouterr().err


# -- rrfp run: one line naming the disk, what was kept, exit 1 ------------------------------------------------------------


def _failing_launch(monkeypatch, before_failing):
    """``rrfp run``'s launch, replaced: ``before_failing(out_root)`` leaves what ranks would have, then the run
    fails as the ranks of a full disk make it fail (their reports lost)."""
    import runtime.run.launch as launch

    def launched(jobs, options, nproc, checked=False):
        before_failing(Path(options.out_root))
        raise launch.RunFailed("rank 0 (stage 0) exited with code 1 without a report")

    monkeypatch.setattr(launch, "launch", launched)


def _three_iterations(out: Path) -> None:
    (out / "metrics.jsonl").write_text("".join(json.dumps({**ROW, "iteration": i}) + "\n" for i in range(3))
                                       + '{"iteration": 3, "lo')  # the row the disk cut short


def test_a_run_whose_metrics_parquet_is_refused_names_the_disk_and_keeps_the_log(tmp_path, monkeypatch):
    import runtime.run.metrics as metrics

    def refused(path, write):
        raise DiskError(f"cannot write {path}: the disk is full (file system at /, 0 B free)", path)

    monkeypatch.setattr(metrics, "write_whole", refused)
    _failing_launch(monkeypatch, _three_iterations)
    result = run_cli(tmp_path, "run", "--workload", "emulated", "--iters", "10", "--no-trace", "--out", "r")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "rrfp run -> r",  # no terminal: the run directory first (runtime/run/progress.py)
        "error: run failed: cannot write r/metrics.parquet: the disk is full (file system at /, 0 B free)",
        "kept 3 completed iterations of ready-1f1b@1f1b in r (metrics.jsonl)"]
    assert len(logged_rows(tmp_path / "r")) == 3


def test_a_run_on_a_real_full_disk_names_it_even_with_nothing_to_keep(tmp_path, monkeypatch):
    with full_tmpfs(tmp_path / "disk", free_kib=64) as disk:
        def fill(out: Path) -> None:  # the ranks filled the disk before their first iteration
            take_the_rest(out, "filler")

        _failing_launch(monkeypatch, fill)
        result = run_cli(tmp_path, "run", "--workload", "emulated", "--iters", "10", "--out", str(disk / "r"))
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [
        f"rrfp run -> {disk / 'r'}",
        f"error: run failed: cannot write {disk / 'r'}: the disk is full (file system at {disk}, 0 B free)"]
