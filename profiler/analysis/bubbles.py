"""Idle time by cause: every idle nanosecond of a rank in an iteration, in exactly one category.

:func:`bubbles` sums the categories per rank and iteration, :func:`misalignment_gaps` lists the gaps with
misalignment, :func:`idle_segments` cuts each gap into its causes along the timeline (the timeline's hatches),
and :func:`simulated_bubbles` splits a simulation's idle time by the same code. Windows and ready times follow
the conventions of :mod:`profiler.analysis.windows`; the dispatch cost is calibrated as in
:mod:`profiler.analysis.realized`.

[Note: bubble categories]
    Every nanosecond of a rank inside the iteration window (first task start
    to last task end over all ranks; when the trace records the optimizer
    step, to the last rank's step end) that it spends outside a task falls in
    exactly one category:

    * ``fill``: before the rank's first task;
    * ``step``: its optimizer step, after its last task (the ``step`` track);
    * ``drain``: the rest of the time after its last task (waiting for the
      other ranks, the barrier that ends the iteration included).

    An idle gap between two tasks, the rank having run ``next`` at its end,
    splits along a timeline. Until anything was ready (``next`` or a later
    task of the rank) it is ``dependency``. The end of the gap is
    ``dispatch``: the rank's own latency, the longer of the time since
    ``next`` was ready and the calibrated per-dispatch overhead (the median of
    :func:`profiler.analysis.realized.dispatch_overhead`'s gaps): a rank
    needs that much to start any task, whichever rule it follows. In
    between, another task was ready but
    not ``next``: ``budget_held`` while every such task was an admission the
    memory budget held back (the decision's ``held_back``), else
    ``misalignment``. So misalignment is what readiness-first could still
    recover at the same budget: idle time beyond the dispatch cost while a
    task the budget allowed was ready.

    Under ``--p2p blocking`` a gap opens with ``rendezvous``: from the end of
    the task before it until the receivers of that task's messages posted
    their receives (the trace's ``rendezvous`` slices, [Note: blocking p2p in
    the runtime] in runtime.exec.executor). Nothing could start then, whatever
    was ready, so that time is the protocol's, not a dependency's; the rest
    of the gap splits as above. (A wait after a rank's last task is drain.)
"""

from __future__ import annotations

from typing import Sequence

import polars as pl

from hints.errors import UserError
from profiler.analysis.realized import calibrated_dispatch_ns
from profiler.analysis.windows import iteration_windows, ready_times
from profiler.trace.reader import TraceFrames

BUBBLE_COLUMNS = ("fill_ns", "drain_ns", "step_ns", "rendezvous_ns", "dependency_ns", "budget_held_ns",
                  "dispatch_ns", "misalignment_ns")
_NEVER = float("inf")  # the ready time of no task, or of one whose inputs the trace lacks


def bubbles(frames: TraceFrames, dispatch_s: float | None = None) -> pl.DataFrame:
    """Per rank and iteration: busy time and the rest split by [Note: bubble categories].

    ``dispatch_s`` is the per-dispatch overhead (default: calibrated from ``frames``).
    """
    tasks = ready_times(frames)
    if tasks.height == 0:
        raise UserError("the trace holds no tasks", frames.path)
    dispatch_ns = calibrated_dispatch_ns(tasks) if dispatch_s is None else dispatch_s * 1e9
    windows = _bubble_windows(frames)
    steps = {(r, i): end - start for r, i, start, end in frames.steps.select(
        "rank", "iteration", "start_ns", "barrier_ns").iter_rows()}
    gaps = _gaps(tasks, _held_back(frames), dispatch_ns, rendezvous=_rendezvous_ends(frames))
    rows = []
    for (rank, iteration), group in tasks.group_by(["rank", "iteration"], maintain_order=True):
        begin, finish = windows[iteration]
        first, last = group.get_column("start_ns").min(), group.get_column("end_ns").max()
        step = min(steps.get((rank, iteration), 0), finish - last)
        split = gaps.get((rank, iteration), {})
        rows.append({"rank": rank, "iteration": iteration, "makespan_ns": finish - begin,
                     "busy_ns": int(group.get_column("duration_ns").sum()), "fill_ns": first - begin,
                     "drain_ns": finish - last - step, "step_ns": step,
                     **{name: int(split.get(name, 0)) for name in _GAP_COLUMNS}})
    frame = pl.DataFrame(rows).sort("iteration", "rank")
    return frame.with_columns((pl.col("busy_ns") / pl.col("makespan_ns")).alias("utilization"))


