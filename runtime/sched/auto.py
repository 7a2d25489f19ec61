"""``--policy auto``: run ready, and fall back to the hint's fixed order when the last iterations say it pays.

[Note: the auto policy]
    The arbitration rules are proved not to deadlock and the lookahead and
    safe-state rules remove the losses that were found, but nothing proves
    readiness never loses to its own hint in fixed order. ``auto`` guards
    against what the rules miss, with the run's own data:

    * After every iteration, the durations that iteration realized (every
      task's compute and every message's latency; in ``rrfp run`` all ranks'
      spans and arrivals, all-gathered) are kept, with the hint it followed,
      in a window of the last :data:`WINDOW` iterations.
    * Each kept iteration is replayed by the simulator twice, the hint under
      the ready rule (at the run's budget) and in fixed order: what each rule
      would have taken on exactly those durations (as ``rrfp trace
      sensitivity`` does from a trace). Replays are made once, when the
      iteration is kept.
    * The prediction is fixed's gain over the window, ``sum(ready) /
      sum(fixed) - 1``. Its *error* is measured on the same iterations, as
      two medians over the window, added: how far each prediction was from
      the gain its iteration then had (its own two replays), and how far
      each iteration's realized makespan was from the replay of the rule
      that ran (0 in the simulator, whose replay is exact; timing noise and
      dispatch costs in ``rrfp run``).
    * The next iteration runs fixed when the predicted gain exceeds that
      error, else ready. So a switch needs a gain the window can tell apart
      from its own noise, and a rule runs until the evidence turns. Until one
      prediction has been checked (the first two iterations) it runs ready.
    * The fixed order is a candidate only when the hint completes in fixed
      order within every rank's budget: the test that turns on safe-state
      admission (:class:`runtime.sched.fixed_order.SafeAdmission`), so
      ``auto`` never holds more memory than ``ready`` at the same budget.
      Otherwise every iteration runs ready, and the decision says why (and
      ``rrfp run`` neither gathers nor replays what it would not use).
    * The first iteration runs ready (nothing observed yet).

    Every decision (the rule, the two predictions, the error, and why) is
    returned as an :class:`AutoDecision`: ``rrfp run`` writes it on the
    iteration's slice of the trace and in ``metrics.jsonl``; ``rrfp simulate
    --policy auto`` prints one row per iteration. All ranks of a replica
    decide alike: they replay the same gathered data with the same code.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Sequence

from hints.deps import TaskGraph
from hints.orders import HintOrder
from runtime.durations.variability import Durations
from runtime.sched.budget import MemoryBudget
from runtime.sched.fixed_order import SafeAdmission
from runtime.sched.rules import RULES, ArbiterRule

WINDOW = 4  # iterations kept for the replay


@dataclass(frozen=True)
class AutoDecision:
    """The rule of one iteration under ``--policy auto``, and why."""

    iteration: int
    rule: str  # "fixed", or the ready rule's name ("lookahead" or "greedy")
    predicted_ready: float | None  # replayed makespan over the window (seconds), None before any observation
    predicted_fixed: float | None
    error: float | None  # the replay's measured relative error over the window
    reason: str

    @property
    def label(self) -> str:
        return RULES[self.rule].label

    def to_json(self) -> dict:
        return {"iteration": self.iteration, "rule": self.rule, "label": self.label,
                "predicted_ready_s": self.predicted_ready, "predicted_fixed_s": self.predicted_fixed,
                "error": self.error, "reason": self.reason}

    def annotation(self) -> str:
        """One line for the trace's iteration slice."""
        return f"{self.label}: {self.reason}"


@dataclass
class _Observed:
    ready: float  # replayed makespan under the ready rule
    fixed: float  # replayed in fixed order
    ran: str  # the rule that ran
    realized: float | None  # the makespan the run measured (None: only replays, as in the simulator)
    forecast_error: float | None  # |predicted gain - this iteration's gain| (None: no prediction was made)


