"""Tensor parallelism: lightweight coordination of a stage's TP group (the sharded layers: :mod:`runtime.workloads.tp_layers`).

With ``--tp N`` each pipeline stage runs on the N members of a TP group
(:class:`runtime.comm.grid.ProcessGrid`); every member holds a shard of the
stage's layers and the layers' collectives (all-reduces on the group) run
inside ``F``, ``B`` and ``I``. Members must therefore run the group's tasks in
one order: a collective matches the next collective of the other members, so
two members running different tasks would hang, or sum the wrong tensors.

[Note: TP coordination]
    Member 0 of a group, the *leader*, decides with the group's arbiter (its
    ready set, the hint, the memory budget, the lookahead: everything of a
    pipeline-only rank). Before it runs the chosen task it posts one DECISION
    message to each follower on a dedicated link (:mod:`runtime.comm.frames`:
    a header-only frame, task and index; no collective, nothing per poll).
    A follower's arbiter is a :class:`FollowerArbiter`: the leader's
    decisions, in order, are its order; it runs the next one as soon as that
    task's inputs have reached it, and nothing else. The executor loop is the
    same on every member; only the arbiter differs (:func:`member_arbiter`).

[Note: every member receives its own inputs]
    Activations and gradients at stage boundaries are replicated across a TP
    group (the row-parallel layers all-reduce their outputs), so each member
    of the producing group sends its own copy to the member with the same TP
    index in the consuming group: links within each TP slice of the grid, no
    extra hop. The alternative, only the leader receives and broadcasts to
    its followers, puts a second transfer of the whole activation on the
    follower's path of every input and serializes the group's receptions on
    the leader's thread. Measured in docs/benchmarks/tp-dp.md with
    ``rrfp trace follow``: the follow latency per decision, and each
    follower's input lag behind its leader's copy (about zero on gpt at
    pp=2; 0.3 ms at pp=4 on the emulated workload, where forwarding might
    have been faster: the own copies come from followers that run behind).

[Note: TP coordination cannot deadlock]
    Claim: if the leaders' arbiters, seen as a pipeline-only job, cannot
    deadlock (the notes of :mod:`runtime.sched.arbiter`), neither can the job with
    followers. Order all decisions of an iteration by the instant their
    leader made them. Suppose some member never completes some decided task,
    and let ``u``, decided by the leader of group ``G``, be the earliest such
    task in that order. (1) Every member of ``G`` reaches ``u``: the tasks
    before ``u`` in ``G``'s sequence were decided earlier, so by minimality
    every member completed them, and each follower gets the DECISION for
    ``u`` (links are FIFO and never drop). (2) Every member of ``G`` has
    ``u``'s inputs: local ones come from tasks earlier in the sequence
    (the leader decided ``u`` only once they were done, and its local
    dependencies are the followers' local dependencies: same stages); a
    remote one is the output of a task ``p`` of a group ``G'``, and the
    leader of ``G`` received ``p``'s output before deciding ``u``, so ``p``
    was decided before ``u``; by minimality every member of ``G'``
    completed ``p`` and sent its output to its counterpart in ``G``, which
    receives it. (3) So every member of ``G`` starts ``u``, and, running
    the same code on the same shapes, issues the same collectives in the
    same order on ``G``'s group; they all complete, and so does ``u`` on every
    member: a contradiction. Hence every decided task completes on every
    member, the leaders see a pipeline whose every started task ends, and
    their own notes apply. Two things keep the premise of (3) true: a TP
    group's collectives run only inside tasks, on the executor's thread
    (DP all-reduces use other groups; the end-of-iteration barrier comes
    after every task); and nothing but the leader chooses.
    ``tests/unit/test_tp.py`` drives random arrival orders per member through
    this logic without processes, and shows that uncoordinated members do
    reach mismatched collectives.
"""

from __future__ import annotations

import time
from collections import deque
from heapq import heapify
from typing import Any, Callable

from hints.tasks import Task
from runtime.sched.arbiter import Arbiter
from runtime.sched.rules import RULES