def _bubble_windows(frames: TraceFrames) -> dict[int, tuple[int, int]]:
    """Per iteration, the task window, its end extended to the last optimizer step's end when recorded."""
    ends = dict(frames.steps.group_by("iteration").agg(pl.col("end_ns").max()).iter_rows())
    return {i: (start, max(end, ends.get(i, end))) for i, start, end in iteration_windows(frames).select(
        "iteration", "start_ns", "end_ns").iter_rows()}


_GAP_COLUMNS = ("rendezvous_ns", "dependency_ns", "budget_held_ns", "dispatch_ns", "misalignment_ns")


def split_gap(a: float, b: float, next_ready: float, free_ready: float, held_ready: float,
              dispatch: float, rendezvous_until: float | None = None) -> dict[str, float]:
    """The idle gap ``a..b`` before a task ready at ``next_ready``, by [Note: bubble categories].

    ``free_ready`` and ``held_ready``: when the first later task of the rank that the budget allowed (held back)
    was ready; ``inf`` for never (or unknown). ``rendezvous_until``: when the rank's wait for its receivers to
    post ended (``--p2p blocking``; None: no wait).
    """
    rendezvous = 0 if rendezvous_until is None else max(0, min(b, rendezvous_until) - a)
    if rendezvous:  # the rest of the gap as any gap (all zero when the wait filled it)
        return {**split_gap(a + rendezvous, b, next_ready, free_ready, held_ready, dispatch),
                "rendezvous_ns": rendezvous}
    anything = max(a, min(next_ready, free_ready, held_ready))
    if anything >= b:
        return {"rendezvous_ns": 0, "dependency_ns": b - a, "budget_held_ns": 0, "dispatch_ns": 0,
                "misalignment_ns": 0, "misaligned_from_ns": b}
    dispatch = min(b - anything, max(b - max(a, next_ready), dispatch))
    waiting_end = b - dispatch  # before it, something other than `next` was ready
    misaligned = max(0, waiting_end - max(anything, free_ready))
    return {"rendezvous_ns": 0, "dependency_ns": anything - a, "budget_held_ns": waiting_end - anything - misaligned,
            "dispatch_ns": dispatch, "misalignment_ns": misaligned, "misaligned_from_ns": waiting_end - misaligned}


def _rendezvous_ends(frames: TraceFrames) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """Per ``(rank, iteration)``: the ``(start_ns, end_ns)`` of each rendezvous wait, in time order."""
    out: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for rank, iteration, start, end in frames.rendezvous.sort("start_ns").select(
            "rank", "iteration", "start_ns", "end_ns").iter_rows():
        out.setdefault((rank, iteration), []).append((start, end))
    return out


def _held_back(frames: TraceFrames) -> dict[tuple[int, int, str], frozenset[str]]:
    """``(rank, iteration, chosen task) -> the admissions the budget held back`` at the decision that chose it."""
    held = frames.decisions.filter(pl.col("held_back").is_not_null())
    return {(r, i, chosen): frozenset(text.split()) for r, i, chosen, text in held.select(
        "rank", "iteration", "chosen", "held_back").iter_rows()}


