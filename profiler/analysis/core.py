"""Pipeline analyses of a trace: pure functions of the frames of :mod:`profiler.trace.reader`.

Conventions
-----------
* An *iteration window* spans the first task start to the last task end over
  all ranks; a rank's makespan is that window's length.
* A task's *ready time* is when its last input was available on its rank:
  a local prerequisite's end, or a remote one's arrival (the message handed
  to the executor). The prerequisites are those of ``hints.deps``, the one
  dependency model. ``F(0, i)`` is ready when its rank's iteration begins.

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
    :func:`dispatch_overhead`'s gaps): a rank needs that much to start any
    task, whichever rule it follows. In between, another task was ready but
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

import statistics
from dataclasses import dataclass, replace
from typing import Sequence

import polars as pl

from hints.errors import UserError
from hints.orders import HintOrder
from hints.tasks import LOOPING, PipelineShape, Task
from profiler.trace.reader import TraceFrames
from hints.deps import prerequisites
from runtime.durations.variability import Durations


def pipeline_shape(frames: TraceFrames) -> PipelineShape:
    meta = next(iter(frames.meta.values()), None)
    if meta is None:
        raise UserError("the trace has no rrfp metadata", frames.path)
    split = frames.tasks.filter(pl.col("kind").is_in(["I", "W"])).height > 0
    # Traces written before placement was recorded are all looping.
    return PipelineShape(int(meta["stages"]), int(meta["chunks"]), int(meta["microbatches"]), split,
                         meta.get("placement", LOOPING))


def traced_iterations(frames: TraceFrames) -> list[int]:
    return sorted(frames.tasks.get_column("iteration").unique().drop_nulls().to_list())


def ranges(values: Sequence[int]) -> str:
    """``[1, 2, 3, 7]`` as ``1..3, 7``."""
    runs: list[list[int]] = []
    for value in values:
        if runs and value == runs[-1][-1] + 1:
            runs[-1].append(value)
        else:
            runs.append([value])
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}..{run[-1]}" for run in runs)


def chosen_iterations(iterations: Sequence[int], window: tuple[int, int | None] | None) -> list[int]:
    """[Note: iteration 0] The iterations of ``iterations`` an analysis looks at: those in ``window`` (``(A, B)``:
    ``A..B-1``, ``B`` None for no end), by default every one but iteration 0 unless it is the only one."""
    if window is None:
        return [i for i in iterations if i != 0] or list(iterations)
    start, stop = window
    return [i for i in iterations if i >= start and (stop is None or i < stop)]


def select_iterations(frames: TraceFrames, window: tuple[int, int | None] | None = None,
                      flag: str = "--iterations") -> tuple[TraceFrames, list[str]]:
    """``frames`` cut to :func:`chosen_iterations` of its traced ones, and notes for the user.

    [Note: iteration 0]
        Iteration 0 pays one-off start-up costs (allocations, first
        communications, lazy initialisation), so every trace analysis leaves
        it out by default, as ``rrfp run``'s medians do; a trace of iteration
        0 alone is analysed whole, with a note. ``--iterations A:B`` (or
        ``-i N``) chooses. Counters are not cut.
    """
    traced = traced_iterations(frames)
    if not traced:
        return frames, []
    chosen = chosen_iterations(traced, window)
    if not chosen:
        start, stop = window
        raise UserError(f"no traced iteration in {start}:{'' if stop is None else stop} (traced: {ranges(traced)})",
                        flag)
    notes = ["only iteration 0 is traced; it includes start-up costs"] if window is None and chosen == [0] else []
    keep = pl.col("iteration").is_in(chosen)
    return replace(frames, tasks=frames.tasks.filter(keep), decisions=frames.decisions.filter(keep),
                   transfers=frames.transfers.filter(keep), iterations=frames.iterations.filter(keep),
                   steps=frames.steps.filter(keep), rendezvous=frames.rendezvous.filter(keep),
                   members=frames.members.filter(keep),
                   member_decisions=frames.member_decisions.filter(keep)), notes


def iteration_windows(frames: TraceFrames) -> pl.DataFrame:
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


# -- bubbles -------------------------------------------------------------------

BUBBLE_COLUMNS = ("fill_ns", "drain_ns", "step_ns", "rendezvous_ns", "dependency_ns", "budget_held_ns",
                  "dispatch_ns", "misalignment_ns")
_NEVER = float("inf")


def bubbles(frames: TraceFrames, dispatch_s: float | None = None) -> pl.DataFrame:
    """Per rank and iteration: busy time and the rest split by [Note: bubble categories].

    ``dispatch_s`` is the per-dispatch overhead (default: calibrated from ``frames``).
    """
    tasks = ready_times(frames)
    if tasks.height == 0:
        raise UserError("the trace holds no tasks", frames.path)
    dispatch_ns = _calibrated(tasks) if dispatch_s is None else dispatch_s * 1e9
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
    dispatch_ns = (_calibrated(tasks) if dispatch_s is None else dispatch_s * 1e9) if tasks.height else 0.0
    return _gaps(tasks, _held_back(frames), dispatch_ns, keep=True, rendezvous=_rendezvous_ends(frames))


def _integral(value):
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

    ``result`` is a :class:`runtime.sched.simulator.SimResult` run with ``record=True`` (the decisions say what
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


# -- hint conformance ------------------------------------------------------------


def conformance(frames: TraceFrames) -> pl.DataFrame:
    """Per rank and iteration: how far the executed order is from the hint.

    ``skips`` counts decisions that passed over the hint head; ``kendall_tau``
    compares the executed order with the hint order (1 = identical, -1 =
    reversed); ``max_displacement`` is the largest |executed position - hint
    position|.
    """
    hints = {(r, i): h.split() for r, i, h in frames.iterations.select("rank", "iteration", "hint").iter_rows()}
    skips = {(r, i): n for r, i, n in frames.decisions.group_by("rank", "iteration").agg(
        pl.col("skipped").is_not_null().sum()).iter_rows()}
    rows = []
    for (rank, iteration), group in frames.tasks.sort("start_ns").group_by(["rank", "iteration"],
                                                                           maintain_order=True):
        executed = group.get_column("task").to_list()
        hint = hints.get((rank, iteration))
        if not hint:
            continue
        position = {task: i for i, task in enumerate(hint)}
        ranks = [position[t] for t in executed if t in position]
        rows.append({"rank": rank, "iteration": iteration, "tasks": len(executed),
                     "skips": skips.get((rank, iteration), 0), "kendall_tau": kendall_tau(ranks),
                     "max_displacement": max((abs(i - r) for i, r in enumerate(ranks)), default=0)})
    return pl.DataFrame(rows, schema={"rank": pl.Int64, "iteration": pl.Int64, "tasks": pl.Int64,
                                      "skips": pl.Int64, "kendall_tau": pl.Float64,
                                      "max_displacement": pl.Int64}).sort("iteration", "rank")


def kendall_tau(sequence: Sequence[int]) -> float:
    """Kendall's tau between ``sequence`` and its sorted order, via an O(n log n) inversion count."""
    n = len(sequence)
    if n < 2:
        return 1.0
    inversions = _count_inversions(list(sequence))
    return 1.0 - 4.0 * inversions / (n * (n - 1))


