"""``rrfp bench``'s simulated part: each cell of the matrix on sampled tables, the variability sweep, the bubbles.

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
* Fixed orders ignore the budget; a cell's budget applies to the ready rows. The sorted 1F1B rows
  (``fixed-1f1b-light``/``-heavy``) are the exception: their warm-ups fill each cell's budget.
* *ready / best fixed*: per table, the makespan of the best fixed row that kept to the budget (lowest
  median) over the ready row's: what readiness earns over the best fixed order a user could run at that
  memory ([Note: the best fixed order at equal memory] in :mod:`runtime.sched.baselines`).
* A split backward (the zb rows) costs each workload's measured ``(I + W) / B``
  ([Note: split backward cost by preset] in :mod:`runtime.durations.presets`: 1.05 for
  the language presets, 1.06 for the vision-language ones, 1.0 for
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
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Sequence

from hints.tasks import PipelineShape
from profiler.bench.matrix import (
    BASELINE_ROW,
    MATRIX_ROWS,
    MICROBATCHES_PER_RANK,
    TUNED,
    MatrixRow,
    Settings,
    row_unavailable,
)
from profiler.bench.results import Progress, Suite, save, spread


def _simulate_kwargs(row: MatrixRow) -> dict:
    """Options a row passes to ``runtime.sched.simulator.simulate`` ([Note: rows that need an option] in :mod:`profiler.bench.matrix`)."""
    return {"p2p": row.p2p} if row.p2p is not None else {}


@dataclass
class Tuned:
    """What the tuner picked for one (workload, ranks, budget): a hint and a rule, and why."""

    candidate: Any  # runtime.tune.evaluator.Candidate
    label: str
    kept: bool
    reason: str


def tune_cell(workload: str, ranks: int, budget: str, settings: Settings) -> Tuned:
    """rrfp tune-hint's library entry point on model scenarios (seeds disjoint from the tables')."""
    from runtime.durations.variability import VariabilityModel
    from runtime.tune.decide import tune
    from runtime.tune.evaluator import Objective
    from runtime.tune.scenarios import from_model

    shape = PipelineShape(ranks, 1, MICROBATCHES_PER_RANK * ranks)
    model = VariabilityModel(workload=workload, jitter=settings.jitter, split_overhead=settings.split_overhead)
    scenarios = from_model(model, shape, 8, 8, settings.seed)
    outcome = tune(scenarios, "ready", budget, Objective.parse("mean"), settings.tune_seconds, 1, settings.seed)
    chosen = outcome.verdict.chosen.candidate
    return Tuned(chosen, chosen.label, outcome.verdict.tuned_kept, outcome.verdict.reason)


def hint_for(row: MatrixRow, shape: PipelineShape, table, tuned: Tuned | None, budget: str, cp=None):
    """The hint ``row`` runs on ``table`` at ``budget``; None where the row has no order there (a plan that
    cannot complete). ``cp``: the planned row plans from this ``cp`` hint, already built for ``table``."""
    from runtime.sched.baselines import PLANNED, sorted_baselines
    from runtime.sched.budget import MemoryBudget
    from runtime.sched.evaluate import concrete, planned_baseline, resolve

    if row.hint == PLANNED:  # [Note: planned orders] in runtime.sched.baselines
        return planned_baseline(shape, table, MemoryBudget.parse(budget), cp=cp)
    if row.fills_budget:  # the sorted 1F1B with warm-ups that fill this budget (its built-in at 1F1B's)
        fitted = sorted_baselines(shape, table.expected().microbatch_costs,
                                  MemoryBudget.parse(budget).per_rank(shape), budget)
        if f"{row.hint} @{budget}" in fitted:
            return fitted[f"{row.hint} @{budget}"]
    if row.hint == TUNED:
        candidate = tuned.candidate
        if candidate.hint is not None:
            return concrete(candidate.hint, table)
        return resolve(candidate.builtin, shape.ranks, shape.chunks, shape.microbatches, table)
    return resolve(row.hint, shape.ranks, shape.chunks, shape.microbatches, table)


def simulate_table(workload: str, ranks: int, jitter: float, table_seed: int, rows: Sequence[MatrixRow],
                   budgets: Sequence[str], tuned: dict[str, Tuned] | None = None,
                   bubbles: bool = False, split_overhead: float | None = None, unknown: str = "",
                   keep_plans: bool = False) -> dict:
    """Every row of ``rows`` on one sampled table, at every budget.

    Returns ``{"bound": {chunks: seconds}, "cost_spread": cv, "runs": {(row, budget): run}}`` where a run
    holds ``makespan``, ``peak`` (microbatches, max over ranks), ``within`` (every rank within the
    budget's slots), and for ready rows ``fixed_makespan``, ``fixed_peak``, ``fixed_within`` of the same
    hint in fixed order (None if that order cannot complete); with ``bubbles`` also ``bubbles`` (seconds
    by cause, :func:`profiler.analysis.bubbles.simulated_bubbles`). With ``keep_plans`` also ``tables``
    (``{chunks: the sampled table}``) and ``plans`` (``{(chunks, budget): the planned order its planned rows
    ran}``, None where no plan completes), for a caller that builds on them rather than drawing and planning
    again (benchmarks/unknown_variability.py's yardsticks).
    """
    from hints.deps import TaskGraph
    from runtime.durations.variability import VariabilityModel, sample_durations
    from runtime.sched.baselines import PLANNED
    from runtime.sched.bounds import bound_family, hint_bound, split_bound
    from runtime.sched.budget import MemoryBudget
    from runtime.sched.results import ScheduleDeadlock
    from runtime.sched.simulator import simulate

    m = MICROBATCHES_PER_RANK * ranks
    model = VariabilityModel(workload=workload, jitter=jitter, split_overhead=split_overhead, unknown=unknown)
    tables, bounds, graphs, family_bounds = {}, {}, {}, {}
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
        hint_budget = budget if row.hint == TUNED or row.fills_budget else None  # the hint depends on the budget
        key = (row.hint, row.chunks, row.p2p, rule, hint_budget, budget if rule != "fixed" else None)
        if key in cache:
            return cache[key]
        shape = PipelineShape(ranks, row.chunks, m)
        table = table_for(row.chunks)
        hint_key = (row.hint, row.chunks, hint_budget)
        if hint_key not in hints:
            cp = None
            if row.hint == PLANNED:  # planned from the cp the ready-cp row runs: built once per table
                cp_key = ("cp", row.chunks, None)
                if cp_key not in hints:
                    hints[cp_key] = hint_for(MatrixRow("ready-cp", "cp", "lookahead", chunks=row.chunks), shape,
                                             table, None, budget)
                cp = hints[cp_key]
            hints[hint_key] = hint_for(row, shape, table, (tuned or {}).get(budget), budget, cp)
        hint = hints[hint_key]
        if hint is None:
            cache[key] = None
            return None
        if hint.shape not in graphs:
            graphs[hint.shape] = TaskGraph.build(hint.shape)
        graph = graphs[hint.shape]
        if hint.shape not in family_bounds:  # [Note: bound per hint family] in runtime.sched.bounds
            family_bounds[hint.shape] = hint_bound(hint.shape, table, graph).value
        breakdown = bubbles and row.p2p is None  # a blocking replay records no decisions: no breakdown for it
        try:
            result = simulate(hint, table, rule, MemoryBudget.parse(budget), record=breakdown, graph=graph,
                              **_simulate_kwargs(row))
        except ScheduleDeadlock:
            cache[key] = None
            return None
        peaks = [peak / row.chunks for peak in result.peak_in_flight]
        out = {"makespan": result.makespan, "peak": max(peaks), "peaks": peaks, "bound": bounds[row.chunks],
               "family_bound": family_bounds[hint.shape], "bound_family": bound_family(hint.shape), "rule": rule}
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
    out = {"bound": bounds, "cost_spread": costs, "runs": runs}
    if keep_plans:
        out["tables"] = tables
        out["plans"] = {(chunks, budget): hint for (name, chunks, budget), hint in hints.items() if name == PLANNED}
    return out


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
            "makespan_over_bound": spread([r["makespan"] / r["family_bound"] if r else None for r in runs]),
            "bound_family": next(r["bound_family"] for r in runs if r),
            "makespan_over_universal_bound": spread([r["makespan"] / r["bound"] if r else None for r in runs]),
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
    best_fixed = _best_fixed(rows, per_table, budget)
    if best_fixed is not None:
        name, fixed_makespans = best_fixed
        by_name = {row.name: row for row in rows}
        for entry in out_rows:
            row = by_name[entry["row"]]
            if row.ready or row.hint == TUNED:
                runs = [t["runs"].get((row.name, budget)) for t in per_table]
                entry["ready_over_best_fixed"] = spread([f / r["makespan"] if f and r else None
                                                         for f, r in zip(fixed_makespans, runs)])
                entry["best_fixed"] = name
    return {"workload": workload, "ranks": ranks, "microbatches": MICROBATCHES_PER_RANK * ranks, "budget": budget,
            "jitter": jitter, "tables": len(per_table),
            "lower_bound_s": spread([t["bound"][1] for t in per_table]),
            "cost_spread": spread([t["cost_spread"] for t in per_table]), "rows": out_rows}


def _best_fixed(rows: Sequence[MatrixRow], per_table: Sequence[dict], budget: str
                ) -> tuple[str, list[float | None]] | None:
    """The fixed row within the budget on every table with the lowest median makespan, and its makespans:
    the best fixed order a user could run at this memory ([Note: the best fixed order at equal memory] in
    :mod:`runtime.sched.baselines`). Async p2p only (the blocking row is the same order, slower)."""
    best = None
    for row in rows:
        if row.ready or row.hint == TUNED or row.p2p is not None:
            continue
        runs = [t["runs"].get((row.name, budget)) for t in per_table]
        if not all(runs) or not all(r["within"] for r in runs):
            continue
        makespans = [r["makespan"] for r in runs]
        if best is None or statistics.median(makespans) < statistics.median(best[1]):
            best = (row.name, makespans)
    return best


def simulation_units(settings: Settings) -> int:
    """Progress units of the simulated part: one per table of every cell (all budgets at once)."""
    matrix = len(settings.workloads) * len(settings.ranks) * len(settings.tables)
    sweep = len(settings.workloads) * len(settings.variability_jitters) * len(settings.tables)
    unknown = len(settings.workloads) * (1 + sum(len(levels) for _, levels in settings.unknown_sweep)) * \
        len(settings.tables) if settings.unknown_sweep else 0
    return matrix + sweep + unknown + len(settings.workloads)  # + one bubble table per workload


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
    sim = suite.results.setdefault("simulation", {"cells": [], "variability": [], "unknown": [], "bubbles": []})
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
    done = _unknown_sweep(suite, progress, done, sim.setdefault("unknown", []))
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


def _unknown_sweep(suite: Suite, progress: Progress, done: int, cells: list) -> int:
    """Each kind of [Note: unknown variability] (runtime.durations.unknown) at each level of
    ``settings.unknown_sweep``, and none (level 0: the matrix's own tables), at the variability sweep's rank
    count: how the gain of readiness over the best fixed order at equal memory grows with what no order knows."""
    settings = suite.settings
    if not settings.unknown_sweep:
        return done
    ranks = settings.variability_ranks
    points = [("none", 0.0, "")] + [(kind, level, f"{kind}={level:g}") for kind, levels in settings.unknown_sweep
                                    for level in levels]
    for workload in settings.workloads:
        rows = [r for r in active_rows(settings, ranks, suite) if r.hint != TUNED]
        for kind, level, spec in points:
            per_table = []
            for seed, iteration in settings.tables:
                progress(done, f"unknown variability: {workload}, {spec or 'none'}")
                per_table.append(simulate_table(workload, ranks, settings.jitter, 1000 * seed + iteration, rows,
                                                settings.budgets, split_overhead=settings.split_overhead,
                                                unknown=spec))
                done += 1
            for budget in settings.budgets:
                cell = summarize_cell(workload, ranks, budget, per_table, rows, None, settings.jitter)
                cells.append(cell | {"unknown": spec, "kind": kind, "level": level})
        save(suite)
    return done