def _gaps(tasks: pl.DataFrame, held_back: dict, dispatch: float, keep: bool = False, rendezvous: dict | None = None):
    """Per ``(rank, iteration)``: the idle gaps between tasks summed by category; with ``keep``, a list of every
    gap (its categories, ``ran_next``, the free and held tasks ready before it ended) instead. ``rendezvous``:
    :func:`_rendezvous_ends`."""
    out: dict = {}
    rendezvous = rendezvous or {}
    for (rank, iteration), group in tasks.sort("start_ns").group_by(["rank", "iteration"], maintain_order=True):
        waits = rendezvous.get((rank, iteration), [])
        names = group.get_column("task").to_list()
        starts, ends = group.get_column("start_ns").to_list(), group.get_column("end_ns").to_list()
        ready = [_NEVER if r is None else r for r in group.get_column("ready_ns").to_list()]
        later = _suffix_min(ready)
        for k in range(1, len(names)):
            a, b = ends[k - 1], starts[k]
            if b <= a:
                continue
            held = held_back.get((rank, iteration, names[k]), frozenset())
            free_ready, held_ready = later[k + 1], _NEVER
            if held:
                free_ready = min((ready[j] for j in range(k + 1, len(names)) if names[j] not in held), default=_NEVER)
                held_ready = min((ready[j] for j in range(k + 1, len(names)) if names[j] in held), default=_NEVER)
            # A wait that began at the previous task's end (the executor's clock reads it a moment later).
            until = next((end for start, end in waits if a <= start < b), None)
            split = split_gap(a, b, ready[k], free_ready, held_ready, dispatch, until)
            if keep:
                others = sorted((ready[j], names[j]) for j in range(k + 1, len(names)) if ready[j] < b)
                out.setdefault((rank, iteration), []).append({
                    **split, "gap_start_ns": a, "gap_end_ns": b, "ran_next": names[k],
                    "ready": " ".join(n for _, n in others if n not in held),
                    "held": " ".join(n for _, n in others if n in held)})
            else:
                totals = out.setdefault((rank, iteration), dict.fromkeys(_GAP_COLUMNS, 0))
                for name in _GAP_COLUMNS:
                    totals[name] += split[name]
    return out


def _suffix_min(values: list[float]) -> list[float]:
    """``out[k] = min(values[k:])`` (``inf`` past the end)."""
    out = [_NEVER] * (len(values) + 1)
    for k in range(len(values) - 1, -1, -1):
        out[k] = min(out[k + 1], values[k])
    return out


def bubble_totals(frame: pl.DataFrame) -> pl.DataFrame:
    """Per rank over all iterations (and an ``all`` row): seconds and shares of the makespan."""
    per_rank = (frame.group_by("rank").agg(pl.col("makespan_ns", "busy_ns", *BUBBLE_COLUMNS).sum())
                .sort("rank").with_columns(pl.col("rank").cast(pl.Utf8)))
    total = per_rank.select(pl.lit("all").alias("rank"), pl.col("makespan_ns", "busy_ns", *BUBBLE_COLUMNS).sum())
    out = pl.concat([per_rank, total])
    return out.with_columns((pl.col("busy_ns") / pl.col("makespan_ns")).alias("utilization"))


def misalignment_gaps(frames: TraceFrames, limit: int | None = None, dispatch_s: float | None = None) -> pl.DataFrame:
    """Every idle gap with misalignment ([Note: bubble categories]), longest misaligned time first.

    ``ran_next`` is the task the rank ran at the gap's end; ``ready`` the other tasks of the rank the budget
    allowed that were ready before it (what readiness-first could have run instead), ``held`` those it held
    back. The misaligned time is ``misaligned_from_ns .. misaligned_from_ns + misaligned_ns``.
    """
    rows = [{"rank": rank, "iteration": iteration, "misaligned_ns": gap["misalignment_ns"], **gap}
            for (rank, iteration), gaps in _every_gap(frames, dispatch_s).items()
            for gap in gaps if gap["misalignment_ns"] > 0]
    columns = {"rank": pl.Int64, "iteration": pl.Int64, "gap_start_ns": pl.Int64, "gap_end_ns": pl.Int64,
               "misaligned_from_ns": pl.Int64, "misaligned_ns": pl.Int64, "budget_held_ns": pl.Int64,
               "dispatch_ns": pl.Int64, "ran_next": pl.Utf8, "ready": pl.Utf8, "held": pl.Utf8}
    frame = pl.DataFrame([{k: _integral(row[k]) for k in columns} for row in rows], schema=columns)
    frame = frame.sort("misaligned_ns", descending=True)
    return frame.head(limit) if limit else frame


def _every_gap(frames: TraceFrames, dispatch_s: float | None) -> dict:
    """:func:`_gaps` with ``keep``: every idle gap of ``frames``, the dispatch cost calibrated unless given."""
    tasks = ready_times(frames)
    dispatch_ns = (calibrated_dispatch_ns(tasks) if dispatch_s is None else dispatch_s * 1e9) if tasks.height else 0.0
    return _gaps(tasks, _held_back(frames), dispatch_ns, keep=True, rendezvous=_rendezvous_ends(frames))


