"""Evaluation: where durations come from, which hints to try, and every (hint, rule) on one graph.

``rrfp simulate`` (one run, or ``--compare``), ``rrfp trace sensitivity``
and tune-hint all ask the same question: given a duration table, how long
does each hint take under each rule, at one memory budget? This module
answers it once:

* :func:`durations_for` -- sample a table from a model, or load a recorded one.
* :func:`resolve` -- a hint spec (built-in, file, ``torch:``, ``planned``) for a
  shape, with ``bfw``'s costs, ``cp``'s priorities and the planned order taken from the table's
  *expected* durations ([Note: expected durations] in
  :mod:`runtime.durations.variability`), never from the values being replayed.
* :func:`compare` -- each hint under each rule on one compiled graph per
  shape, with the lower bound of :mod:`runtime.sched.bounds`, speedups over the
  baseline (fixed-order 1F1B), what readiness itself adds (a ready rule over
  ``fixed`` of the same hint) and whether each row kept to the budget;
  with ``blocking``, each hint's fixed order also under [Note: blocking p2p]
  in :mod:`runtime.sched.simulator` (Megatron's 1F1B baseline), labelled ``fixed
  (blocking p2p)``; a hint that deadlocks under that rule is listed in
  :attr:`Comparison.deadlocked` instead of getting a row.

[Note: equal memory]
    A speedup credits readiness only when both sides hold the same
    activation memory. Ready rules are held to the budget by the arbiter; a
    fixed order holds whatever its order holds (``gpipe``, ``bf``, ``bfw``
    and ``cp`` keep every microbatch). :class:`Row` records each run's peak
    in flight and whether it stayed within the budget on every rank, so
    tables can put the rows that did side by side and list the others apart.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from hints.deps import TaskGraph
from hints.errors import HintError, UserError
from hints.files.load import hint_shape, resolve_hint
from hints.orders import (
    BUILTIN_HINTS,
    HintOrder,
    applicable_builtins,
    baseline_hint_name,
    resolve_cost_ranked,
)
from hints.tasks import LOOPING, PipelineShape
from runtime.durations.variability import Durations, VariabilityModel, sample_durations
from runtime.sched.baselines import PLANNED, sorted_baselines, sorted_zero_bubble
from runtime.sched.bounds import LowerBound, bound_family, hint_bound, split_bound
from runtime.sched.budget import MemoryBudget
from runtime.sched.results import ScheduleDeadlock, SimResult
from runtime.sched.rules import RULES, ArbiterRule
from runtime.sched.simulator import simulate


def durations_for(shape: PipelineShape, model: VariabilityModel | None = None, seed: int = 0,
                  table: str | Path | None = None, iteration: int | None = None,
                  comm_latency: float = 0.0) -> Durations:
    """Where a simulation's durations come from: a recorded ``table`` if given, else ``model`` at ``seed``."""
    if table is not None:
        from runtime.durations.tables import load_durations

        return load_durations(table, shape.stages, shape.microbatches, comm_latency, iteration)
    return sample_durations(model or VariabilityModel(), shape, seed)


