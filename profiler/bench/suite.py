"""``rrfp bench``: the headline comparisons as one matrix, run side by side, written as one results folder.

What this module owns: the matrix (:data:`MATRIX_ROWS`, :data:`WORKLOADS`,
:data:`RANKS`, :data:`BUDGETS`: tables of data, so a baseline or a workload
preset is one line), its evaluation in the simulator, the variability sweep,
the bubble breakdown by cause, the paper's headline rows, and the results
folder (JSON, Markdown, plots, a section for BENCHMARKS.md). The real runs
(``rrfp run`` jobs and torch's schedules through
``benchmarks/cross_framework.py``) are in :mod:`profiler.bench.runs`; the
command line in :mod:`rrfp_cli.cmd_bench`.

Conventions
-----------
* A *cell* is one workload x rank count x memory budget; ``m = 4p``
  microbatches (:data:`MICROBATCHES_PER_RANK`). Each cell is simulated on
  ``seeds x iterations`` sampled tables: table ``(seed s, iteration i)`` is
  ``sample_durations(model, shape, 1000 * s + i)``. Every figure is the
  median over the tables, with p10..p90 and min..max beside it.
* Speedups are per table (fixed 1F1B's makespan over the row's on the same
  table), then summarized. The ready rows use the default rule of
  ``--policy ready`` (lookahead).
* Fixed orders ignore the budget; a cell's budget applies to the ready rows.
* A split backward (the zb rows) costs each workload's measured ``(I + W) / B``
  ([Note: split backward cost by preset] in :mod:`runtime.durations.presets`: 1.57 for
  the language presets, 1.65 for the vision-language ones, 1.0 for
  ``uniform``) unless ``--split-overhead`` sets one figure for all.

[Note: honest credit]
    A speedup over fixed 1F1B mixes what a hint's structure gives (its
    order, a split backward, more memory) with what readiness adds. Every
    ready row therefore also carries the same hint in fixed order on the
    same tables: its speedup, ready-X over fixed-X, and both peaks in
    flight, with whether fixed-X stayed within the budget (when it did not,
    ready-X over fixed-X is not at equal memory and is marked ``*``).
    *Peak in flight* is the most microbatches any rank held activations
    for: microbatch-chunks over the chunks per rank, so an interleaved
    order with 2 chunks per rank counts each chunk as half a microbatch.

[Note: rows that need an option]
    A row may not run in every cell (the tuned row: a search budget, and
    at most TUNE_MAX_RANKS ranks). :func:`row_unavailable` says why a row cannot run;
    the suite prints that and lists it under ``skipped`` in the results,
    never dropping a row silently.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from hints.errors import UserError
from hints.tasks import PipelineShape
from profiler.trace.schema import write_atomically

SCHEMA = "rrfp-bench/1"

# -- the matrix (data) ----------------------------------------------------------------------------

# The workload presets the suite runs (names VariabilityModel(workload=...) accepts; docs/workloads.md).
WORKLOADS: tuple[str, ...] = ("uniform", "pretrain-packed", "sft-chat", "vlm-mixed", "vlm-video", "legacy-language",
                              "legacy-multimodal")
QUICK_WORKLOADS: tuple[str, ...] = ("sft-chat", "vlm-mixed")
# Which of the paper's settings a workload preset stands for (for the gap sentences); None: no counterpart.
PAPER_KIND: dict[str, str | None] = {
    "uniform": None, "language": "language", "multimodal": "multimodal",
    "legacy-language": "language", "legacy-multimodal": "multimodal", "pretrain-packed": "language",
    "sft-chat": "language", "vlm-mixed": "multimodal", "vlm-video": "multimodal",
}
RANKS: tuple[int, ...] = (8, 16, 32, 64, 128)
QUICK_RANKS: tuple[int, ...] = (8, 16, 32)
BUDGETS: tuple[str, ...] = ("1f1b", "2x")
MICROBATCHES_PER_RANK = 4
JITTER = 0.1  # lognormal task noise on top of each workload's own variability
VARIABILITY_JITTERS: tuple[float, ...] = (0.0, 0.1, 0.2, 0.4)
TUNE_MAX_RANKS = 32  # above this the search's cost per scenario makes a tuned row too slow for a suite

BASELINE_ROW = "fixed-1f1b"
TUNED = "tuned"  # a MatrixRow.hint: the hint rrfp tune-hint's library entry point picks for the cell


@dataclass(frozen=True)
class MatrixRow:
    """One way to run a cell: a hint under a rule (``runtime.sched.arbiter.RULES``), maybe with an option."""

    name: str
    hint: str  # a built-in hint, or TUNED
    rule: str  # "fixed" or "lookahead" (ready, the default rule); a tuned row uses the tuner's rule
    chunks: int = 1
    p2p: str | None = None  # "blocking": Megatron-style fixed baseline ([Note: rows that need an option])
    about: str = ""

    @property
    def ready(self) -> bool:
        return self.rule != "fixed"


MATRIX_ROWS: tuple[MatrixRow, ...] = (
    MatrixRow("fixed-1f1b", "1f1b", "fixed", about="fixed-order 1F1B, asynchronous p2p: the baseline"),
    MatrixRow("fixed-1f1b-blocking", "1f1b", "fixed", p2p="blocking",
              about="fixed-order 1F1B with blocking p2p (Megatron-style)"),
    MatrixRow("fixed-interleaved", "interleaved-1f1b", "fixed", chunks=2,
              about="fixed-order interleaved 1F1B, 2 chunks per rank"),
    MatrixRow("fixed-zb", "zb", "fixed", about="fixed-order zero bubble (split backward)"),
    MatrixRow("ready-1f1b", "1f1b", "lookahead", about="readiness-first, 1f1b hint"),
    MatrixRow("ready-bf", "bf", "lookahead", about="readiness-first, bf hint (breadth first)"),
    MatrixRow("ready-bfw", "bfw", "lookahead", about="readiness-first, bfw hint (heaviest microbatch first)"),
    MatrixRow("ready-zb", "zb", "lookahead", about="readiness-first, zb hint"),
    MatrixRow("ready-cp", "cp", "lookahead", about="readiness-first, cp hint (critical path first)"),
    MatrixRow("ready-tuned", TUNED, "lookahead", about="readiness-first, the hint and rule tune-hint picks"),
)


@dataclass(frozen=True)
class PaperRow:
    """A headline setting of the RRFP paper (arXiv 2605.18750), cited, against our row at its rank count."""

    setting: str
    kind: str  # "language" or "multimodal": which of our workloads the gap sentence speaks of
    row: str  # our MatrixRow name, or "external" for the torch comparison of the real runs
    ranks: int
    paper: float
    cited: str


PAPER_ROWS: tuple[PaperRow, ...] = (
    PaperRow("language-only, 128 stages, BF hint vs fixed 1F1B", "language", "ready-bf", 128, 1.77,
             "up to 1.77x (language, 128 GPUs)"),
    PaperRow("language-only, 128 stages, BFW hint vs fixed 1F1B", "language", "ready-bfw", 128, 1.77,
             "up to 1.77x (language, 128 GPUs)"),
    PaperRow("multimodal, 128 stages, BF hint vs fixed 1F1B", "multimodal", "ready-bf", 128, 2.77,
             "up to 2.77x (multimodal, 128 GPUs)"),
    PaperRow("multimodal, 128 stages, BFW hint vs fixed 1F1B", "multimodal", "ready-bfw", 128, 2.77,
             "up to 2.77x (multimodal, 128 GPUs)"),
    PaperRow("readiness (BF hint) vs a faster external system", "multimodal", "external", 0, 1.84,
             "1.84x over the external system with its default BF hint"),
)


@dataclass(frozen=True)
class Settings:
    """One suite run: what to simulate and what to run for real."""

    workloads: tuple[str, ...] = WORKLOADS
    ranks: tuple[int, ...] = RANKS
    budgets: tuple[str, ...] = BUDGETS
    seeds: int = 3
    iterations: int = 2
    seed: int = 0
    jitter: float = JITTER
    variability_jitters: tuple[float, ...] = VARIABILITY_JITTERS
    variability_ranks: int = 32
    bubble_ranks: int = 32
    tune_seconds: float = 10.0
    split_overhead: float | None = None  # None: each workload's own (runtime.durations.presets.SPLIT_OVERHEAD)
    real: bool = True
    external: bool = True
    quick: bool = False

    @classmethod
    def quick_defaults(cls) -> "Settings":
        return cls(workloads=QUICK_WORKLOADS, ranks=QUICK_RANKS, seeds=2, iterations=1, variability_ranks=16,
                   bubble_ranks=16, tune_seconds=2.0, quick=True)

    @property
    def tables(self) -> list[tuple[int, int]]:
        """The ``(seed, iteration)`` of every table a cell is simulated on."""
        return [(self.seed + s, i) for s in range(self.seeds) for i in range(self.iterations)]


def check_settings(settings: Settings) -> None:
    """Bad input as one :class:`UserError` before anything runs."""
    from runtime.sched.arbiter import MemoryBudget
    from runtime.durations.variability import WORKLOADS as KNOWN

    for name in settings.workloads:
        if name not in KNOWN:
            raise UserError(f"unknown workload {name!r}; choose from {', '.join(KNOWN)}", "--workloads")
    if not settings.workloads:
        raise UserError("give at least one workload", "--workloads")
    if not settings.ranks or any(r < 2 for r in settings.ranks):
        raise UserError(f"every rank count must be at least 2, got {list(settings.ranks)}", "--ranks")
    if not settings.budgets:
        raise UserError("give at least one budget, e.g. 1f1b,2x", "--budgets")
    chunks = max(row.chunks for row in MATRIX_ROWS)
    for ranks in settings.ranks:  # a budget too small for some cell is refused now, not at that cell
        shape = PipelineShape(ranks, chunks, MICROBATCHES_PER_RANK * ranks)
        for budget in settings.budgets:
            MemoryBudget.parse(budget).per_rank(shape)
    if settings.seeds < 1 or settings.iterations < 1:
        raise UserError("need at least one seed and one iteration", "--seeds")
    if settings.jitter < 0 or any(j < 0 for j in settings.variability_jitters):
        raise UserError("jitter must be >= 0", "--jitter")
    if settings.tune_seconds < 0:
        raise UserError("must be >= 0 (0 skips the tuned row)", "--tune-seconds")
    if settings.split_overhead is not None:
        from runtime.durations.variability import check_split_overhead

        check_split_overhead(settings.split_overhead, "--split-overhead")


def parse_ranks(text: str) -> tuple[int, ...]:
    """``8,16,32`` -> ``(8, 16, 32)``; one ``error:`` line otherwise."""
    try:
        ranks = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UserError(f"{text!r} is not a comma-separated list of integers, e.g. 8,16,32", "--ranks") from None
    if not ranks or any(r < 2 for r in ranks):
        raise UserError(f"{text!r}: give rank counts of at least 2, e.g. 8,16,32", "--ranks")
    return tuple(sorted(set(ranks)))


# -- rows that need an option -----------------------------------------------------------------------


def row_unavailable(row: MatrixRow, settings: Settings, ranks: int | None = None) -> str | None:
    """Why ``row`` cannot run here (printed and recorded), or None."""
    if row.hint == TUNED:
        if settings.tune_seconds <= 0:
            return "--tune-seconds 0"
        if ranks is not None and ranks > TUNE_MAX_RANKS:
            return f"tuning runs up to {TUNE_MAX_RANKS} ranks (profiler.bench.suite.TUNE_MAX_RANKS)"
    return None


def _simulate_kwargs(row: MatrixRow) -> dict:
    """Options a row passes to ``runtime.sched.simulator.simulate`` ([Note: rows that need an option])."""
    return {"p2p": row.p2p} if row.p2p is not None else {}


# -- summaries ------------------------------------------------------------------------------------


def quantile(values: Sequence[float], level: float) -> float:
    ordered = sorted(values)
    position = level * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spread(values: Sequence[float | None]) -> dict | None:
    """Median, p10, p90, min, max and count of the finite values (None when there are none)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None
    return {"median": statistics.median(finite), "p10": quantile(finite, 0.1), "p90": quantile(finite, 0.9),
            "min": min(finite), "max": max(finite), "n": len(finite)}


