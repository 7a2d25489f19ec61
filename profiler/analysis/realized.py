"""What the simulator replays from a trace: realized durations and latencies, and the per-dispatch overhead.

:func:`realized_iterations` turns each complete traced iteration into a
:class:`runtime.durations.variability.Durations` table (``rrfp trace export
--durations``, hint sensitivity, tune-hint's scenarios); :func:`dispatch_overhead`
calibrates the runtime's cost of starting a task from the gaps between tasks:
every replay adds it, and the bubble split counts at least that much of a gap
as ``dispatch`` (:func:`calibrated_dispatch_ns`). Windows and ready times follow
the conventions of :mod:`profiler.analysis.windows`. Trace times are
nanoseconds; tables and estimates are seconds.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

import polars as pl

from hints.errors import UserError
from hints.tasks import PipelineShape, Task
from profiler.analysis.windows import complete_iterations, pipeline_shape, ready_times, traced_iterations
from profiler.trace.reader import TraceFrames
from runtime.durations.variability import Durations, durations_from_rows


def realized_durations(frames: TraceFrames, iteration: int) -> Durations:
    """The trace's task durations and message latencies of one iteration, as a simulator table.

    A message whose latency the trace lacks takes the iteration's median (see
    :func:`realized_iterations`, which says which ones).
    """
    return realized_iterations(frames, [iteration])[0].durations


@dataclass(frozen=True)
class RealizedIteration:
    """One complete traced iteration as a duration table, and where each latency came from.

    A task's duration is its traced ``end - start``; with a split backward
    ``B`` is ``I + W``. A message's latency is its receiver's ``recv_end_ns``
    (handed to the executor) minus its producer's ``end_ns``, both on rank 0's
    clock, clipped at 0. ``measured`` names the cross-rank senders whose
    message's arrival the trace holds; ``filled`` those whose arrival it
    lacks (the receiver's side missing): they take ``fill_s``, the median of
    the measured latencies (0 when none was measured). Messages between two stages of one
    rank (a single-rank run) do not exist; their latency is 0 and in neither.
    """

    iteration: int
    durations: Durations
    measured: tuple[str, ...]
    filled: tuple[str, ...]
    fill_s: float


def realized_iterations(frames: TraceFrames, iterations: Sequence[int] | None = None) -> list[RealizedIteration]:
    """:class:`RealizedIteration` of each of ``iterations`` (default: every complete one), in that order."""
    shape = pipeline_shape(frames)
    chosen = complete_iterations(frames) if iterations is None else list(iterations)
    return [_realize(frames, shape, iteration) for iteration in chosen]


def realized_tables(frames: TraceFrames, iterations: Sequence[int] | None = None) -> list[tuple[int, Durations]]:
    """``(iteration, durations)`` of each of ``iterations`` (default: every complete one), for
    :func:`runtime.durations.tables.write_durations`. Iteration 0 includes start-up; the caller decides."""
    return [(r.iteration, r.durations) for r in realized_iterations(frames, iterations)]


def _realize(frames: TraceFrames, shape: PipelineShape, iteration: int) -> RealizedIteration:
    stages, m = shape.stages, shape.microbatches
    tasks = frames.tasks.filter(pl.col("iteration") == iteration)
    if tasks.height != shape.total_tasks:
        try:
            advice = "pick a complete one: " + ", ".join(map(str, complete_iterations(frames)))
        except UserError:
            advice = "the trace holds no complete one"
        raise UserError(f"iteration {iteration} holds {tasks.height} of {shape.total_tasks} tasks "
                        f"(truncated trace?); {advice}", frames.path)
    table = {kind: [[0.0] * m for _ in range(stages)] for kind in "FBIW"}
    ends = {}
    for text, start, end in tasks.select("task", "start_ns", "end_ns").iter_rows():
        task = Task.parse(text)
        table[task.kind.value][task.stage][task.microbatch] = (end - start) * 1e-9
        ends[text] = end
    latency = {}
    for producer, recv_end in frames.transfers.filter(
            (pl.col("iteration") == iteration) & pl.col("recv_end_ns").is_not_null()).select(
            "producer", "recv_end_ns").iter_rows():
        if producer in ends:
            latency[producer] = max(0.0, (recv_end - ends[producer]) * 1e-9)
    fill = statistics.median(latency.values()) if latency else 0.0
    measured: list[str] = []
    filled: list[str] = []

    def sent(text: str) -> float:
        if text in latency:
            measured.append(text)
            return latency[text]
        filled.append(text)
        return fill

    def sends(kind, step: int) -> list[list[float]]:
        """Latencies of the messages of stage ``k``'s task ``kind(k)`` to stage ``k + step``; 0 where there is
        none or it stays on the rank."""
        rows = []
        for k in range(stages):
            consumer = k + step
            crosses = 0 <= consumer < stages and shape.rank_of(consumer) != shape.rank_of(k)
            rows.append([sent(f"{k}{kind(k)}{i}") if crosses else 0.0 for i in range(m)])
        return rows

    send_forward = sends(lambda k: "F", +1)
    send_backward = sends(lambda k: shape.upstream_backward_of(k).value, -1)
    durations = durations_from_rows(shape, table, send_forward, send_backward, f"{frames.path} (iteration {iteration})")
    return RealizedIteration(iteration, durations, tuple(measured), tuple(filled), fill)


@dataclass(frozen=True)
class OverheadEstimate:
    """The runtime's per-dispatch overhead, calibrated from a trace (see :func:`dispatch_overhead`)."""

    per_task_s: float  # median gap: what the simulator should add per dispatched task
    mean_s: float
    samples: int  # gaps measured; 0 when none could be (then both times are 0)


def dispatch_overhead(frames: TraceFrames, iterations: Sequence[int] | None = None) -> OverheadEstimate:
    """How long a rank takes to start a task that was ready when it could have started it.

    For every task but the first of its rank in an iteration, the gap from
    ``max(end of the rank's previous task, the task's ready time)`` (see
    :func:`ready_times`) to the task's start: the time between the moment
    the rank was free *and* the task could run, and the moment it ran. When
    the task was already ready as the previous one ended, that is the
    executor's dispatch cost (record the end, ask the arbiter, look up the
    inputs, launch). When a message made it ready while the rank was idle, the
    gap also holds the executor's wake-up from its inbox. It never holds a wait
    for inputs. Tasks whose ready time is unknown (a producer missing from the
    trace) are left out; a gap the clocks make negative counts as 0.

    The estimate is the median over the tasks of ``iterations`` (default:
    every complete iteration), so a few slow wake-ups do not move it;
    ``mean_s`` shows how heavy the tail is.
    """
    traced = set(traced_iterations(frames))
    chosen = complete_iterations(frames) if iterations is None else list(iterations)
    absent = [i for i in chosen if i not in traced]
    if absent:
        raise UserError(f"iteration {absent[0]} is not in the trace (traced: {sorted(traced)})", frames.path)
    gaps = _dispatch_gaps(ready_times(frames).filter(pl.col("iteration").is_in(chosen)))
    if not gaps:
        return OverheadEstimate(0.0, 0.0, 0)
    return OverheadEstimate(statistics.median(gaps) * 1e-9, statistics.fmean(gaps) * 1e-9, len(gaps))


def _dispatch_gaps(tasks: pl.DataFrame) -> list[int]:
    """For each task with a known ready time but a rank's first of an iteration: start - max(previous end, ready)."""
    gaps = []
    for _, group in tasks.sort("rank", "iteration", "start_ns").group_by(["rank", "iteration"], maintain_order=True):
        starts = group.get_column("start_ns").to_list()
        ends = group.get_column("end_ns").to_list()
        ready = group.get_column("ready_ns").to_list()
        for k in range(1, len(starts)):
            if ready[k] is not None:
                gaps.append(max(0, starts[k] - max(ends[k - 1], ready[k])))
    return gaps


def calibrated_dispatch_ns(tasks: pl.DataFrame) -> float:
    """The median dispatch gap (ns) of ``tasks`` (with ready times), 0 when none is known."""
    gaps = _dispatch_gaps(tasks)
    return float(statistics.median(gaps)) if gaps else 0.0
