"""A rank's health: where it is, whether it progresses, and the reports it leaves when it fails.

* :class:`StatusBoard`: where the rank is (job, iteration, task) in ``status/rank<r>``, a small
  memory-mapped file that outlives the process, so the launcher can say where a rank killed outright was.
* :class:`TrackingRecorder`: the recorder wrapper that keeps the status board, the current task and the
  last decisions up to date from the executor's own recorder calls.
* :class:`Watchdog`: a rank whose iteration makes no progress for ``timeout`` seconds writes
  ``failures/rank<r>-stall.json`` (:func:`report_stall`: ready set, inputs it still waits for, last
  decisions) and exits with :data:`STALL_EXIT_CODE`, unless progress resumes first, which withdraws the
  report.
* :func:`report_error`: a rank that raises (or is interrupted) writes ``failures/rank<r>-error.json``.
  Reports are written whole or not at all (:mod:`hints.outputs`); one the disk refuses is kept in the
  rank's status file instead ([Note: a report the disk refuses]).
* :func:`step_allowed` and :class:`NonFiniteLoss`: [Note: non-finite losses].

:mod:`runtime.run.diagnose` reads these files and names the root cause of a failed run.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import threading
import time
import traceback
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hints.outputs import allocate, write_error, write_text

if TYPE_CHECKING:
    from runtime.run.worker import RankContext

STALL_EXIT_CODE = 75


class TrackingRecorder:
    """Recorder wrapper that also keeps what a fault report needs (current task, recent decisions) and the
    rank's status board."""

    def __init__(self, inner, ctx: RankContext) -> None:
        self.inner, self.ctx = inner, ctx

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def decision(self, iteration, decision, wait_ns):
        self.ctx.recent.append(f"it{iteration} t={decision.time:.6f} ran {decision.chosen}"
                               + (f" (skipped {decision.head})" if decision.head else "")
                               + f" ready={[str(t) for t, _ in decision.ready][:8]}")
        self.inner.decision(iteration, decision, wait_ns)

    def task_started(self, iteration, task, now_ns):
        self.ctx.current["task"] = text = str(task)
        self.ctx.status.running(text)
        self.inner.task_started(iteration, task, now_ns)

    def task_finished(self, span):
        self.ctx.current.pop("task", None)
        self.ctx.status.idle()
        self.inner.task_finished(span)


class Watchdog:
    """Reports a stall when nothing progressed for ``timeout`` seconds of an iteration, then ends the process.

    Armed only while an iteration runs (:meth:`arm` / :meth:`disarm`), so
    per-job set-up on a loaded machine is never taken for a stall. Every
    stalled rank writes its report at the same moment; a rank stuck *inside*
    a task (the likely root cause) exits one second later, an idle rank
    (waiting on others) only after a further grace period, so the root cause
    exits first and the others' reports are already on disk when the
    launcher stops them. If progress resumes before the exit, the report is
    withdrawn, so a later failure is never blamed on a stale stall.
    """

    def __init__(self, timeout: float, report, withdraw) -> None:
        self.timeout, self.report = timeout, report  # report(seconds) -> True if stuck inside a task
        self.withdraw = withdraw  # () -> None: delete the report
        self.last = time.monotonic()
        self.armed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rrfp-watchdog", daemon=True)

    def start(self) -> None:
        self.last = time.monotonic()
        self._thread.start()

    def arm(self) -> None:
        self.last = time.monotonic()
        self.armed = True

    def disarm(self) -> None:
        self.armed = False

    def progress(self) -> None:
        self.last = time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        exit_at = None
        while not self._stop.wait(min(0.5, self.timeout / 4)):
            exit_at = self.check(time.monotonic(), exit_at)

    def check(self, now: float, exit_at: float | None) -> float | None:
        """One look at the clock; returns when to exit (None: no stall pending)."""
        silent = now - self.last
        if not self.armed or silent <= self.timeout:
            if exit_at is not None:  # progress resumed after a report
                self.withdraw()
            return None
        if exit_at is None:
            in_task = self.report(silent)
            return now + (1.0 if in_task else max(2.0, self.timeout / 2))
        if now >= exit_at:
            os._exit(STALL_EXIT_CODE)
        return exit_at