# -- one cell -------------------------------------------------------------------------------------


@dataclass
class Tuned:
    """What the tuner picked for one (workload, ranks, budget): a hint and a rule, and why."""

    candidate: Any  # runtime.tune.evaluator.Candidate
    label: str
    kept: bool
    reason: str


def tune_cell(workload: str, ranks: int, budget: str, settings: Settings) -> Tuned:
    """rrfp tune-hint's library entry point on model scenarios (seeds disjoint from the tables')."""
    from runtime.tune.scenarios import from_model
    from runtime.tune.decide import tune
    from runtime.tune.evaluator import Objective
    from runtime.durations.variability import VariabilityModel

    shape = PipelineShape(ranks, 1, MICROBATCHES_PER_RANK * ranks)
    model = VariabilityModel(workload=workload, jitter=settings.jitter, split_overhead=settings.split_overhead)
    scenarios = from_model(model, shape, 8, 8, settings.seed)
    outcome = tune(scenarios, "ready", budget, Objective.parse("mean"), settings.tune_seconds, 1, settings.seed)
    chosen = outcome.verdict.chosen.candidate
    return Tuned(chosen, chosen.label, outcome.verdict.tuned_kept, outcome.verdict.reason)


def _hint_for(row: MatrixRow, shape: PipelineShape, table, tuned: Tuned | None):
    from runtime.sched.evaluate import concrete, resolve

    if row.hint == TUNED:
        candidate = tuned.candidate
        if candidate.hint is not None:
            return concrete(candidate.hint, table)
        return resolve(candidate.builtin, shape.ranks, shape.chunks, shape.microbatches, table)
    return resolve(row.hint, shape.ranks, shape.chunks, shape.microbatches, table)


