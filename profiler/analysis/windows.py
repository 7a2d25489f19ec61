"""Which iterations of a trace an analysis reads, each one's window, and when each task could have run.

Every other analysis module builds on these; like them, they are pure functions of the frames of
:mod:`profiler.trace.reader`.

Conventions
-----------
* An *iteration window* spans the first task start to the last task end over
  all ranks; a rank's makespan is that window's length.
* A task's *ready time* is when its last input was available on its rank:
  a local prerequisite's end, or a remote one's arrival (the message handed
  to the executor). The prerequisites are those of ``hints.deps``, the one
  dependency model. ``F(0, i)`` is ready when its rank's iteration begins.
* [Note: iteration 0] (in :func:`select_iterations`): analyses leave
  iteration 0 out by default.
* [Note: iterations cut short] (in :func:`select_iterations`): an iteration
  the trace does not hold whole is left out of every analysis, with a warning.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import polars as pl

from hints.deps import prerequisites
from hints.errors import UserError
from hints.tasks import LOOPING, PipelineShape, Task, ranges
from profiler.trace.reader import TraceFrames


def pipeline_shape(frames: TraceFrames) -> PipelineShape:
    """The trace's pipeline shape, from the rrfp metadata its ranks wrote."""
    meta = next(iter(frames.meta.values()), None)
    if meta is None:
        raise UserError("the trace has no rrfp metadata", frames.path)
    split = frames.tasks.filter(pl.col("kind").is_in(["I", "W"])).height > 0
    # A split run whose stage ran B: the hint left that stage's backward whole (PipelineShape.fused_stages).
    fused = frames.tasks.filter(pl.col("kind") == "B").get_column("stage").unique().to_list() if split else []
    # Traces written before placement was recorded are all looping.
    return PipelineShape(int(meta["stages"]), int(meta["chunks"]), int(meta["microbatches"]), split,
                         meta.get("placement", LOOPING), frozenset(fused))


def traced_iterations(frames: TraceFrames) -> list[int]:
    """Every iteration the trace holds a task of, in order."""
    return sorted(frames.tasks.get_column("iteration").unique().drop_nulls().to_list())


def complete_iterations(frames: TraceFrames) -> list[int]:
    """The iterations that hold every task of the shape (not cut short by the end of the trace)."""
    shape = pipeline_shape(frames)
    counts = frames.tasks.group_by("iteration").len()
    complete = sorted(i for i, n in counts.iter_rows() if n == shape.total_tasks)
    if not complete:
        raise UserError("no complete iteration in the trace", frames.path)
    return complete


def cut_short(frames: TraceFrames) -> dict[int, int]:
    """The iterations the trace holds only part of (a run killed or interrupted during them), each with how
    many tasks it holds ([Note: iterations cut short])."""
    if frames.tasks.is_empty() or not frames.meta:
        return {}
    total = pipeline_shape(frames).total_tasks
    counts = frames.tasks.drop_nulls("iteration").group_by("iteration").len()
    return {int(i): int(n) for i, n in sorted(counts.iter_rows()) if n < total}


def cut_short_notes(frames: TraceFrames, window: tuple[int, int | None] | None = None) -> list[str]:
    """The warning for the iterations in ``window`` (:func:`chosen_iterations`) that an analysis leaves out
    because the trace holds only part of them; none if there are none."""
    cut = cut_short(frames)
    left_out = {i: n for i, n in cut.items() if i in chosen_iterations(traced_iterations(frames), window)}
    return [cut_short_note(left_out, pipeline_shape(frames).total_tasks)] if left_out else []


def cut_short_note(cut: dict[int, int], total: int) -> str:
    """The warning for iterations left out because the trace holds only part of them."""
    held = ", ".join(f"{i} ({n} of {total} tasks)" for i, n in cut.items())
    return (f"left out iteration{'s' if len(cut) > 1 else ''} {held}: the run ended before "
            f"{'they' if len(cut) > 1 else 'it'} finished")


def chosen_iterations(iterations: Sequence[int], window: tuple[int, int | None] | None) -> list[int]:
    """[Note: iteration 0] The iterations of ``iterations`` an analysis looks at: those in ``window`` (``(A, B)``:
    ``A..B-1``, ``B`` None for no end), by default every one but iteration 0 unless it is the only one."""
    if window is None:
        return [i for i in iterations if i != 0] or list(iterations)
    start, stop = window
    return [i for i in iterations if i >= start and (stop is None or i < stop)]