class StatusBoard:
    """Where a rank is (job, iteration, task, running or not), in a small memory-mapped file.

    A rank killed outright (SIGKILL, the OOM killer) writes no report, but the
    pages of a shared file mapping outlive the process, so the launcher can
    still say "killed during 2B5, iteration 3". Updating it is a store into
    memory, no system call: the first byte is the state (``R`` running,
    ``I`` between tasks, ``F`` finished, ``S`` before the first iteration),
    then ``pid<TAB>job<TAB>iteration<TAB>task``.

    [Note: a rank's life is a lock on its status file]
        The writer holds an exclusive ``flock`` on the file for as long as its
        process lives; the kernel drops it when the process ends, however it
        ends (SIGKILL, the OOM killer, a crash). :meth:`ended` asks for a
        shared lock without waiting: granted means the rank's process is gone.
        That is how a rank under ``torchrun``, which sees no exit codes (the
        agent, not the launcher, is every rank's parent), tells a neighbour
        that was killed from one that is still writing its report
        (:func:`runtime.run.diagnose.ended_without_report`). It needs no pid
        or host, so it holds wherever the run directory is shared. The lock
        is taken on a descriptor of its own (the mapping keeps a duplicate of
        the one it was made from), which a child the rank forks (a data
        loader's worker) closes as it starts (``os.register_at_fork``), so no
        process but the rank keeps the lock.
    """

    SIZE = 4096  # one block: the live status in the first LIVE bytes, then a report the disk refused
    LIVE = 256
    STATES = {ord("S"): "starting", ord("R"): "running", ord("I"): "idle", ord("F"): "finished"}

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.ftruncate(fd, self.SIZE)
            allocate(fd, self.SIZE, path)  # a full disk: ENOSPC here, not a SIGBUS at a store into the map
            self.map = mmap.mmap(fd, self.SIZE)
        finally:
            os.close(fd)
        self._lock = _lock_for_life(path)  # [Note: a rank's life is a lock on its status file]
        board = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: board() is not None and board().close())
        self.pid = os.getpid()
        self.prefix = f"{self.pid}\t\t\t".encode()
        self._write(b"S", b"")

    def iteration(self, job: str, iteration: int) -> None:
        self.prefix = f"{self.pid}\t{job}\t{iteration}\t".encode()
        self._write(b"I", b"")

    def running(self, task: str) -> None:
        self._write(b"R", task.encode())

    def idle(self) -> None:
        self.map[0] = ord("I")  # the last task stays: "after 2B5"

    def finished(self) -> None:
        self.map[0] = ord("F")

    def _write(self, state: bytes, task: bytes) -> None:
        data = (state + self.prefix + task)[: self.LIVE - 1] + b"\0"
        self.map[: len(data)] = data

    def keep_report(self, report: dict[str, Any]) -> None:
        """Keep ``report`` (its short fields) in this file's blocks, allocated when it was made: where a report
        goes when the disk refuses the report's own file ([Note: a report the disk refuses])."""
        data = _fit_report(report, self.SIZE - self.LIVE - 1)
        self.map[self.LIVE: self.LIVE + len(data) + 1] = data + b"\0"

    def withdraw_report(self, kind: str) -> None:
        """Withdraw the report :meth:`keep_report` kept, if it is of ``kind``."""
        if _parse_report(self.map[self.LIVE:]).get("kind") == kind:
            self.map[self.LIVE] = 0

    def close(self) -> None:
        """Drop the lock, as the process's end does (tests; a rank keeps its board until it exits; a forked child
        drops its copy as it starts). The mapping stays: it holds no lock."""
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1

    @staticmethod
    def ended(path: Path) -> bool:
        """Whether the process that wrote ``path`` has ended ([Note: a rank's life is a lock on its status file]);
        False also when there is no such file."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:  # held: the writer lives
            return False
        finally:
            os.close(fd)  # and with it the shared lock, if granted
        return True

    @classmethod
    def read(cls, path: Path) -> dict[str, Any] | None:
        """``{"state", "pid", "job", "iteration", "task"}`` as last written (None if there is no such file)."""
        try:
            raw = Path(path).read_bytes()
        except OSError:
            return None
        fields = raw[1: cls.LIVE].split(b"\0", 1)[0].decode(errors="replace").split("\t")
        if not raw or raw[0] not in cls.STATES or len(fields) != 4 or not fields[0].isdigit():
            return None
        pid, job, iteration, task = fields
        return {"state": cls.STATES[raw[0]], "pid": int(pid), "job": job or None,
                "iteration": int(iteration) if iteration.isdigit() else None, "task": task or None}

    @classmethod
    def kept_report(cls, path: Path) -> dict[str, Any] | None:
        """The report kept in ``path`` by :meth:`keep_report` (None if there is none)."""
        try:
            raw = Path(path).read_bytes()
        except OSError:
            return None
        return _parse_report(raw[cls.LIVE:]) or None


def _parse_report(raw: bytes) -> dict[str, Any]:
    """A report kept in a status file (:meth:`StatusBoard.keep_report`), from the bytes after the live status;
    {} if there is none."""
    try:
        report = json.loads(raw.split(b"\0", 1)[0] or b"{}")
    except ValueError:
        return {}
    return report if isinstance(report, dict) and "rank" in report and "kind" in report else {}


def kept_reports(out_root: Path) -> list[dict[str, Any]]:
    """The reports kept in the run's status files ([Note: a report the disk refuses])."""
    found = (StatusBoard.kept_report(path) for path in sorted((Path(out_root) / "status").glob("rank*")))
    return [report for report in found if report is not None]


