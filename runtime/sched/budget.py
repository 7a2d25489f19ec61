"""The memory budget: how many microbatch-chunks each rank may hold in flight (``--memory-budget``).

A budget is written ``1f1b`` (per rank, what the shape's baseline order holds), ``<k>x`` (k times that)
or a slot count; :meth:`MemoryBudget.per_rank` turns it into slots per rank for a shape. The arbiter
applies it ([Note: memory budget and chunk deadlock] in :mod:`runtime.sched.arbiter`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

from hints.errors import UserError
from hints.orders import one_f_one_b_warmups, peak_in_flight, zero_bubble_v
from hints.tasks import PipelineShape, V


@dataclass(frozen=True)
class MemoryBudget:
    """``--memory-budget``: ``1f1b`` (default), ``<k>x`` (k times that), or a slot count.

    ``1f1b`` is, per rank, the most microbatch-chunks the baseline order of
    the shape keeps in flight on that rank: 1F1B's (``1f1b`` for one chunk,
    ``interleaved-1f1b`` for more), ``min(warmup_r + 1, m * v)`` with the
    warmup of :mod:`hints.orders`; under V placement, ZB-V's (``zbv``, whose
    peak is ``2p`` on every rank once ``m >= 2p - 1``: the activation memory
    of 1F1B, ``p`` microbatches of a ``1/p`` stage, in half-size chunks).
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
                raise UserError(f"{text!r}: a multiple below 1x would starve 1F1B's own order", "`memory_budget`")
            return cls(raw, factor=factor)
        if raw.isdigit():
            return cls(raw, slots=int(raw))
        raise UserError(
            f"{text!r} is not a budget; use 1f1b, a multiple such as 2x, or a slot count such as 6",
            "`memory_budget`",
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
                "`memory_budget`",
            )
        return budgets

    def __str__(self) -> str:
        return self.spec


def one_f_one_b_bounds(shape: PipelineShape) -> list[int]:
    """Per-rank peak in-flight microbatch-chunks of the baseline order of ``shape`` (1F1B; ZB-V under V)."""
    p, v, m = shape.ranks, shape.chunks, shape.microbatches
    if shape.placement == V:
        return list(_zbv_peaks(p, m))
    try:
        warmups = one_f_one_b_warmups(p, v, m)
    except UserError:  # Megatron's round (p microbatches) when torch's relaxation does not apply
        warmups = [(v - 1) * p + 2 * (p - 1 - r) for r in range(p)]
    return [min(w + 1, m * v) for w in warmups]


def budget_spelling(shape: PipelineShape, peaks: list[int]) -> str | None:
    """Per-rank peaks in flight as a ``--memory-budget`` spelling: ``1f1b`` when they are the baseline order's, a
    slot count when every rank's is the same; None when no spelling says them."""
    if peaks == MemoryBudget.parse("1f1b").per_rank(shape):
        return "1f1b"
    return str(peaks[0]) if len(set(peaks)) == 1 else None


@lru_cache(maxsize=32)
def _zbv_peaks(ranks: int, microbatches: int) -> tuple[int, ...]:
    """ZB-V's per-rank peak in flight, read off its order (built once per shape: 0.7 s at 128 x 512)."""
    shape = PipelineShape(ranks, 2, microbatches, split_backward=True, placement=V)
    return tuple(peak_in_flight(order, shape) for order in zero_bubble_v(ranks, 2, microbatches))
