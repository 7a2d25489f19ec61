"""List-scheduling priorities computed on the task graph: the bottom levels behind the ``cp`` hint.

A task's *bottom level* is its own duration plus the longest path of
durations and cross-rank latencies from its end to the end of the iteration
(:func:`runtime.bounds.longest_paths` gives the tail; the bottom level is
``compute + tail``). Running the ready task with the highest bottom level
first is HLFET list scheduling (Adam, Chandy and Dickson 1974): the task with
the most work still hanging behind it goes first.

Conventions: priorities are computed on the *split-backward* graph of the
shape (``I`` and ``W`` each half of ``B`` unless the table recorded them, see
[Note: split backward durations] in :mod:`runtime.variability`), from
*expected* durations (:meth:`runtime.variability.Durations.expected`: the
workload model's expectation, or the mean of recorded durations per
(stage, kind)), never from the durations being replayed.

Ties: two tasks of equal bottom level (zero-duration tasks) are ordered by
their position in one topological order of the whole graph, so every rank's
order is a subsequence of one topological order and the hint completes even
under the fixed policy.
"""

from __future__ import annotations

from hints.tasks import PipelineShape, Task
from runtime.bounds import longest_paths
from runtime.deps import TaskGraph
from runtime.variability import Durations


def cp_priorities(shape: PipelineShape, expected: Durations) -> dict[Task, tuple[float, int]]:
    """Every task of ``shape`` (split backward) -> ``(bottom level, -topological position)``; higher first."""
    split = PipelineShape(shape.ranks, shape.chunks, shape.microbatches, split_backward=True)
    graph = TaskGraph.build(split)
    compute, transfer = expected.for_graph(graph)
    order, _, tail = longest_paths(graph, compute, transfer)
    position = [0] * len(graph)
    for index, tid in enumerate(order):
        position[tid] = index
    tasks = graph.tasks
    return {tasks[t]: (compute[t] + tail[t], -position[t]) for t in range(len(graph))}


__all__ = ["cp_priorities"]
