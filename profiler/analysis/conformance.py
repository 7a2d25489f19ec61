"""How far each rank's executed order is from its hint order: skips, Kendall tau, largest displacement."""

from __future__ import annotations

from typing import Sequence

import polars as pl

from profiler.trace.reader import TraceFrames


def conformance(frames: TraceFrames) -> pl.DataFrame:
    """Per rank and iteration: how far the executed order is from the hint.

    ``skips`` counts decisions that passed over the hint head; ``kendall_tau``
    compares the executed order with the hint order (1 = identical, -1 =
    reversed); ``max_displacement`` is the largest |executed position - hint
    position|.
    """
    hints = {(r, i): h.split() for r, i, h in frames.iterations.select("rank", "iteration", "hint").iter_rows()}
    skips = {(r, i): n for r, i, n in frames.decisions.group_by("rank", "iteration").agg(
        pl.col("skipped").is_not_null().sum()).iter_rows()}
    rows = []
    for (rank, iteration), group in frames.tasks.sort("start_ns").group_by(["rank", "iteration"],
                                                                           maintain_order=True):
        executed = group.get_column("task").to_list()
        hint = hints.get((rank, iteration))
        if not hint:
            continue
        position = {task: i for i, task in enumerate(hint)}
        ranks = [position[t] for t in executed if t in position]
        rows.append({"rank": rank, "iteration": iteration, "tasks": len(executed),
                     "skips": skips.get((rank, iteration), 0), "kendall_tau": kendall_tau(ranks),
                     "max_displacement": max((abs(i - r) for i, r in enumerate(ranks)), default=0)})
    return pl.DataFrame(rows, schema={"rank": pl.Int64, "iteration": pl.Int64, "tasks": pl.Int64,
                                      "skips": pl.Int64, "kendall_tau": pl.Float64,
                                      "max_displacement": pl.Int64}).sort("iteration", "rank")


def kendall_tau(sequence: Sequence[int]) -> float:
    """Kendall's tau between ``sequence`` and its sorted order, via an O(n log n) inversion count."""
    n = len(sequence)
    if n < 2:
        return 1.0
    inversions = _count_inversions(list(sequence))
    return 1.0 - 4.0 * inversions / (n * (n - 1))


def _count_inversions(values: list[int]) -> int:
    if len(values) < 2:
        return 0
    middle = len(values) // 2
    left, right = values[:middle], values[middle:]
    count = _count_inversions(left) + _count_inversions(right)
    i = j = k = 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            values[k] = left[i]
            i += 1
        else:
            values[k] = right[j]
            j += 1
            count += len(left) - i
        k += 1
    values[k:] = left[i:] + right[j:]
    return count
