"""Small hand-made hints and duration tables for the scheduling tests (pure: no torch, no processes)."""

from __future__ import annotations

import random

from hints.deps import TaskGraph, prerequisites
from hints.orders import HintOrder
from hints.tasks import PipelineShape, Task


def unit_durations(graph: TaskGraph, f: float = 1.0, b: float = 2.0, latency: float = 0.0,
                   w: float | None = None):
    """F = f, B = b, and for a split backward I = b - w and W = w (default b/2 each)."""
    w = b / 2 if w is None else w
    per_kind = {"F": f, "B": b, "I": b - w, "W": w}
    compute = [per_kind[t.kind.value] for t in graph.tasks]
    transfer = [latency if graph.remote_consumers[t] else 0.0 for t in range(len(graph))]
    return compute, transfer


def hint_from_text(orders: list[list[str]], name: str = "hand-made", split: bool = False) -> HintOrder:
    parsed = [[Task.parse(t) for t in order] for order in orders]
    ranks = len(parsed)
    stages = max(t.stage for o in parsed for t in o) + 1
    mbs = max(t.microbatch for o in parsed for t in o) + 1
    shape = PipelineShape(ranks, stages // ranks, mbs, split)
    return HintOrder(shape, tuple(tuple(o) for o in parsed), name)


def random_order_hint(shape: PipelineShape, seed: int) -> HintOrder:
    """Random per-rank orders that are structurally valid (F before its backward, I before W)."""
    rng = random.Random(seed)
    orders = []
    for rank in range(shape.ranks):
        tasks = list(shape.tasks_of_rank(rank))
        rng.shuffle(tasks)
        slots: dict[tuple[int, int], list[int]] = {}
        for pos, task in enumerate(tasks):
            slots.setdefault((task.stage, task.microbatch), []).append(pos)
        order = [None] * len(tasks)
        for (stage, mb), positions in slots.items():
            for pos, kind in zip(sorted(positions), shape.kinds):
                order[pos] = type(tasks[0])(stage, kind, mb)
        orders.append(tuple(order))
    return HintOrder(shape, tuple(orders), f"random-{seed}")


def random_completing_hint(shape: PipelineShape, seed: int) -> HintOrder:
    """Random per-rank orders that complete in fixed order: each rank's order is the order a random list
    schedule ran its tasks in (each step, any task whose prerequisites have run)."""
    rng = random.Random(seed)
    todo = {task for rank in range(shape.ranks) for task in shape.tasks_of_rank(rank)}
    done: set[Task] = set()
    orders: list[list[Task]] = [[] for _ in range(shape.ranks)]
    while todo:
        task = rng.choice(sorted(t for t in todo if all(p in done for p in prerequisites(t, shape))))
        todo.remove(task)
        done.add(task)
        orders[shape.rank_of(task.stage)].append(task)
    return HintOrder(shape, tuple(map(tuple, orders)), f"random-run-{seed}")
