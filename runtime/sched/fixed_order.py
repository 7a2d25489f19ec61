"""A fixed order replayed without an event loop: the exact order over buffered links, and blocking p2p.

When a rank runs its hint order exactly (the ``fixed`` rule), its timeline is arithmetic on the order and
the durations ([Note: exact order without events]); :func:`runtime.sched.simulator.simulate` takes these
paths when it records no decisions. Under ``p2p="blocking"`` the same arithmetic follows Megatron's blocking
point-to-point instead ([Note: blocking p2p]). Conventions are the simulator's (:mod:`runtime.sched.simulator`).

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
"""

from __future__ import annotations

from array import array
from collections import deque
from functools import reduce
from itertools import accumulate
from operator import add
from typing import Sequence

from hints.deps import TaskGraph
from hints.orders import HintOrder
from hints.validate import format_grid
from runtime.sched.results import Compute, ScheduleDeadlock, Transfer


def busy_times(executed: list[list[int]], compute: Compute) -> list[float]:
    """Per rank, its tasks' durations added up in execution order (the event loop's running sum)."""
    return [reduce(add, map(compute.__getitem__, tids), 0.0) for tids in executed]


def replay_exact_order(graph: TaskGraph, orders: list[list[int]], compute: Compute, transfer: Transfer,
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
    unmet, following = _order_links(graph, orders)
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
    peak_in_flight = order_peaks(graph, orders)
    # A task's inputs_ready is final once it runs: start = inputs_ready + overhead, as in the loop.
    began = [array("d", [inputs_ready[tid] + overhead for tid in order]) for order in orders]
    return makespan, orders, began, busy_times(orders, compute), peak_in_flight


def _order_links(graph: TaskGraph, orders: list[list[int]]) -> tuple[list[int], list[int]]:
    """Per task, its unmet inputs counting the previous task in its rank's order as one more, and the next
    task in that order (-1 for a rank's last): the graph a fixed order runs on."""
    unmet = [count + 1 for count in graph.prereq_count]
    following = [-1] * len(graph)
    for order in orders:
        if order:
            unmet[order[0]] -= 1
            for before, after in zip(order, order[1:]):
                following[before] = after
    return unmet, following


def completes_within(graph: TaskGraph, orders: list[list[int]], budgets: Sequence[int] | None) -> bool:
    """Whether the orders (task ids per rank) complete in fixed order and hold at most ``budgets`` on every
    rank: when the arbiters may use [Note: safe-state admission] in :mod:`runtime.sched.arbiter`.

    Completion is a topological sort of the dependencies plus each rank's order (no durations: with
    buffered links a fixed order completes iff that graph is acyclic and covers every task).
    """
    if budgets is None or sum(map(len, orders)) != len(graph):
        return False
    if any(peak > budget for peak, budget in zip(order_peaks(graph, orders), budgets)):
        return False
    unmet, following = _order_links(graph, orders)
    runnable = [order[0] for order in orders if order and not unmet[order[0]]]
    consumers = [local + remote for local, remote in zip(graph.local_offsets, graph.remote_offsets)]  # per block
    block_size = graph.shape.microbatches
    done = 0
    while runnable:
        tid = runnable.pop()
        done += 1
        for offset in consumers[tid // block_size]:
            consumer = tid + offset
            unmet[consumer] -= 1
            if not unmet[consumer]:
                runnable.append(consumer)
        after = following[tid]
        if after >= 0:
            unmet[after] -= 1
            if not unmet[after]:
                runnable.append(after)
    return done == len(graph)


class SafeAdmission:
    """Per iteration's hint, whether its arbiters use [Note: safe-state admission] (:func:`completes_within`),
    worked out once per hint object: a run's ranks ask every iteration, and a static hint is one object."""

    def __init__(self, graph: TaskGraph, budgets: Sequence[int] | None) -> None:
        self.graph, self.budgets = graph, budgets
        self._last: tuple[HintOrder, bool] | None = None

    def __call__(self, hint: HintOrder) -> bool:
        if self.budgets is None:
            return False
        if self._last is None or self._last[0] is not hint:
            self._last = (hint, completes_within(self.graph, [self.graph.ids(o) for o in hint.orders], self.budgets))
        return self._last[1]


def order_peaks(graph: TaskGraph, orders: list[list[int]]) -> list[int]:
    """Per rank, the most microbatch-chunks in flight over its order: +1 when a forward starts, -1 when the
    last backward of its (stage, microbatch) ends (an order's own, whatever the timing)."""
    change = [forward - frees for forward, frees in zip(graph.is_forward, graph.frees)]
    return [max(0, max(accumulate(map(change.__getitem__, order)), default=0)) for order in orders]


def replay_blocking(hint: HintOrder, graph: TaskGraph, orders: list[list[int]], compute: Compute,
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
    peak_in_flight = order_peaks(graph, orders)
    began = [array("d", [end[tid] - compute[tid] for tid in order]) for order in orders]
    return makespan, orders, began, busy_times(orders, compute), peak_in_flight


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
