"""What a tuning candidate scores: the objective, the candidates, and the evaluator that simulates them on scenarios.

Hint tuning searches for the hint order that makes a distribution of scenarios finish soonest.

What is optimized: an :class:`Objective` (mean, p90 or CVaR) of the
simulated makespans of one candidate over a :class:`runtime.tune.scenarios.ScenarioSet`'s
tuning scenarios, under the arbiter rule and memory budget the run will use.
The simulator drives the very arbiter that runs in production, so a
candidate is judged by what readiness-first will really do with it, not by
its fixed-order makespan.

This module owns the pieces the search is built from:

* :class:`Objective` -- from a list of makespans to one number;
* :class:`Candidate` -- a hint (index or cost-ranked), a rule, and where it
  came from (its *family*);
* :class:`Evaluator` -- scores candidates on scenarios, with every array a
  simulation needs (durations, latencies, estimates, per-scenario resolved
  hints) built once per scenario; workers of a process pool are forked after
  it is built and receive only orders;
* :func:`paired_bootstrap` -- the confidence interval of a paired
  difference, which decides whether a tuned hint is kept ([Note: never
  worse]).

The search itself (portfolio, local search, racing) is :mod:`runtime.tune.search`.

[Note: never worse]
    A tuned hint replaces the best built-in only if its improvement on the
    *held-out* scenarios (paired: same scenario, both hints) has a paired
    bootstrap 95% interval above zero; otherwise the output is the best
    built-in and the report says why. At the 1f1b budget the output is in
    addition never slower than fixed-order 1F1B on the held-out scenarios
    (fixed 1F1B itself is a candidate, so the rule can always fall back to it).

[Note: fixed candidates and the budget]
    A ready rule is held to the memory budget by the arbiter; a fixed order holds what its order holds
    (``gpipe``, ``bfw``, ``cp`` keep every microbatch in flight). A fixed candidate whose peak in flight,
    read off its order, exceeds the budget on any rank is therefore not a candidate at that budget: it is
    scored (the report shows it) but ranks after every candidate that fits (:meth:`Evaluator.fits`), so it
    can be neither the best found nor written out. The baseline (fixed 1F1B) is the one exception: it is the
    reference every verdict compares with, and at the ``1f1b`` budget it fits by definition.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

from hints.deps import TaskGraph
from hints.errors import UserError
from hints.orders import HintOrder, peak_in_flight
from hints.tasks import PipelineShape
from runtime.sched.budget import MemoryBudget
from runtime.sched.evaluate import concrete, resolve
from runtime.sched.results import ScheduleDeadlock, SimResult
from runtime.sched.rules import RULES
from runtime.sched.simulator import simulate
from runtime.tune.scenarios import ScenarioSet


@dataclass(frozen=True)
class Objective:
    """``mean``, ``p90`` (any ``pNN``) or ``cvar:ALPHA`` (mean of the worst ``1 - ALPHA`` share)."""

    kind: str
    level: float = 0.0

    @classmethod
    def parse(cls, text: str) -> "Objective":
        raw = str(text).strip().lower()
        if raw == "mean":
            return cls("mean")
        if raw.startswith("p") and raw[1:].isdigit() and 0 < int(raw[1:]) < 100:
            return cls("quantile", int(raw[1:]) / 100)
        if raw.startswith("cvar:"):
            try:
                level = float(raw[5:])
            except ValueError:
                level = -1.0
            if 0.0 < level < 1.0:
                return cls("cvar", level)
        raise UserError(f"{text!r} is not an objective; use mean, p90 (any pNN) or cvar:0.9", "`objective`")

    def __str__(self) -> str:
        if self.kind == "mean":
            return "mean"
        if self.kind == "quantile":
            return f"p{round(self.level * 100)}"
        return f"cvar:{self.level:g}"

    def __call__(self, makespans: Sequence[float]) -> float:
        if not makespans:
            return math.inf
        if self.kind == "mean":
            return statistics.fmean(makespans)
        ordered = sorted(makespans)
        if self.kind == "quantile":
            return quantile(ordered, self.level)
        tail = ordered[min(len(ordered) - 1, math.floor(self.level * len(ordered))):]
        return statistics.fmean(tail)


def quantile(ordered: Sequence[float], level: float) -> float:
    """Linear-interpolation quantile of sorted values (numpy's default)."""
    position = level * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary(makespans: Sequence[float]) -> dict[str, float]:
    """The figures every report row gives for a distribution of makespans."""
    ordered = sorted(makespans)
    return {"mean": statistics.fmean(ordered), "p50": quantile(ordered, 0.5), "p90": quantile(ordered, 0.9),
            "cvar90": Objective("cvar", 0.9)(ordered), "scenarios": len(ordered)}


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float

    def above_zero(self) -> bool:
        return self.low > 0.0


def paired_bootstrap(baseline: Sequence[float], candidate: Sequence[float], resamples: int = 2000,
                     seed: int = 0, confidence: float = 0.95) -> Interval:
    """The mean relative improvement ``(baseline - candidate) / baseline`` over paired scenarios, with a
    percentile bootstrap interval (resampling scenarios, so each pair stays together)."""
    if len(baseline) != len(candidate) or not baseline:
        raise ValueError("paired samples must be non-empty and of one length")
    gains = [(b - c) / b if b > 0 else 0.0 for b, c in zip(baseline, candidate)]
    rng = random.Random(f"{seed}:bootstrap")
    n = len(gains)
    means = sorted(statistics.fmean(gains[rng.randrange(n)] for _ in range(n)) for _ in range(resamples))
    tail = (1.0 - confidence) / 2.0
    return Interval(statistics.fmean(gains), quantile(means, tail), quantile(means, 1.0 - tail))


class Outcome(NamedTuple):
    """What the verdict and the report read of one simulation (a deadlock: inf, and no peaks or bubble)."""

    makespan: float
    peak_in_flight: tuple[int, ...] | None
    bubble_fraction: float | None


@dataclass
class Candidate:
    """One hint under one rule: what the search proposes and scores.

    ``hint`` is an index or cost-ranked :class:`HintOrder`, or ``None`` with
    ``builtin`` naming a built-in that is rebuilt for every scenario from its
    expectation (``bfw``, ``cp``).
    """

    name: str
    family: str
    rule: str  # runtime.sched.arbiter RULES name
    hint: HintOrder | None = None
    builtin: str | None = None
    notes: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.name} ({RULES[self.rule].label})"


