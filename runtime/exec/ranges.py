"""Profiler ranges around each executed task: torch.profiler's ``PP:<task>`` and, on CUDA, an NVTX range.

The executor's loop opens one range per task, around its handler (the task's computation), through
:meth:`TaskRanges.around`; nothing else in the runtime knows of profilers.

[Note: profiler ranges]
    Name: ``"PP:" + str(task)`` (``PP:1F0``, ``PP:0I2``, ``PP:0W2``, ``PP:2B5``), the name torch's own
    ``_PipelineScheduleRuntime`` gives each action, so a torch-profiler trace of an rrfp rank reads like
    one of a ``torch.distributed.pipelining`` rank: HTA, the Chrome trace viewer and ``prof.events()``
    find the same slice names.

    When: a ``torch.profiler.record_function`` range only while a torch profiler records on this
    thread (``torch.profiler.profile``, ``torch.autograd.profiler.profile`` or ``emit_nvtx``), decided
    per task by ``torch._C._autograd._profiler_enabled()``, so a profiler started with a schedule
    (wait, warm-up, active) sees every task of its active steps; an NVTX range (``range_push`` /
    ``range_pop``) around every task when the rank's device is CUDA, since nothing tells a process that
    nsys is listening. The check is needed: ``record_function`` costs about 13 us even with no
    profiler (its enter and exit are two dispatched operator calls), while the check costs about
    0.1 us.

    Measured (``benchmarks/record_function_cost.py``, BENCHMARKS.md; the 2-core VM, one thread, medians
    of 9 repeats, three runs): per task, with no profiler recording 0.59-0.62 us over the bare handler
    call (0.39-0.47 us of it the ``with`` and the call, which remain when switched off); an unchecked
    ``record_function`` would cost 13.6-13.9 us; with ``torch.profiler.profile`` recording,
    17.1-17.4 us (what any ``record_function`` costs there; torch's own schedules pay it per action).
    A task of the default ``gpt`` workload (hidden 64) takes 0.6-1 ms on that machine (median
    0.94 ms), so without a profiler the ranges add about 0.06%. NVTX was not measured (no GPU here);
    with no tool attached ``range_push`` calls into a stub.

    Off switch: ``RRFP_PROFILER_RANGES=0`` in the environment of the ranks (``rrfp run`` passes its own
    environment on), or ``StageExecutor(..., ranges=False)``; then :meth:`TaskRanges.around` returns
    the shared no-op range and nothing is checked. Any other value, or none, leaves them on.
"""

from __future__ import annotations

import os
from typing import Mapping

import torch

from hints.tasks import Task

RANGES_VARIABLE = "RRFP_PROFILER_RANGES"
_OFF = ("0", "off", "false", "no")

try:  # the state record_function itself is recorded under (set by every torch profiler)
    from torch._C._autograd import _profiler_enabled
except ImportError:  # a torch without it: always open the range (correct, only slower)
    def _profiler_enabled() -> bool:
        return True


def ranges_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``RRFP_PROFILER_RANGES`` leaves the ranges on ([Note: profiler ranges]): any value but ``0``,
    ``off``, ``false``, ``no``."""
    return environ.get(RANGES_VARIABLE, "1").strip().lower() not in _OFF


class _NoRange:
    """The range used when nothing records: enters and exits doing nothing."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


NO_RANGE = _NoRange()


class _TaskRange:
    """One task's ranges: NVTX outside (pushed first, popped last), the profiler's ``record_function`` inside."""

    __slots__ = ("name", "record", "nvtx")

    def __init__(self, name: str, profiling: bool, nvtx: bool) -> None:
        self.name, self.nvtx = name, nvtx
        self.record = torch.profiler.record_function(name) if profiling else None

    def __enter__(self) -> None:
        if self.nvtx:
            torch.cuda.nvtx.range_push(self.name)
        if self.record is not None:
            self.record.__enter__()

    def __exit__(self, *exc) -> None:
        if self.record is not None:
            self.record.__exit__(*exc)
        if self.nvtx:
            torch.cuda.nvtx.range_pop()


class TaskRanges:
    """The ranges of one rank's tasks ([Note: profiler ranges]); ``with ranges.around(task): ...``.

    ``enabled`` None reads ``RRFP_PROFILER_RANGES``; NVTX ranges only when ``device`` is a CUDA device.
    """

    def __init__(self, device: torch.device, enabled: bool | None = None) -> None:
        self.enabled = ranges_enabled() if enabled is None else enabled
        self.nvtx = self.enabled and device.type == "cuda"
        self._names: dict[Task, str] = {}

    def name(self, task: Task) -> str:
        """``PP:<task>``, made once per task."""
        name = self._names.get(task)
        if name is None:
            name = self._names[task] = f"PP:{task}"
        return name

    def around(self, task: Task) -> _TaskRange | _NoRange:
        """The ranges to open around ``task``'s handler: :data:`NO_RANGE` when off, or when no profiler records
        and the device is no GPU."""
        if not self.enabled:
            return NO_RANGE
        profiling = _profiler_enabled()
        if not (profiling or self.nvtx):
            return NO_RANGE
        return _TaskRange(self.name(task), profiling, self.nvtx)