def resolve(spec: str, ranks: int | None, chunks: int | None, microbatches: int | None,
            table: Durations | None = None, placement: str | None = None,
            model: VariabilityModel | None = None, split: PipelineShape | None = None,
            budget: MemoryBudget | None = None) -> HintOrder:
    """``spec`` for the shape; ``bfw``, ``cp`` and ``planned`` take their inputs from ``table.expected()``.

    Without a table, ``model``'s durations sampled at seed 0 (``rrfp hints show --workload``); without
    either, ``bfw`` and the sorted 1F1Bs keep index order and ``cp`` uses uniform durations. ``split``: the
    stages ``cp`` splits are those of this shape instead of its own choice ([Note: which stages split]; a run keeps its first iteration's).
    ``placement`` None is the hint's own (see :func:`hints.files.load.resolve_hint`). ``planned`` ([Note:
    planned orders] in :mod:`runtime.sched.baselines`) is planned within ``budget`` (default 1f1b; any budget that
    gives slots per rank, as tune-hint's held budgets do), on ``split``'s shape where given.
    """
    planned = spec == PLANNED
    builtin = BUILTIN_HINTS.get(spec)
    if not planned and (builtin is None or not (builtin.takes_costs or builtin.takes_priorities)):
        return resolve_hint(spec, ranks, chunks, microbatches, placement=placement)
    if ranks is None or microbatches is None:
        raise UserError(f"hint {spec!r} needs `ranks` and `microbatches`")
    shape = hint_shape(None if planned else spec, ranks, chunks, microbatches, placement)
    placement = shape.placement
    if table is None:
        if not planned and not builtin.takes_priorities and model is None:
            return resolve_hint(spec, ranks, chunks, microbatches, placement=placement)
        table = sample_durations(model or VariabilityModel(), shape, 0)  # uniform: every task its kind's cost
    if planned:
        budget = budget if budget is not None else MemoryBudget.parse("1f1b")
        plan = planned_baseline(shape, table, budget, keep=split)
        if plan is None:
            raise UserError(f"no order could be planned within the memory budget {budget} for {shape.describe()}",
                            "`hint` planned")
        return plan
    costs, priorities = _expected_inputs(shape, table, builtin.takes_priorities, split)
    return resolve_hint(spec, ranks, chunks, microbatches, costs, priorities, placement)


def planned_baseline(shape: PipelineShape, table: Durations, budget, keep: PipelineShape | None = None,
                     cp: HintOrder | None = None) -> HintOrder | None:
    """The planned order at ``budget`` (a :class:`MemoryBudget`, or any budget that gives slots per rank;
    [Note: planned orders] in :mod:`runtime.sched.baselines`): the split-backward order whose lookahead run on
    ``table.expected()`` within the budget is shortest, fixed as that run ordered each rank. ``keep``: plan only
    on this shape (a run's first iteration's: its task graph and handlers are built for one shape). ``cp``:
    that hint already built for ``table`` (its choice of split stages simulates several; ``--compare`` has
    it). None where no plan completes."""
    expected = table.expected()
    sources = []
    if cp is None:
        try:
            cp = resolve("cp", shape.ranks, shape.chunks, shape.microbatches, table, shape.placement, split=keep)
        except HintError:
            pass
    if cp is not None:
        sources.append(cp)
    if shape.placement == LOOPING:
        sources.append(sorted_zero_bubble(shape, expected.microbatch_costs))
    slots = budget.per_rank(shape)
    best = None
    for source in sources:
        if keep is not None and source.shape != keep:
            continue
        try:
            plan = simulate(source, expected, "lookahead", slots)
        except ScheduleDeadlock:
            continue
        if best is None or plan.makespan < best[0].makespan:
            best = (plan, source)
    if best is None:
        return None
    plan, source = best
    tasks = plan.graph.tasks
    orders = tuple(tuple(tasks[tid] for tid in executed) for executed in plan.executed)
    return HintOrder(source.shape, orders, f"{PLANNED} @{budget}",
                     {"generator": PLANNED, "from": source.name, "rule": "lookahead", "budget": str(budget),
                      "planned_makespan": plan.makespan})


def concrete(hint: HintOrder, table: Durations) -> HintOrder:
    """``hint`` for the iteration ``table`` describes: a cost-ranked hint's slots become microbatches.

    [Note: cost-ranked hints] in :mod:`hints.orders`: the microbatches are ranked by the hint's own cost
    model applied to what each microbatch holds, when both are known; otherwise by the table's
    expected costs. An index hint is returned unchanged.
    """
    if not hint.cost_ranked:
        return hint
    return resolve_cost_ranked(hint, ranking_costs(hint, table))


def ranking_costs(hint: HintOrder, table: Durations) -> list[float]:
    """The per-microbatch costs a cost-ranked ``hint`` ranks ``table``'s microbatches by."""
    features = table.microbatch_features()
    if hint.cost_model is not None and features is not None:
        return hint.cost_model.microbatch_costs(features)
    return list(table.expected().microbatch_costs)