def _count_inversions(values: list[int]) -> int:
    if len(values) < 2:
        return 0
    middle = len(values) // 2
    left, right = values[:middle], values[middle:]
    count = _count_inversions(left) + _count_inversions(right)
    i = j = k = 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            values[k] = left[i]
            i += 1
        else:
            values[k] = right[j]
            j += 1
            count += len(left) - i
        k += 1
    values[k:] = left[i:] + right[j:]
    return count


# -- critical path ---------------------------------------------------------------


@dataclass
class CriticalPath:
    iteration: int
    makespan_ns: int
    segments: pl.DataFrame  # kind (compute/transfer/wait), task, rank, start_ns, end_ns, duration_ns

    def shares(self) -> dict[str, float]:
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
        raise UserError(f"iteration {iteration} is not in the trace (traced: {iterations})", "--iteration")
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


# -- realized durations and dispatch overhead: what the simulator replays --------


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
    if shape.split_backward:
        table["B"] = [[table["I"][k][i] + table["W"][k][i] for i in range(m)] for k in range(stages)]
    latency = {}
    for producer, recv_end in frames.transfers.filter(
            (pl.col("iteration") == iteration) & pl.col("recv_end_ns").is_not_null()).select(
            "producer", "recv_end_ns").iter_rows():
        if producer in ends:
            latency[producer] = max(0.0, (recv_end - ends[producer]) * 1e-9)
    fill = statistics.median(latency.values()) if latency else 0.0
    backward = shape.upstream_backward.value
    measured: list[str] = []
    filled: list[str] = []

    def sent(text: str) -> float:
        if text in latency:
            measured.append(text)
            return latency[text]
        filled.append(text)
        return fill

    def sends(kind: str, step: int) -> list[list[float]]:
        """Latencies of ``kind``'s messages to stage ``k + step``; 0 where there is none or it stays on the rank."""
        rows = []
        for k in range(stages):
            consumer = k + step
            crosses = 0 <= consumer < stages and shape.rank_of(consumer) != shape.rank_of(k)
            rows.append([sent(f"{k}{kind}{i}") if crosses else 0.0 for i in range(m)])
        return rows

    send_forward = sends("F", +1)
    send_backward = sends(backward, -1)
    costs = [sum(table["F"][k][i] + table["B"][k][i] for k in range(stages)) for i in range(m)]
    durations = Durations(stages, m, table["F"], table["B"], send_forward, send_backward, costs,
                          input_grad=table["I"] if shape.split_backward else None,
                          weight_grad=table["W"] if shape.split_backward else None,
                          source=f"{frames.path} (iteration {iteration})")
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


