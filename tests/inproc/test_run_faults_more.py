"""`rrfp run`'s remaining fault paths (issue 24): a failure report the disk refuses, ``logs/run.log`` on a full disk,
a checkpoint the disk refuses, a rank that fails before its process group exists. Each with an injected ENOSPC and,
where the machine lets a test mount one, on a real full disk (a small tmpfs). End to end on real ranks:
tests/multiproc/test_run_faults_more.py.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import torch

from hints.outputs import DiskError
from runtime.run.diagnose import diagnose, failure_reports
from runtime.run.health import StatusBoard, report_error, report_stall
from runtime.run.worker import RankContext
from tests.helpers.disk import full_tmpfs


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _rank(out_root: Path, rank: int = 0) -> RankContext:
    ctx = RankContext(rank, 2, rank, torch.device("cpu"), out_root,
                      status=StatusBoard(out_root / "status" / f"rank{rank}"))
    ctx.current = {"job": "ready-1f1b@1f1b", "iteration": 3, "task": "0F1"}
    ctx.status.iteration("ready-1f1b@1f1b", 3)
    return ctx


def _fill(disk: Path) -> None:
    """Take what is left of ``disk``."""
    fd = os.open(disk / "filler-rest", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 1024)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- 1. a failure report the disk refuses ([Note: a report the disk refuses] in runtime/run/health.py) -----------------


def _disk_full_error(out_root: Path) -> DiskError:
    return DiskError(f"cannot write {out_root}/metrics.jsonl: the disk is full (file system at /x, 0 B free)",
                     out_root / "metrics.jsonl")


def test_a_refused_report_leaves_no_empty_file_and_the_diagnosis_still_names_the_disk(tmp_path, monkeypatch):
    ctx = _rank(tmp_path)
    began = time.time()
    real_write_text = Path.write_text

    def full_disk(path, text, *args, **kwargs):  # as a full disk does: the file is created, its bytes refused
        real_write_text(path, "")
        _enospc()

    monkeypatch.setattr(Path, "write_text", full_disk)
    try:
        raise _disk_full_error(tmp_path)
    except DiskError as err:
        report_error(ctx, err)
    monkeypatch.undo()
    assert [p.name for p in (tmp_path / "failures").iterdir()] == []  # no empty report, no temporary file
    message = diagnose(tmp_path, {}, began, 2).splitlines()
    assert message[0] == (f"rank 0 in task 0F1 (iteration 3 of job ready-1f1b@1f1b) failed: DiskError: cannot write "
                          f"{tmp_path}/metrics.jsonl: the disk is full (file system at /x, 0 B free)")
    [kept] = failure_reports(tmp_path, began)
    assert kept["report_refused"].startswith(f"cannot write {tmp_path}/failures/rank0-error.json: the disk is full")
    assert StatusBoard.read(tmp_path / "status" / "rank0")["task"] is None  # the live status is untouched
    assert StatusBoard.read(tmp_path / "status" / "rank0")["iteration"] == 3


def test_a_report_refused_by_a_real_full_disk_is_kept_in_the_status_file(tmp_path):
    with full_tmpfs(tmp_path / "disk", free_kib=16) as disk:
        ctx = _rank(disk)  # its status file allocated while there was room
        _fill(disk)
        began = time.time()
        try:
            raise ValueError("a cause that is not the disk")
        except ValueError as err:
            report_error(ctx, err)
        assert not (disk / "failures").exists() or not any((disk / "failures").iterdir())
        message = diagnose(disk, {}, began, 2)
    assert message.startswith("rank 0 in task 0F1 (iteration 3 of job ready-1f1b@1f1b) failed: ValueError: a cause "
                              "that is not the disk"), message


def test_a_stall_report_the_disk_refuses_is_kept_and_withdrawn_there(tmp_path, monkeypatch):
    from runtime.run.health import withdraw_stall

    ctx = _rank(tmp_path, rank=1)
    began = time.time()
    monkeypatch.setattr(Path, "write_text", _enospc)
    assert report_stall(ctx, 12.5) is True  # no OSError out of the watchdog's thread; stuck inside a task
    monkeypatch.undo()
    [kept] = failure_reports(tmp_path, began)
    assert kept["kind"] == "stall" and kept["seconds_without_progress"] == 12.5 and kept["task"] == "0F1"
    withdraw_stall(ctx)  # progress resumed
    assert failure_reports(tmp_path, began) == []
