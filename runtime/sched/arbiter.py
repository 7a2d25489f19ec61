"""The ready-set arbiter: one object per rank, shared by the simulator and the runtime.

Pure Python (no torch). The owner feeds it events and asks it what to run:

* :meth:`Arbiter.available` -- the output of a task is now available on this
  rank (a local task finished, or its message arrived over a link). Tasks of
  this rank whose prerequisites (:mod:`hints.deps`) are all available enter
  the ready set.
* :meth:`Arbiter.expect` -- a task of another rank whose output this rank
  needs has *started*, and its output should arrive here at ``eta`` (a
  prediction: the producer's start, plus its estimated duration, plus the
  link's latency). Only the lookahead rule uses it.
* :meth:`Arbiter.choose` -- the task to run now, or ``None``; the chosen task
  counts as started. After ``None``, :meth:`Arbiter.next_wakeup` says when
  the arbiter wants to be asked again even if nothing arrives (or ``None``:
  only an event can change its answer).
* :meth:`Arbiter.finish` -- a local task ended: frees its memory slot and
  makes its output available to local consumers.

Rules (``fixed``, ``greedy``, ``lookahead``: the subclasses below) are chosen through the one table
:data:`runtime.sched.rules.RULES`; the memory budget's slot counts come from :mod:`runtime.sched.budget`.

[Note: memory budget and chunk deadlock]
    The budget counts *microbatch-chunks in flight* per rank: forwarded and
    whose last backward (``B``, or ``W`` when split) has not ended. With
    ``v > 1`` chunks a greedy arbiter could fill the budget with chunk-0
    forwards of new microbatches so that no admitted microbatch can run its
    later chunks on this rank: deadlock. We therefore *reserve*: a microbatch is
    admitted on a rank (its chunk-0 forward starts) only if all ``v`` of its
    chunks still fit, i.e. ``reserved + v <= budget`` where ``reserved`` sums,
    over admitted microbatches, the chunks whose last backward has not ended.
    Later-chunk forwards use their reserved slot and are never held back, so
    the in-flight count never exceeds ``reserved <= budget``.
    Why this cannot deadlock: only admissions are ever held back. If every
    remaining task were stuck, take a rank ``r`` holding back an admission; it
    has some admitted microbatch ``j`` whose next task cannot be a backward or
    a reserved forward (those are never held back), so it is an admission on
    a rank ``r' > r`` (microbatches enter ranks in increasing order within
    chunk 0), which must itself be full, and so on: an infinite increasing
    sequence of ranks. Budgets below ``v`` (one microbatch) are rejected up
    front by :meth:`MemoryBudget.per_rank`.

    The proof, re-checked for V placement ([Note: placement] in
    :mod:`hints.tasks`). There a microbatch meets its chunks on a rank in no
    fixed rank order: it goes down the ranks through chunk 0 (stage ``r`` on
    rank ``r``), turns on rank ``p-1``, and comes back up through chunk 1
    (stage ``2p-1-r``), so rank ``p-1`` runs its two chunks back to back and
    rank 0 runs its chunk 1 last. The proof uses none of that; it uses two
    facts, and both hold for every placement in which chunk 0 of rank ``r``
    is stage ``r``: (1) *a later-chunk forward is reserved*: a later chunk's
    stage is ``>= p`` and the microbatch's stages run in increasing order, so
    its chunk-0 forward on that rank (stage ``r < p``) ran before and
    reserved its slot; (2) *the next task of a stuck admitted microbatch is
    an admission further down*: it is input-ready, so held back, so an
    admission, i.e. a chunk-0 forward ``F(r', j)``; ``j`` was admitted on
    ``r`` at stage ``r``, so stage ``r' > r``, and chunk-0 stage ``r'`` is on
    rank ``r'``. The sequence of full ranks still increases, and the rule is
    the same code for both placements (``TaskGraph.admits`` marks the
    chunk-0 forwards). ``test_properties`` checks that no seeded budget >=
    ``v`` deadlocks, with looping and V shapes.

[Note: safe-state admission]
    The reservation rule above is conservative: it holds ``v`` slots for
    every admitted microbatch, so at a hint's own fixed peak a chunked ready
    run admits fewer microbatches than the fixed order it was given (an
    interleaved ready run peaked at 20-21 of the 23 slots the fixed order
    uses, and lost 13% to it). When the hint *completes in fixed order* and
    its fixed order keeps within every rank's budget, the arbiter uses a
    banker's-style test instead (Dijkstra's banker's algorithm, with the
    hint's own order as the safe sequence): a task may start only if the
    hint order, continued from the resulting state, still keeps within the
    budget. That test is per rank, and exact:

    * *The continuation completes.* The hint order completes in fixed order,
      so the graph of its dependencies plus each rank's order is acyclic.
      From any state the arbiters reach (started tasks are closed under
      dependencies), each rank's not-started tasks in hint order form a
      subsequence of its order: a cycle among them would map to one in the
      full graph, so there is none, and the fixed continuation completes.
    * *Its memory is a rank's own.* In fixed order a rank's microbatch-chunks
      in flight depend only on its own sequence: ``d = +1`` for a forward,
      ``-1`` for the last backward of a (stage, microbatch), 0 otherwise.
      With ``s_k`` the prefix sums of ``d`` over the not-started positions
      below ``k``, the continuation keeps within the budget iff
      ``in_flight + max_k s_k <= budget`` (the invariant). Running a
      backward never breaks it (removing a ``-1`` raises a later ``s_k`` by
      at most the slot it frees; removing a 0 changes nothing). A forward at
      position ``q`` keeps it iff ``in_flight + max_{k <= q} s_k <= budget -
      1``, which is monotone in ``q``: if the best-ranked ready forward
      fails, every later one fails too, so the rule is "the best-ranked
      ready task, skipping forwards once the best ready forward fails".
    * *How it is answered, and what it costs.* With ``t`` the rank's head
      (its lowest not-started position), ``s_k = 0`` for ``k <= t``: the
      head forward passes iff ``in_flight <= budget - 1``, and otherwise
      only ``t < k <= q`` matter. Positions in the window ``[t, t + w)``
      (``w = Arbiter._near``, 16) are read from the hint order's ``d`` and
      the started flags, a scan of ``min(q - t, w)`` steps. Beyond it a
      segment tree over positions holds (sum, best prefix) of ``d`` for the
      hint order with some started positions cleared; its invariant: *every
      started position at or beyond* ``t + w`` *is cleared or noted*. A
      start at ``h >= t + w`` is noted (a list append; ``t`` may lag, which
      only notes more); one below cannot leave the window, since ``t`` only
      rises. A query that reaches past the window first clears the noted
      positions still beyond it, ``O(log n)`` each, and forgets the rest
      (inside the window from then on, never read from the tree again); the
      tree is then exact over ``[t + w, n)``, and one pass over its nodes
      (``O(log n)``) gives that part's sum and best prefix, added after the
      window's. So a start is ``O(1)``, each position is cleared at most
      once, and a query costs ``O(min(q - t, w))``, plus ``O(log n)`` only
      when it reaches past the window, as the lookahead rule's test of the
      whole continuation (``max_k s_k``, :meth:`Arbiter.continuation_peak`)
      does. In practice the ready forward is the head or next to it: in the
      1F1B runs of ``benchmarks/foundation.py`` at 256 ranks x 1024
      microbatches, greedy's queries never reach past the window and the
      lookahead rule's do for 0.3% of tasks, while 19% of greedy's starts
      are beyond it (backwards run ahead of a forward head). The tree alone,
      cleared at every start and walked for every query, cost ``O(log n)``
      each, about half of a ready rule's time, and grew with the order's
      length (docs/benchmarks/simulator-speed.md).

    Why this cannot deadlock: the invariant holds initially (it is the fixed
    order's peak within the budget) and every start keeps it. At a state
    where no event is pending and nothing runs, the fixed continuation
    exists, so some rank's first not-started task (its hint head) has every
    input: it is ready. A head forward always passes the test (``s_k = 0``
    for ``k <= q`` at the head, and the invariant with ``s_{q+1} = 1`` gives
    ``in_flight <= budget - 1``), and backwards are never held: that rank
    starts something. The budget holds (``k = 0`` of the invariant). Where
    the hint does not complete in fixed order, or its fixed order holds more
    than the budget on some rank (``gpipe``, ``bf``, ``bfw`` at 1F1B's
    memory), the reservation rule applies as before. The caller decides
    (:func:`runtime.sched.fixed_order.completes_within`), the same way in the
    simulator and the runtime, for every rank of an iteration.

[Note: lookahead admission]
    Greedy readiness loses to fixed order at tight memory in one way: the
    hint's head ``h`` is on its way (its input is being computed on another
    rank), a task ``c`` ranked after it is ready, and running ``c`` (tasks
    are not preemptible) delays ``h`` by up to ``est(c)``; the delay travels
    along ``h``'s chain and, with the budget fixing how many microbatches
    circulate, slows the whole cycle. First seen with ``h`` a forward and
    ``c`` a backward (twice a forward); then with ``h`` a backward (``B`` or
    ``I``) whose output gradient is being computed downstream and ``c`` a
    ``W`` or a forward (issue 22's zero-bubble losses: the backward chain
    upstream waits); then with ``h`` a chunk-1 forward whose input comes
    back from the far end of the pipeline and ``c`` a chunk-0 forward
    (interleaved, DualPipeV). The rule: when ``h`` is not yet input-ready
    but its arrival is predicted at ``eta``, run ``c`` only if ``now +
    est(c) <= eta``; otherwise run the best-ranked runnable task ``x`` with
    ``now + est(x) <= eta``, or wait. It holds back

    * a ``W``: it feeds no other rank;
    * a ``B`` or ``I`` only for a forward head: ahead of a backward head, a
      ready backward feeds a backward chain upstream just as the head would,
      and waiting for the better-ranked one only trades work for hint rank
      (guarding it cost interleaved 1F1B's median at twice its peak 1%);
    * a forward only where memory *binds*: the budget holds fewer than the
      rank's ``v * m`` microbatch-chunks, and the hint's own continuation
      from this state fills it (``in_flight + max_k s_k >= budget`` of
      [Note: safe-state admission]; under the reservation rule the hint is
      not known to keep within the budget, which counts as binding). Where
      the budget has room beyond the hint's plan (twice its peak), running
      forwards ahead of the hint is what readiness earns: guarding a
      backward head against them there too cost ready 1F1B at twice its peak
      2% of its median on the never-lose grid (3-6% on ``pretrain-packed``),
      and ``cp``, whose budget holds every microbatch, 1%
      (docs/benchmarks/readiness-credit.md);

    and a forward ``h`` is guarded only if it will fit the budget when it
    arrives (a backward never waits for memory).

    Predictions come through :meth:`expect`, in two strengths, from a
    forward for the next stage's forward and from a backward for the
    previous stage's backward, between ranks only (the V turn's ``F(p-1) ->
    F(p)`` and ``B(p) -> B(p-1)`` stay on rank ``p-1``):

    * *firm*: ``h``'s producer has started; ``eta`` is its start plus its
      estimated duration plus the link's latency. The rule holds ``c`` until
      ``h`` arrives, even past ``eta`` (the producer runs late, but it runs).
    * *relayed*: the producer has not started, but its own producer has; the
      middle rank relays ``eta`` = its own predicted arrival plus the
      producer's estimate plus the latency. The middle rank may be busy, so
      this one is only a hope: the rule holds ``c`` until ``eta`` at most
      (:meth:`next_wakeup` asks to be woken then) and stands aside after.

    Firm predictions alone leave most of the loss in place: the task that
    delays ``h`` usually starts a few milliseconds before ``h``'s producer
    itself starts, when no firm prediction exists yet. With no estimate for a task (the runtime's first
    tasks), the rule does not apply to it. Estimates are expectations, never
    the realized duration: the model's expected cost in the simulator, the
    running mean per (stage, kind) in the runtime.

    Why this cannot deadlock: the rule only makes a rank wait while an event
    for it is *pending*: a firm wait ends when ``h``'s input arrives, which
    happens in finite time because its producer is running; a relayed wait
    ends at its wake-up time. The arrival makes ``h`` ready: a forward has
    no other input, and a backward's only other input, its own forward,
    precedes it in the hint order (:mod:`hints.validate`), so it has
    started, being before the head, and ended, the rank being idle; so a
    firm wait never outlives its message. So at any moment when no event is
    pending anywhere (the only state in which a simulation or a run could
    stop making progress), no arbiter is holding a task back for the
    lookahead, every arbiter chooses exactly as ``greedy`` does, and [Note:
    memory budget and chunk deadlock] (or [Note: safe-state admission])
    applies unchanged. The rule never starts a task that greedy would hold
    back for memory (``x`` is drawn from what greedy may start: admissions
    only when they pass the budget's test), so budgets hold as before.
    (Why a relayed wait must expire: the middle rank may itself be waiting,
    for memory, on a backward that only the waiting rank can run.)
    ``test_properties`` checks both heads with estimates that make the rule
    wait whenever it may: every hint completes, every budget holds.
"""