class Evaluator:
    """Scores candidates on the scenarios of a :class:`ScenarioSet`, at one memory budget.

    Everything a simulation needs that does not depend on the candidate is
    built once: the two task graphs (full and split backward), per scenario
    and graph the durations, latencies and expectations as per-task lists,
    and the per-scenario hints of built-ins that depend on the scenario. A
    process pool forked after this ships only candidates. ``simulations``
    counts every simulated scenario. A candidate's figures on a held-out
    scenario are kept (:meth:`outcome`): the verdict and every report row
    read the same few candidates' makespans, peaks and bubbles, and simulate
    each scenario once.
    """

    def __init__(self, scenarios: ScenarioSet, budget: MemoryBudget, overhead: float = 0.0) -> None:
        self.scenarios = scenarios
        self.shape = scenarios.shape
        self.budget = budget
        self.slots = budget.per_rank(self.shape)
        self.overhead = overhead
        self.sets = {"tuning": scenarios.tuning, "holdout": scenarios.holdout}
        self._graphs: dict[PipelineShape, TaskGraph] = {}  # by shape: which stages split is part of it
        self._arrays: dict[tuple[str, int, PipelineShape], tuple] = {}
        self._bounds: dict[tuple[str, int, PipelineShape], tuple[float, float, str]] = {}  # (which, index, shape)
        self._builtins: dict[tuple[str, str, int], HintOrder] = {}
        self._held: dict[tuple[int, int], tuple[Candidate, Outcome]] = {}  # (id(candidate), index): held-out figures
        self.simulations = 0

    def at_budget(self, budget: MemoryBudget) -> "Evaluator":
        """An evaluator of the same scenarios at another budget, sharing what does not depend on it (task graphs,
        per-task arrays, lower bounds): ``--memory-budget auto``'s sweep and verdict build and bound nothing twice."""
        other = Evaluator(self.scenarios, budget, self.overhead)
        other._graphs, other._arrays, other._bounds = self._graphs, self._arrays, self._bounds
        return other

    def graph(self, shape: PipelineShape) -> TaskGraph:
        """The task graph of ``shape`` (this evaluator's, split or not, some stages fused or none)."""
        if shape not in self._graphs:
            self._graphs[shape] = TaskGraph.build(shape)
        return self._graphs[shape]

    def prepare(self) -> None:
        """Build every array now (before forking workers, so they share them)."""
        for which, scenarios in self.sets.items():
            for index in range(len(scenarios)):
                for split in (False, True):
                    self._scenario_arrays(which, index, self.shape.with_split(split))

    def _scenario_arrays(self, which: str, index: int, shape: PipelineShape) -> tuple:
        key = (which, index, shape)
        arrays = self._arrays.get(key)
        if arrays is None:
            scenario = self.sets[which][index]
            graph = self.graph(shape)
            arrays = self._arrays[key] = (*scenario.table.for_graph(graph), scenario.expected.for_graph(graph))
        return arrays

    def hint_for(self, candidate: Candidate, which: str, index: int) -> HintOrder:
        """The index hint ``candidate`` runs in scenario ``index`` of ``which``."""
        scenario = self.sets[which][index]
        if candidate.builtin is not None:
            key = (candidate.builtin, which, index)
            hint = self._builtins.get(key)
            if hint is None:
                s = self.shape
                hint = self._builtins[key] = resolve(candidate.builtin, s.ranks, s.chunks, s.microbatches,
                                                     scenario.table, s.placement, budget=self.budget)
            return hint
        return concrete(candidate.hint, scenario.table)

    def fits(self, candidate: Candidate) -> bool:
        """Whether ``candidate`` keeps to the budget ([Note: fixed candidates and the budget])."""
        if RULES[candidate.rule].uses_budget:
            return True  # the arbiter holds every rank to its slots
        hint = self.hint_for(candidate, "tuning", 0)
        return all(peak_in_flight(order, hint.shape) <= slot for order, slot in zip(hint.orders, self.slots))

    def simulate(self, candidate: Candidate, which: str, index: int, record: bool = False) -> SimResult:
        hint = self.hint_for(candidate, which, index)
        compute, transfer, estimates = self._scenario_arrays(which, index, hint.shape)
        self.simulations += 1
        return simulate(hint, (compute, transfer), candidate.rule, self.slots, record=record,
                        graph=self.graph(hint.shape), overhead=self.overhead, estimates=estimates)

    def outcome(self, candidate: Candidate, which: str, index: int) -> Outcome:
        """``candidate``'s figures on scenario ``index`` of ``which``; kept for the held-out scenarios."""
        key = (id(candidate), index)
        if which == "holdout":
            kept = self._held.get(key)
            if kept is not None and kept[0] is candidate:  # the candidate itself is kept too: its id stays its own
                return kept[1]
        try:
            result = self.simulate(candidate, which, index)
            figures = Outcome(result.makespan, tuple(result.peak_in_flight), result.bubble_fraction)
        except ScheduleDeadlock:
            figures = Outcome(math.inf, None, None)
        if which == "holdout":
            self._held[key] = (candidate, figures)
        return figures

    def keep_holdout(self, candidate: Candidate, index: int, figures: Outcome) -> None:
        """Keep figures a worker process computed for a held-out scenario (:meth:`outcome` returns them)."""
        self._held[(id(candidate), index)] = (candidate, figures)

    def makespans(self, candidate: Candidate, which: str = "tuning", indices: Sequence[int] | None = None
                  ) -> list[float]:
        """Makespans of ``candidate`` on scenarios ``indices`` of ``which`` (default all); inf if it deadlocks."""
        if indices is None:
            indices = range(len(self.sets[which]))
        return [self.outcome(candidate, which, index).makespan for index in indices]

    def bounds(self, candidate: Candidate, which: str, index: int) -> tuple[float, float, str]:
        """Scenario ``index`` of ``which``'s lower bound for ``candidate``'s hint family, the universal one, and
        the family's name ([Note: bound per hint family] in runtime.sched.bounds)."""
        return self._bounds_of(which, index, self.hint_for(candidate, which, index).shape)

    def price_bounds(self, which: str = "holdout") -> float:
        """Compute and keep the bounds of scenario 0 of ``which`` for the hints that split no backward and for those
        that split every one (most rows'); the seconds it took: what the report's bounds cost per scenario, for a
        clock budget to keep back (runtime.tune.decide)."""
        if not self.sets[which]:
            return 0.0
        began = time.perf_counter()
        for split in (False, True):
            self._bounds_of(which, 0, self.shape.with_split(split))
        return time.perf_counter() - began

    def _bounds_of(self, which: str, index: int, shape: PipelineShape) -> tuple[float, float, str]:
        from runtime.sched.bounds import bound_family, hint_bound, split_bound

        key = (which, index, shape)
        if key not in self._bounds:
            table = self.sets[which][index].table
            self._bounds[key] = (hint_bound(shape, table, self.graph(shape)).value, split_bound(shape, table).value,
                                 bound_family(shape))
        return self._bounds[key]

    def peak_in_flight(self, candidate: Candidate, which: str = "tuning") -> list[int]:
        """Per rank, the most microbatch-chunks in flight over the scenarios of ``which``."""
        peaks = [0] * self.shape.ranks
        for index in range(len(self.sets[which])):
            figures = self.outcome(candidate, which, index)
            if figures.peak_in_flight is not None:
                peaks = [max(a, b) for a, b in zip(peaks, figures.peak_in_flight)]
        return peaks


__all__ = ["Candidate", "Evaluator", "Interval", "Objective", "Outcome", "paired_bootstrap", "quantile", "summary"]
