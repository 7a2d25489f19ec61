"""rrfp's versioned hint file: ``rrfp-hint/1`` and ``rrfp-hint/2`` JSON, reading and writing.

``rrfp-hint/1`` (the public, versioned hint format)::

    {
      "format": "rrfp-hint/1",
      "name": "1f1b",
      "shape": {"ranks": 4, "chunks": 1, "microbatches": 8, "split_backward": false},
                                                            # with "split_backward": true, optional
                                                            # "fused_stages": [0, 3]: stages left unsplit
      "placement": "looping",                               # optional: "looping" (the default) or "v"
      "orders": [["0F0", "0F1", ...], ["1F0", ...], ...],   # one list per rank
      "provenance": {"generator": "1f1b", ...}               # free-form, kept verbatim
    }

``rrfp-hint/2`` is ``rrfp-hint/1`` plus two keys, for cost-ranked hints
([Note: cost-ranked hints] in :mod:`hints.orders`)::

      "microbatches": "cost-ranked",      # or "index" (what /1 means)
      "cost_model": {"features": ["tokens", "images"], "stages": 4,
                     "coefficients": {"0F": [a, b, c], "0B": [...], ...}}   # optional, hints.costs

Index hints are written as ``rrfp-hint/1`` so older rrfp reads them; this
rrfp reads both. Unknown keys are rejected (a typo must not be silently
ignored). Loading validates fully (:func:`hints.validate.validate_orders`);
every failure is a :class:`HintError` naming the file, the rank and the task.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hints.costs import CostModel
from hints.errors import HintError, UserError, render_inputs
from hints.orders import MICROBATCH_ORDERS, HintOrder
from hints.outputs import write_text
from hints.tasks import LOOPING, PLACEMENTS, PipelineShape, Task
from hints.validate import validate_orders

HINT_FORMAT = "rrfp-hint/1"
HINT_FORMAT_2 = "rrfp-hint/2"
_TOP_KEYS = {"format", "name", "shape", "placement", "orders", "provenance"}
_TOP_KEYS_2 = _TOP_KEYS | {"microbatches", "cost_model"}
_SHAPE_KEYS = {"ranks", "chunks", "microbatches", "split_backward", "fused_stages"}


def hint_to_json(hint: HintOrder) -> dict[str, Any]:
    shape = hint.shape.to_json()
    data = {
        "format": HINT_FORMAT_2 if hint.cost_ranked else HINT_FORMAT,
        "name": hint.name,
        "shape": shape,
        "placement": shape.pop("placement"),  # the file keeps it beside the shape (files without it: looping)
        "orders": hint.text_orders(),
        "provenance": dict(hint.provenance),
    }
    if hint.cost_ranked:
        data["microbatches"] = hint.microbatches
        if hint.cost_model is not None:
            data["cost_model"] = hint.cost_model.to_json()
    return data


def save_hint(hint: HintOrder, path: str | Path) -> None:
    write_text(path, json.dumps(hint_to_json(hint), indent=1) + "\n")


def hint_from_json(data: Any, where: str) -> HintOrder:
    """Build and validate a hint from parsed ``rrfp-hint/1`` or ``rrfp-hint/2`` JSON."""
    if not isinstance(data, dict):
        raise HintError(f"expected a JSON object with format {HINT_FORMAT!r}", where)
    version = data.get("format")
    if version not in (HINT_FORMAT, HINT_FORMAT_2):
        raise HintError(
            f"format is {version!r}; this rrfp reads {HINT_FORMAT!r} and {HINT_FORMAT_2!r}", where
        )
    allowed = _TOP_KEYS if version == HINT_FORMAT else _TOP_KEYS_2
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise HintError(f"unknown key {unknown[0]!r} (allowed in {version}: {', '.join(sorted(allowed))})", where)
    microbatches = data.get("microbatches", "index")
    if microbatches not in MICROBATCH_ORDERS:
        raise HintError(f"'microbatches' is {microbatches!r}; use one of {', '.join(MICROBATCH_ORDERS)}", where)
    for key in ("shape", "orders"):
        if key not in data:
            raise HintError(f"missing key {key!r}", where)
    placement = data.get("placement", LOOPING)
    if placement not in PLACEMENTS:
        raise HintError(f"placement {placement!r} is not one of {', '.join(map(repr, PLACEMENTS))}", where)
    shape = _shape_from_json(data["shape"], f"{where}: shape", placement)
    orders = data["orders"]
    if not isinstance(orders, list) or not all(isinstance(o, list) for o in orders):
        raise HintError("'orders' must be a list with one list of task strings per rank", where)
    parsed = [
        [_parse_task(text, f"{where}: rank {rank}, step {step}") for step, text in enumerate(order)]
        for rank, order in enumerate(orders)
    ]
    validate_orders(shape, parsed, where)
    name = data.get("name", Path(where).stem)
    provenance = data.get("provenance", {})
    if not isinstance(name, str):
        raise HintError("'name' must be a string", where)
    if not isinstance(provenance, dict):
        raise HintError("'provenance' must be an object", where)
    cost_model = None
    if "cost_model" in data:
        if microbatches != "cost-ranked":
            raise HintError("'cost_model' only goes with \"microbatches\": \"cost-ranked\"", where)
        cost_model = CostModel.from_json(data["cost_model"], where)
        if cost_model.stages != shape.stages:
            raise HintError(f"the cost model covers {cost_model.stages} model stages but the hint has "
                            f"{shape.stages}", where)
    return HintOrder(shape, tuple(tuple(o) for o in parsed), name, provenance, microbatches, cost_model)


def _shape_from_json(data: Any, where: str, placement: str = LOOPING) -> PipelineShape:
    if not isinstance(data, dict):
        raise HintError("must be an object with ranks, chunks, microbatches", where)
    unknown = sorted(set(data) - _SHAPE_KEYS)
    if unknown:
        raise HintError(f"unknown key {unknown[0]!r} (allowed: {', '.join(sorted(_SHAPE_KEYS))})", where)
    for key in ("ranks", "chunks", "microbatches"):
        if key not in data:
            raise HintError(f"missing key {key!r}", where)
    split = data.get("split_backward", False)
    if not isinstance(split, bool):
        raise HintError("'split_backward' must be true or false", where)
    fused = data.get("fused_stages", [])
    if not isinstance(fused, list) or not all(isinstance(k, int) and not isinstance(k, bool) for k in fused):
        raise HintError("'fused_stages' must be a list of stage numbers", where)
    try:
        return PipelineShape(data["ranks"], data["chunks"], data["microbatches"], split, placement, frozenset(fused))
    except UserError as err:  # an input the shape names (`chunks`) is the file's key here, not a caller's input
        raise HintError(render_inputs(err.what, str), f"{where}: {render_inputs(err.where or '', str)}") from None


def _parse_task(text: Any, where: str) -> Task:
    if not isinstance(text, str):
        raise HintError(f"{text!r} is not a task string", where)
    try:
        return Task.parse(text)
    except HintError as err:
        raise err.located(where) from None

