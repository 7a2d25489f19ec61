"""Makespan lower bounds: one that holds for every hint, policy and memory budget, and a tighter one per hint family.

This module owns :func:`makespan_lower_bound` (a bound for one compiled
:class:`~hints.deps.TaskGraph` and its per-task durations),
:func:`split_bound` (the *universal* bound for a shape and a
:class:`Durations` table, computed on the free-split graph: valid for every
hint, so the one to compare hints of different families against) and
:func:`hint_bound` (the bound of one hint's *family*, computed on the hint's
own graph with the durations it is charged: tighter, valid for that family
only; [Note: bound per hint family]). Pure Python, standard library only.

Conventions: durations are per task id, ``compute[t]`` seconds of work and
``transfer[t]`` the latency of the message ``t`` sends to a consumer on
another rank, exactly as :mod:`runtime.sched.simulator` uses them. A task's *head*
is the longest path from the start of the iteration to its start (the
predecessors' compute plus the latencies of cross-rank edges); its *tail* is
the longest path from its end to the end of the iteration (latencies plus
the successors' compute). Same-rank edges cost nothing.

The bound is the larger of

1. the *critical path*: ``max(head + compute + tail)`` over all tasks, the
   makespan with one machine per task;
2. per rank, the optimum of the *preemptive* one-machine problem
   ``1 | r_j, pmtn | max(C_j + q_j)`` over that rank's tasks with release
   ``r_j = head`` and tail ``q_j = tail``, solved exactly by Jackson's
   preemptive rule (run the released task with the largest tail, preempting
   when a larger tail is released).

Why it is valid (proof sketch). Take any schedule of the graph the simulator
can produce, whatever the hint, policy or memory budget: it runs each task
once, one at a time per rank, and starts a task only after its inputs have
arrived. By induction along a topological order, every task starts at or
after its head, and the iteration ends at least its tail after the task ends;
so ``makespan >= C_j + q_j`` for every task (term 1, with ``C_j >= r_j +
p_j``). Restricted to one rank, the schedule is a non-preemptive schedule of
that rank's tasks that respects the releases, hence also a feasible
preemptive one, and its ``max(C_j + q_j)`` is at most the makespan; the
preemptive optimum is at most that (term 2). Both terms drop memory limits
and orders, which only remove schedules, so no hint, policy or budget can go
below the bound. (Term 2 also implies term 1, since a task alone is a job
set; the critical path is kept because it names the cause when it binds.)
Why the split graph bounds hints with full backwards too: see
:func:`split_bound`.

Cost: a topological pass for heads (Kahn's algorithm, no recursion), a
reverse pass for tails (both :func:`hints.paths.longest_paths`), and per rank a sort plus O(n log n) heap work:
the job in hand is re-keyed only at a release, so a rank of n tasks does
O(n) heap operations.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from typing import Sequence

from hints.deps import TaskGraph
from hints.paths import longest_paths
from hints.tasks import PipelineShape, ranges
from runtime.durations.variability import Durations


@dataclass(frozen=True)
class LowerBound:
    """A makespan lower bound and the terms it is the largest of.

    ``binding`` names the term that sets ``value``: ``"critical path"`` or
    ``"rank <r>"`` (the critical path wins ties, being the simpler cause).
    """

    value: float
    critical_path: float
    rank_bounds: list[float]
    binding: str


def makespan_lower_bound(graph: TaskGraph, compute: Sequence[float], transfer: Sequence[float]) -> LowerBound:
    """The larger of the critical path and every rank's preemptive one-machine bound (module docstring)."""
    n = len(graph)
    if len(compute) != n or len(transfer) != n:
        raise ValueError(f"need one compute and one transfer time per task ({n}), "
                         f"got {len(compute)} and {len(transfer)}")
    order, head, tail = longest_paths(graph, compute, transfer)
    critical_path = max(map(_sum3, head, compute, tail), default=0.0)

    tasks_of_rank: list[list[int]] = [[] for _ in range(graph.shape.ranks)]
    for tid, rank in enumerate(graph.rank):
        tasks_of_rank[rank].append(tid)
    rank_bounds = [
        _preemptive_jackson(sorted([(head[t], -tail[t], compute[t]) for t in tids])) for tids in tasks_of_rank
    ]

    value = max(critical_path, *rank_bounds)
    top_rank = max(range(len(rank_bounds)), key=rank_bounds.__getitem__)
    # Term 2 includes term 1, so a rank equal to the critical path up to rounding does not bind.
    rank_binds = rank_bounds[top_rank] - critical_path > 1e-12 * max(1.0, abs(value))
    binding = f"rank {top_rank}" if rank_binds else "critical path"
    return LowerBound(value=value, critical_path=critical_path, rank_bounds=rank_bounds, binding=binding)


