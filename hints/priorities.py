"""List-scheduling priorities computed on the task graph: the bottom levels behind the ``cp`` hint.

The ``cp`` hint is made here and in :func:`hints.orders.by_priority`, which sorts each rank's tasks by
these priorities; the durations they are computed from are the only thing a caller brings (any table with
``for_graph(graph) -> (compute, transfer)``: :class:`runtime.durations.variability.Durations`), as the
``bfw`` hint takes its costs.

A task's *bottom level* is its own duration plus the longest path of
durations and cross-rank latencies from its end to the end of the iteration
(:func:`hints.paths.longest_paths` gives the tail; the bottom level is
``compute + tail``). Running the ready task with the highest bottom level
first is HLFET list scheduling (Adam, Chandy and Dickson 1974): the task with
the most work still hanging behind it goes first.

Conventions: priorities are computed on the *split-backward* graph of the
shape (``I`` and ``W`` each half of ``B`` unless the table recorded them, see
[Note: split backward durations] in :mod:`runtime.durations.variability`), from
*expected* durations (:meth:`runtime.durations.variability.Durations.expected`: the
workload model's expectation, or the mean of recorded durations per
(stage, kind)), never from the durations being replayed.

Ties: two tasks of equal bottom level (zero-duration tasks) are ordered by
their position in one topological order of the whole graph, so every rank's
order is a subsequence of one topological order and the hint completes even
under the fixed policy.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from hints.deps import TaskGraph
from hints.paths import longest_paths
from hints.tasks import PipelineShape, Task


class TaskDurations(Protocol):
    """What priorities are computed from: per task id of a graph, seconds of compute and of transfer."""

    def for_graph(self, graph: TaskGraph) -> tuple[Sequence[float], Sequence[float]]: ...


def cp_priorities(shape: PipelineShape, expected: TaskDurations) -> dict[Task, tuple[float, int]]:
    """Every task of ``shape`` (split backward, the fused stages' whole) -> ``(bottom level, -topological
    position)``; higher first."""
    graph = TaskGraph.build(_split(shape))
    return bottom_levels(graph, *expected.for_graph(graph))


def bottom_levels(graph: TaskGraph, compute: Sequence[float], transfer: Sequence[float]
                  ) -> dict[Task, tuple[float, int]]:
    """:func:`cp_priorities` on a graph already built, with its durations already read."""
    return _rules(graph, compute, transfer, every=False)["longest remaining path"]


def _split(shape: PipelineShape) -> PipelineShape:
    """``shape`` as the priorities see it: split, with its fused stages if it has any."""
    return shape if shape.split_backward else shape.with_split(True)


def list_priorities(shape: PipelineShape, expected: TaskDurations) -> dict[str, dict[Task, tuple[float, int]]]:
    """Per-task priorities (higher first) of three list-scheduling rules, on the split-backward graph.

    ``longest remaining path`` (the bottom level, ``cp``), ``most remaining work`` (the task's work plus
    all its descendants'), ``longest task first`` (a task weighs its longest descendant, so it never
    ranks below one). Each is non-increasing along every edge and ties go by topological position, so
    every order made from them is consistent with one topological order of the graph (it completes in
    fixed order too).
    """
    graph = TaskGraph.build(_split(shape))
    return _rules(graph, *expected.for_graph(graph), every=True)


def _rules(graph: TaskGraph, compute: Sequence[float], transfer: Sequence[float], every: bool
           ) -> dict[str, dict[Task, tuple[float, int]]]:
    """The rules of :func:`list_priorities` (``every``), or only the longest remaining path."""
    order, _, tail = longest_paths(graph, compute, transfer)
    position = [0] * len(graph)
    for index, tid in enumerate(order):
        position[tid] = index
    tasks = graph.tasks
    rules = {"longest remaining path": {tasks[t]: (compute[t] + tail[t], -position[t]) for t in range(len(graph))}}
    if not every:
        return rules
    # Remaining work counts every descendant once: summing over consumers would count shared ones twice,
    # so walk the descendants (a microbatch's subgraph is small).
    remaining = [0.0] * len(graph)
    longest = [0.0] * len(graph)
    for tid in reversed(order):
        seen, stack, total = {tid}, [tid], 0.0
        while stack:
            t = stack.pop()
            total += compute[t]
            for consumer in graph.consumers(t):
                if consumer not in seen:
                    seen.add(consumer)
                    stack.append(consumer)
        remaining[tid] = total
        longest[tid] = max([compute[tid], *(longest[c] for c in graph.consumers(tid))])
    rules["most remaining work"] = {tasks[t]: (remaining[t], -position[t]) for t in range(len(graph))}
    rules["longest task first"] = {tasks[t]: (longest[t], -position[t]) for t in range(len(graph))}
    return rules


__all__ = ["bottom_levels", "cp_priorities", "list_priorities"]
