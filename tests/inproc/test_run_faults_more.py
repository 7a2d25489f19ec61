"""`rrfp run`'s remaining fault paths (issue 24): a failure report the disk refuses, ``logs/run.log`` on a full disk,
a checkpoint the disk refuses, a rank that fails before its process group exists. Each with an injected ENOSPC and,
where the machine lets a test mount one, on a real full disk (a small tmpfs). End to end on real ranks:
tests/multiproc/test_run_faults_more.py.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hints.outputs import DiskError
from runtime.run.diagnose import diagnose, failure_reports
from runtime.run.health import StatusBoard, report_error, report_stall
from runtime.run.worker import RankContext
from tests.helpers.cli import REPO, child_env
from tests.helpers.disk import full_tmpfs, take_the_rest


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _rank(out_root: Path, rank: int = 0) -> RankContext:
    ctx = RankContext(rank, 2, rank, torch.device("cpu"), out_root,
                      status=StatusBoard(out_root / "status" / f"rank{rank}"))
    ctx.current = {"job": "ready-1f1b@1f1b", "iteration": 3, "task": "0F1"}
    ctx.status.iteration("ready-1f1b@1f1b", 3)
    return ctx


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
        take_the_rest(disk)
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


# -- 2. logs/ on a full disk ([Note: logs on a full disk] in runtime/run/worker.py) ----------------------------


def _links_rank(out_root: Path) -> RankContext:
    from runtime.comm.grid import ProcessGrid
    from runtime.config import RunConfig

    ctx = RankContext(0, 2, 0, torch.device("cpu"), out_root)
    ctx.grid = ProcessGrid.of(RunConfig(workload="emulated", ranks=2), 0)
    return ctx


def test_a_refused_run_log_line_is_a_disk_error_naming_the_log(tmp_path, monkeypatch):
    from runtime.run.worker import _log_links

    monkeypatch.setattr(os, "write", _enospc)
    with pytest.raises(DiskError, match=rf"cannot write {tmp_path}/logs/run\.log: the disk is full \(file system at "):
        _log_links(_links_rank(tmp_path), "gloo", {(0, 1)})


def test_a_run_log_line_cut_short_by_the_disk_is_a_disk_error(tmp_path, monkeypatch):
    from runtime.run.worker import _log_links

    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, data[:10]))  # room for 10 bytes
    with pytest.raises(DiskError, match=r"logs/run\.log: the disk is full"):
        _log_links(_links_rank(tmp_path), "gloo", {(0, 1)})


def test_a_rank_printing_into_a_real_full_disk_goes_on(tmp_path):
    with full_tmpfs(tmp_path / "disk", free_kib=4) as disk:
        # a process of its own, as a rank: its stdout and stderr become its log file, which takes the last 4 KiB
        code = ("import sys; from pathlib import Path; from runtime.run.worker import _redirect_output\n"
                "_redirect_output(1, Path(sys.argv[1]))\n"
                "for i in range(20000):\n    print('a line the disk refuses', i)\n"
                "print('and a warning', file=sys.stderr); sys.stderr.flush()\n"
                "Path(sys.argv[2]).write_text('went on')\n")
        done = subprocess.run([sys.executable, "-c", code, str(disk), str(tmp_path / "went-on")], cwd=REPO,
                              env=child_env(), timeout=60)
        log = (disk / "logs" / "rank1.log").read_text()
    assert done.returncode == 0 and (tmp_path / "went-on").read_text() == "went on", log[-2000:]
    assert log.startswith("a line the disk refuses 0\n") and "Traceback" not in log


def test_a_run_log_line_refused_by_a_real_full_disk_is_a_disk_error(tmp_path):
    from runtime.run.worker import _log_links

    with full_tmpfs(tmp_path / "disk", free_kib=0) as disk:
        with pytest.raises(DiskError, match=rf"cannot write {disk}/logs/run\.log: the disk is full \(file system at "
                                            rf"{disk}, 0 B free\)"):
            _log_links(_links_rank(disk), "gloo", {(0, 1)})


# -- 3. a checkpoint the disk refuses ([Note: a checkpoint the disk refuses] in runtime/run/checkpoint.py) -------------


@pytest.fixture
def one_rank_group():
    """A process group of this process alone (gloo): what a checkpoint's collective save runs on."""
    import torch.distributed as dist

    from runtime.run.launch import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _checkpointer(job_dir: Path, width: int = 32):
    import random

    from runtime.run.checkpoint import RankCheckpointer

    model = torch.nn.Linear(width, 256)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    return RankCheckpointer(job_dir, 0, {0: model}, optimizer, {"noise": random.Random(0)})



def _config():
    from runtime.config import RunConfig

    return RunConfig(workload="emulated", ranks=1)