def split_bound(shape: PipelineShape, table: Durations) -> LowerBound:
    """The bound for ``shape`` on ``table``'s durations, computed on the split-backward graph.

    Valid for hints with full backwards as well: by the [Note: split backward
    durations] of :mod:`runtime.durations.variability`, a full ``B`` costs ``I + W``.
    Running ``I`` and then at once ``W`` in the slot of each ``B`` turns any
    schedule of the unsplit graph into a schedule of the split graph with the
    same makespan (``I`` ends no later than ``B`` did, so its gradient reaches
    the previous stage no later; ``W`` ends when ``B`` did). The split graph's
    best makespan is therefore at most the unsplit one's, and a lower bound for
    the split graph bounds both.

    That needs ``I + W = B``: a table that charges a costly split
    (``split_overhead > 1``, [Note: split backward durations]) is bounded on
    its free split (``I = W = B/2``). Every term of the bound grows with the
    durations, and a schedule of the costly split graph, its ``W`` shortened,
    stays a schedule of the free one, so the free split's bound holds for the
    split hints too (recorded ``I`` and ``W`` are used as recorded).
    """
    split_shape = shape.with_split(True)
    graph = TaskGraph.build(split_shape)
    if table.split_overhead != 1.0 and not (table.input_grad and table.weight_grad):
        table = replace(table, split_overhead=1.0)
    compute, transfer = table.for_graph(graph)
    return makespan_lower_bound(graph, compute, transfer)


def hint_bound(shape: PipelineShape, table: Durations, graph: TaskGraph | None = None) -> LowerBound:
    """The bound of the family of hints of ``shape``, on their own task graph ([Note: bound per hint family]).

    [Note: bound per hint family]
        A hint's family is its shape's graph: full backwards (1f1b, bf, bfw,
        gpipe, interleaved), a split backward on every stage (zb, zbv, the
        torch zero-bubble schedules), or on some stages (``cp`` and tuned hints
        that leave a stage's backward whole: ``PipelineShape.fused_stages``).
        Every schedule the simulator can produce for such a hint, under any
        policy and memory budget, runs exactly that graph's tasks with the
        durations :meth:`Durations.for_graph` charges them (a full ``B``; or
        ``I`` and ``W`` with the split's charged cost). The proof in the
        module docstring then applies to that graph as it is, so the bound
        computed on it holds for the whole family, whatever its order.

        It is at least :func:`split_bound` (the free split is a relaxation of
        every family: a full ``B`` is one ``I`` then ``W`` at once, and a
        charged split only lengthens ``W``), and tighter where the family
        cannot overlap what the free split overlaps: with full backwards
        the previous stage's gradient leaves only when the whole ``B`` ends.
        It bounds nothing outside its family: a full-backward hint's bound is
        not a bound for zb. Compare hints of different families against the
        universal :func:`split_bound`; rrfp's tables give each row both.
    """
    graph = graph if graph is not None and graph.shape == shape else TaskGraph.build(shape)
    compute, transfer = table.for_graph(graph)
    own = makespan_lower_bound(graph, compute, transfer)
    universal = split_bound(shape, table)
    return own if own.value >= universal.value else universal  # equal up to rounding where they coincide


def bound_family(shape: PipelineShape) -> str:
    """The name of ``shape``'s bound ([Note: bound per hint family]): ``full-backward``, ``split``, or
    ``split on stages ...`` when some stages keep a whole backward."""
    whole = sorted(shape.fused_stages) if shape.split_backward else list(range(shape.stages))
    if len(whole) == shape.stages:
        return "full-backward"
    if not whole:
        return "split"
    return f"split except stage{'s' if len(whole) > 1 else ''} {ranges(whole).replace(' ', '')}"


def jackson_preemptive_bound(release: Sequence[float], processing: Sequence[float],
                             tail: Sequence[float]) -> float:
    """Optimal ``max(C_j + q_j)`` of ``1 | r_j, pmtn | max(C_j + q_j)`` (0 for no jobs)."""
    return _preemptive_jackson(sorted(zip(release, (-q for q in tail), processing)))


def _sum3(a: float, b: float, c: float) -> float:
    return a + b + c


def _preemptive_jackson(jobs: list[tuple[float, float, float]]) -> float:
    """Jackson's preemptive rule; ``jobs`` are ``(release, -tail, processing)`` sorted by release.

    Returns ``max(C_j + q_j)``. Between two releases the machine works on the
    pending job with the largest tail; at a release the job in hand stays in
    the heap with what is left of it, and the largest tail is picked again
    (a preemption if a larger one came).
    """
    pending: list[tuple[float, float]] = []  # (-tail, remaining processing): a max-heap on tail
    push, pop, replace = heapq.heappush, heapq.heappop, heapq.heapreplace
    now = best = 0.0
    for release, negative_tail, processing in jobs:
        while pending and now < release:
            top_negative_tail, remaining = pending[0]
            if now + remaining <= release:
                pop(pending)
                now += remaining
                if now - top_negative_tail > best:
                    best = now - top_negative_tail
            else:
                replace(pending, (top_negative_tail, remaining - (release - now)))
                now = release
        if now < release:
            now = release  # idle until this release
        push(pending, (negative_tail, processing))
    # Everything is released: no more preemptions, largest tail first to the end.
    for negative_tail, remaining in sorted(pending):
        now += remaining
        if now - negative_tail > best:
            best = now - negative_tail
    return best


__all__ = ["LowerBound", "bound_family", "hint_bound", "jackson_preemptive_bound", "makespan_lower_bound",
           "split_bound"]
