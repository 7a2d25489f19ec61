"""The fixed orders readiness is credited against: sorted 1F1B with warm-ups that fill a memory budget.

[Note: the best fixed order at equal memory]
    A gain credited to readiness must not be one a fixed order gets too. Two levers need no runtime: ordering
    microbatches by the cost known before the iteration (what ``bfw`` and ``cp`` read) and holding more
    activation memory. The built-ins ``1f1b-light`` and ``1f1b-heavy`` ([Note: sorted 1F1B] in
    :mod:`hints.orders`) take the first at 1F1B's memory. :func:`sorted_baselines` adds the second: at a
    budget above 1F1B's, the same sorted orders with every rank's warm-up deepened to fill its slots
    (``slots - 1`` forwards before the first backward, so the rank peaks at exactly its budget), named
    ``1f1b-light @<budget>``. ``rrfp simulate --compare``, ``rrfp trace sensitivity`` and ``rrfp bench``
    run them beside the built-ins, and :func:`runtime.sched.evaluate.credit` picks the fastest fixed order
    within the budget and the fastest ready one: *readiness* is their ratio, beside each hint's ready over
    its own fixed order. The 1F1B family places stages looping; a V shape gets no sorted baseline (its
    fixed baseline is ZB-V).
"""

from __future__ import annotations

from typing import Sequence

from hints.errors import HintError
from hints.orders import (
    HintOrder,
    lightest_to_heaviest,
    one_f_one_b_warmups,
    relabelled,
    sorted_one_f_one_b,
    zero_bubble,
)
from hints.tasks import LOOPING, PipelineShape

SORTED_1F1B = {"1f1b-light": True, "1f1b-heavy": False}  # built-in name -> lightest first


def fitted_warmups(shape: PipelineShape, slots: Sequence[int]) -> list[int]:
    """Per rank, the deepest warm-up a 1F1B-family order can run within ``slots`` (it peaks at warm-up + 1)."""
    total = shape.chunks * shape.microbatches
    return [max(0, min(slot, total) - 1) for slot in slots]


def sorted_baselines(shape: PipelineShape, costs: Sequence[float], slots: Sequence[int], budget: str
                     ) -> dict[str, HintOrder]:
    """``1f1b-light`` and ``1f1b-heavy`` with warm-ups deepened to fill ``slots`` ([Note: the best fixed order
    at equal memory]); empty where that is 1F1B's own warm-up (the built-ins are the baseline), where a rank's
    budget is below 1F1B's peak, or for a V shape."""
    if shape.placement != LOOPING:
        return {}
    try:
        base = one_f_one_b_warmups(shape.ranks, shape.chunks, shape.microbatches)
    except HintError:  # an interleaved shape whose microbatches do not divide into rounds
        return {}
    # A warm-up of total - 1 forwards or more is one order (all forwards, then all backwards).
    base = [min(w, shape.chunks * shape.microbatches - 1) for w in base]
    fitted = fitted_warmups(shape, slots)
    if fitted == base or any(f < b for f, b in zip(fitted, base)):
        return {}
    out = {}
    for name, lightest in SORTED_1F1B.items():
        orders = sorted_one_f_one_b(shape.ranks, shape.chunks, shape.microbatches, costs, lightest, fitted)
        label = f"{name} @{budget}"
        out[label] = HintOrder(shape.with_split(False), tuple(orders), label,
                               {"generator": name, "warmups": fitted, "costs": [float(c) for c in costs]})
    return out


def sorted_zero_bubble(shape: PipelineShape, costs: Sequence[float]) -> HintOrder:
    """``zb`` (ZB-H1) with microbatches sorted lightest first by ``costs``, as ``1f1b-light`` sorts 1F1B."""
    orders = relabelled(zero_bubble(shape.ranks, shape.chunks, shape.microbatches), lightest_to_heaviest(costs))
    return HintOrder(PipelineShape(shape.ranks, shape.chunks, shape.microbatches, True, LOOPING), orders, "zb-light",
                     {"generator": "zb", "lightest_first": True, "costs": [float(c) for c in costs]})


PLANNED = "planned"


__all__ = ["PLANNED", "SORTED_1F1B", "fitted_warmups", "sorted_baselines", "sorted_zero_bubble"]