def _calibrated(tasks: pl.DataFrame) -> float:
    """The median dispatch gap (ns) of ``tasks`` (with ready times), 0 when none is known."""
    gaps = _dispatch_gaps(tasks)
    return float(statistics.median(gaps)) if gaps else 0.0


# -- hint sensitivity -------------------------------------------------------------


def trace_hint(frames: TraceFrames, iteration: int) -> HintOrder:
    shape = pipeline_shape(frames)
    hints = {rank: hint for rank, hint in frames.iterations.filter(pl.col("iteration") == iteration).select(
        "rank", "hint").iter_rows()}
    missing = [rank for rank in range(shape.ranks) if not hints.get(rank)]
    if missing:
        raise UserError(f"iteration {iteration}: rank {missing[0]}'s iteration record (its hint order) is missing "
                        f"from the trace (cut short?); replay other iterations with --iterations", frames.path)
    orders = tuple(tuple(Task.parse(t) for t in hints[rank].split()) for rank in range(shape.ranks))
    name = next(iter(frames.meta.values())).get("hint", "trace")
    return HintOrder(shape, orders, f"{name} (traced)")


def traced_rule(frames: TraceFrames) -> str:
    """The arbiter rule the traced run used (traces older than the lookahead rule ran ``greedy``)."""
    meta = next(iter(frames.meta.values()))
    rule = meta.get("rule")
    if isinstance(rule, str):
        return rule
    return "fixed" if meta.get("policy", "fixed") == "fixed" else "greedy"


