"""What a simulation returns: :class:`SimResult` (times, busy time, peaks, decisions), or
:class:`ScheduleDeadlock` when the hint cannot complete under the rule (with the rank-by-step grid).

Conventions: task ids are those of :class:`hints.deps.TaskGraph`; ``executed[r]`` lists rank ``r``'s tasks in
the order they ran and ``began[r]`` their starts, in seconds from the iteration's start.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass
from functools import cached_property
from operator import add
from typing import Sequence

from hints.deps import TaskGraph
from hints.errors import UserError
from runtime.sched.arbiter import Decision
from runtime.sched.rules import ArbiterRule, Policy

Compute = Sequence[float]
Transfer = Sequence[float]


class ScheduleDeadlock(UserError):
    """The hint cannot complete under the policy; ``details`` holds the rank-by-step grid."""

    def __init__(self, what: str, where: str | None = None, details: str = "") -> None:
        super().__init__(what, where)
        self.details = details


@dataclass
class SimResult:
    hint: str
    rule: ArbiterRule
    graph: TaskGraph
    budgets: list[int] | None
    makespan: float
    busy: list[float]
    executed: list[list[int]]  # per rank, task ids in execution order
    began: list[Sequence[float]]  # per rank, the start of each task in `executed`
    compute: Sequence[float]  # per task id, its duration
    peak_in_flight: list[int]
    decisions: list[Decision] | None
    p2p: str = "async"  # or "blocking": [Note: blocking p2p]

    # Per task id, start and end times: built on first use. The event loop keeps only each rank's
    # start times, unboxed, in execution order: storing two float objects per task into task-sized
    # lists as tasks run costs a cache miss each at hundreds of thousands of tasks, and most callers
    # (tune-hint, --compare) read only the makespan and busy times.
    @cached_property
    def start(self) -> array:
        return self._per_task(self.began)

    @cached_property
    def end(self) -> array:
        return self._per_task(map(add, began, map(self.compute.__getitem__, tids))
                              for tids, began in zip(self.executed, self.began))

    def _per_task(self, per_rank) -> array:
        times = array("d", bytes(8 * len(self.graph)))
        for tids, values in zip(self.executed, per_rank):
            deque(map(times.__setitem__, tids, values), maxlen=0)
        return times

    @property
    def policy(self) -> Policy:
        return self.rule.policy

    @property
    def idle(self) -> list[float]:
        return [self.makespan - b for b in self.busy]

    @property
    def bubble_fraction(self) -> float:
        ranks = len(self.busy)
        return sum(self.idle) / (ranks * self.makespan) if self.makespan > 0 else 0.0

    def executed_tasks(self, rank: int):
        tasks = self.graph.tasks
        return [tasks[t] for t in self.executed[rank]]

    def to_json(self) -> dict:
        shape = self.graph.shape
        return {
            "hint": self.hint,
            "policy": str(self.policy),
            "rule": self.rule.name,
            "lookahead": self.rule.lookahead,
            "p2p": self.p2p,
            "shape": shape.to_json(),
            "memory_budget": self.budgets,
            "makespan": self.makespan,
            "busy": self.busy,
            "idle": self.idle,
            "bubble_fraction": self.bubble_fraction,
            "peak_in_flight": self.peak_in_flight,
            "tasks": len(self.graph),
        }
