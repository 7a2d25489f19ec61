"""``--policy auto`` in ``rrfp run``: what each iteration realized, gathered so every rank replays the same data.

[Note: the auto policy] (:mod:`runtime.sched.auto`) decides; this module feeds it. After each iteration every
rank all-gathers (on the CPU control group) each task's start and end and, for each message it received, when it
arrived, on rank 0's clock. Each rank keeps its own replica's pipeline (its data-parallel index; the TP group's
leaders, which run and time every task of their stage) and builds one realized table: a task's compute is its
end minus its start, a message's latency its arrival minus its producer's end. The replica's realized makespan
is from its first task's start to its last task's end, as the simulator counts it. All ranks of a replica
therefore decide alike, and replicas may differ (they meet only at the gradient reduction). The first iteration
a process runs (the first of the run, or of a resumed run) is not kept: it pays one-off start-up costs.
"""

from __future__ import annotations

import math

from hints.deps import TaskGraph
from hints.tasks import B, F, I
from runtime.durations.variability import Durations, durations_from_rows


def gather_realized(ctx, result, graph: TaskGraph) -> tuple[Durations, float]:
    """This replica's realized table and makespan for the iteration of ``result`` (a collective: every rank
    calls it)."""
    import torch
    import torch.distributed as dist

    n = len(graph)
    offset = ctx.clock_offset_ns
    mine = torch.full((3 * n,), float("nan"), dtype=torch.float64)
    for tid, began, ended in result.spans:
        mine[3 * tid] = (began + offset) * 1e-9
        mine[3 * tid + 1] = (ended + offset) * 1e-9
    for producer, arrived in result.arrivals.items():
        mine[3 * producer + 2] = (arrived + offset) * 1e-9
    everyone = [torch.empty_like(mine) for _ in range(ctx.world)]
    dist.all_gather(everyone, mine, group=ctx.control_group)
    grid = ctx.grid
    _, _, replica = grid.coordinates(ctx.rank)
    start, end, arrive = [math.nan] * n, [math.nan] * n, [math.nan] * n
    for rank, values in enumerate(everyone):
        _, tp, dp = grid.coordinates(rank)
        if dp != replica or tp != 0:
            continue
        values = values.tolist()
        for tid in range(n):
            if values[3 * tid] == values[3 * tid]:
                start[tid], end[tid] = values[3 * tid], values[3 * tid + 1]
            if values[3 * tid + 2] == values[3 * tid + 2]:
                arrive[tid] = values[3 * tid + 2]
    missing = [graph.tasks[tid] for tid in range(n) if start[tid] != start[tid]]
    if missing:
        raise RuntimeError(f"auto policy: no timing gathered for {missing[0]} ({len(missing)} tasks)")
    compute = [e - s for s, e in zip(start, end)]
    latency = [max(0.0, a - e) if a == a else 0.0 for a, e in zip(arrive, end)]
    return realized_table(graph, compute, latency), max(end) - min(start)


def realized_table(graph: TaskGraph, compute: list[float], latency: list[float]) -> Durations:
    """:func:`runtime.durations.variability.durations_from_rows` of per-task-id compute seconds and message
    latencies: ``send_backward`` is the latency of the ``B`` or ``I`` that sends the gradient."""
    shape = graph.shape
    stages, m = shape.stages, shape.microbatches
    rows = {kind: [[0.0] * m for _ in range(stages)] for kind in "FBIW"}
    send_forward = [[0.0] * m for _ in range(stages)]
    send_backward = [[0.0] * m for _ in range(stages)]
    for tid, task in enumerate(graph.tasks):
        k, i = task.stage, task.microbatch
        rows[task.kind.value][k][i] = compute[tid]
        if task.kind is F:
            send_forward[k][i] = latency[tid]
        elif task.kind is B or task.kind is I:
            send_backward[k][i] = latency[tid]
    return durations_from_rows(shape, rows, send_forward, send_backward, "realized iteration (rrfp run --policy auto)")