@dataclass
class Sensitivity:
    """The trace's realized durations replayed under its own hint and every built-in (see :func:`sensitivity`)."""

    iterations: list[int]
    overhead_s: float  # per-dispatch overhead used in every replay
    overhead: OverheadEstimate | None  # the calibration, when the overhead was not given
    measured_s: dict[int, float]  # iteration -> measured makespan
    replayed_s: dict[int, float]  # iteration -> the traced hint and rule replayed
    rows: list  # runtime.sched.evaluate.Row, medians over the iterations; the first is the traced hint
    budget: str
    baseline: str = "1f1b fixed"  # what speedups are over (runtime.sched.evaluate.Comparison.baseline)

    @property
    def errors(self) -> dict[int, float]:
        """Per iteration, (replayed - measured) / measured: how well the simulator reproduces the run."""
        return {i: (self.replayed_s[i] - m) / m for i, m in self.measured_s.items() if m > 0}

    def to_json(self) -> dict:
        own = self.rows[0].makespan
        return {
            "iterations": self.iterations, "memory_budget": self.budget, "baseline": self.baseline,
            "task_overhead_s": self.overhead_s,
            "overhead_calibration": None if self.overhead is None else {
                "median_s": self.overhead.per_task_s, "mean_s": self.overhead.mean_s,
                "samples": self.overhead.samples},
            "measured_makespan_s": statistics.median(self.measured_s.values()),
            "replay": [{"iteration": i, "measured_s": self.measured_s[i], "replayed_s": self.replayed_s[i],
                        "error": self.errors.get(i)} for i in self.iterations],
            "rows": [{**row.to_json(), "speedup_vs_traced": own / row.makespan if row.makespan else None}
                     for row in self.rows],
        }


def sensitivity(frames: TraceFrames, iterations: Sequence[int] | None = None,
                overhead: float | None = None) -> Sensitivity:
    """Replay the trace's realized durations and latencies under its own hint and every built-in.

    Each iteration's realized table (:func:`realized_durations`) is replayed
    by ``runtime.sched.evaluate.compare``: the traced hint under the traced rule
    first, then every built-in (``bfw`` and ``cp`` from the table's
    per-(stage, kind) means: no oracle) under fixed, ready and ready with
    lookahead, at the traced memory budget. Every replay adds ``overhead``
    seconds per dispatched task; by default it is calibrated from the trace
    itself (:func:`dispatch_overhead`), which is what lets the traced hint's
    replay reproduce each measured iteration. Figures are medians over
    ``iterations`` (default: every complete iteration whose hint every rank
    recorded; the CLI has left iteration 0 out by then, [Note: iteration 0]).
    """
    from runtime.sched.budget import MemoryBudget
    from runtime.sched.evaluate import builtin_candidates, compare, median_rows

    meta = next(iter(frames.meta.values()))
    budget = MemoryBudget.parse(meta.get("memory_budget", "1f1b"))
    complete = complete_iterations(frames)
    if iterations is None:
        iterations = replayable_iterations(frames, complete)
    iterations = list(iterations)
    incomplete = [i for i in iterations if i not in complete]
    if incomplete:
        raise UserError(f"iteration {incomplete[0]} is not a complete traced iteration "
                        f"(complete: {', '.join(map(str, complete))})", "--iterations")
    calibration = None
    if overhead is None:
        calibration = dispatch_overhead(frames, iterations)
        overhead = calibration.per_task_s
    measured = {row[0]: row[1] * 1e-9 for row in iteration_windows(frames).select(
        "iteration", "makespan_ns").iter_rows()}
    rule = traced_rule(frames)
    p2p = meta.get("p2p", "async")  # traces older than --p2p ran async
    own_name = f"(traced) {meta.get('hint', '')}"
    comparisons = []
    for it in iterations:
        table = realized_durations(frames, it)
        hints = {own_name: trace_hint(frames, it), **builtin_candidates(pipeline_shape(frames), table)}
        comparisons.append(compare(hints, table, budget, overhead=overhead, own=(own_name, rule), own_p2p=p2p))
    rows = median_rows(comparisons)
    rows.sort(key=lambda r: r.hint != own_name)  # the traced hint first, then the built-ins in order
    # A replay's makespan counts the first dispatch (its first task starts at `overhead`); a traced
    # iteration's window starts at its first task.
    replayed = {it: c.row(own_name, rule, p2p).makespan - overhead for it, c in zip(iterations, comparisons)}
    return Sensitivity(iterations, overhead, calibration, {i: measured[i] for i in iterations}, replayed, rows,
                       str(budget), comparisons[0].baseline)


def replayable_iterations(frames: TraceFrames, complete: Sequence[int]) -> list[int]:
    """Those of ``complete`` whose hint order every rank recorded (its iteration slice ended)."""
    ranks = pipeline_shape(frames).ranks
    recorded = dict(frames.iterations.group_by("iteration").agg(pl.col("rank").n_unique()).iter_rows())
    replayable = [i for i in complete if recorded.get(i, 0) == ranks]
    if not replayable:
        trace_hint(frames, complete[0])  # says which rank's record is missing
    return replayable


