"""Discrete-event pipeline simulator driving the same arbiters as the runtime.

Semantics (exactly these; tests assert makespans against them):

* A task needs the outputs named by :mod:`runtime.deps`. An output produced on
  another rank arrives ``latency`` seconds after its producer ends (the
  latency of that message, from :class:`runtime.variability.Durations`); on
  the same rank it is available when the producer ends. So ``F(0, i)`` is
  ready at 0, ``F(k, i)`` at ``end(F(k-1, i)) + latency``, ``B(S-1, i)`` at
  ``end(F(S-1, i))`` and ``B(k, i)`` at ``max(end(F(k, i)), end(B(k+1, i)) +
  latency)``.
* A rank runs one task at a time without preemption. It decides when it
  becomes idle and whenever a task becomes ready while it is idle. A decision
  at time ``t`` sees every event at or before ``t``: all events of one instant
  are applied before any rank decides.
* ``overhead`` seconds pass between a decision and the start of the chosen
  task (the runtime's dispatch cost; 0 by default): the rank is busy from
  the decision on, but only the task's own duration counts as busy time.
* Rules that look ahead ([Note: lookahead admission] in
  :mod:`runtime.arbiter`) learn, when a forward starts, when its output
  should reach its consumer's rank (start + *expected* duration + *expected*
  latency, from the model's expectations, never the sampled values: a firm
  prediction), and the rank after that when the consumer's output should
  follow (that plus the consumer's expected duration and latency: a relayed
  prediction), as the runtime's notices do. An arbiter that chose to wait
  may ask for a wake-up at a time; the simulator asks it again then.
* Makespan is the last task's end. Busy is the sum of a rank's task
  durations; idle is ``makespan - busy``; the bubble fraction is total idle
  over ``ranks * makespan``.

Deterministic: no randomness here (durations are sampled beforehand), ties
broken by rank and event order. If no event is pending while tasks remain,
the hint cannot complete under that policy and :class:`ScheduleDeadlock`
explains where each rank is stuck.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence

from hints.errors import UserError
from hints.orders import HintOrder
from hints.validate import format_grid
from runtime.arbiter import ArbiterRule, Decision, MemoryBudget, Policy, as_rule, make_arbiter
from runtime.deps import TaskGraph
from runtime.variability import Durations


class ScheduleDeadlock(UserError):
    """The hint cannot complete under the policy; ``details`` holds the rank-by-step grid."""

    def __init__(self, what: str, where: str | None = None, details: str = "") -> None:
        super().__init__(what, where)
        self.details = details


Compute = Sequence[float]
Transfer = Sequence[float]

# Event kinds (the last field of an event; ties in time are broken by the sequence number before it).
ARRIVAL, END, WAKE = 0, 1, 2


@dataclass
class SimResult:
    hint: str
    rule: ArbiterRule
    graph: TaskGraph
    budgets: list[int] | None
    makespan: float
    busy: list[float]
    start: list[float]  # per task id
    end: list[float]  # per task id
    executed: list[list[int]]  # per rank, task ids in execution order
    peak_in_flight: list[int]
    decisions: list[Decision] | None

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
            "shape": shape.to_json(),
            "memory_budget": self.budgets,
            "makespan": self.makespan,
            "busy": self.busy,
            "idle": self.idle,
            "bubble_fraction": self.bubble_fraction,
            "peak_in_flight": self.peak_in_flight,
            "tasks": len(self.graph),
        }


def simulate(
    hint: HintOrder,
    durations: Durations | tuple[Compute, Transfer],
    policy: ArbiterRule | Policy | str = Policy.FIXED,
    budget: MemoryBudget | Sequence[int] | None = None,
    record: bool = False,
    graph: TaskGraph | None = None,
    overhead: float = 0.0,
    estimates: tuple[Compute, Transfer] | None = None,
) -> SimResult:
    """Run ``hint`` under ``policy`` (a rule or its name, see :func:`runtime.arbiter.as_rule`) on ``durations``.

    ``durations`` is a :class:`Durations` table or, per task id of ``graph``,
    ``(compute seconds, latency of the message it sends)``. ``budget`` applies
    to rules that use one (default ``1f1b``); ``fixed`` ignores it. ``graph``
    may be passed to reuse one compiled graph across runs. ``overhead`` is
    the per-dispatch cost in seconds. ``estimates`` (same form as raw
    durations) are what a lookahead rule expects; by default the table's
    :meth:`Durations.expected`.
    """
    rule = as_rule(policy)
    shape = hint.shape
    if graph is None or graph.shape != shape:
        graph = TaskGraph.build(shape)
    if isinstance(durations, Durations):
        compute, transfer = durations.for_graph(graph)
        if rule.lookahead and estimates is None:
            estimates = durations.expected().for_graph(graph)
    else:
        compute, transfer = durations
    if overhead < 0 or overhead != overhead:
        raise UserError(f"must be a number >= 0, got {overhead!r}", "--task-overhead")
    lookahead = rule.lookahead
    if lookahead and estimates is None:
        raise ValueError("the lookahead rule needs estimates when durations are given as raw lists")
    expected_compute, expected_transfer = estimates if lookahead else (None, None)
    budgets = _budgets(rule, budget, shape)
    positions = [0] * len(graph)  # shared by the arbiters: each fills in its own rank's tasks
    arbiters = [
        make_arbiter(rule, graph, r, hint.orders[r], None if budgets is None else budgets[r], record, positions,
                     expected_compute)
        for r in range(shape.ranks)
    ]
    n = len(graph)
    start = [0.0] * n
    end = [0.0] * n
    executed: list[list[int]] = [[] for _ in range(shape.ranks)]
    busy = [0.0] * shape.ranks
    idle = [True] * shape.ranks
    task_rank = graph.rank
    remote_consumers = graph.remote_consumers
    is_forward = graph.is_forward
    finish = [a.finish for a in arbiters]
    deliver = [a.available for a in arbiters]
    choose = [a.choose for a in arbiters]
    expect = [a.expect for a in arbiters]
    wakeup = [a.next_wakeup for a in arbiters]

    # Event heap entries: (time, sequence, rank, task id, kind). A task end happens on the task's
    # rank; an arrival delivers the task's output to `rank`; a wake-up asks `rank` again. Decisions
    # of different ranks at one instant do not interact (a started task ends later, or at `now` as a
    # new event), so ranks decide in the order they were touched; a rank touched twice just finds
    # nothing new.
    events: list[tuple[float, int, int, int, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    sequence = 0
    now = 0.0
    deciders = list(range(shape.ranks))
    remaining = n
    while True:
        for r in deciders:
            if idle[r]:
                tid = choose[r](now)
                if tid is not None:
                    idle[r] = False
                    began = now + overhead
                    start[tid] = began
                    duration = compute[tid]
                    end[tid] = began + duration
                    busy[r] += duration
                    executed[r].append(tid)
                    sequence += 1
                    push(events, (began + duration, sequence, r, tid, END))
                    if lookahead and is_forward[tid]:
                        # Firm prediction to the consumer; relayed one hop further, as the runtime does.
                        eta = began + expected_compute[tid] + expected_transfer[tid]
                        for consumer in remote_consumers[tid]:
                            expect[task_rank[consumer]](tid, eta)
                            relayed = eta + expected_compute[consumer] + expected_transfer[consumer]
                            for further in remote_consumers[consumer]:
                                if is_forward[further]:
                                    expect[task_rank[further]](consumer, relayed, False)
                elif lookahead:
                    wake = wakeup[r]()
                    if wake is not None:
                        sequence += 1
                        push(events, (wake, sequence, r, -1, WAKE))
        deciders = []
        if not events:
            break
        now = events[0][0]
        while events and events[0][0] == now:
            _, _, r, tid, kind = pop(events)
            if kind == END:
                remaining -= 1
                finish[r](tid)
                idle[r] = True
                deciders.append(r)
                for consumer in remote_consumers[tid]:
                    dest = task_rank[consumer]
                    latency = transfer[tid]
                    if latency > 0.0:
                        sequence += 1
                        push(events, (now + latency, sequence, dest, tid, ARRIVAL))
                    elif deliver[dest](tid) and idle[dest]:
                        deciders.append(dest)
            elif kind == ARRIVAL:
                if deliver[r](tid) and idle[r]:
                    deciders.append(r)
            elif idle[r]:  # WAKE
                deciders.append(r)

    if remaining:
        raise _deadlock(hint, rule, graph, arbiters, executed)
    makespan = max(end) if n else 0.0
    return SimResult(
        hint=hint.name,
        rule=rule,
        graph=graph,
        budgets=budgets,
        makespan=makespan,
        busy=busy,
        start=start,
        end=end,
        executed=executed,
        peak_in_flight=[a.peak_in_flight for a in arbiters],
        decisions=[d for a in arbiters for d in a.decisions] if record else None,
    )


def _budgets(rule: ArbiterRule, budget: MemoryBudget | Sequence[int] | None, shape) -> list[int] | None:
    if not rule.uses_budget:
        return None
    if budget is None:
        budget = MemoryBudget.parse("1f1b")
    if isinstance(budget, MemoryBudget):
        return budget.per_rank(shape)
    budgets = list(budget)
    if len(budgets) != shape.ranks:
        raise UserError(f"needs one slot count per rank ({shape.ranks}), got {len(budgets)}", "memory budget")
    if min(budgets) < shape.chunks:
        raise UserError(f"{min(budgets)} slot(s) cannot hold one microbatch of {shape.chunks} chunks",
                        "memory budget")
    return budgets


def _deadlock(hint, rule: ArbiterRule, graph, arbiters, executed) -> ScheduleDeadlock:
    rows: list[list[str]] = []
    marks: dict[int, int] = {}
    lines = []
    for rank, arbiter in enumerate(arbiters):
        row = [str(graph.tasks[t]) for t in executed[rank]]
        if not arbiter.done:
            waiting = arbiter.waiting_on()
            if rule.exact_order and waiting and arbiter.head < len(arbiter.order):
                blocked = arbiter.order[arbiter.head]
                needs = next((n for t, n in waiting if t == blocked), [])
            else:
                blocked, needs = waiting[0] if waiting else (None, [])
            if blocked is not None:
                marks[rank] = len(row)
                row.append(f"{blocked}?")
                wanted = ", ".join(f"{t} (rank {graph.shape.rank_of(t.stage)})" for t in needs) or "memory"
                lines.append(f"rank {rank} waits at step {len(row) - 1} for {blocked}, which needs {wanted}")
        rows.append(row)
    grid = format_grid(rows, marks)
    done = sum(a.finished for a in arbiters)
    what = (
        f"cannot complete under the {rule.policy} policy: all ranks wait with {len(graph) - done} of "
        f"{len(graph)} tasks left (first: {lines[0] if lines else 'no runnable task'})"
    )
    return ScheduleDeadlock(what, f"hint {hint.name}", grid + "\n" + "\n".join(lines))


def check_completes(hint: HintOrder) -> None:
    """Raise :class:`ScheduleDeadlock` if ``hint`` cannot complete under the fixed policy.

    Whether a fixed order completes does not depend on durations, so unit
    durations answer it.
    """
    graph = TaskGraph.build(hint.shape)
    simulate(hint, ([1.0] * len(graph), [0.0] * len(graph)), "fixed", graph=graph)


__all__ = ["ScheduleDeadlock", "SimResult", "check_completes", "simulate"]
