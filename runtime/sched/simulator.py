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
  :mod:`runtime.sched.arbiter`) learn, when a forward starts, when its output
  should reach its consumer's rank (start + *expected* duration + *expected*
  latency, from the model's expectations, never the sampled values: a firm
  prediction), and the rank after that when the consumer's output should
  follow (that plus the consumer's expected duration and latency: a relayed
  prediction), as the runtime's notices do. An arbiter that chose to wait
  may ask for a wake-up at a time; the simulator asks it again then.
* Makespan is the last task's end. Busy is the sum of a rank's task
  durations; idle is ``makespan - busy``; the bubble fraction is total idle
  over ``ranks * makespan``.

* ``p2p="blocking"`` (``--p2p blocking``, the ``fixed`` rule only) replaces
  the buffered links by Megatron's blocking point-to-point: [Note: blocking
  p2p].

Deterministic: no randomness here (durations are sampled beforehand), ties
broken by rank and event order. If no event is pending while tasks remain,
the hint cannot complete under that policy and :class:`ScheduleDeadlock`
explains where each rank is stuck.

[Note: blocking p2p]
    Megatron-core's 1F1B (``forward_backward_pipelining_without_interleaving``
    in ``megatron/core/pipeline_parallel/schedules.py``) communicates between
    compute steps through ``p2p_communication._communicate``: it posts the
    step's sends and receives together (``batch_isend_irecv``, or one
    ``isend``/``irecv`` each) and waits on all of them before computing
    again (``send_forward_recv_backward``, ``send_backward_recv_forward``,
    ``recv_forward``, ``send_forward``...). An NCCL send completes only when
    the peer has posted the matching receive. The rule, for a fixed order:

    * a rank's *post point* before its ``k``-th task is the end of its task
      ``k-1`` (0 for the first task). There it posts the sends of task
      ``k-1``'s cross-rank outputs and the receives of task ``k``'s
      cross-rank inputs, and waits until all of them complete;
    * a message from producer ``p`` to consumer ``c`` completes, on both
      sides, at ``max(end(p), post(c)) + latency(p)``: the sender posts it
      at ``end(p)``, the receiver at ``post(c)``, and the bytes move once
      both have (rendezvous);
    * so ``start(t_k) = max(post(t_k), completion of each receive of t_k,
      completion of each send of t_{k-1}) + overhead``.

    What this leaves out: Megatron's warm-up and cool-down call
    ``recv_forward`` and ``send_forward`` (``recv_backward``,
    ``send_backward``) one after the other, not batched; batching them can
    only complete earlier, so the model is, if anything, kind to the
    baseline. The interleaved schedule pairs a forward and a backward
    between two communication points and receives one step ahead
    (``send_forward_backward_recv_forward_backward``); that pairing is not
    modelled: every task is its own step. NCCL's eager protocol for small
    messages (a send that completes before the receive is posted) is not
    modelled either.

    Never faster than async: by induction over the tasks in the order the
    replay computes them, each blocking start time is a maximum over a
    superset of the async terms (the previous task's end, each input's end
    plus its latency), each term no smaller, since ``max(end(p), post(c)) >=
    end(p)``. ``test_properties`` checks it on random durations.

    Deadlock. The rule makes ``t_k`` wait for ``t_{k-1}``, for the producer
    of each of its inputs, and, for each consumer ``c`` of ``t_{k-1}``'s
    outputs, for the task before ``c`` on its rank (whose end is ``c``'s post
    point). An order completes iff this wait-for graph is acyclic, which the
    replay decides by counting (Kahn's algorithm): a task whose waits are
    all met runs; if tasks remain when none can, they wait on one another in
    a cycle and the hint cannot complete under blocking p2p, whatever the
    durations; :class:`ScheduleDeadlock` names each stuck rank's task and
    what it waits for. An order that completes async can still deadlock
    here: rank 0 runs ``0F0 0F1`` and rank 1 ``1F1 1F0``; rank 0's send of
    ``0F0`` waits for rank 1 to reach ``1F0``, which follows ``1F1``, whose
    input rank 0 sends only after that wait. 1F1B never does: its two
    neighbours post matching pairs at every step.

Cost: linear in the number of tasks. The event loop delivers a message
without an event when nothing can tell the difference ([Note: early
delivery]); a rule that runs the hint order exactly (``fixed``) needs no
events at all unless decisions are recorded ([Note: exact order without
events]); allocation-heavy work runs with the cyclic collector paused
([Note: cyclic GC and task-sized lists] in :mod:`hints.tasks`).
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from functools import cached_property, reduce
from itertools import accumulate
from operator import add
from typing import Sequence

from hints.errors import UserError
from hints.orders import HintOrder
from hints.tasks import cyclic_gc_paused
from hints.validate import format_grid
from runtime.sched.arbiter import Decision
from runtime.sched.budget import MemoryBudget
from runtime.sched.rules import ArbiterRule, as_rule, check_p2p, make_arbiter, Policy
from hints.deps import TaskGraph
from runtime.durations.variability import Durations


class ScheduleDeadlock(UserError):
    """The hint cannot complete under the policy; ``details`` holds the rank-by-step grid."""

    def __init__(self, what: str, where: str | None = None, details: str = "") -> None:
        super().__init__(what, where)
        self.details = details


Compute = Sequence[float]
Transfer = Sequence[float]

# Event kinds.
ARRIVAL, END, WAKE = 0, 1, 2


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
        raise UserError(f"must be a number >= 0, got {overhead!r}", "--task-overhead")
    lookahead = rule.lookahead
    if lookahead and estimates is None:
        raise ValueError("the lookahead rule needs estimates when durations are given as raw lists")
    expected_compute, expected_transfer = estimates if lookahead else (None, None)
    budgets = _budgets(rule, budget, shape)
    if p2p == "blocking":
        orders = [graph.ids(order) for order in hint.orders]
        makespan, executed, began, busy, peak_in_flight = _replay_blocking(hint, graph, orders, compute, transfer,
                                                                           overhead)
        return SimResult(hint=hint.name, rule=rule, graph=graph, budgets=budgets, makespan=makespan, busy=busy,
                         executed=executed, began=began, compute=compute, peak_in_flight=peak_in_flight,
                         decisions=None, p2p=p2p)
    if rule.exact_order and not record and min(compute, default=0.0) >= 0.0:
        replayed = _replay_exact_order(graph, [graph.ids(order) for order in hint.orders], compute, transfer, overhead)
        if replayed is not None:
            makespan, executed, began, busy, peak_in_flight = replayed
            return SimResult(hint=hint.name, rule=rule, graph=graph, budgets=budgets, makespan=makespan, busy=busy,
                             executed=executed, began=began, compute=compute, peak_in_flight=peak_in_flight,
                             decisions=None)
        # Some rank is stuck: the event loop below finds where, for the report.
    positions = [0] * len(graph)  # shared by the arbiters: each fills in its own rank's tasks
    arbiters = [
        make_arbiter(rule, graph, r, hint.orders[r], None if budgets is None else budgets[r], record, positions,
                     expected_compute)
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
    # The same, only forwards that feed forwards (what lookahead predictions follow).
    forward_targets = [tuple((d, rank) for d, rank in targets if block_forward[b + d // block_size])
                       if block_forward[b] else () for b, targets in enumerate(remote_targets)]
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
                        targets = forward_targets[tid // block_size]
                        if targets:  # a forward: firm prediction to its consumer, relayed one hop further
                            eta = began + expected_compute[tid] + expected_transfer[tid]
                            for offset, dest in targets:
                                consumer = tid + offset
                                if inline:  # expect_consumer, written out ([Note: inlined predictions])
                                    h = positions[consumer]
                                    if unmets[dest][h]:
                                        etas[dest][h] = eta
                                else:
                                    expect[dest](consumer, eta)
                                further_targets = forward_targets[consumer // block_size]
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
        busy=_busy(executed, compute),
        executed=executed,
        began=began_at,
        compute=compute,
        peak_in_flight=[a.peak_in_flight for a in arbiters],
        decisions=[d for a in arbiters for d in a.decisions] if record else None,
    )


def _busy(executed: list[list[int]], compute: Compute) -> list[float]:
    """Per rank, its tasks' durations added up in execution order (the event loop's running sum)."""
    return [reduce(add, map(compute.__getitem__, tids), 0.0) for tids in executed]


def _replay_exact_order(graph: TaskGraph, orders: list[list[int]], compute: Compute, transfer: Transfer,
                        overhead: float):
    """The event loop's result for a rule that runs the hint order exactly, computed without events.

    [Note: exact order without events] When every rank runs its order
    exactly, the event loop reduces to arithmetic: a rank decides on its next
    task when it becomes idle or when that task's last input arrives,
    whichever is later, so the task starts at ``max(end of the rank's previous
    task, arrival of each input) + overhead``, where an input arrives at its
    producer's end, plus the message's latency when it crosses ranks. Treating
    "the previous task in the rank's order" as one more input, tasks are
    computed in any order that respects these inputs, each once. Every time
    is the same float sum as in the event loop, so results are identical.
    Returns ``(makespan, executed, began, busy, peak in flight)`` (see
    :class:`SimResult`), or ``None`` if some task never runs (a deadlock: the
    event loop then reports it).
    """
    n = len(graph)
    if sum(map(len, orders)) != n:
        return None
    unmet = [count + 1 for count in graph.prereq_count]  # + the previous task in the rank's order
    following = [-1] * n  # the next task in the rank's order
    for order in orders:
        if order:
            unmet[order[0]] -= 1
            for before, after in zip(order, order[1:]):
                following[before] = after
    inputs_ready = [0.0] * n  # the latest input arrival seen so far (the previous task's end included)
    makespan = 0.0
    local_offsets, remote_offsets, block_size = graph.local_offsets, graph.remote_offsets, graph.shape.microbatches
    runnable = deque(order[0] for order in orders if order and not unmet[order[0]])
    take, add_runnable = runnable.popleft, runnable.append
    done = 0
    while runnable:
        tid = take()
        done += 1
        finished = inputs_ready[tid] + overhead + compute[tid]  # (its start, then + its duration)
        if finished > makespan:
            makespan = finished
        block = tid // block_size
        for offset in local_offsets[block]:  # later on this rank: its previous task's end covers this one's
            consumer = tid + offset
            unmet[consumer] -= 1
            if not unmet[consumer]:
                add_runnable(consumer)
        offsets = remote_offsets[block]
        if offsets:
            latency = transfer[tid]
            arrival = finished + latency if latency > 0.0 else finished
            for offset in offsets:
                consumer = tid + offset
                if arrival > inputs_ready[consumer]:
                    inputs_ready[consumer] = arrival
                unmet[consumer] -= 1
                if not unmet[consumer]:
                    add_runnable(consumer)
        after = following[tid]
        if after >= 0:
            if finished > inputs_ready[after]:
                inputs_ready[after] = finished
            unmet[after] -= 1
            if not unmet[after]:
                add_runnable(after)
    if done < n:
        return None
    peak_in_flight = _order_peaks(graph, orders)
    # A task's inputs_ready is final once it runs: start = inputs_ready + overhead, as in the loop.
    began = [array("d", [inputs_ready[tid] + overhead for tid in order]) for order in orders]
    return makespan, orders, began, _busy(orders, compute), peak_in_flight


def _order_peaks(graph: TaskGraph, orders: list[list[int]]) -> list[int]:
    """Per rank, the most microbatch-chunks in flight over its order: +1 when a forward starts, -1 when the
    last backward of its (stage, microbatch) ends (an order's own, whatever the timing)."""
    change = [forward - frees for forward, frees in zip(graph.is_forward, graph.frees)]
    return [max(0, max(accumulate(map(change.__getitem__, order)), default=0)) for order in orders]


def _replay_blocking(hint: HintOrder, graph: TaskGraph, orders: list[list[int]], compute: Compute,
                     transfer: Transfer, overhead: float):
    """A fixed order under [Note: blocking p2p]: ``(makespan, executed, began, busy, peak in flight)``.

    Raises :class:`ScheduleDeadlock` when the order cannot complete under the rule.
    """
    n = len(graph)
    if sorted(t for order in orders for t in order) != list(range(n)):
        raise ScheduleDeadlock("cannot complete with blocking p2p: the hint does not run every task once",
                               f"hint {hint.name}")
    before = [-1] * n  # the previous task in its rank's order: its end is this task's post point
    for order in orders:
        for earlier, later in zip(order, order[1:]):
            before[later] = earlier
    consumers = graph.remote_consumers  # per task id: the cross-rank consumers of its output (messages)
    inputs = graph.remote_producers  # per task id: the producers of its cross-rank inputs
    # What each task waits for (the wait-for graph of the note): its previous task, its inputs' producers
    # (local ones too: an order that runs a consumer before its local producer cannot complete), and for
    # each consumer of the previous task's outputs, the task before that consumer.
    waits = [set() for _ in range(n)]
    for producer, targets in enumerate(graph.local_consumers):
        for consumer in targets:
            waits[consumer].add(producer)  # ends before the previous task's end when the order is valid
    for tid in range(n):
        previous = before[tid]
        if previous >= 0:
            waits[tid].add(previous)
            waits[tid].update(before[c] for c in consumers[previous] if before[c] >= 0)
        waits[tid].update(inputs[tid])
    unmet = [len(w) for w in waits]
    followers: list[list[int]] = [[] for _ in range(n)]
    for tid, wanted in enumerate(waits):
        for other in wanted:
            followers[other].append(tid)
    end = [0.0] * n
    done = [False] * n
    runnable = deque(t for t in range(n) if not unmet[t])
    count = 0
    while runnable:
        tid = runnable.popleft()
        previous = before[tid]
        post = end[previous] if previous >= 0 else 0.0
        ready = post
        for producer in inputs[tid]:  # receives posted at `post`
            ready = max(ready, max(end[producer], post) + transfer[producer])
        if previous >= 0:  # the sends of the previous task, posted at its end (= post)
            for consumer in consumers[previous]:
                taken = end[before[consumer]] if before[consumer] >= 0 else 0.0
                ready = max(ready, max(post, taken) + transfer[previous])
        end[tid] = ready + overhead + compute[tid]
        done[tid] = True
        count += 1
        for follower in followers[tid]:
            unmet[follower] -= 1
            if not unmet[follower]:
                runnable.append(follower)
    if count < n:
        raise _blocking_deadlock(hint, graph, orders, done, before, inputs, consumers)
    makespan = max(end, default=0.0)
    peak_in_flight = _order_peaks(graph, orders)
    began = [array("d", [end[tid] - compute[tid] for tid in order]) for order in orders]
    return makespan, orders, began, _busy(orders, compute), peak_in_flight


def _blocking_deadlock(hint, graph: TaskGraph, orders, done, before, inputs, consumers) -> ScheduleDeadlock:
    """Where each rank is stuck under [Note: blocking p2p], as a grid and a line per rank."""
    tasks, rank_of = graph.tasks, graph.rank
    rows, marks, lines = [], {}, []
    for rank, order in enumerate(orders):
        row = [str(tasks[t]) for t in order if done[t]]
        stuck = next((t for t in order if not done[t]), None)
        if stuck is not None:
            marks[rank] = len(row)
            row.append(f"{tasks[stuck]}?")
            wanted = [f"its input {tasks[p]} (rank {rank_of[p]})" for p in inputs[stuck] if not done[p]]
            wanted += [f"its input {tasks[p]} (this rank, later in the order)"
                       for p in range(len(done)) if stuck in graph.local_consumers[p] and not done[p]]
            previous = before[stuck]
            if previous >= 0:
                wanted += [f"rank {rank_of[c]} to post its receive of {tasks[previous]} (before {tasks[c]}, "
                           f"after {tasks[before[c]]})" for c in consumers[previous]
                           if before[c] >= 0 and not done[before[c]]]
            lines.append(f"rank {rank} waits at step {len(row) - 1} for {tasks[stuck]}: "
                         f"{'; '.join(wanted) or 'its previous task'}")
        rows.append(row)
    left = len(done) - sum(done)
    what = (f"cannot complete with blocking p2p (--p2p blocking): the ranks wait for one another with {left} of "
            f"{len(done)} tasks left (first: {lines[0] if lines else 'no runnable task'})")
    return ScheduleDeadlock(what, f"hint {hint.name}", format_grid(rows, marks) + "\n" + "\n".join(lines))


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