def complete_iterations(frames: TraceFrames) -> list[int]:
    shape = pipeline_shape(frames)
    counts = frames.tasks.group_by("iteration").len()
    complete = sorted(i for i, n in counts.iter_rows() if n == shape.total_tasks)
    if not complete:
        raise UserError("no complete iteration in the trace", frames.path)
    return complete


# -- summary and comparison ---------------------------------------------------------


def summary(frames: TraceFrames) -> dict:
    meta = next(iter(frames.meta.values()))
    windows = iteration_windows(frames)
    totals = bubble_totals(bubbles(frames)).filter(pl.col("rank") == "all").row(0, named=True)
    agreement = conformance(frames)
    makespans = windows.get_column("makespan_ns").to_list()
    idle = totals["makespan_ns"] - totals["busy_ns"]
    return {
        "trace": frames.path,
        "job": meta.get("job"),
        "workload": meta.get("workload"),
        "shape": pipeline_shape(frames).describe(),
        "policy": meta.get("policy"),
        "p2p": meta.get("p2p", "async"),  # traces older than --p2p ran async
        "hint": meta.get("hint"),
        "memory_budget": meta.get("memory_budget"),
        "timing": meta.get("timing"),
        "grid": f"tp {meta['tp']} x dp {meta['dp']} (analyses read the TP leaders of replica 0)"
        if "tp" in meta else None,
        "ranks": frames.ranks,
        "iterations": len(makespans),
        "iteration_numbers": traced_iterations(frames),
        "median_makespan_s": statistics.median(makespans) * 1e-9 if makespans else None,
        "utilization": totals["utilization"],
        "idle_share": {name.removesuffix("_ns"): (totals[name] / idle if idle else 0.0) for name in BUBBLE_COLUMNS},
        "skips": int(agreement.get_column("skips").sum()) if agreement.height else 0,
        "mean_kendall_tau": agreement.get_column("kendall_tau").mean() if agreement.height else None,
        "max_clock_error_ns": max(int(m.get("clock_error_ns", 0)) for m in frames.meta.values()),
        "warnings": frames.warnings,
    }


def follow_latency(frames: TraceFrames) -> tuple[pl.DataFrame, pl.DataFrame]:
    """TP coordination ([Note: TP coordination] in runtime.exec.tp), from every rank's decisions.

    Returns ``(per_decision, per_rank)``. Per follower decision: ``follow_ns`` (the follower started the task
    this long after its leader decided it), ``delivery_ns`` (until the DECISION arrived) and ``after_arrival_ns``
    (from its arrival to the start: the follower's own inputs, or a task still running). Per rank: the
    medians and 90th percentiles of those on followers, and on leaders the time spent posting decisions
    (``announce``), also as a share of the median iteration makespan. Empty frames for a trace without TP.
    """
    decisions = frames.member_decisions.filter(pl.col("index").is_not_null())
    per_decision = (decisions.filter(pl.col("tp_rank") > 0)
                    .select("rank", "pipe_rank", "tp_rank", "dp_rank", "iteration", "index", "chosen",
                            (pl.col("time_ns") - pl.col("leader_ns")).alias("follow_ns"),
                            (pl.col("decision_arrived_ns") - pl.col("leader_ns")).alias("delivery_ns"),
                            (pl.col("time_ns") - pl.col("decision_arrived_ns")).alias("after_arrival_ns"))
                    .sort("iteration", "pipe_rank", "index", "rank"))
    makespans = iteration_windows(frames).get_column("makespan_ns").to_list()
    makespan = statistics.median(makespans) if makespans else None
    iterations = max(1, decisions.get_column("iteration").n_unique())
    lag = _input_lag(frames)
    rows = []
    for (rank,), group in decisions.group_by(["rank"], maintain_order=True):
        first = group.row(0, named=True)
        row = {"rank": rank, "stage_rank": first["pipe_rank"], "tp_rank": first["tp_rank"],
               "dp_rank": first["dp_rank"], "decisions": group.height}
        if first["tp_rank"] == 0:
            announce = group.get_column("announce_ns")
            per_iteration = announce.sum() / iterations
            row.update(announce_us=announce.median() / 1e3, announce_p90_us=announce.quantile(0.9) / 1e3,
                       announce_share=per_iteration / makespan if makespan else None)
        else:
            mine = per_decision.filter(pl.col("rank") == rank)
            for name in ("follow", "delivery", "after_arrival"):
                column = mine.get_column(f"{name}_ns")
                row[f"{name}_us"] = column.median() / 1e3
                if name == "follow":
                    row["follow_p90_us"] = column.quantile(0.9) / 1e3
            row["input_lag_us"] = lag.get(rank)
        rows.append(row)
    columns = {"rank": pl.Int64, "stage_rank": pl.Int64, "tp_rank": pl.Int64, "dp_rank": pl.Int64,
               "decisions": pl.Int64, "announce_us": pl.Float64, "announce_p90_us": pl.Float64,
               "announce_share": pl.Float64, "follow_us": pl.Float64, "follow_p90_us": pl.Float64,
               "delivery_us": pl.Float64, "after_arrival_us": pl.Float64, "input_lag_us": pl.Float64}
    per_rank = pl.DataFrame(rows, schema=columns) if rows else pl.DataFrame(schema=columns)
    return per_decision, per_rank.sort("dp_rank", "stage_rank", "tp_rank")