def select_iterations(frames: TraceFrames, window: tuple[int, int | None] | None = None,
                      flag: str = "`iterations`") -> tuple[TraceFrames, list[str]]:
    """``frames`` cut to :func:`chosen_iterations` of its traced ones, and notes for the user.

    [Note: iteration 0]
        Iteration 0 pays one-off start-up costs (allocations, first
        communications, lazy initialisation), so every trace analysis leaves
        it out by default, as ``rrfp run``'s medians do; a trace of iteration
        0 alone is analysed whole, with a note. ``--iterations A:B`` (or
        ``-i N``) chooses. Counters are not cut.

    [Note: iterations cut short]
        A run killed or interrupted during an iteration leaves that iteration's first tasks in the trace;
        counted as an iteration, it would show a short makespan and idle ranks that never were. Every
        analysis leaves it out (as ``export --durations``, ``sensitivity`` and tune-hint's sources did
        already), with a warning that names it and how many of its tasks the trace holds; a window of
        nothing but such iterations is an error naming them.
    """
    traced = traced_iterations(frames)
    if not traced:
        return frames, []
    whole = [i for i in traced if i not in cut_short(frames)]
    chosen = chosen_iterations(whole, window)
    notes = cut_short_notes(frames, window)
    if not chosen:
        if notes:
            raise UserError(notes[0].replace("left out", "cannot analyse", 1)
                            + (f" (whole: {ranges(whole)})" if whole else " (no iteration is whole)"),
                            flag if window is not None else frames.path)
        start, stop = window
        raise UserError(f"no traced iteration in {start}:{'' if stop is None else stop} (traced: {ranges(traced)})",
                        flag)
    if window is None and chosen == [0]:
        notes.append("only iteration 0 is traced; it includes start-up costs")
    keep = pl.col("iteration").is_in(chosen)
    return replace(frames, tasks=frames.tasks.filter(keep), decisions=frames.decisions.filter(keep),
                   transfers=frames.transfers.filter(keep), iterations=frames.iterations.filter(keep),
                   steps=frames.steps.filter(keep), rendezvous=frames.rendezvous.filter(keep),
                   members=frames.members.filter(keep),
                   member_decisions=frames.member_decisions.filter(keep)), notes


def iteration_windows(frames: TraceFrames) -> pl.DataFrame:
    """Per iteration: its window (first task start, last task end over all ranks) and ``makespan_ns``."""
    return (frames.tasks.group_by("iteration")
            .agg(pl.col("start_ns").min().alias("start_ns"), pl.col("end_ns").max().alias("end_ns"))
            .with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("makespan_ns"))
            .sort("iteration"))


# -- ready times ---------------------------------------------------------------


def ready_times(frames: TraceFrames) -> pl.DataFrame:
    """Each traced task with ``ready_ns`` (null when an input's producer was not traced)."""
    shape = pipeline_shape(frames)
    tasks = frames.tasks
    ends = {(row[0], row[1]): row[2] for row in tasks.select("iteration", "task", "end_ns").iter_rows()}
    arrivals = {(row[0], row[1], row[2]): row[3] for row in frames.transfers.filter(
        pl.col("recv_end_ns").is_not_null()).select("iteration", "producer", "dst", "recv_end_ns").iter_rows()}
    begins = {(row[0], row[1]): row[2] for row in frames.iterations.select("rank", "iteration", "start_ns").iter_rows()}
    ready = []
    for rank, iteration, text in tasks.select("rank", "iteration", "task").iter_rows():
        task = Task.parse(text)
        needs = prerequisites(task, shape)
        times = []
        for need in needs:
            if shape.rank_of(need.stage) == rank:
                times.append(ends.get((iteration, str(need))))
            else:
                times.append(arrivals.get((iteration, str(need), rank)))
        if not needs:
            times.append(begins.get((rank, iteration)))
        ready.append(None if any(t is None for t in times) else max(times))
    return tasks.with_columns(pl.Series("ready_ns", ready, dtype=pl.Int64))