def simulate_table(workload: str, ranks: int, jitter: float, table_seed: int, rows: Sequence[MatrixRow],
                   budgets: Sequence[str], tuned: dict[str, Tuned] | None = None,
                   bubbles: bool = False, split_overhead: float | None = None) -> dict:
    """Every row of ``rows`` on one sampled table, at every budget.

    Returns ``{"bound": {chunks: seconds}, "cost_spread": cv, "runs": {(row, budget): run}}`` where a run
    holds ``makespan``, ``peak`` (microbatches, max over ranks), ``within`` (every rank within the
    budget's slots), and for ready rows ``fixed_makespan``, ``fixed_peak``, ``fixed_within`` of the same
    hint in fixed order (None if that order cannot complete); with ``bubbles`` also ``bubbles`` (seconds
    by cause, :func:`profiler.analysis.bubbles.simulated_bubbles`).
    """
    from runtime.sched.arbiter import MemoryBudget
    from runtime.sched.bounds import split_bound
    from hints.deps import TaskGraph
    from runtime.sched.simulator import ScheduleDeadlock, simulate
    from runtime.durations.variability import VariabilityModel, sample_durations

    m = MICROBATCHES_PER_RANK * ranks
    model = VariabilityModel(workload=workload, jitter=jitter, split_overhead=split_overhead)
    tables, bounds, graphs = {}, {}, {}
    base_shape = PipelineShape(ranks, 1, m)
    slots = {budget: MemoryBudget.parse(budget).per_rank(base_shape) for budget in budgets}

    def table_for(chunks: int):
        if chunks not in tables:
            shape = PipelineShape(ranks, chunks, m)
            tables[chunks] = sample_durations(model, shape, table_seed)
            bounds[chunks] = split_bound(shape, tables[chunks]).value
        return tables[chunks]

    hints: dict = {}
    cache: dict = {}

    def run(row: MatrixRow, rule: str, budget: str) -> dict | None:
        """One simulation; fixed orders ignore the budget, so each runs once for all budgets."""
        hint_budget = budget if row.hint == TUNED else None  # the tuner picks per budget
        key = (row.hint, row.chunks, row.p2p, rule, hint_budget, budget if rule != "fixed" else None)
        if key in cache:
            return cache[key]
        shape = PipelineShape(ranks, row.chunks, m)
        table = table_for(row.chunks)
        hint_key = (row.hint, row.chunks, hint_budget)
        if hint_key not in hints:
            hints[hint_key] = _hint_for(row, shape, table, (tuned or {}).get(budget))
        hint = hints[hint_key]
        if hint.shape not in graphs:
            graphs[hint.shape] = TaskGraph.build(hint.shape)
        graph = graphs[hint.shape]
        breakdown = bubbles and row.p2p is None  # a blocking replay records no decisions: no breakdown for it
        try:
            result = simulate(hint, table, rule, MemoryBudget.parse(budget), record=breakdown, graph=graph,
                              **_simulate_kwargs(row))
        except ScheduleDeadlock:
            cache[key] = None
            return None
        peaks = [peak / row.chunks for peak in result.peak_in_flight]
        out = {"makespan": result.makespan, "peak": max(peaks), "peaks": peaks, "bound": bounds[row.chunks],
               "rule": rule}
        if breakdown:
            from profiler.analysis.bubbles import simulated_bubbles

            out["bubbles"] = simulated_bubbles(result, table.for_graph(graph)[1])
        cache[key] = out
        return out

    def within(peaks: list[float], budget: str) -> bool:
        return all(peak <= slot for peak, slot in zip(peaks, slots[budget]))

    runs: dict[tuple[str, str], dict] = {}
    for budget in budgets:
        for row in rows:
            rule = tuned[budget].candidate.rule if row.hint == TUNED else row.rule
            result = run(row, rule, budget)
            if result is None:
                continue
            result = {k: v for k, v in result.items() if k != "peaks"} | {"within": within(result["peaks"], budget)}
            if row.ready or row.hint == TUNED:
                fixed = run(row, "fixed", budget) if rule != "fixed" else run(row, rule, budget)
                result.update(fixed_makespan=fixed and fixed["makespan"], fixed_peak=fixed and fixed["peak"],
                              fixed_within=fixed and within(fixed["peaks"], budget))
            if bubbles and "bubbles" in result:
                result["bubbles"] = dict(result["bubbles"])
            runs[(row.name, budget)] = result
    costs = _cost_spread(table_for(1))
    return {"bound": bounds, "cost_spread": costs, "runs": runs}