@dataclass
class AutoPolicy:
    """One replica's ``--policy auto`` (see [Note: the auto policy]).

    ``ready`` is the ready rule it runs and replays (lookahead or greedy); ``budget`` the run's memory budget
    (or its slots per rank).
    """

    ready: ArbiterRule
    budget: MemoryBudget | Sequence[int]
    window: int = WINDOW
    observed: list[_Observed] = field(default_factory=list)
    decisions: list[AutoDecision] = field(default_factory=list)
    _graphs: dict = field(default_factory=dict)  # per shape: (its TaskGraph, its SafeAdmission)
    _prediction: float | None = None  # the gain predicted for the iteration running

    def __post_init__(self) -> None:
        if self.ready.exact_order:
            raise ValueError("auto replays a ready rule against the fixed order; give it the ready rule")

    def _built(self, hint: HintOrder) -> tuple[TaskGraph, SafeAdmission]:
        if hint.shape not in self._graphs:
            graph = TaskGraph.build(hint.shape)
            slots = self.budget.per_rank(hint.shape) if isinstance(self.budget, MemoryBudget) else list(self.budget)
            self._graphs[hint.shape] = graph, SafeAdmission(graph, slots)
        return self._graphs[hint.shape]

    def fixed_fits(self, hint: HintOrder) -> bool:
        """Whether the hint in fixed order completes within every rank's budget (else only ready runs): the
        test of [Note: safe-state admission], worked out once per hint object."""
        return self._built(hint)[1](hint)

    def decide(self, iteration: int, hint: HintOrder) -> AutoDecision:
        """The rule iteration ``iteration`` runs with ``hint``."""
        ready = self.ready.name
        self._prediction = None
        window = self.observed[-self.window:]
        forecasts = [o.forecast_error for o in window if o.forecast_error is not None]
        if not self.fixed_fits(hint):
            decision = AutoDecision(iteration, ready, None, None, None,
                                    f"{hint.name} in fixed order holds more than the budget {self.budget}")
        elif not window:
            decision = AutoDecision(iteration, ready, None, None, None, "nothing observed yet")
        else:
            ready_total = sum(o.ready for o in window)
            fixed_total = sum(o.fixed for o in window)
            gain = self._prediction = ready_total / fixed_total - 1.0 if fixed_total > 0 else 0.0
            replay = [abs(o.realized - (o.fixed if o.ran == "fixed" else o.ready)) / o.realized
                      for o in window if o.realized]
            error = (statistics.median(forecasts) if forecasts else 0.0) + \
                (statistics.median(replay) if replay else 0.0)
            n = len(window)
            if not forecasts:
                decision = AutoDecision(iteration, ready, ready_total, fixed_total, None,
                                        f"replaying the last {n} iteration(s), fixed is {gain:+.1%} faster; no "
                                        f"prediction checked yet")
            elif gain > error:
                decision = AutoDecision(iteration, "fixed", ready_total, fixed_total, error,
                                        f"replaying the last {n} iteration(s), fixed is {gain:.1%} faster, beyond "
                                        f"the replay's error {error:.1%}")
            else:
                decision = AutoDecision(iteration, ready, ready_total, fixed_total, error,
                                        f"replaying the last {n} iteration(s), fixed is {gain:+.1%} faster, not "
                                        f"beyond the replay's error {error:.1%}")
        self.decisions.append(decision)
        return decision

    def observe(self, hint: HintOrder, table: Durations, ran: str, realized: float | None = None) -> None:
        """Keep one finished iteration: the hint it followed, the durations it realized, the rule it ran and
        its measured makespan (None in the simulator). Replays it under both rules now."""
        from runtime.sched.simulator import simulate

        graph = self._built(hint)[0]
        ready = simulate(hint, table, self.ready, self.budget, graph=graph).makespan
        fixed = simulate(hint, table, RULES["fixed"], graph=graph).makespan
        forecast = None
        if self._prediction is not None and fixed > 0:
            forecast = abs(self._prediction - (ready / fixed - 1.0))
        self._prediction = None
        self.observed.append(_Observed(ready, fixed, ran, realized, forecast))
        del self.observed[:-self.window]

    @property
    def switches(self) -> int:
        """How many times the rule changed from one iteration to the next."""
        return sum(1 for a, b in zip(self.decisions, self.decisions[1:]) if a.rule != b.rule)


@dataclass(frozen=True)
class AutoIteration:
    """One simulated iteration under ``--policy auto``: its decision, and what each rule took on its table."""

    decision: AutoDecision
    ready: float  # the hint under the ready rule
    fixed: float  # the hint in fixed order

    @property
    def makespan(self) -> float:
        """What auto took: the makespan of the rule it chose."""
        return self.fixed if self.decision.rule == "fixed" else self.ready

    def to_json(self) -> dict:
        return {**self.decision.to_json(), "makespan_s": self.makespan, "ready_s": self.ready, "fixed_s": self.fixed}


def simulate_auto(iterations, ready: ArbiterRule, budget: MemoryBudget | Sequence[int], window: int = WINDOW
                  ) -> tuple[list[AutoIteration], AutoPolicy]:
    """``--policy auto`` in the simulator: ``iterations`` yields ``(hint, table)`` per iteration, in order.

    Each iteration runs the rule :meth:`AutoPolicy.decide` picks from the iterations before it; the
    simulator replays exactly, so the one simulation of each rule that :meth:`AutoPolicy.observe` makes is
    also what the iteration took under it (and what always-ready and always-fixed would have taken).
    """
    policy = AutoPolicy(ready, budget, window)
    out = []
    for index, (hint, table) in enumerate(iterations):
        decision = policy.decide(index, hint)
        policy.observe(hint, table, decision.rule)
        last = policy.observed[-1]
        out.append(AutoIteration(decision, last.ready, last.fixed))
    return out, policy
