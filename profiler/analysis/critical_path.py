"""The critical path of an iteration: the chain of compute, transfers and waits that ends with its last task.

Windows follow the conventions of :mod:`profiler.analysis.windows`; a task's inputs are those of ``hints.deps``.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from hints.deps import prerequisites
from hints.errors import UserError
from hints.tasks import Task
from profiler.analysis.windows import iteration_windows, pipeline_shape, traced_iterations
from profiler.trace.reader import TraceFrames


@dataclass
class CriticalPath:
    """An iteration's critical path: its segments in time order and the makespan they add up to."""

    iteration: int
    makespan_ns: int
    segments: pl.DataFrame  # kind (compute/transfer/wait), task, rank, start_ns, end_ns, duration_ns

    def shares(self) -> dict[str, float]:
        """Each segment kind's (compute, transfer, wait) share of the makespan."""
        totals = {kind: 0 for kind in ("compute", "transfer", "wait")}
        for kind, duration in self.segments.select("kind", "duration_ns").iter_rows():
            totals[kind] += duration
        return {kind: value / self.makespan_ns if self.makespan_ns else 0.0 for kind, value in totals.items()}


def critical_path(frames: TraceFrames, iteration: int | None = None) -> CriticalPath:
    """The chain of tasks, transfers and waits that ends with the iteration's last task.

    Walking back from the last task, each task's start is attributed to the
    latest of: its previous task on the rank, and its inputs' availability
    (a remote input through its transfer). Time between that and the start is
    ``wait``.
    """
    shape = pipeline_shape(frames)
    iterations = traced_iterations(frames)
    if not iterations:
        raise UserError("the trace holds no tasks", frames.path)
    if iteration is None:
        iteration = iterations[-1]
    if iteration not in iterations:
        raise UserError(f"iteration {iteration} is not in the trace (traced: {iterations})", "`iteration`")
    tasks = frames.tasks.filter(pl.col("iteration") == iteration).sort("start_ns")
    info = {text: (rank, start, end) for text, rank, start, end in
            tasks.select("task", "rank", "start_ns", "end_ns").iter_rows()}
    previous: dict[str, str | None] = {}
    for _, group in tasks.group_by("rank", maintain_order=True):
        order = group.get_column("task").to_list()
        for before, after in zip([None, *order], order):
            previous[after] = before
    arrivals = {(p, d): (s, r) for p, d, s, r in frames.transfers.filter(pl.col("iteration") == iteration).select(
        "producer", "dst", "send_start_ns", "recv_end_ns").iter_rows()}
    begin = tasks.get_column("start_ns").min()
    current = tasks.sort("end_ns").get_column("task").to_list()[-1]
    segments = []
    while current is not None:
        rank, start, end = info[current]
        segments.append(("compute", current, rank, start, end))
        candidates = []  # (available at, kind, predecessor, transfer segment)
        before = previous.get(current)
        if before is not None:
            candidates.append((info[before][2], 1, before, None))
        for need in prerequisites(Task.parse(current), shape):
            text = str(need)
            if text not in info:
                continue
            producer_rank, _, producer_end = info[text]
            if producer_rank == rank:
                candidates.append((producer_end, 0, text, None))
            elif (text, rank) in arrivals and arrivals[(text, rank)][1] is not None:
                arrived = arrivals[(text, rank)][1]
                candidates.append((arrived, 0, text, ("transfer", text, rank, producer_end, arrived)))
        if not candidates:
            if start > begin:
                segments.append(("wait", current, rank, begin, start))
            break
        available, _, predecessor, transfer = max(candidates, key=lambda c: (c[0], -c[1]))
        if start > available:
            segments.append(("wait", current, rank, available, start))
        if transfer is not None:
            segments.append(transfer)
        current = predecessor
    segments.reverse()
    frame = pl.DataFrame(segments, schema=["kind", "task", "rank", "start_ns", "end_ns"], orient="row")
    frame = frame.with_columns((pl.col("end_ns") - pl.col("start_ns")).clip(lower_bound=0).alias("duration_ns"))
    window = iteration_windows(frames).filter(pl.col("iteration") == iteration)
    return CriticalPath(iteration, int(window.get_column("makespan_ns")[0]), frame)