def builtin_candidates(shape: PipelineShape, table: Durations, budget: MemoryBudget | None = None
                       ) -> dict[str, HintOrder]:
    """Every built-in that applies to ``shape``, with ``bfw``, ``cp`` and the sorted 1F1Bs from the table's
    expectation; with a ``budget``, also the sorted 1F1Bs whose warm-ups fill it ([Note: the best fixed order
    at equal memory] in :mod:`runtime.sched.baselines`) and the order planned within it on the expected
    durations ([Note: planned orders])."""
    costs, priorities = _expected_inputs(shape, table, True)
    built = applicable_builtins(shape.ranks, shape.chunks, shape.microbatches, costs, priorities, shape.placement)
    if budget is not None:
        built.update(sorted_baselines(shape.with_split(False), costs, budget.per_rank(shape), str(budget)))
        planned = planned_baseline(shape, table, budget, cp=built.get("cp"))
        if planned is not None:
            built[planned.name] = planned
    return built


def _expected_inputs(shape: PipelineShape, table: Durations, priorities: bool, split: PipelineShape | None = None):
    """``bfw``'s per-microbatch costs and ``cp``'s per-task priorities (on the stages it splits: [Note: which
    stages split] in :mod:`runtime.sched.split_choice`), from expected durations only."""
    from hints.priorities import cp_priorities
    from runtime.sched.split_choice import split_and_priorities

    expected = table.expected()
    if not priorities:
        return expected.microbatch_costs, None
    if split is not None:
        return expected.microbatch_costs, cp_priorities(split, expected)
    return expected.microbatch_costs, split_and_priorities(shape, expected)[1]


@dataclass
class Row:
    """One (hint, rule) on one table."""

    hint: str
    rule: str  # a runtime.sched.rules.RULES name
    makespan: float
    bubble_fraction: float
    peak_in_flight: list[int]  # per rank
    within_budget: bool  # peak <= budget on every rank ([Note: equal memory])
    speedup: float = float("nan")  # baseline makespan / this one
    vs_fixed: float | None = None  # fixed-order makespan of the same hint / this one (ready rules only)
    over_bound: float = float("nan")  # makespan / the bound of the hint's family (>= 1; [Note: bound per hint family])
    p2p: str = "async"  # "blocking": [Note: blocking p2p] (fixed only)
    bound: float = float("nan")  # the lower bound of the hint's family (seconds)
    bound_family: str = ""  # which one: runtime.sched.bounds.bound_family
    over_universal: float = float("nan")  # makespan / the universal (free-split) bound, for cross-family reading
    shape: PipelineShape | None = field(default=None, repr=False)  # the hint's, which says its bound's family

    @property
    def label(self) -> str:
        """``fixed``, ``ready``, ``ready+la``, or ``fixed (blocking p2p)``."""
        return RULES[self.rule].label + (" (blocking p2p)" if self.p2p == "blocking" else "")

    def to_json(self) -> dict:
        rule = RULES[self.rule]
        return {"hint": self.hint, "rule": self.rule, "policy": str(rule.policy), "lookahead": rule.lookahead,
                "p2p": self.p2p, "label": self.label,
                "makespan": self.makespan, "bubble_fraction": self.bubble_fraction,
                "peak_in_flight": max(self.peak_in_flight), "peak_in_flight_per_rank": self.peak_in_flight,
                "within_budget": self.within_budget, "speedup": self.speedup,
                "vs_fixed_same_hint": self.vs_fixed, "makespan_over_bound": self.over_bound,
                "lower_bound": self.bound, "lower_bound_family": self.bound_family,
                "makespan_over_universal_bound": self.over_universal}