def _cost_spread(table) -> float:
    """The cost spread: per model stage, the coefficient of variation of its forward time across microbatches,
    averaged over the stages (what the workload's contents and the jitter make a task vary by)."""
    from runtime.durations.variability import coefficient_of_variation

    return statistics.fmean(coefficient_of_variation(row) for row in table.forward)


def summarize_cell(workload: str, ranks: int, budget: str, per_table: Sequence[dict], rows: Sequence[MatrixRow],
                   tuned: Tuned | None, jitter: float) -> dict:
    """One cell's figures over its tables ([Note: honest credit])."""
    base = [t["runs"].get((BASELINE_ROW, budget), {}).get("makespan") for t in per_table]
    out_rows = []
    for row in rows:
        runs = [t["runs"].get((row.name, budget)) for t in per_table]
        if not any(runs):
            continue

        def ratio(top, bottom):
            return [a / b if a and b else None for a, b in zip(top, bottom)]

        makespans = [r["makespan"] if r else None for r in runs]
        entry = {
            "row": row.name, "hint": row.hint if row.hint != TUNED else tuned.label, "rule": runs[0]["rule"]
            if runs[0] else row.rule, "chunks": row.chunks, "makespan_s": spread(makespans),
            "speedup_vs_fixed_1f1b": spread(ratio(base, makespans)),
            "makespan_over_bound": spread([r["makespan"] / r["bound"] if r else None for r in runs]),
            "peak_in_flight": max(r["peak"] for r in runs if r), "within_budget": all(r["within"] for r in runs if r),
        }
        if row.ready or row.hint == TUNED:
            fixed = [r.get("fixed_makespan") if r else None for r in runs]
            entry.update({
                "fixed_same_hint_speedup": spread(ratio(base, fixed)),
                "ready_over_fixed_same_hint": spread(ratio(fixed, makespans)),
                "fixed_same_hint_peak_in_flight": max((r["fixed_peak"] for r in runs if r and r["fixed_peak"]),
                                                      default=None),
                "fixed_same_hint_within_budget": all(r["fixed_within"] for r in runs if r and r["fixed_within"]
                                                     is not None) if any(r and r["fixed_within"] is not None
                                                                         for r in runs) else None,
            })
        if row.hint == TUNED:
            entry["tuned"] = {"picked": tuned.label, "kept_over_built_ins": tuned.kept, "reason": tuned.reason}
        out_rows.append(entry)
    return {"workload": workload, "ranks": ranks, "microbatches": MICROBATCHES_PER_RANK * ranks, "budget": budget,
            "jitter": jitter, "tables": len(per_table),
            "lower_bound_s": spread([t["bound"][1] for t in per_table]),
            "cost_spread": spread([t["cost_spread"] for t in per_table]), "rows": out_rows}


