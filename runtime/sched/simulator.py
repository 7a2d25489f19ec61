"""Discrete-event pipeline simulator driving the same arbiters as the runtime.

Semantics (exactly these; tests assert makespans against them):

* A task needs the outputs named by :mod:`hints.deps`. An output produced on
  another rank arrives ``latency`` seconds after its producer ends (the
  latency of that message, from :class:`runtime.durations.variability.Durations`); on
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
  :mod:`runtime.sched.arbiter`) learn, when a forward starts whose output
  goes to another rank's forward, or a backward (``B`` or ``I``) whose input
  gradient goes to another rank's backward, when that output should reach
  its consumer's rank (start + *expected* duration + *expected* latency, from
  the model's expectations, never the sampled values: a firm prediction),
  and the rank after that when the consumer's output should follow (that plus
  the consumer's expected duration and latency: a relayed prediction), as
  the runtime's notices do. An arbiter that chose to wait may ask for a
  wake-up at a time; the simulator asks it again then.
* Makespan is the last task's end. Busy is the sum of a rank's task
  durations; idle is ``makespan - busy``; the bubble fraction is total idle
  over ``ranks * makespan``.

* ``p2p="blocking"`` (``--p2p blocking``, the ``fixed`` rule only) replaces
  the buffered links by Megatron's blocking point-to-point: [Note: blocking
  p2p] in :mod:`runtime.sched.fixed_order`.

Deterministic: no randomness here (durations are sampled beforehand), ties
broken by rank and event order. If no event is pending while tasks remain,
the hint cannot complete under that policy and :class:`ScheduleDeadlock`
explains where each rank is stuck. What a simulation returns (:class:`SimResult`,
:class:`ScheduleDeadlock`) is in :mod:`runtime.sched.results`.

Cost: linear in the number of tasks. The event loop delivers a message
without an event when nothing can tell the difference ([Note: early
delivery]); a rule that runs the hint order exactly (``fixed``) needs no
events at all unless decisions are recorded ([Note: exact order without
events] in :mod:`runtime.sched.fixed_order`); allocation-heavy work runs with the cyclic collector paused
([Note: cyclic GC and task-sized lists] in :mod:`hints.tasks`).
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from typing import Sequence

from hints.deps import TaskGraph
from hints.errors import UserError
from hints.orders import HintOrder
from hints.tasks import cyclic_gc_paused
from hints.validate import format_grid
from runtime.durations.variability import Durations
from runtime.sched.budget import MemoryBudget
from runtime.sched.fixed_order import busy_times, completes_within, replay_blocking, replay_exact_order
from runtime.sched.results import Compute, ScheduleDeadlock, SimResult, Transfer
from runtime.sched.rules import ArbiterRule, Policy, as_rule, check_p2p, make_arbiter

# Event kinds.
ARRIVAL, END, WAKE = 0, 1, 2


@cyclic_gc_paused()  # [Note: cyclic GC and task-sized lists] in hints.tasks
def simulate(
    hint: HintOrder,
    durations: Durations | tuple[Compute, Transfer],
    rule: ArbiterRule | Policy | str = "fixed",
    budget: MemoryBudget | Sequence[int] | None = None,
    record: bool = False,
    graph: TaskGraph | None = None,
    overhead: float = 0.0,
    estimates: tuple[Compute, Transfer] | None = None,
    p2p: str = "async",
) -> SimResult:
    """Run ``hint`` under ``rule`` (a rule, its name, or the policy ``ready`` for greedy: see
    :func:`runtime.sched.rules.as_rule`) on ``durations``.

    ``durations`` is a :class:`Durations` table or, per task id of ``graph``,
    ``(compute seconds, latency of the message it sends)``. ``budget`` applies
    to rules that use one (default ``1f1b``); ``fixed`` ignores it. ``graph``
    may be passed to reuse one compiled graph across runs. ``overhead`` is
    the per-dispatch cost in seconds. ``estimates`` (same form as raw
    durations) are what a lookahead rule expects; by default the table's
    :meth:`Durations.expected`. ``p2p="blocking"`` (the ``fixed`` rule only)
    runs [Note: blocking p2p]; decisions are not recorded then.
    """
    rule = as_rule(rule)
    check_p2p(p2p, rule)
    if p2p == "blocking" and record:
        raise ValueError("blocking p2p replays the order without an arbiter: there are no decisions to record")
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
        raise UserError(f"must be a number >= 0, got {overhead!r}", "`task_overhead`")
    lookahead = rule.lookahead
    if lookahead and estimates is None:
        raise ValueError("the lookahead rule needs estimates when durations are given as raw lists")
    expected_compute, expected_transfer = estimates if lookahead else (None, None)
    budgets = _budgets(rule, budget, shape)
    if p2p == "blocking":
        orders = [graph.ids(order) for order in hint.orders]
        makespan, executed, began, busy, peak_in_flight = replay_blocking(hint, graph, orders, compute, transfer,
                                                                           overhead)
        return SimResult(hint=hint.name, rule=rule, graph=graph, budgets=budgets, makespan=makespan, busy=busy,
                         executed=executed, began=began, compute=compute, peak_in_flight=peak_in_flight,
                         decisions=None, p2p=p2p)
    if rule.exact_order and not record and min(compute, default=0.0) >= 0.0:
        replayed = replay_exact_order(graph, [graph.ids(order) for order in hint.orders], compute, transfer, overhead)
        if replayed is not None:
            makespan, executed, began, busy, peak_in_flight = replayed
            return SimResult(hint=hint.name, rule=rule, graph=graph, budgets=budgets, makespan=makespan, busy=busy,
                             executed=executed, began=began, compute=compute, peak_in_flight=peak_in_flight,
                             decisions=None)
        # Some rank is stuck: the event loop below finds where, for the report.
    # Shared by the arbiters (see runtime.sched.arbiter.Arbiter): each fills in its own rank's tasks, with
    # position numbers from one list of ints.
    positions = [0] * len(graph)
    numbers = list(range(max(map(len, hint.orders), default=0)))
    # [Note: safe-state admission] in runtime.sched.arbiter
    safe = rule.uses_budget and completes_within(graph, [graph.ids(order) for order in hint.orders], budgets)
    arbiters = [
        make_arbiter(rule, graph, r, hint.orders[r], None if budgets is None else budgets[r], record, positions,
                     expected_compute, safe, numbers)
        for r in range(shape.ranks)
    ]
    executed: list[list[int]] = [[] for _ in range(shape.ranks)]
    began_at = [array("d") for _ in range(shape.ranks)]  # see SimResult.start
    makespan = 0.0
    idle = [True] * shape.ranks
    busy_until = [0.0] * shape.ranks  # the end of the rank's running task
    remote_offsets, block_size = graph.remote_offsets, shape.microbatches  # consumers of t: t + d
    # Per block, (offset, rank) of each remote consumer: the per-task lists are cache misses at scale.
    block_rank, block_forward = graph.block_rank, graph.block_forward
    remote_targets = [tuple((d, block_rank[b + d // block_size]) for d in offsets)
                      for b, offsets in enumerate(remote_offsets)]
    # The same, only forwards that feed forwards and backwards that feed backwards (what lookahead
    # predictions follow: every remote consumer is one, but the rule is the note's, not the graph's).
    predicted_targets = [tuple((d, rank) for d, rank in targets if block_forward[b + d // block_size] ==
                               block_forward[b]) for b, targets in enumerate(remote_targets)]
    finish = [a.finish for a in arbiters]
    deliver = [a.available for a in arbiters]
    choose = [a.choose for a in arbiters]
    expect = [a.expect_consumer for a in arbiters]
    expect_relayed = [a.expect_consumer_relayed for a in arbiters]
    # [Note: inlined predictions] A lookahead simulation sends about one prediction per task, and a
    # method call each was about 4% of its CPU time at 128 ranks x 512 microbatches. An arbiter that exposes
    # the lists its expect_consumer/expect_consumer_relayed write (prediction_slots) gets those writes
    # inline, the same rule; any other arbiter, the calls. test_simulator checks both give one result.
    slots = [getattr(a, "prediction_slots", None) for a in arbiters]
    inline = lookahead and all(slots)
    unmets, etas, relayed_etas = zip(*(slot() for slot in slots)) if inline else ((), (), ())
    wakeup = [a.next_wakeup for a in arbiters]
    run = [tids.append for tids in executed]
    run_at = [starts.append for starts in began_at]

    # Events: a task end happens on the task's rank; an arrival delivers the task's output to `rank`;
    # a wake-up asks `rank` again. All events of one instant are applied, in the order they were
    # scheduled, before the ranks they touched decide, in the order they were touched (a started task
    # ends later, or at `now` as a new event); a rank touched twice is asked again. (Only the lookahead
    # rule's predictions reach another rank within a decision round, but the order is kept for every
    # rule.) Pending events are two lists sorted by time: inserting with bisect_right after the events
    # of the same instant keeps the scheduling order, and costs less than a heap of tuples.
    #
    # [Note: early delivery] A message that arrives while its destination is running a task that ends
    # strictly later is delivered when it is sent, without an arrival event. Nothing can tell the
    # difference: the destination decides nothing before its task ends, delivery only counts an input
    # (the ready set it builds does not depend on the order of deliveries), and the only thing another
    # rank asks it meanwhile (a lookahead prediction, Arbiter.expect) concerns a consumer whose
    # producer has not ended, so never this one. (When the task ends at the arrival instant, the
    # event is kept: the arrival touches the rank again in that instant's deciders.)
    times: list[float] = []  # pending events, sorted by time (ties: in the order they were scheduled)
    events: list[tuple[int, int, int]] = []  # (kind, rank, task id) of each, in the same order
    now = 0.0
    deciders = list(range(shape.ranks))
    while True:
        for r in deciders:
            if idle[r]:
                tid = choose[r](now)
                if tid is not None:
                    idle[r] = False
                    began = now + overhead
                    finished = busy_until[r] = began + compute[tid]
                    if finished > makespan:
                        makespan = finished
                    run[r](tid)
                    run_at[r](began)
                    at = bisect_right(times, finished)
                    times.insert(at, finished)
                    events.insert(at, (END, r, tid))
                    if lookahead:
                        targets = predicted_targets[tid // block_size]
                        if targets:  # firm prediction to its consumer, relayed one hop further
                            eta = began + expected_compute[tid] + expected_transfer[tid]
                            for offset, dest in targets:
                                consumer = tid + offset
                                if inline:  # expect_consumer, written out ([Note: inlined predictions])
                                    h = positions[consumer]
                                    if unmets[dest][h]:
                                        etas[dest][h] = eta
                                else:
                                    expect[dest](consumer, eta)
                                further_targets = predicted_targets[consumer // block_size]
                                if further_targets:
                                    relayed = eta + expected_compute[consumer] + expected_transfer[consumer]
                                    for further_offset, further_dest in further_targets:
                                        if inline:  # expect_consumer_relayed, written out
                                            h = positions[consumer + further_offset]
                                            if unmets[further_dest][h] and etas[further_dest][h] is None:
                                                relayed_etas[further_dest][h] = relayed
                                        else:
                                            expect_relayed[further_dest](consumer + further_offset, relayed)
                elif lookahead:
                    wake = wakeup[r]()
                    if wake is not None:
                        at = bisect_right(times, wake)
                        times.insert(at, wake)
                        events.insert(at, (WAKE, r, -1))
        if not times:
            break
        # Apply every event of the next instant, then let the ranks they touched decide.
        now = times.pop(0)
        kind, r, tid = events.pop(0)
        deciders.clear()
        while True:
            if kind == END:
                finish[r](tid)
                idle[r] = True
                deciders.append(r)
                targets = remote_targets[tid // block_size]
                if targets:
                    latency = transfer[tid]
                    for offset, dest in targets:
                        if latency > 0.0:
                            arrival = now + latency
                            if not idle[dest] and busy_until[dest] > arrival:
                                deliver[dest](tid)  # [Note: early delivery]
                                continue
                            at = bisect_right(times, arrival)
                            times.insert(at, arrival)
                            events.insert(at, (ARRIVAL, dest, tid))
                        elif deliver[dest](tid) and idle[dest]:
                            deciders.append(dest)
            elif kind == ARRIVAL:
                if deliver[r](tid) and idle[r]:
                    deciders.append(r)
            elif idle[r]:  # WAKE
                deciders.append(r)
            if not times or times[0] != now:
                break
            del times[0]
            kind, r, tid = events.pop(0)

    if not all(a.done for a in arbiters):
        raise _deadlock(hint, rule, graph, arbiters, executed)
    return SimResult(
        hint=hint.name,
        rule=rule,
        graph=graph,
        budgets=budgets,
        makespan=makespan,
        busy=busy_times(executed, compute),
        executed=executed,
        began=began_at,
        compute=compute,
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


def check_completes(hint: HintOrder, p2p: str = "async") -> None:
    """Raise :class:`ScheduleDeadlock` if ``hint`` cannot complete under the fixed policy (with ``p2p``).

    Whether a fixed order completes does not depend on durations (under
    blocking p2p neither: [Note: blocking p2p]), so unit durations answer it.
    """
    graph = TaskGraph.build(hint.shape)
    simulate(hint, ([1.0] * len(graph), [0.0] * len(graph)), "fixed", graph=graph, p2p=p2p)


__all__ = ["ScheduleDeadlock", "SimResult", "check_completes", "simulate"]
