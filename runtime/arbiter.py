"""The ready-set arbiter: one policy object per rank, shared by the simulator and the runtime.

Pure Python (no torch). The owner feeds it events and asks it what to run:

* :meth:`Arbiter.available` -- the output of a task is now available on this
  rank (a local task finished, or its message arrived over a link). Tasks of
  this rank whose prerequisites (:mod:`runtime.deps`) are all available enter
  the ready set.
* :meth:`Arbiter.choose` -- the task to run now, or ``None``; the chosen task
  counts as started.
* :meth:`Arbiter.finish` -- a local task ended: frees its memory slot and
  makes its output available to local consumers.

Policies (:class:`Policy`):

``fixed``
    Strictly the hint order: only the head of the rank's order may run, and it
    runs when its inputs have arrived. The memory budget is not applied (the
    order itself decides memory); this is the baseline every speedup is
    measured against.
``ready``
    Readiness-first: among the ready tasks, the one with the lowest hint rank
    (position in the rank's hint order). A forward that the memory budget
    cannot take is not ready. Each decision is O(log n) in the ready-set size:
    two binary heaps keyed by hint rank, one for admissions and one for
    everything else.

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
"""

from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple, Sequence

from hints.errors import UserError
from hints.orders import microbatches_per_round
from hints.tasks import PipelineShape, Task
from runtime.deps import TaskGraph, prerequisites


class Policy(str, Enum):
    FIXED = "fixed"
    READY = "ready"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class MemoryBudget:
    """``--memory-budget``: ``1f1b`` (default), ``<k>x`` (k times that), or a slot count.

    ``1f1b`` is, per rank, the most microbatch-chunks the baseline 1F1B order
    of the shape keeps in flight on that rank (``1f1b`` for one chunk,
    ``interleaved-1f1b`` for more): ``min(warmup_r + 1, m * v)`` with the
    warmup of :mod:`hints.orders`.
    """

    spec: str
    factor: float | None = None  # for "1f1b" (1.0) and "<k>x"
    slots: int | None = None  # for an integer budget

    @classmethod
    def parse(cls, text: str | int) -> "MemoryBudget":
        raw = str(text).strip().lower()
        if raw == "1f1b":
            return cls("1f1b", factor=1.0)
        scaled = re.fullmatch(r"(\d+(?:\.\d+)?)x", raw)
        if scaled:
            factor = float(scaled.group(1))
            if factor < 1.0:
                raise UserError(f"{text!r}: a multiple below 1x would starve 1F1B's own order", "--memory-budget")
            return cls(raw, factor=factor)
        if raw.isdigit():
            return cls(raw, slots=int(raw))
        raise UserError(
            f"{text!r} is not a budget; use 1f1b, a multiple such as 2x, or a slot count such as 6",
            "--memory-budget",
        )

    def per_rank(self, shape: PipelineShape) -> list[int]:
        """Slots per rank; raises if any rank could not hold one whole microbatch (``v`` slots)."""
        if self.slots is not None:
            budgets = [self.slots] * shape.ranks
        else:
            budgets = [
                min(shape.chunks * shape.microbatches, math.floor(self.factor * bound))
                for bound in one_f_one_b_bounds(shape)
            ]
        smallest = min(budgets)
        if smallest < shape.chunks:
            raise UserError(
                f"{self.spec} gives {smallest} slot(s) on some rank, below the smallest that can complete: "
                f"one microbatch needs {shape.chunks} slot(s) (one per chunk) on every rank",
                "--memory-budget",
            )
        return budgets

    def __str__(self) -> str:
        return self.spec


def one_f_one_b_bounds(shape: PipelineShape) -> list[int]:
    """Per-rank peak in-flight microbatch-chunks of the baseline 1F1B order of ``shape``."""
    p, v, m = shape.ranks, shape.chunks, shape.microbatches
    if v == 1:
        warmups = [p - 1 - r for r in range(p)]
    else:
        try:
            per_round = microbatches_per_round(p, m)
        except UserError:
            per_round = p  # Megatron's round when torch's relaxation does not apply
        warmups = [(v - 1) * per_round + 2 * (p - 1 - r) for r in range(p)]
    return [min(w + 1, m * v) for w in warmups]