@dataclass(frozen=True)
class Credit:
    """What readiness earns at one budget ([Note: the best fixed order at equal memory] in
    :mod:`runtime.sched.baselines`): the fastest fixed order and the fastest ready run within the budget."""

    best_fixed: Row | None
    best_ready: Row | None

    @property
    def readiness(self) -> float | None:
        """Best fixed makespan over best ready makespan (> 1: readiness wins at this memory)."""
        if self.best_fixed is None or self.best_ready is None or self.best_ready.makespan <= 0:
            return None
        return self.best_fixed.makespan / self.best_ready.makespan

    def to_json(self) -> dict:
        def pick(row: Row | None):
            return None if row is None else {"hint": row.hint, "rule": row.rule, "makespan": row.makespan,
                                             "peak_in_flight": max(row.peak_in_flight)}
        return {"best_fixed": pick(self.best_fixed), "best_ready": pick(self.best_ready),
                "ready_over_best_fixed": self.readiness}

    def sentence(self, write: Callable[[float], str]) -> str:
        """One line for tables: which fixed order and which ready run are best, and their ratio."""
        if self.best_fixed is None or self.best_ready is None:
            return ""
        return (f"Best fixed order within the budget: {self.best_fixed.hint} ({write(self.best_fixed.makespan)}); "
                f"best ready: {self.best_ready.hint} {self.best_ready.label} ({write(self.best_ready.makespan)}); "
                f"readiness over the best fixed order: {self.readiness:.3f}x.")


def credit(rows: Sequence[Row]) -> Credit:
    """The fastest fixed-order row and the fastest ready row that kept to the budget (async p2p)."""
    within = [r for r in rows if r.within_budget and r.p2p == "async" and r.makespan > 0]
    fixed = [r for r in within if r.rule == "fixed"]
    ready = [r for r in within if r.rule != "fixed"]
    return Credit(min(fixed, key=lambda r: r.makespan, default=None),
                  min(ready, key=lambda r: r.makespan, default=None))


@dataclass
class Comparison:
    """Hints x rules on one table at one memory budget."""

    shape: PipelineShape
    budget: MemoryBudget
    slots: list[int]  # the budget per rank
    baseline: str  # "<hint> fixed", what speedups are relative to
    bound: LowerBound
    rows: list[Row] = field(default_factory=list)
    deadlocked: list[str] = field(default_factory=list)  # hints whose fixed order deadlocks under blocking p2p

    def row(self, hint: str, rule: str, p2p: str = "async") -> Row | None:
        return next((r for r in self.rows if r.hint == hint and r.rule == rule and r.p2p == p2p), None)

    @property
    def versus_label(self) -> str:
        """How tables head the speedup over the baseline: ``vs 1F1B``, or ``vs ZB-V`` under V placement."""
        return versus_label(self.baseline)

    @property
    def credit(self) -> Credit:
        return credit(self.rows)

    def to_json(self) -> dict:
        return {"shape": self.shape.to_json(), "baseline": self.baseline, "memory_budget": str(self.budget),
                "memory_budget_slots": self.slots, "lower_bound": self.bound.value,
                "lower_bound_binding": self.bound.binding, "critical_path": self.bound.critical_path,
                "rows": [r.to_json() for r in self.rows], "blocking_p2p_deadlocks": self.deadlocked,
                "credit": self.credit.to_json()}


DEFAULT_RULES = ("fixed", "greedy", "lookahead")


def versus_label(baseline: str) -> str:
    """The column head for speedups over ``baseline`` (a :attr:`Comparison.baseline`, ``"<hint> fixed"``)."""
    return "vs ZB-V" if baseline.startswith("zbv") else "vs 1F1B"