from __future__ import annotations

from collections import deque
from heapq import heapify, heappop, heappush
from itertools import compress
from operator import not_
from typing import TYPE_CHECKING, NamedTuple, Sequence

from hints.deps import TaskGraph, prerequisites
from hints.tasks import Task, W

if TYPE_CHECKING:
    from runtime.sched.rules import ArbiterRule, Policy


class Decision(NamedTuple):
    """One arbiter decision, as recorded for traces and tests."""

    time: float
    rank: int
    chosen: Task
    hint_position: int  # the chosen task's position in this rank's hint order
    head: Task | None  # the lowest-ranked task not yet started, when the choice skipped it
    ready: tuple[tuple[Task, int], ...]  # runnable tasks and their hint positions, chosen included
    held_back: tuple[Task, ...]  # input-ready admissions the memory budget held back
    in_flight: int  # microbatch-chunks in flight once the chosen task started
    deferred: Task | None = None  # a better-ranked ready task the lookahead passed over ([Note: lookahead admission])
    # TP groups ([Note: TP coordination] in runtime.exec.tp_follow): the decision's index in the group's sequence; on a
    # follower the leader's clock at the decision (ns, rank 0's clock) and when it arrived (this rank's clock);
    # on the leader the time spent posting it to the followers (ns).
    index: int | None = None
    leader_ns: int | None = None
    decision_arrived_ns: int | None = None
    announce_ns: int | None = None