class Decision(NamedTuple):
    """One arbiter decision, as recorded for traces and tests."""

    time: float
    rank: int
    chosen: Task
    hint_rank: int
    head: Task | None  # the lowest-ranked task not yet started, when the choice skipped it
    ready: tuple[tuple[Task, int], ...]  # runnable tasks and their hint ranks, chosen included
    held_back: tuple[Task, ...]  # input-ready admissions the memory budget held back
    in_flight: int  # microbatch-chunks in flight once the chosen task started


class Arbiter:
    """Dependency counting and memory accounting for one rank; subclasses choose."""

    policy: Policy

    def __init__(
        self,
        graph: TaskGraph,
        rank: int,
        order: Sequence[Task],
        budget: int | None = None,
        record: bool = False,
        positions: list[int] | None = None,
    ) -> None:
        self.graph = graph
        self.rank = rank
        self.order = tuple(order)
        self.chunks = graph.shape.chunks
        self.budget = budget
        tids = graph.ids(self.order)
        self.tids = tids
        # position[task id] = hint rank of that task in its own rank's order. Every task belongs to one
        # rank, so the simulator shares one list between all arbiters, each filling in its own tasks.
        if positions is None:
            positions = [0] * len(graph)
        for h, tid in enumerate(tids):
            positions[tid] = h
        self.position = positions
        self.unmet = [graph.prereq_count[t] for t in tids]
        self.admits = [graph.admits[t] for t in tids]
        self.frees = [graph.frees[t] for t in tids]
        self.forward = [graph.is_forward[t] for t in tids]
        self.started = bytearray(len(tids))
        self.done_flags = bytearray(len(tids))
        self.head = 0  # lowest hint rank not yet started
        self.finished = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.reserved = 0
        self.decisions: list[Decision] | None = [] if record else None
        self.ready_count = 0  # input-ready tasks not yet started (held-back admissions included)
        for h, unmet in enumerate(self.unmet):
            if unmet == 0:
                self.ready_count += 1
                self._input_ready(h)

    # -- events ----------------------------------------------------------
    def available(self, producer: int) -> bool:
        """``producer`` (a task of another rank) delivered its output here; True if a task became ready."""
        consumers = self.graph.remote_consumers[producer]
        if len(consumers) == 1:  # the usual case: one message, one consumer, on this rank
            return self._deliver(consumers)
        rank_of, me = self.graph.rank, self.rank
        return self._deliver([c for c in consumers if rank_of[c] == me])

    def finish(self, tid: int) -> bool:
        """A task of this rank ended; True if a local task became ready."""
        h = self.position[tid]
        self.finished += 1
        self.done_flags[h] = 1
        if self.frees[h]:
            self.in_flight -= 1
            self.reserved -= 1
        return self._deliver(self.graph.local_consumers[tid])

    def _deliver(self, consumers) -> bool:
        """Count an arrived input for each consumer (all on this rank)."""
        became_ready = False
        position, unmet = self.position, self.unmet
        for consumer in consumers:
            h = position[consumer]
            left = unmet[h] - 1
            unmet[h] = left
            if left == 0:
                self.ready_count += 1
                self._input_ready(h)
                became_ready = True
        return became_ready

    # -- queries ---------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.finished == len(self.tids)

    def choose(self, now: float = 0.0) -> int | None:
        """The task id to run now (it counts as started), or ``None``."""
        raise NotImplementedError

    def ready_tasks(self) -> list[Task]:
        """Input-ready tasks not yet started, in hint order (for reports; O(n log n))."""
        raise NotImplementedError

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
            missing = [t for t in local if not self.done_flags[self.position[self.graph.tid(t)]]]
            remote_missing = self.unmet[h] - len(missing)
            missing += [t for t in needs if t not in local][:remote_missing]
            out.append((task, missing))
        return out

    # -- internals -------------------------------------------------------
    def _input_ready(self, h: int) -> None:
        raise NotImplementedError

    def _start(self, h: int) -> int:
        self.started[h] = 1
        self.ready_count -= 1
        if self.forward[h]:
            self.in_flight += 1
            if self.in_flight > self.peak_in_flight:
                self.peak_in_flight = self.in_flight
            if self.admits[h]:
                self.reserved += self.chunks
        if h == self.head:
            started = self.started
            head, end = h + 1, len(started)
            while head < end and started[head]:
                head += 1
            self.head = head
        return self.tids[h]

    def _record(self, now: float, h: int, ready_hs: Sequence[int], held_hs: Sequence[int]) -> None:
        order = self.order
        skipped = order[self.head] if self.head != h else None
        self.decisions.append(
            Decision(
                time=now,
                rank=self.rank,
                chosen=order[h],
                hint_rank=h,
                head=skipped,
                ready=tuple((order[x], x) for x in sorted(ready_hs)),
                held_back=tuple(order[x] for x in sorted(held_hs)),
                in_flight=self.in_flight + (1 if self.forward[h] else 0),
            )
        )