class FollowerArbiter(Arbiter):
    """A TP follower's arbiter: the leader's decisions are the order; the next runs once its inputs are here.

    Dependency counting, memory accounting and reports are the base class's (the hint order only
    numbers the tasks); :meth:`follow` appends a decision, :meth:`choose` starts the next decision's
    task when it is input-ready. No budget: the leader's choice already respected it, and a follower
    holds exactly the leader's tasks.
    """

    rule = RULES["fixed"]  # it runs an order exactly: the leader's

    def __init__(self, graph, rank: int, order, record: bool = False) -> None:
        super().__init__(graph, rank, order, budget=None, record=record)
        self.pending: deque[tuple[int, int, int, int]] = deque()  # (index, task id, decided_ns, arrived_ns)
        self.followed = 0  # decisions received so far

    def follow(self, index: int, task: Task, decided_ns: int = 0, arrived_ns: int = 0) -> None:
        """The leader's ``index``-th decision of the iteration: run ``task`` (FIFO: indices come in order)."""
        if index != self.followed:
            raise RuntimeError(f"rank {self.rank}: leader decision {index} arrived, expected {self.followed}")
        tid = self.graph.tid(task)
        if self.graph.rank[tid] != self.rank:
            raise RuntimeError(f"rank {self.rank}: the leader decided {task}, a task of pipeline rank "
                               f"{self.graph.rank[tid]}")
        self.followed += 1
        self.pending.append((index, tid, decided_ns, arrived_ns))

    def choose(self, now: float = 0.0) -> int | None:
        if not self.pending:
            return None
        index, tid, decided_ns, arrived_ns = self.pending[0]
        h = self.position[tid]
        if self.unmet[h] or self.started[h]:
            if self.started[h]:
                raise RuntimeError(f"rank {self.rank}: the leader decided {self.order[h]} twice")
            return None
        self.pending.popleft()
        heap = self._admissions if self._admits[tid] else self._others
        ready = heap + (self._others if heap is self._admissions else self._admissions)
        if self.decisions is not None:
            self._record(now, h, ready, ())
            self.decisions[-1] = self.decisions[-1]._replace(index=index, leader_ns=decided_ns,
                                                             decision_arrived_ns=arrived_ns)
        heap.remove(h)  # the decided task need not top its heap: O(ready set), a handful of tasks
        heapify(heap)
        return self._start(h)


class Announcer:
    """The leader's arbiter, telling its followers every decision before the task runs.

    ``announce(index, task, decided_ns)`` posts one DECISION per follower. Everything else is the
    wrapped arbiter's (the executor cannot tell the difference). The time spent announcing is added to
    the recorded decision (``announce_ns``): the leader's share of the coordination cost.
    """

    def __init__(self, arbiter: Arbiter, announce: Callable[[int, Task, int], None],
                 clock_offset_ns: int = 0) -> None:
        self.arbiter, self.announce, self.clock_offset_ns = arbiter, announce, clock_offset_ns
        self.index = 0

    def choose(self, now: float = 0.0) -> int | None:
        tid = self.arbiter.choose(now)
        if tid is None:
            return None
        began = time.monotonic_ns()
        self.announce(self.index, self.arbiter.graph.tasks[tid], began + self.clock_offset_ns)
        decisions = self.arbiter.decisions
        if decisions:
            decisions[-1] = decisions[-1]._replace(index=self.index, announce_ns=time.monotonic_ns() - began)
        self.index += 1
        return tid

    def __getattr__(self, name: str) -> Any:
        return getattr(self.arbiter, name)


def member_arbiter(grid, build_leader: Callable[[], Arbiter], graph, order, transport, iteration: int,
                   clock_offset_ns: int = 0, record: bool = True):
    """The arbiter of one TP member for one iteration ([Note: TP coordination]).

    A follower gets a :class:`FollowerArbiter`; a leader with followers its rule's arbiter
    (``build_leader()``) wrapped in an :class:`Announcer` that posts DECISIONs on ``transport`` (global
    ranks); without TP, the rule's arbiter as it is.
    """
    if not grid.is_leader:
        return FollowerArbiter(graph, grid.pipe_rank, order, record=record)
    arbiter = build_leader()
    followers = grid.followers
    if not followers:
        return arbiter

    def announce(index: int, task: Task, decided_ns: int) -> None:
        for follower in followers:
            transport.decide(follower, iteration, index, task, decided_ns)

    return Announcer(arbiter, announce, clock_offset_ns)