# -- the suite ------------------------------------------------------------------------------------


Progress = Callable[[int, str], None]  # (units done so far, what is running now)


@dataclass
class Suite:
    """The state of one run: what finished, written to ``out`` after every step ([Note: keep what finished])."""

    settings: Settings
    out: Path
    command: str
    results: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def note(self, message: str) -> None:
        if message not in self.notes:
            self.notes.append(message)


def simulation_units(settings: Settings) -> int:
    """Progress units of the simulated part: one per table of every cell (all budgets at once)."""
    matrix = len(settings.workloads) * len(settings.ranks) * len(settings.tables)
    sweep = len(settings.workloads) * len(settings.variability_jitters) * len(settings.tables)
    return matrix + sweep + len(settings.workloads)  # + one bubble table per workload


def active_rows(settings: Settings, ranks: int, suite: Suite) -> list[MatrixRow]:
    rows = []
    for row in MATRIX_ROWS:
        why = row_unavailable(row, settings, ranks)
        if why is None:
            rows.append(row)
        else:
            suite.note(f"row {row.name} skipped at {ranks} ranks: {why}" if row.hint == TUNED and settings.tune_seconds > 0
                       else f"row {row.name} skipped: {why}")
    return rows


def run_simulation(suite: Suite, progress: Progress, done: int = 0) -> int:
    """The matrix, the variability sweep and the bubble breakdown; results saved after every cell."""
    settings = suite.settings
    sim = suite.results.setdefault("simulation", {"cells": [], "variability": [], "bubbles": []})
    for workload in settings.workloads:
        for ranks in settings.ranks:
            rows = active_rows(settings, ranks, suite)
            tuned = None
            if any(r.hint == TUNED for r in rows):
                progress(done, f"tuning {workload} x {ranks} ranks")
                tuned = {budget: tune_cell(workload, ranks, budget, settings) for budget in settings.budgets}
            per_table = []
            for seed, iteration in settings.tables:
                progress(done, f"{workload} x {ranks} ranks, seed {seed} iteration {iteration}")
                per_table.append(simulate_table(workload, ranks, settings.jitter, 1000 * seed + iteration, rows,
                                                settings.budgets, tuned, split_overhead=settings.split_overhead))
                done += 1
            for budget in settings.budgets:
                sim["cells"].append(summarize_cell(workload, ranks, budget, per_table, rows,
                                                   tuned[budget] if tuned else None, settings.jitter))
            save(suite)
    for workload in settings.workloads:
        ranks = settings.variability_ranks
        rows = [r for r in active_rows(settings, ranks, suite) if r.hint != TUNED]
        for jitter in settings.variability_jitters:
            per_table = []
            for seed, iteration in settings.tables:
                progress(done, f"variability: {workload}, jitter {jitter:g}")
                per_table.append(simulate_table(workload, ranks, jitter, 1000 * seed + iteration, rows,
                                                settings.budgets, split_overhead=settings.split_overhead))
                done += 1
            for budget in settings.budgets:
                sim["variability"].append(summarize_cell(workload, ranks, budget, per_table, rows, None, jitter))
        save(suite)
    for workload in settings.workloads:
        ranks = settings.bubble_ranks
        rows = [r for r in active_rows(settings, ranks, suite) if r.hint != TUNED]
        seed, iteration = settings.tables[0]
        progress(done, f"bubbles: {workload}, {ranks} ranks")
        table = simulate_table(workload, ranks, settings.jitter, 1000 * seed + iteration, rows, settings.budgets,
                               bubbles=True, split_overhead=settings.split_overhead)
        done += 1
        for budget in settings.budgets:
            for row in rows:
                run = table["runs"].get((row.name, budget))
                if run is None or "bubbles" not in run:  # no breakdown of a blocking replay
                    continue
                causes = run["bubbles"]
                total = causes.pop("makespan_x_ranks")
                sim["bubbles"].append({"workload": workload, "ranks": ranks, "budget": budget, "row": row.name,
                                       "seed": seed, "iteration": iteration,
                                       "share": {k: v / total for k, v in causes.items()}, "seconds": causes})
        save(suite)
    return done


