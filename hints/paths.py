"""Longest paths through a compiled task graph: a topological order, and every task's head and tail.

Conventions (those of the simulator and the lower bound, :mod:`runtime.sched.bounds`): durations are per
task id, ``compute[t]`` seconds of work and ``transfer[t]`` the latency of the message ``t`` sends to a
consumer on another rank. A task's *head* is the longest path from the start of the iteration to its start
(the predecessors' compute plus the latencies of cross-rank edges); its *tail* is the longest path from its
end to the end of the iteration (latencies plus the successors' compute). Same-rank edges cost nothing.
Pure Python: the lower bound and the list-scheduling priorities of :mod:`hints.priorities` are made of it.
"""

from __future__ import annotations

from typing import Sequence

from hints.deps import TaskGraph


def longest_paths(graph: TaskGraph, compute: Sequence[float], transfer: Sequence[float]
                  ) -> tuple[list[int], list[float], list[float]]:
    """A topological order of the task ids (Kahn's, sources in id order), and every task's head and tail.

    Also what list-scheduling priorities are made of (:mod:`hints.priorities`): a task's bottom
    level is ``compute + tail``.
    """
    order, head = _topological_order_and_heads(graph, compute, transfer)
    return order, head, _tails(graph, compute, transfer, order)


def _topological_order_and_heads(graph: TaskGraph, compute: Sequence[float],
                                 transfer: Sequence[float]) -> tuple[list[int], list[float]]:
    """Kahn's algorithm; a task's head is final once its last producer is taken."""
    local_consumers, remote_consumers = graph.local_consumers, graph.remote_consumers
    waiting = list(graph.prereq_count)
    head = [0.0] * len(graph)
    order = [tid for tid, count in enumerate(waiting) if count == 0]
    for tid in order:  # `order` grows while it is walked: it is Kahn's queue and the result at once
        ends = head[tid] + compute[tid]
        for consumer in local_consumers[tid]:
            if ends > head[consumer]:
                head[consumer] = ends
            waiting[consumer] -= 1
            if not waiting[consumer]:
                order.append(consumer)
        remote = remote_consumers[tid]
        if remote:
            arrives = ends + transfer[tid]
            for consumer in remote:
                if arrives > head[consumer]:
                    head[consumer] = arrives
                waiting[consumer] -= 1
                if not waiting[consumer]:
                    order.append(consumer)
    if len(order) != len(graph):
        raise ValueError("the task graph has a cycle")  # deps.py rules never make one
    return order, head


def _tails(graph: TaskGraph, compute: Sequence[float], transfer: Sequence[float], order: list[int]) -> list[float]:
    """Reverse topological pass: a task's tail is final once all its consumers are done."""
    local_consumers, remote_consumers = graph.local_consumers, graph.remote_consumers
    tail = [0.0] * len(graph)
    through = [0.0] * len(graph)  # compute + tail: a consumer's cost seen from its producer
    for tid in reversed(order):
        longest = 0.0
        for consumer in local_consumers[tid]:
            if through[consumer] > longest:
                longest = through[consumer]
        remote = remote_consumers[tid]
        if remote:
            latency = transfer[tid]
            for consumer in remote:
                if through[consumer] + latency > longest:
                    longest = through[consumer] + latency
        tail[tid] = longest
        through[tid] = compute[tid] + longest
    return tail