def test_a_checkpoint_the_disk_refuses_is_a_disk_error_and_the_last_one_stays(tmp_path, monkeypatch, one_rank_group):
    from torch.distributed.checkpoint.filesystem import FileSystem

    from runtime.run.checkpoint import latest, read_manifest

    checkpointer = _checkpointer(tmp_path)
    checkpointer.save(2, _config())
    real_stream = FileSystem.create_stream

    def full_disk(self, path, mode):  # the rank's data file: its first bytes are refused
        stream = real_stream(self, path, mode)
        if not str(path).endswith(".distcp"):
            return stream
        import contextlib

        @contextlib.contextmanager
        def refusing():
            with stream as opened:
                class Refusing:
                    def write(self, data):
                        _enospc()

                    def __getattr__(self, name):
                        return getattr(opened, name)

                yield Refusing()

        return refusing()

    monkeypatch.setattr(FileSystem, "create_stream", full_disk)
    with pytest.raises(DiskError, match=rf"cannot write {tmp_path}/checkpoints/\.tmp-step-00000004/__0_0\.distcp: "
                                        r"the disk is full \(file system at "):
        checkpointer.save(4, _config())
    monkeypatch.undo()
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000002"]  # no partial directory
    assert latest(tmp_path).name == "step-00000002" and read_manifest(latest(tmp_path))["step"] == 2


def test_a_checkpoint_manifest_the_disk_refuses_is_a_disk_error(tmp_path, monkeypatch, one_rank_group):
    from runtime.run.checkpoint import latest

    checkpointer = _checkpointer(tmp_path)
    checkpointer.save(2, _config())
    real_write_text = Path.write_text

    def full_disk(path, text, *args, **kwargs):
        if "rrfp-checkpoint.json" not in path.name:
            return real_write_text(path, text, *args, **kwargs)
        real_write_text(path, "")  # created, its bytes refused
        _enospc()

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(DiskError, match=r"\.tmp-step-00000004/rrfp-checkpoint\.json: the disk is full"):
        checkpointer.save(4, _config())
    monkeypatch.undo()
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000002"]
    assert latest(tmp_path).name == "step-00000002"


def test_a_checkpoint_on_a_real_full_disk_names_it_and_keeps_the_last_one(tmp_path, one_rank_group):
    from runtime.run.checkpoint import latest

    with full_tmpfs(tmp_path / "disk", free_kib=256, size_kib=256) as disk:
        checkpointer = _checkpointer(disk)
        checkpointer.save(2, _config())  # about 170 KiB: no room for a second one beside it
        with pytest.raises(DiskError, match=rf"cannot write {disk}/checkpoints/\.tmp-step-00000004/__0_0\.distcp: "
                                            rf"the disk is full \(file system at {disk}, 0 B free\)"):
            checkpointer.save(4, _config())
        assert [p.name for p in (disk / "checkpoints").iterdir()] == ["step-00000002"]
        assert latest(disk).name == "step-00000002"


def test_a_checkpoint_that_fails_otherwise_names_the_rank_and_leaves_no_partial(tmp_path, monkeypatch, one_rank_group):
    from torch.distributed.checkpoint.filesystem import FileSystem

    from hints.errors import Failure

    checkpointer = _checkpointer(tmp_path)

    def broken(self, path, mode):
        raise ValueError("the storage said no")

    monkeypatch.setattr(FileSystem, "create_stream", broken)
    with pytest.raises(Failure, match=r"^checkpoint step-00000002 was not written: rank 0: ValueError: the storage "
                                      r"said no$") as raised:
        checkpointer.save(2, _config())
    assert not isinstance(raised.value, DiskError)
    assert list((tmp_path / "checkpoints").iterdir()) == []


# -- 4. a rank's bootstrap waits where signals land ([Note: bootstrap waits where signals land] in worker.py) -------


def test_a_signal_ends_a_bootstrap_wait_that_blocks_in_cpp_at_once():
    import signal
    import threading
    from datetime import timedelta

    import torch.distributed as dist

    from runtime.run.launch import free_port
    from runtime.run.worker import _while_signals_are_handled

    # a store wait for a peer that never comes: C++, GIL released, as init_process_group waits for a dead rank
    store = dist.TCPStore("127.0.0.1", free_port(), 1, is_master=True, timeout=timedelta(seconds=4),
                          wait_for_workers=False)

    class Stopped(Exception):
        pass

    def stop(signum, frame):
        raise Stopped

    previous = signal.signal(signal.SIGUSR1, stop)
    try:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1)).start()  # the agent's SIGTERM, in effect
        began = time.monotonic()
        with pytest.raises(Stopped):
            _while_signals_are_handled(lambda: store.get("a peer's address"))
        assert time.monotonic() - began < 2.0  # called directly, the handler would run after the store's 4 s
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_bootstrap_error_is_raised_in_the_waiting_thread():
    from runtime.run.worker import _while_signals_are_handled

    def fails():
        raise ValueError("no such address")

    assert _while_signals_are_handled(lambda: 7) == 7
    with pytest.raises(ValueError, match="no such address"):
        _while_signals_are_handled(fails)
