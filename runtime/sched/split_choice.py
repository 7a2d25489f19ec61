"""Which stages a ``cp`` hint splits: a split backward is worth it only where it fills a bubble.

[Note: which stages split]
    Splitting a stage's backward into ``I`` + ``W`` sends the input gradient upstream sooner (``I`` is about
    half of ``B``) and leaves ``W`` to fill idle time later, but the split costs more than the fused ``B``
    (``I + W = split_overhead x B``: 1.05 on the language presets, 1.06 on the vision-language ones, from
    ``benchmarks/split_cost.py``). Where the extra work is more than the bubble it fills, the split loses.
    What a split buys depends on where the stage sits: stage ``k``'s ``I`` shortens the backward chain of
    every stage below it, so the later stages gain most and stage 0 gains nothing (nothing waits for its
    input gradient). :func:`choose_split` therefore weighs *suffixes*: split stages ``k`` and later, for
    ``k`` in 0 (every stage), 1, S/8, S/4, S/2, 3S/4 and S (none), builds ``cp`` for each, runs each in
    fixed order on the expected durations (what ``cp`` itself is built from; the simulator, no memory
    budget) and keeps the fastest; ties go to the fewest splits (so stage 0, whose split buys nothing,
    stays fused unless splitting it is faster). The choice is never slower on the expected durations than
    the ``cp`` of before (every stage split) or than no split at all, and costs at most seven simulations
    of the iteration.

    The hint's shape records the choice (:attr:`hints.tasks.PipelineShape.fused_stages`): ``rrfp hints show
    cp`` and the hint file name the fused stages, a trace shows ``B`` on them and ``I``/``W`` elsewhere, and
    ``rrfp trace summary`` says which stages split.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from hints.deps import TaskGraph
from hints.orders import HintOrder, by_priority
from hints.priorities import TaskDurations, bottom_levels
from hints.tasks import PipelineShape, Task
from runtime.sched.simulator import simulate


def choose_split(shape: PipelineShape, expected: TaskDurations) -> PipelineShape:
    """``shape`` split where [Note: which stages split] finds it pays (its ``fused_stages`` the others)."""
    return split_and_priorities(shape, expected)[0]


def split_and_priorities(shape: PipelineShape, expected: TaskDurations
                         ) -> tuple[PipelineShape, dict[Task, tuple[float, int]]]:
    """:func:`choose_split`, with ``cp``'s priorities on the chosen shape (computed on the way)."""
    every = shape.with_split(True)
    stages = shape.stages
    starts = sorted({0, 1, stages // 8, stages // 4, stages // 2, 3 * stages // 4, stages})
    tried = [_run(replace(every, fused_stages=frozenset(range(min(k, stages)))), expected) for k in starts]
    best = min(tried, key=lambda run: (run.makespan, run.splits))
    return best.shape, best.priorities


class _Tried(NamedTuple):
    makespan: float
    splits: int
    shape: PipelineShape
    priorities: dict[Task, tuple[float, int]]


def _run(shape: PipelineShape, expected: TaskDurations) -> _Tried:
    """``cp`` for ``shape``, in fixed order, on the expected durations."""
    graph = TaskGraph.build(shape)
    compute, transfer = expected.for_graph(graph)
    priorities = bottom_levels(graph, compute, transfer)
    orders = by_priority(shape.ranks, shape.chunks, shape.microbatches, priorities, shape.placement)
    result = simulate(HintOrder(shape, tuple(map(tuple, orders)), "cp"), (compute, transfer), "fixed", graph=graph)
    return _Tried(result.makespan, len(shape.split_stages), shape, priorities)


__all__ = ["choose_split", "split_and_priorities"]