def compare(hints: dict[str, HintOrder], table: Durations, budget: MemoryBudget,
            rules: Sequence[str] = DEFAULT_RULES, overhead: float = 0.0,
            own: tuple[str, str] | None = None, advance: Callable[[int], None] | None = None,
            blocking: bool = False, own_p2p: str = "async") -> Comparison:
    """Every hint of ``hints`` under every rule of ``rules`` on ``table``.

    The graph is compiled once per shape (split or not) and reused. ``own`` is
    a ``(hint name, rule)`` pair run under that rule only (a traced hint), with ``own_p2p``.
    ``blocking`` adds each hint's fixed order under blocking p2p (after its async fixed row).
    Speedups are over the baseline of the first hint's placement (fixed-order
    1F1B, interleaved with chunks >= 2; ZB-V under V), which is always run.
    ``advance(n)`` reports progress.
    """
    first = next(iter(hints.values()))
    shape = first.shape.with_split(False)
    baseline_name = baseline_hint_name(shape.chunks, shape.placement)
    plan: list[tuple[str, HintOrder, ArbiterRule, str]] = []
    if baseline_name not in hints or "fixed" not in rules:
        plan.append((baseline_name, resolve(baseline_name, shape.ranks, shape.chunks, shape.microbatches,
                                            placement=shape.placement), RULES["fixed"], "async"))
    for name, hint in hints.items():
        if own is not None and name == own[0]:
            plan.append((name, hint, RULES[own[1]], own_p2p))
            continue
        for rule in rules:
            plan.append((name, hint, RULES[rule], "async"))
            if blocking and RULES[rule].exact_order:
                plan.append((name, hint, RULES[rule], "blocking"))
    slots = budget.per_rank(shape)
    graphs: dict[PipelineShape, TaskGraph] = {}
    rows: list[Row] = []
    deadlocked: list[str] = []
    for name, hint, rule, p2p in plan:
        if hint.shape not in graphs:
            graphs[hint.shape] = TaskGraph.build(hint.shape)
        try:
            result = simulate(concrete(hint, table), table, rule, budget, graph=graphs[hint.shape],
                              overhead=overhead, p2p=p2p)
        except ScheduleDeadlock:
            if p2p != "blocking" or (own is not None and name == own[0]):
                raise
            deadlocked.append(name)  # an order that needs buffered links: no blocking row
        else:
            rows.append(_row(name, rule, result, slots, p2p, hint.shape))
        if advance:
            advance(1)
    bound = split_bound(shape, table)
    families = {s: hint_bound(s, table, graphs[s]) for s in graphs}
    base = next(r.makespan for r in rows if r.hint == baseline_name and r.rule == "fixed" and r.p2p == "async")
    fixed = {r.hint: r.makespan for r in rows if r.rule == "fixed" and r.p2p == "async"}
    for row in rows:
        row.speedup = base / row.makespan if row.makespan > 0 else float("nan")
        own = families[row.shape]
        row.bound, row.bound_family = own.value, bound_family(row.shape)
        row.over_bound = row.makespan / own.value if own.value > 0 else float("nan")
        row.over_universal = row.makespan / bound.value if bound.value > 0 else float("nan")
        if row.rule != "fixed" and row.hint in fixed and row.makespan > 0:
            row.vs_fixed = fixed[row.hint] / row.makespan
    return Comparison(shape, budget, slots, f"{baseline_name} fixed", bound, rows, deadlocked)


def _row(name: str, rule: ArbiterRule, result: SimResult, slots: list[int], p2p: str,
         shape: PipelineShape) -> Row:
    peaks = list(result.peak_in_flight)
    return Row(name, rule.name, result.makespan, result.bubble_fraction, peaks,
               all(peak <= slot for peak, slot in zip(peaks, slots)), p2p=p2p, shape=shape)


def median_rows(comparisons: Sequence[Comparison]) -> list[Row]:
    """Per (hint, rule, p2p), the median over several tables (iterations) of every figure."""
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for comparison in comparisons:
        for row in comparison.rows:
            groups.setdefault((row.hint, row.rule, row.p2p), []).append(row)

    def median(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    out = []
    for (hint, rule, p2p), rows in groups.items():
        peaks = [max(r.peak_in_flight[k] for r in rows) for k in range(len(rows[0].peak_in_flight))]
        out.append(Row(hint, rule, median(r.makespan for r in rows), median(r.bubble_fraction for r in rows),
                       peaks, all(r.within_budget for r in rows), median(r.speedup for r in rows),
                       median(r.vs_fixed for r in rows), median(r.over_bound for r in rows), p2p,
                       median(r.bound for r in rows), rows[0].bound_family,
                       median(r.over_universal for r in rows), rows[0].shape))
    return out


__all__ = ["Comparison", "Credit", "DEFAULT_RULES", "Row", "builtin_candidates", "compare", "concrete", "credit",
           "durations_for", "median_rows", "planned_baseline", "ranking_costs", "resolve"]