class FixedArbiter(Arbiter):
    """Only the head of the hint order may run."""

    policy = Policy.FIXED

    def _input_ready(self, h: int) -> None:
        if self.decisions is not None:
            self._ready_set.add(h)

    def __init__(self, *args, **kwargs) -> None:
        self._ready_set: set[int] = set()
        super().__init__(*args, **kwargs)

    def choose(self, now: float = 0.0) -> int | None:
        h = self.head
        if h >= len(self.tids) or self.unmet[h]:
            return None
        if self.decisions is not None:
            self._record(now, h, list(self._ready_set), ())
            self._ready_set.discard(h)
        return self._start(h)

    def ready_tasks(self) -> list[Task]:
        return [self.order[h] for h in range(self.head, len(self.tids))
                if not self.started[h] and self.unmet[h] == 0]


class ReadyArbiter(Arbiter):
    """The ready task with the lowest hint rank, within the memory budget."""

    policy = Policy.READY

    def __init__(self, *args, **kwargs) -> None:
        self._others: list[int] = []  # heap of hint ranks: backwards and reserved forwards
        self._admissions: list[int] = []  # heap of hint ranks: chunk-0 forwards (need v free slots)
        super().__init__(*args, **kwargs)
        if self.budget is None:
            raise ValueError("the ready policy needs a memory budget")

    def _input_ready(self, h: int) -> None:
        heapq.heappush(self._admissions if self.admits[h] else self._others, h)

    def choose(self, now: float = 0.0) -> int | None:
        others = self._others
        admissions = self._admissions
        fits = bool(admissions) and self.reserved + self.chunks <= self.budget
        if fits and not (others and others[0] < admissions[0]):
            pick = admissions
        elif others:
            pick = others
        else:
            return None
        if self.decisions is not None:
            ready = others + admissions if fits else list(others)
            self._record(now, pick[0], ready, () if fits else admissions)
        return self._start(heapq.heappop(pick))

    def ready_tasks(self) -> list[Task]:
        return [self.order[h] for h in sorted(self._others + self._admissions)]


def make_arbiter(
    policy: Policy | str,
    graph: TaskGraph,
    rank: int,
    order: Sequence[Task],
    budget: int | None = None,
    record: bool = False,
    positions: list[int] | None = None,
) -> Arbiter:
    """Build the arbiter of ``policy`` for ``rank``; ``budget`` is that rank's slot count.

    ``positions`` (task id -> hint rank) may be one list shared by the arbiters of all ranks of one
    process (the simulator); each arbiter fills in its own tasks.
    """
    policy = Policy(policy)
    cls = FixedArbiter if policy is Policy.FIXED else ReadyArbiter
    return cls(graph, rank, order, budget=budget, record=record, positions=positions)


__all__ = [
    "Arbiter",
    "Decision",
    "FixedArbiter",
    "MemoryBudget",
    "Policy",
    "ReadyArbiter",
    "make_arbiter",
    "one_f_one_b_bounds",
]