# -- environment ----------------------------------------------------------------------------------


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "machine": platform.machine()}


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch = version("torch")
    except PackageNotFoundError:
        torch = None
    root = Path(__file__).resolve().parents[2]
    commit = dirty = None
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10).stdout
        dirty = bool(status.strip()) if commit else None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"python": platform.python_version(), "torch": torch, "rrfp_commit": commit, "rrfp_dirty": dirty}


# -- the results folder ---------------------------------------------------------------------------

RESULTS_JSON, RESULTS_MD, SECTION_MD, PLOTS = "results.json", "results.md", "benchmarks_section.md", "plots"
OUTPUT_NAMES = [RESULTS_JSON, RESULTS_MD, SECTION_MD, PLOTS]


def header(suite: Suite) -> dict:
    settings = suite.settings
    return {"schema": SCHEMA, "command": suite.command, "started": suite.results.get("started"),
            "machine": machine(), "versions": versions(),
            "settings": {**asdict(settings), "microbatches_per_rank": MICROBATCHES_PER_RANK,
                         "tables": [{"seed": s, "iteration": i, "table_seed": 1000 * s + i}
                                    for s, i in settings.tables]},
            "matrix_rows": [{**asdict(r), "skipped": row_unavailable(r, settings)} for r in MATRIX_ROWS]}


