"""What the executor reports while it runs, and the in-memory record the runtime keeps.

The executor calls a :class:`Recorder` at a few fixed points of its loop and
nowhere else (no timers inside handlers). ``runtime`` only knows this
protocol; the Perfetto trace writer in ``profiler`` implements it and is
plugged in by name (``"module:Class"``), so the import graph stays
``hints <- runtime <- profiler <- rrfp_cli``.

Clock: host ``time.monotonic_ns()`` for every timestamp given here. A recorder
that can do better on a device (CUDA events) does so inside ``task_started``
and ``task_finished``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from hints.errors import UserError
from hints.tasks import Task
from runtime.sched.arbiter import Decision


@dataclass(frozen=True)
class TaskSpan:
    """One executed task on this rank."""

    iteration: int
    task: Task
    start_ns: int
    end_ns: int
    wait_ns: int  # how long the rank had been idle before this task
    info: dict[str, Any] = field(default_factory=dict)  # tokens, images, ...


@dataclass(frozen=True)
class RecorderSetup:
    """What a recorder is built with, on each rank (``load_recorder_class(spec)(setup)``)."""

    rank: int
    world: int
    out_dir: str
    job: str
    config: Any  # runtime.config.RunConfig
    device: Any  # torch.device
    clock_offset_ns: int  # add to this rank's monotonic clock to get rank 0's
    clock_error_ns: int  # bound on that offset's error (half the best round trip)
    budget: int | None  # this rank's memory budget (ready policy)
    grid: Any = None  # runtime.comm.grid.ProcessGrid: the rank's pipeline, TP and DP coordinates (None: pipeline only)


class Recorder(Protocol):
    def begin_iteration(self, iteration: int, now_ns: int, order: tuple[Task, ...]) -> None: ...

    def decision(self, iteration: int, decision: Decision, wait_ns: int) -> None: ...

    def task_started(self, iteration: int, task: Task, now_ns: int) -> None: ...

    def task_finished(self, span: TaskSpan) -> None: ...

    def arrival(self, iteration: int, arrival: Any) -> None: ...

    def counters(self, iteration: int, now_ns: int, values: dict[str, float]) -> None: ...

    def rendezvous(self, iteration: int, start_ns: int, end_ns: int, messages: tuple[tuple[Task, int], ...]) -> None:
        """``--p2p blocking``: from ``start_ns`` to ``end_ns`` the rank waited for the receivers of ``messages``
        (``(producer, destination rank)`` pairs) to post their receives ([Note: blocking p2p in the runtime])."""

    def end_iteration(self, iteration: int, now_ns: int, sends: list[Any]) -> None: ...

    def optimizer_step(self, iteration: int, start_ns: int, barrier_ns: int, end_ns: int) -> None:
        """After ``end_iteration``: the optimizer step from ``start_ns``, then the end-of-iteration barrier
        from ``barrier_ns`` to ``end_ns`` (host monotonic clock, this rank's)."""

    def close(self) -> None: ...


class NullRecorder:
    """Records nothing (the executor's own metrics still work)."""

    def begin_iteration(self, iteration, now_ns, order): pass

    def decision(self, iteration, decision, wait_ns): pass

    def task_started(self, iteration, task, now_ns): pass

    def task_finished(self, span): pass

    def arrival(self, iteration, arrival): pass

    def counters(self, iteration, now_ns, values): pass

    def rendezvous(self, iteration, start_ns, end_ns, messages): pass

    def end_iteration(self, iteration, now_ns, sends): pass

    def optimizer_step(self, iteration, start_ns, barrier_ns, end_ns): pass

    def close(self): pass


class ListRecorder(NullRecorder):
    """Keeps spans and decisions in lists (tests, and budgets checked after a run)."""

    def __init__(self) -> None:
        self.spans: list[TaskSpan] = []
        self.decisions: list[tuple[int, Decision]] = []
        self.waits: list[tuple[int, int, int, tuple]] = []  # rendezvous: (iteration, start_ns, end_ns, messages)

    def decision(self, iteration, decision, wait_ns):
        self.decisions.append((iteration, decision))

    def task_finished(self, span):
        self.spans.append(span)

    def rendezvous(self, iteration, start_ns, end_ns, messages):
        self.waits.append((iteration, start_ns, end_ns, messages))


def load_recorder_class(spec: str):
    """``"package.module:Class"`` -> the class (how ``rrfp run`` plugs in the trace writer)."""
    module_name, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as err:
        raise UserError(f"cannot load recorder {spec!r}: {err}", "recorder") from None