def _fit_report(report: dict[str, Any], size: int) -> bytes:
    """``report``'s short fields as JSON of at most ``size`` bytes: the decisions and the traceback left out,
    long texts cut."""
    short = {key: value for key, value in report.items() if key not in ("recent_decisions", "traceback")}
    for limit in (1500, 600, 200):
        cut = {key: value[:limit] if isinstance(value, str) else value for key, value in short.items()}
        data = json.dumps(cut).encode()
        if len(data) <= size:
            return data
    return json.dumps({key: short[key] for key in ("rank", "kind", "time") if key in short}).encode()


def _lock_for_life(path: Path) -> int:
    """A descriptor of ``path`` holding an exclusive ``flock`` ([Note: a rank's life is a lock on its status file]);
    -1 if another live process holds it (a rank of another run: this rank's end then goes unseen, nothing worse)."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)  # writable: NFS takes flock as a write lock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return -1
    return fd


def failure_path(ctx: RankContext, kind: str) -> Path:
    return ctx.out_root / "failures" / f"rank{ctx.rank}-{kind}.json"


def write_report(ctx: RankContext, kind: str, report: dict[str, Any]) -> None:
    """Write ``failures/rank<r>-<kind>.json`` whole, or keep ``report`` in the status file if that is refused.

    [Note: a report the disk refuses]
        A rank's failure report is how the launcher learns the cause ([Note: root cause] in
        :mod:`runtime.run.diagnose`), and on a full disk the cause is often the disk, which then refuses the
        report too. Written with ``Path.write_text`` it was left as an empty file, read as no report: the rank
        was "exited with code 1 without a report", its cause (a DiskError naming the disk, or any other error)
        lost. So the report is written whole or not at all (:func:`hints.outputs.write_text`), and one that is
        refused (disk full, over quota, read-only, a folder that cannot be made) goes into the rank's status
        file, whose blocks were allocated when it was made (:class:`StatusBoard`, :meth:`StatusBoard.keep_report`):
        its short fields (kind, error, job, iteration, task) and why its file was refused
        (``report_refused``), without the traceback and the last decisions. The diagnosis reads reports from
        both places (:func:`runtime.run.diagnose.failure_reports`). A withdrawn stall report is withdrawn from
        both.
    """
    path = failure_path(ctx, kind)
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)  # not Outputs.directory: ranks share the folder
        except OSError as err:
            raise write_error(err, path.parent) from None
        write_text(path, json.dumps(report, indent=1))
    except Exception as err:  # DiskError, UserError: the report's file is refused, not the rank's cause
        if ctx.status is not None:
            ctx.status.keep_report({**report, "report_refused": str(err)})


def withdraw_stall(ctx: RankContext) -> None:
    """Progress resumed after a stall report: withdraw it, wherever it was written."""
    failure_path(ctx, "stall").unlink(missing_ok=True)
    if ctx.status is not None:
        ctx.status.withdraw_report("stall")


def report_stall(ctx: RankContext, seconds: float) -> bool:
    report: dict[str, Any] = {"rank": ctx.rank, "kind": "stall", "time": time.time(),
                              "seconds_without_progress": seconds, **ctx.current,
                              "recent_decisions": list(ctx.recent)}
    executor = ctx.executor
    if executor is not None and executor.arbiter is not None:
        arbiter = executor.arbiter
        report["ready"] = [str(t) for t in arbiter.ready_tasks()]
        report["waiting_for"] = [f"{task} needs {', '.join(map(str, needs))}"
                                 for task, needs in arbiter.waiting_on()[:8]]
        pending = getattr(arbiter, "pending", None)  # a TP follower: the leader's decisions it has yet to run
        if pending is not None:
            report["following"] = {"decisions_received": arbiter.followed,
                                   "next": [str(arbiter.graph.tasks[tid]) for _, tid, _, _ in list(pending)[:4]]}
    write_report(ctx, "stall", report)
    return "task" in ctx.current


def report_error(ctx: RankContext, err: BaseException) -> None:
    """Write ``err``'s report. Bad input only a rank can see (a user's TP plan that leaves an output sharded,
    found on the rank's first microbatch before any task) is a ``UserError``: its ``what`` and ``where`` are
    kept, so ``rrfp run`` says it as bad input (one ``error:`` line, exit 2)."""
    from hints.errors import Interrupted, UserError
    from runtime.comm.errors import TransportError

    kind = ("interrupt" if isinstance(err, Interrupted) else "transport" if isinstance(err, TransportError)
            else "error")
    report = {"rank": ctx.rank, "kind": kind,
              "time": time.time(), "error": f"{type(err).__name__}: {err}", **ctx.current,
              "recent_decisions": list(ctx.recent), "traceback": traceback.format_exc()}
    if isinstance(err, UserError):
        report["user_error"] = {"what": err.what, "where": err.where}
    write_report(ctx, "error", report)


class NonFiniteLoss(RuntimeError):
    """The loss was NaN or infinite (the run stops before the optimizer step; see :func:`step_allowed`)."""


def step_allowed(ctx: RankContext, config, result, iteration: int) -> bool:
    """Whether this iteration's optimizer step may run: no when its loss was NaN or infinite.

    [Note: non-finite losses] The loss is known on the rank of the last stage
    only. By default that rank raises :class:`NonFiniteLoss` here, before
    the end-of-iteration all-gather: no rank gets past that barrier, so no
    checkpoint is written after the bad step ([Note: atomic checkpoints] in
    :mod:`runtime.run.checkpoint`) and the launcher names this error as the root
    cause. With ``--skip-nonfinite`` every rank learns it from one small
    all-reduce and skips the step (the gradients are dropped, the optimizer's
    state is untouched), and the metrics row says ``skipped_step``.
    """
    import math

    bad = result.loss is not None and not math.isfinite(result.loss)
    if not config.skip_nonfinite:
        if bad:
            raise NonFiniteLoss(f"the loss is {result.loss} at iteration {iteration}; stopped before the optimizer "
                                f"step, so no checkpoint holds it (--skip-nonfinite skips such steps instead)")
        return True
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1.0 if bad else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=ctx.control_group)
    return flag.item() == 0.0