def save(suite: Suite, final: bool = False) -> None:
    """[Note: keep what finished] Rewrite results.json and the Markdown (atomically) with what is done."""
    data = {**header(suite), **{k: v for k, v in suite.results.items() if k != "started"}, "notes": suite.notes,
            "complete": final and not suite.results.get("interrupted")}
    suite.out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_jsonable(data), indent=1) + "\n"
    write_atomically(suite.out / RESULTS_JSON, lambda temporary: Path(temporary).write_text(text))
    from profiler.bench.report import results_markdown, section_markdown

    markdown = results_markdown(data)
    write_atomically(suite.out / RESULTS_MD, lambda temporary: Path(temporary).write_text(markdown))
    section = section_markdown(data)
    write_atomically(suite.out / SECTION_MD, lambda temporary: Path(temporary).write_text(section))


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def check_out(out: Path, force: bool) -> None:
    """The results folder: new, or holding none of the suite's files unless ``force``; writable."""
    if out.exists() and not out.is_dir():
        raise UserError("is a file; give a directory", f"--out {out}")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"no such directory {str(parent)!r}", f"--out {out}")
    clash = [name for name in OUTPUT_NAMES if (out / name).exists()]
    if clash and not force:
        raise UserError(f"already holds {clash[0]}; pass --force to overwrite", f"--out {out}")
    try:  # created now, and probed with a file: os.access says yes to root in read-only places (/proc)
        out.mkdir(exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as err:
        raise UserError(f"cannot write there: {err.strerror or err}", f"--out {out}") from None


def run_suite(settings: Settings, out: Path, command: str, progress_factory) -> dict:
    """Everything, in order: simulation, real runs, external; plots and Markdown at the end.

    ``progress_factory(total)`` is a context manager yielding ``update(done, status)``. Ctrl-C (or
    SIGTERM) keeps what finished: results are saved with ``interrupted: true`` and plots drawn from what
    is there, then the interrupt goes on (exit 130 / 143).
    """
    from profiler.bench import runs as bench_runs
    from profiler.bench.report import write_plots

    # The tree's commit as the run starts: a commit made while it runs must not be credited with its figures.
    suite = Suite(settings, out, command, {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "versions": versions()})
    for row in MATRIX_ROWS:
        why = row_unavailable(row, settings)
        if why is not None and row.hint != TUNED:
            suite.note(f"row {row.name} skipped: {why}")
    began = time.perf_counter()
    real_units = bench_runs.units(settings)
    total = simulation_units(settings) + real_units
    try:
        with progress_factory(total) as update:
            done = run_simulation(suite, update)
            if settings.real:
                done = bench_runs.run_real(suite, update, done)
            else:
                suite.note("real runs skipped (--no-real)")
            if settings.external:
                bench_runs.run_external(suite, update, done)
            else:
                suite.note("external systems (torch.distributed.pipelining) skipped (--no-external)")
    except KeyboardInterrupt:
        suite.results["interrupted"] = True
        suite.results["wall_seconds"] = time.perf_counter() - began
        save(suite, final=True)
        _plots_if_any(suite, write_plots)
        raise
    suite.results["wall_seconds"] = time.perf_counter() - began
    save(suite, final=True)
    suite.results["plots"] = _plots_if_any(suite, write_plots)
    save(suite, final=True)
    return json.loads((out / RESULTS_JSON).read_text())


def _plots_if_any(suite: Suite, write_plots) -> list[str]:
    data = json.loads((suite.out / RESULTS_JSON).read_text())
    return [str(p.relative_to(suite.out)) for p in write_plots(data, suite.out / PLOTS)]


__all__ = ["BUDGETS", "MATRIX_ROWS", "MatrixRow", "PAPER_ROWS", "PaperRow", "RANKS",
           "SCHEMA", "Settings", "Suite", "WORKLOADS", "check_out", "check_settings", "parse_ranks", "row_unavailable",
           "run_suite", "save", "simulate_table", "spread", "summarize_cell"]