def _input_lag(frames: TraceFrames) -> dict[int, float]:
    """Per follower rank: the median of (its copy of an input arrived) - (its leader's copy arrived), in us.

    [Note: every member receives its own inputs] in runtime.exec.tp: were the leader to receive alone and
    forward, a follower's input would come one transport hop after the leader's; this says how the own
    copies compare (negative: before the leader's).
    """
    transfers = frames.member_transfers.filter(pl.col("recv_end_ns").is_not_null())
    if not transfers.height:
        return {}
    grid = {rank: (m.get("pipe_rank", rank), m.get("tp_rank", 0), m.get("dp_rank", 0))
            for rank, m in frames.member_meta.items()}
    leader_of = {rank: next((r for r, g in grid.items() if g[0] == pipe and g[1] == 0 and g[2] == dp), None)
                 for rank, (pipe, tp, dp) in grid.items() if tp > 0}
    arrivals = {(row[0], row[1], row[2]): row[3]
                for row in transfers.select("dst", "iteration", "producer", "recv_end_ns").iter_rows()}
    lags: dict[int, list[int]] = {}
    for (dst, iteration, producer), arrived in arrivals.items():
        leader = leader_of.get(dst)
        theirs = arrivals.get((leader, iteration, producer)) if leader is not None else None
        if theirs is not None:
            lags.setdefault(dst, []).append(arrived - theirs)
    return {rank: statistics.median(values) / 1e3 for rank, values in lags.items()}


def compare(a: TraceFrames, b: TraceFrames) -> pl.DataFrame:
    """Two runs side by side: makespan, utilization and the bubble breakdown (seconds per iteration)."""
    rows = []
    for label, frames in (("A", a), ("B", b)):
        totals = bubble_totals(bubbles(frames)).filter(pl.col("rank") == "all").row(0, named=True)
        iterations = len(traced_iterations(frames))
        ranks = frames.ranks
        row = {"run": label, "trace": frames.path, "iterations": ranges(traced_iterations(frames)),
               "median_makespan_s": summary(frames)["median_makespan_s"],
               "utilization": totals["utilization"]}
        for name in BUBBLE_COLUMNS:
            row[name.replace("_ns", "_s")] = totals[name] * 1e-9 / max(1, iterations * ranks)
        rows.append(row)
    frame = pl.DataFrame(rows)
    speedup = rows[0]["median_makespan_s"] / rows[1]["median_makespan_s"]
    return frame.with_columns(pl.Series("speedup_vs_A", [1.0, speedup]))