Estimates = Sequence[float | None]  # task id -> expected seconds (None: not known yet); see LookaheadArbiter


class Arbiter:
    """Dependency counting, the ready set and memory accounting for one rank; subclasses choose.

    Tasks of the rank are numbered by hint position ``h`` (position in the rank's
    order). The ready set is two binary heaps of hint positions: admissions
    (chunk-0 forwards, which need ``v`` free slots) and everything else, so a
    rule finds the best-ranked candidate of each in O(1) and starts it in
    O(log n).

    ``positions`` (task id -> hint position) and ``numbers`` (the ints ``0, 1, ...``, at least as many as the
    order's tasks) may be shared by the arbiters of every rank of one process, as the simulator does: each
    arbiter fills in its own tasks' positions, and takes its position numbers from ``numbers``, so that the
    ranks' heaps and ``positions`` hold the same few int objects rather than one per task (a position above
    256 is an object of its own; at 256 ranks x 1024 microbatches, each read of a rank's own copy was a cache
    miss).
    """

    rule: "ArbiterRule"
    # [Note: safe-state admission]: hint positions within this many of the head are read from the hint order
    # and the started flags; the tree holds what lies beyond.
    _near = 16

    def __init__(
        self,
        graph: TaskGraph,
        rank: int,
        order: Sequence[Task],
        budget: int | None = None,
        record: bool = False,
        positions: list[int] | None = None,
        estimates: Estimates | None = None,
        safe: bool = False,
        numbers: Sequence[int] | None = None,
    ) -> None:
        self.graph = graph
        self.rank = rank
        self.order = tuple(order)
        self.chunks = graph.shape.chunks
        self.budget = budget
        self.estimates = estimates
        tids = graph.ids(self.order)
        self.tids = tids
        # position[task id] = hint position of that task in its own rank's order. Every task belongs to one
        # rank, so the simulator shares one list between all arbiters, each filling in its own tasks.
        if positions is None:
            positions = [0] * len(graph)
        if numbers is None:
            numbers = range(len(tids))
        deque(map(positions.__setitem__, tids, numbers), maxlen=0)  # positions[tid] = h, in C
        self.position = positions
        # Per task id, shared with the graph; consumers per block of m ids (TaskGraph's offsets).
        self._block_size = graph.shape.microbatches
        self._local_offsets, self._remote_offsets = graph.local_offsets, graph.remote_offsets
        self._admits, self._is_forward = graph.admits, graph.is_forward
        self.safe = safe  # [Note: safe-state admission]: every forward is tested, on the heap of admissions
        self._rank_of = graph.rank
        # Per block (task id // m): the hot paths read these, not the per-task lists above: a few
        # entries that stay in cache, where a read of a task-sized list is a cache miss at scale.
        self._block_admits, self._block_frees = graph.block_admits, graph.block_frees
        self._block_forward = graph.block_forward
        if safe:
            self._admits, self._block_admits = graph.is_forward, graph.block_forward
            self._tree_build(tids, graph)
        # Per hint position.
        self.unmet = list(map(graph.prereq_count.__getitem__, tids))
        self.started = [False] * len(tids)  # (lists, not bytearrays: list stores are the interpreter's fast path)
        self._running: int | None = None  # the task id started last and not finished (its rank runs one at a time)
        self._head = 0  # no hint position below this one is left to start (see head)
        self.finished = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.reserved = 0
        self.decisions: list[Decision] | None = [] if record else None
        # The ready set: input-ready tasks not yet started (held-back admissions included), as hint positions.
        ready = list(compress(numbers, map(not_, self.unmet)))
        self._others = [h for h in ready if not self._admits[tids[h]]]  # ascending lists are heaps
        self._admissions = [h for h in ready if self._admits[tids[h]]]

    @property
    def policy(self) -> "Policy":
        return self.rule.policy

    @property
    def head(self) -> int:
        """The lowest hint position not yet started (``len(order)`` once all started)."""
        head, started = self._head, self.started
        end = len(started)
        while head < end and started[head]:  # moves up only: O(1) amortized
            head += 1
        self._head = head
        return head

    @property
    def ready_count(self) -> int:
        """Input-ready tasks not yet started (held-back admissions included)."""
        return len(self._others) + len(self._admissions)

    # -- events ----------------------------------------------------------
    def available(self, producer: int) -> bool:
        """``producer`` (a task of another rank) delivered its output here; True if a task became ready."""
        offsets = self._remote_offsets[producer // self._block_size]
        if len(offsets) == 1:  # the usual case: one message, one consumer, on this rank (inlined _deliver)
            consumer = producer + offsets[0]
            h = self.position[consumer]
            left = self.unmet[h] = self.unmet[h] - 1
            if left:
                return False
            heappush(self._admissions if self._block_admits[consumer // self._block_size] else self._others, h)
            return True
        rank_of, me = self._rank_of, self.rank
        return self._deliver(producer, [d for d in offsets if rank_of[producer + d] == me])

    def expect(self, producer: int, eta: float, started: bool = True) -> None:
        """``producer``'s output (a task of another rank) should arrive here at ``eta``.

        ``started``: the producer is running (its output will come); otherwise the prediction
        was relayed one hop earlier, from the start of the producer's own producer. Only rules
        that look ahead use it ([Note: lookahead admission]); the others ignore it.
        """

    def expect_consumer(self, consumer: int, eta: float) -> None:
        """:meth:`expect` for a ``consumer`` of this rank whose remote input should arrive at ``eta``,
        its producer started (the simulator knows the consumer; the runtime only the producer)."""

    def expect_consumer_relayed(self, consumer: int, eta: float) -> None:
        """:meth:`expect_consumer`, relayed one hop earlier (``expect(..., started=False)``)."""

    def finish(self, tid: int) -> bool:
        """A task of this rank ended; True if a local task became ready."""
        self.finished += 1
        self._running = None
        block_size = self._block_size
        block = tid // block_size
        if self._block_frees[block]:
            self.in_flight -= 1
            self.reserved -= 1
        offsets = self._local_offsets[block]
        if len(offsets) == 1:  # the usual case (F -> next F or B; B -> W ...): _deliver inlined
            consumer = tid + offsets[0]
            h = self.position[consumer]
            left = self.unmet[h] = self.unmet[h] - 1
            if left:
                return False
            heappush(self._admissions if self._block_admits[consumer // block_size] else self._others, h)
            return True
        return self._deliver(tid, offsets) if offsets else False

    def _deliver(self, producer: int, offsets) -> bool:
        """Count ``producer``'s output as arrived for its consumers ``producer + d`` (all on this rank).

        The consumers whose inputs have all arrived join the ready set.
        """
        became_ready = False
        position, unmet, admits, block_size = self.position, self.unmet, self._block_admits, self._block_size
        for offset in offsets:
            consumer = producer + offset
            h = position[consumer]
            left = unmet[h] - 1
            unmet[h] = left
            if left == 0:
                heappush(self._admissions if admits[consumer // block_size] else self._others, h)
                became_ready = True
        return became_ready

    # -- queries ---------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.finished == len(self.tids)

    def choose(self, now: float = 0.0) -> int | None:
        """The task id to run now (it counts as started), or ``None``."""
        raise NotImplementedError

    def next_wakeup(self) -> float | None:
        """After :meth:`choose` returned ``None``: when to ask again even if no event comes (None: never)."""
        return None

    def ready_tasks(self) -> list[Task]:
        """Input-ready tasks not yet started, in hint order (for reports; O(n log n))."""
        return [self.order[h] for h in sorted(self._others + self._admissions)]

    def waiting_on(self) -> list[tuple[Task, list[Task]]]:
        """Not-started tasks blocked on inputs, with the prerequisites not yet available (stall reports)."""
        shape = self.graph.shape
        out = []
        for h in range(self.head, len(self.tids)):
            if self.started[h] or self.unmet[h] == 0:
                continue
            task = self.order[h]
            needs = prerequisites(task, shape)
            local = [t for t in needs if shape.rank_of(t.stage) == self.rank]
            missing = [t for t in local if not self._is_done(self.graph.tid(t))]
            remote_missing = self.unmet[h] - len(missing)
            missing += [t for t in needs if t not in local][:remote_missing]
            out.append((task, missing))
        return out

    # -- internals -------------------------------------------------------
    def _start(self, h: int) -> int:
        """Start the ready task of hint position ``h``, already taken off its heap; returns its task id."""
        self.started[h] = True
        tid = self._running = self.tids[h]
        block = tid // self._block_size
        if self.safe and h >= self._head + self._near:  # [Note: safe-state admission]: beyond the window
            self._far_started.append(h)
        if self._block_forward[block]:
            in_flight = self.in_flight = self.in_flight + 1
            if in_flight > self.peak_in_flight:
                self.peak_in_flight = in_flight
            if self._block_admits[block]:
                self.reserved += self.chunks
        return tid

    # -- [Note: safe-state admission] ------------------------------------------------
    def _tree_build(self, tids: Sequence[int], graph: TaskGraph) -> None:
        """``d`` per hint position, and per node over them the sum of ``d`` and its best prefix (the empty one
        included), for the hint order as given: :meth:`_tree_catch_up` clears what starts beyond the window."""
        forward, frees = graph.is_forward, graph.frees
        change = [1 if forward[tid] else (-1 if frees[tid] else 0) for tid in tids]
        leaves = 1
        while leaves < max(1, len(tids)):
            leaves *= 2
        self._leaves, self._change = leaves, change
        self._far_started: list[int] = []  # positions started beyond the window, not yet cleared from the tree
        total = [0] * leaves + change + [0] * (leaves - len(change))
        best = [0] * leaves + [1 if d > 0 else 0 for d in change] + [0] * (leaves - len(change))
        for node in range(leaves - 1, 0, -1):
            left = 2 * node
            total[node] = total[left] + total[left + 1]
            right = total[left] + best[left + 1]
            best[node] = best[left] if best[left] > right else right
        self._sum, self._best = total, best

    def _tree_catch_up(self, head: int) -> None:
        """Clear from the tree every position started beyond the window that is still beyond it (``head``:
        :attr:`_head`, moved up); the others are never read from the tree again."""
        total, best, change, leaves = self._sum, self._best, self._change, self._leaves
        window_end = head + self._near
        for h in self._far_started:
            if h < window_end or not change[h]:
                continue
            node = leaves + h
            total[node] = best[node] = 0
            node >>= 1
            while node:
                left = 2 * node
                total[node] = total[left] + total[left + 1]
                right = total[left] + best[left + 1]
                best[node] = best[left] if best[left] > right else right
                node >>= 1
        self._far_started.clear()

    def _peak_between(self, head: int, end: int) -> int:
        """``max_k s_k`` over ``head <= k <= end`` (``head``: :attr:`_head`, moved up; ``head <= end <= n``):
        the window by a scan, what lies beyond it from the tree."""
        change, started = self._change, self.started
        middle = head + self._near
        total = peak = 0
        for k in range(head, end if end < middle else middle):
            if not started[k]:
                total += change[k]
                if total > peak:
                    peak = total
        if end <= middle:
            return peak
        # Beyond the window: (sum, best prefix) of [middle, end), nodes combined left to right.
        if self._far_started:
            self._tree_catch_up(head)
        sums, best = self._sum, self._best
        low, high = middle + self._leaves, end + self._leaves
        right_nodes = []
        while low < high:
            if low & 1:
                if total + best[low] > peak:
                    peak = total + best[low]
                total += sums[low]
                low += 1
            if high & 1:
                high -= 1
                right_nodes.append(high)
            low >>= 1
            high >>= 1
        for node in reversed(right_nodes):
            if total + best[node] > peak:
                peak = total + best[node]
            total += sums[node]
        return peak

    def continuation_peak(self) -> int:
        """``max_k s_k``: the most microbatch-chunks the hint order, continued from here, adds to those in flight."""
        head, started = self._head, self.started
        end = len(started)
        while head < end and started[head]:
            head += 1
        self._head = head
        return self._peak_between(head, end)

    def safe_to_start(self, h: int) -> bool:
        """Whether the forward at hint position ``h`` (not started) keeps the continuation within the budget."""
        head, started = self._head, self.started
        while started[head]:  # h is not started, so head stops at or before it
            head += 1
        self._head = head
        if h == head:  # the hint's head: s_k = 0 for k <= h (the usual case, written out)
            return self.in_flight < self.budget
        return self._peak_between(head, h) <= self.budget - 1 - self.in_flight

    def _is_done(self, tid: int) -> bool:
        """Whether ``tid`` (a task of this rank) has finished: started, and not the one running."""
        return self.started[self.position[tid]] and tid != self._running

    def _record(self, now: float, h: int, ready_hs: Sequence[int], held_hs: Sequence[int],
                deferred: int | None = None) -> None:
        order, head = self.order, self.head
        skipped = order[head] if head != h else None
        self.decisions.append(
            Decision(
                time=now,
                rank=self.rank,
                chosen=order[h],
                hint_position=h,
                head=skipped,
                ready=tuple((order[x], x) for x in sorted(ready_hs)),
                held_back=tuple(order[x] for x in sorted(held_hs)),
                in_flight=self.in_flight + (1 if self._is_forward[self.tids[h]] else 0),
                deferred=None if deferred is None else order[deferred],
            )
        )


class FixedArbiter(Arbiter):
    """Only the head of the hint order may run."""

    def choose(self, now: float = 0.0) -> int | None:
        h = self.head
        if h >= len(self.tids) or self.unmet[h]:
            return None
        # The head is the lowest not-started hint position, so when it is ready it tops its heap.
        others, admissions = self._others, self._admissions
        if self.decisions is not None:
            self._record(now, h, others + admissions, ())
        return self._start(heappop(admissions if self._admits[self.tids[h]] else others))


class ReadyArbiter(Arbiter):
    """The ready task with the lowest hint position, within the memory budget (the ``greedy`` rule)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.budget is None:
            raise ValueError("the ready policy needs a memory budget")

    def choose(self, now: float = 0.0) -> int | None:
        others, admissions = self._others, self._admissions
        if admissions and (self.safe_to_start(admissions[0]) if self.safe
                           else self.reserved + self.chunks <= self.budget):  # an admission fits
            fits = True
            pick = others if others and others[0] < admissions[0] else admissions
        elif others:
            fits = False
            pick = others
        else:
            return None
        if self.decisions is not None:
            ready = others + admissions if fits else list(others)
            self._record(now, pick[0], ready, () if fits else admissions)
        return self._start(heappop(pick))


class LookaheadArbiter(ReadyArbiter):
    """``greedy``, but what would delay a head already on its way waits for it ([Note: lookahead admission]).

    ``estimates[task id]`` is the expected duration of a task of this rank
    (``None`` while unknown); :meth:`expect` gives the predicted arrival of
    a forward's input or a backward's input gradient: firm once its producer
    started, tentative (relayed one hop earlier) before.
    """

    def __init__(self, *args, **kwargs) -> None:
        self._wakeup: float | None = None
        super().__init__(*args, **kwargs)
        if self.estimates is None:
            raise ValueError("the lookahead rule needs duration estimates")
        # Nothing is ever held back for memory on this rank (see _memory_binds).
        self._holds_every_chunk = self.budget >= self.chunks * self.graph.shape.microbatches
        self._block_weight = [kind is W for _, kind in self.graph.blocks]  # per block: a weight gradient
        # Per hint position of a task not yet input-ready, the predicted arrival of its remote input (or None).
        # Read only while the task is not input-ready, so choose and _before drop a started task's entries:
        # kept, one or two floats per task stayed alive to the end of a simulation, and at 256 ranks x 1024
        # microbatches allocating fresh memory for each new one cost about 8% of the rule's time.
        self._eta: list[float | None] = [None] * len(self.tids)  # its producer started
        self._eta_relayed: list[float | None] = [None] * len(self.tids)  # its producer's own input is on its way

    def expect(self, producer: int, eta: float, started: bool = True) -> None:
        for offset in self._remote_offsets[producer // self._block_size]:
            consumer = producer + offset  # a forward's next forward, or a backward's previous backward
            if self._rank_of[consumer] == self.rank:
                if started:
                    self.expect_consumer(consumer, eta)
                else:
                    self.expect_consumer_relayed(consumer, eta)

    def expect_consumer(self, consumer: int, eta: float) -> None:
        h = self.position[consumer]
        if self.unmet[h]:
            self._eta[h] = eta

    def expect_consumer_relayed(self, consumer: int, eta: float) -> None:
        h = self.position[consumer]
        if self.unmet[h] and self._eta[h] is None:
            self._eta_relayed[h] = eta

    def prediction_slots(self) -> tuple[list[int], list[float | None], list[float | None]]:
        """``(unmet, firm, relayed)`` per hint position: what the two methods above read and write, for a caller
        that writes them inline, by the same rule (the simulator: [Note: inlined predictions])."""
        return self.unmet, self._eta, self._eta_relayed

    def next_wakeup(self) -> float | None:
        return self._wakeup

    def choose(self, now: float = 0.0) -> int | None:
        # The selection repeats ReadyArbiter.choose's first lines: inlined, because choose is the
        # simulator's hot path (a shared helper costs a call per decision). _wakeup is set on every
        # path that returns None (only then is next_wakeup asked).
        others, admissions = self._others, self._admissions
        if self.safe:  # [Note: safe-state admission]: the head always fits
            budget_room = not admissions or self.safe_to_start(admissions[0])
            head_fits = True
        else:
            head_fits = budget_room = self.reserved + self.chunks <= self.budget
        if admissions and budget_room:  # an admission fits
            fits = True
            pick = others if others and others[0] < admissions[0] else admissions
        elif others:
            fits = False
            pick = others
        else:
            self._wakeup = None
            return None
        best = pick[0]
        h, started = self._head, self.started  # self.head, inlined (the hot path)
        while started[h]:  # the best-ranked ready task is not started, so h stops at or before it
            h += 1
        self._head = h
        if best != h and self.unmet[h]:  # the head is on its way, or not yet
            eta, firm = self._eta[h], True
            if eta is None:
                eta, firm = self._eta_relayed[h], False
            # A firm prediction holds until the input arrives; a relayed one only until its time.
            if eta is not None and (firm or now < eta):
                tids, block_size, forward = self.tids, self._block_size, self._block_forward
                head_block, best_block = tids[h] // block_size, tids[best] // block_size
                # Who is held back: a forward where memory binds; a W; a B or I only for a forward head.
                # A forward head only if it will fit the budget when it arrives (a backward admits nothing).
                if (self._memory_binds() if forward[best_block] else
                        forward[head_block] or self._block_weight[best_block]) and \
                        (head_fits or not self._block_admits[head_block]):
                    duration = self.estimates[tids[best]]
                    if duration is not None and now + duration > eta:
                        return self._before(now, eta, best, fits, firm)
        if self.decisions is not None:
            ready = others + admissions if fits else list(others)
            self._record(now, best, ready, () if fits else admissions)
        self._eta[best] = self._eta_relayed[best] = None  # read no more (see __init__)
        return self._start(heappop(pick))

    def _memory_binds(self) -> bool:
        """Whether a forward may not go ahead of the head ([Note: lookahead admission]): the budget holds
        fewer microbatch-chunks than the rank has, and the hint's own continuation from here fills it (under
        [Note: safe-state admission]) or exceeds it (the reservation rule: the hint does not keep within it)."""
        if self._holds_every_chunk:
            return False
        return not self.safe or self.in_flight + self.continuation_peak() >= self.budget

    def _before(self, now: float, eta: float, deferred: int, fits: bool, firm: bool) -> int | None:
        """The best-ranked runnable task that ends by ``eta``, started; or None: wait for the forward."""
        others, admissions = self._others, self._admissions
        count = len(others) + len(admissions) if fits else len(others)
        # Usually the deferred task is the only candidate: then there is nothing to sort.
        runnable = (sorted(others + admissions) if fits else sorted(others)) if count > 1 else ()
        estimates, tids = self.estimates, self.tids
        for x in runnable:
            if x == deferred:
                continue
            duration = estimates[tids[x]]
            if duration is not None and now + duration <= eta:
                heap = admissions if self._block_admits[tids[x] // self._block_size] else others
                if self.safe and heap is admissions and not self.safe_to_start(x):
                    continue
                heap.remove(x)
                heapify(heap)
                if self.decisions is not None:
                    self._record(now, x, runnable, () if fits else admissions, deferred)
                self._eta[x] = self._eta_relayed[x] = None  # read no more (see __init__)
                return self._start(x)
        self._wakeup = None if firm else eta
        return None
