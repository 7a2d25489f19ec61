"""Hint sensitivity by replay: a trace's realized iterations run through the simulator under other hints.

:func:`sensitivity` replays each iteration's realized durations (:mod:`profiler.analysis.realized`) under the
traced hint and rule (:func:`trace_hint`, :func:`traced_rule`) and every built-in, with the calibrated dispatch
overhead; the traced hint's replay against the measured window is the test of how well the simulator models
the run. ``runtime.sched`` is imported when a replay runs, not with this module.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

import polars as pl

from hints.errors import UserError
from hints.orders import HintOrder
from hints.tasks import Task
from profiler.analysis.realized import OverheadEstimate, dispatch_overhead, realized_durations
from profiler.analysis.windows import complete_iterations, iteration_windows, pipeline_shape
from profiler.trace.reader import TraceFrames


def trace_hint(frames: TraceFrames, iteration: int) -> HintOrder:
    """The hint order every rank recorded for ``iteration``, as a hint named after the traced one."""
    shape = pipeline_shape(frames)
    hints = {rank: hint for rank, hint in frames.iterations.filter(pl.col("iteration") == iteration).select(
        "rank", "hint").iter_rows()}
    missing = [rank for rank in range(shape.ranks) if not hints.get(rank)]
    if missing:
        raise UserError(f"iteration {iteration}: rank {missing[0]}'s iteration record (its hint order) is missing "
                        f"from the trace (cut short?); replay other iterations with `iterations`", frames.path)
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
            "credit": self.credit.to_json(),
        }

    @property
    def credit(self):
        """The fastest fixed order and ready run within the budget ([Note: the best fixed order at equal
        memory] in runtime.sched.baselines), on the median rows."""
        from runtime.sched.evaluate import credit

        return credit(self.rows)


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
                        f"(complete: {', '.join(map(str, complete))})", "`iterations`")
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
        hints = {own_name: trace_hint(frames, it), **builtin_candidates(pipeline_shape(frames), table, budget)}
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