def _integral(value):
    """``value`` for an Int64 column: a gap's bounds are floats once a calibrated (float) dispatch cost enters."""
    return int(value) if isinstance(value, float) else value


IDLE_CAUSES = ("rendezvous", "dependency", "budget_held", "misalignment", "dispatch")


def idle_segments(frames: TraceFrames, dispatch_s: float | None = None) -> pl.DataFrame:
    """Every idle gap between two tasks of a rank, cut where [Note: bubble categories] cuts it.

    One row per non-empty segment: ``rank``, ``iteration``, ``cause`` (one of :data:`IDLE_CAUSES`),
    ``start_ns``, ``end_ns``. A gap runs rendezvous, dependency, budget-held, misalignment, dispatch, in that order,
    so its segments tile it; summed per rank they are :func:`bubbles`' columns of the same names.
    """
    rows = []
    for (rank, iteration), gaps in _every_gap(frames, dispatch_s).items():
        for gap in gaps:
            start = gap["gap_start_ns"]
            for cause in IDLE_CAUSES:
                length = gap[f"{cause}_ns"]
                if length > 0:
                    rows.append((rank, iteration, cause, _integral(start), _integral(start + length)))
                    start += length
    return pl.DataFrame(rows, schema={"rank": pl.Int64, "iteration": pl.Int64, "cause": pl.Utf8,
                                      "start_ns": pl.Int64, "end_ns": pl.Int64}, orient="row")


def simulated_bubbles(result, transfer: Sequence[float]) -> dict[str, float]:
    """A simulation's idle time split by [Note: bubble categories], in seconds summed over ranks.

    ``result`` is a :class:`runtime.sched.results.SimResult` run with ``record=True`` (the decisions say what
    the budget held back) and ``transfer`` the per-task latencies it ran on. Ready times follow the
    simulator's semantics (a producer's end, plus its latency when it is on another rank); the gaps are
    split by the same code as a trace's (:func:`split_gap`), with no dispatch overhead (the simulator
    has none unless asked). Keys: ``fill``, ``drain``, ``dependency``, ``budget_held``,
    ``misalignment``, ``dispatch``, ``rendezvous`` (blocking p2p), and ``busy`` and ``makespan_x_ranks`` for shares.
    """
    graph = result.graph
    shape = graph.shape
    start, end = result.start, result.end
    tasks = graph.tasks
    ns = 1e9
    ready = [0.0] * len(graph)  # the deps.py rules, walked from the producers' side
    for producer, (local, remote) in enumerate(zip(graph.local_consumers, graph.remote_consumers)):
        for consumer in local:
            ready[consumer] = max(ready[consumer], end[producer])
        for consumer in remote:
            ready[consumer] = max(ready[consumer], end[producer] + transfer[producer])
    rows = [(rank, 0, str(tasks[tid]), round(start[tid] * ns), round(end[tid] * ns), round(ready[tid] * ns))
            for rank, executed in enumerate(result.executed) for tid in executed]
    frame = pl.DataFrame(rows, schema={"rank": pl.Int64, "iteration": pl.Int64, "task": pl.Utf8,
                                       "start_ns": pl.Int64, "end_ns": pl.Int64, "ready_ns": pl.Int64},
                         orient="row")
    held = {(d.rank, 0, str(d.chosen)): frozenset(map(str, d.held_back))
            for d in result.decisions or () if d.held_back}
    gaps = _gaps(frame, held, 0.0)
    out = dict.fromkeys(("fill", "drain", *IDLE_CAUSES), 0.0)
    for rank, executed in enumerate(result.executed):
        if executed:
            out["fill"] += start[executed[0]]
            out["drain"] += result.makespan - max(end[t] for t in executed)
        else:
            out["fill"] += result.makespan
        for name, value in gaps.get((rank, 0), {}).items():
            out[name.removesuffix("_ns")] += value / ns
    out["busy"] = sum(result.busy)
    out["makespan_x_ranks"] = result.makespan * shape.ranks
    return out
