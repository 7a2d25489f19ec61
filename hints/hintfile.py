"""Hint files: rrfp's versioned JSON (``rrfp-hint/1``, ``rrfp-hint/2``) and torch's per-rank schedule CSV.

``rrfp-hint/1`` (the public, versioned hint format)::

    {
      "format": "rrfp-hint/1",
      "name": "1f1b",
      "shape": {"ranks": 4, "chunks": 1, "microbatches": 8, "split_backward": false},
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

torch CSV is what ``PipelineScheduleMulti._dump_csv`` / ``_load_csv`` read and
write in their ``compute_only`` format: one row per rank, one action per cell
in torch's grammar (``0F0``, ``1B3``, ``0I2``, ``0W2``); empty cells are idle
steps. Communication and FSDP actions (``SEND_F``, ``UNSHARD``,
``REDUCE_GRAD``, ...) are skipped on reading because rrfp derives them; the
shape is inferred from the tasks present, and so is the placement
([Note: placement] in :mod:`hints.tasks`): the CSV carries stage ids per
rank, and :func:`infer_placement` finds the placement they follow (or
checks the one the caller states), refusing a mapping that follows neither.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from hints.errors import HintError, UserError
from hints.costs import CostModel
from hints.orders import BUILTIN_HINTS, MICROBATCH_ORDERS, HintOrder, builtin_hint
from hints.tasks import LOOPING, PLACEMENTS, V, PipelineShape, Task, check_placement, default_chunks
from hints.validate import validate_orders

HINT_FORMAT = "rrfp-hint/1"
HINT_FORMAT_2 = "rrfp-hint/2"
TORCH_PREFIX = "torch:"
_TOP_KEYS = {"format", "name", "shape", "placement", "orders", "provenance"}
_TOP_KEYS_2 = _TOP_KEYS | {"microbatches", "cost_model"}
_SHAPE_KEYS = {"ranks", "chunks", "microbatches", "split_backward"}

# torch's action grammar (schedules._action_regex); non-compute actions are skipped.
_TORCH_ACTION_RE = re.compile(
    r"^(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)$"
)
_TORCH_COMPUTE = {"F", "B", "I", "W"}


# -- JSON ------------------------------------------------------------------


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
    _write_text(path, json.dumps(hint_to_json(hint), indent=1) + "\n")


def _write_text(path: str | Path, text: str) -> None:
    """Write a file, or one ``UserError`` naming it (a missing directory, a directory, no permission)."""
    try:
        Path(path).write_text(text)
    except OSError as err:
        raise UserError(f"cannot write: {err.strerror or err}", str(path)) from None


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
    try:
        return PipelineShape(data["ranks"], data["chunks"], data["microbatches"], split, placement)
    except UserError as err:
        raise HintError(err.what, f"{where}: {err.where}") from None


def _parse_task(text: Any, where: str) -> Task:
    if not isinstance(text, str):
        raise HintError(f"{text!r} is not a task string", where)
    try:
        return Task.parse(text)
    except HintError as err:
        raise err.located(where) from None


# -- torch CSV -------------------------------------------------------------


def save_torch_csv(hint: HintOrder, path: str | Path) -> None:
    text = io.StringIO(newline="")
    csv.writer(text).writerows(hint.text_orders())
    _write_text(path, text.getvalue())


def hint_from_torch_rows(rows: Sequence[Sequence[str]], where: str, name: str,
                         placement: str | None = None) -> HintOrder:
    """Build a hint from torch's compute-only action rows (one row per rank); ``placement`` None: inferred."""
    orders: list[list[Task]] = []
    for rank, row in enumerate(rows):
        order = []
        for column, cell in enumerate(row):
            text = cell.strip()
            if not text:
                continue
            match = _TORCH_ACTION_RE.match(text)
            if match is None:
                raise HintError(
                    f"{text!r} is not a torch pipelining action", f"{where}: rank {rank}, column {column}"
                )
            stage, kind, mb = match.groups()
            if kind not in _TORCH_COMPUTE:
                continue  # communication / FSDP actions: rrfp derives its own
            if not mb:
                raise HintError(f"{text!r} has no microbatch", f"{where}: rank {rank}, column {column}")
            order.append(Task.parse(f"{stage}{kind}{mb}"))
        orders.append(order)
    return hint_from_task_orders(orders, where, name, {"source": "torch-csv"}, placement)


def hint_from_task_orders(
    orders: Sequence[Sequence[Task]], where: str, name: str, provenance: dict[str, object],
    placement: str | None = None,
) -> HintOrder:
    """Infer the shape and placement from the tasks present (ranks = rows) and validate.

    ``placement`` states it (checked against the tasks); None infers it (:func:`infer_placement`).
    """
    ranks = len(orders)
    tasks = [task for order in orders for task in order]
    if ranks == 0 or not tasks:
        raise HintError("holds no tasks", where)
    stages = max(task.stage for task in tasks) + 1
    if stages % ranks:
        raise HintError(
            f"has {stages} stages over {ranks} ranks; a placement needs a multiple of the rank count", where)
    split = any(task.kind.value in "IW" for task in tasks)
    microbatches = max(task.microbatch for task in tasks) + 1
    placement = infer_placement(orders, stages // ranks, where, placement)
    shape = PipelineShape(ranks, stages // ranks, microbatches, split, placement)
    validate_orders(shape, orders, where)
    return HintOrder(shape, tuple(tuple(o) for o in orders), name, provenance)


def infer_placement(orders: Sequence[Sequence[Task]], chunks: int, where: str, stated: str | None = None) -> str:
    """The placement whose stage-to-rank mapping ``orders`` (one list per rank) follow.

    ``stated`` is checked; otherwise looping is preferred where both fit (one rank). A mapping that follows
    no placement is a :class:`HintError` naming a stage that is on the wrong rank for each of them.
    """
    ranks = len(orders)
    candidates = [check_placement(stated, "--placement")] if stated is not None else list(PLACEMENTS)
    placed = {task.stage: rank for rank, order in enumerate(orders) for task in order}
    reasons = []
    for placement in candidates:
        if placement == V and chunks != 2:
            reasons.append(f"V placement needs 2p = {2 * ranks} stages, not {ranks * chunks}")
            continue
        shape = PipelineShape(ranks, chunks, 1, placement=placement)
        wrong = next((stage for stage in sorted(placed) if placed[stage] != shape.rank_of(stage)), None)
        if wrong is None:
            return placement
        reasons.append(f"{'V' if placement == V else placement} placement puts stage {wrong} on rank "
                       f"{shape.rank_of(wrong)}, not {placed[wrong]}")
    which = f"the {stated} placement" if stated is not None else "either placement"
    raise HintError(f"the stage-to-rank mapping does not follow {which}: {'; '.join(reasons)}", where)


# -- loading any hint ------------------------------------------------------


def load_hint(path: str | Path, placement: str | None = None) -> HintOrder:
    """Load an ``rrfp-hint/1`` JSON file or a torch CSV (by extension ``.csv``).

    ``placement`` states the placement of a CSV (checked against its stages; None: inferred).
    """
    path = Path(path)
    where = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise HintError("no such file", where) from None
    except (OSError, UnicodeDecodeError) as err:
        raise HintError(f"cannot read: {err}", where) from None
    if path.suffix.lower() == ".csv":
        rows = list(csv.reader(text.splitlines()))
        while rows and not any(cell.strip() for cell in rows[-1]):
            rows.pop()  # trailing blank lines are not ranks
        return hint_from_torch_rows(rows, where, path.stem, placement)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise HintError(f"not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}", where) from None
    return hint_from_json(data, where)


def hint_placement(spec: str, stated: str | None = None) -> str:
    """The placement hint ``spec`` runs under, without building it: ``stated`` if given, else the hint's own.

    A built-in's own placement, V for torch's V schedules (:data:`hints.torch_import.V_SCHEDULES`; the
    import then checks it against torch's stage ids), a file's, or looping.
    """
    if stated is not None:
        return check_placement(stated, "--placement")
    if spec in BUILTIN_HINTS:
        return BUILTIN_HINTS[spec].placement
    if spec.startswith(TORCH_PREFIX):
        from hints.torch_import import V_SCHEDULES

        name = spec[len(TORCH_PREFIX):].lower()
        return V if name.removeprefix("schedule") in V_SCHEDULES else LOOPING
    if Path(spec).is_file():
        return load_hint(spec).shape.placement
    return LOOPING


def resolve_hint(
    spec: str,
    ranks: int | None = None,
    chunks: int | None = None,
    microbatches: int | None = None,
    costs: Sequence[float] | None = None,
    priorities: Mapping[Task, Sequence[float]] | None = None,
    placement: str | None = None,
) -> HintOrder:
    """A built-in name or ``torch:SCHEDULE`` (built for the given shape), or a hint file (checked against it).

    For a file, any of ``ranks``/``chunks``/``microbatches``/``placement`` that is given must
    match the file's shape. ``costs`` feed ``bfw``, ``priorities`` feed ``cp``
    (``runtime.evaluate.resolve`` computes both from expected durations). ``placement`` None is the
    hint's own: V for ``zbv`` and torch's V schedules, what a file says, looping otherwise; ``chunks``
    None is 2 under V placement, else 1.
    """
    if placement is not None:
        check_placement(placement, "--placement")
    if spec in BUILTIN_HINTS or spec.startswith(TORCH_PREFIX):
        if ranks is None or microbatches is None:
            raise HintError(f"hint {spec!r} needs --stages and --microbatches")
        if spec in BUILTIN_HINTS:
            chunks = chunks or default_chunks(placement or BUILTIN_HINTS[spec].placement)
            return builtin_hint(spec, ranks, chunks, microbatches, costs, priorities, placement)
        from hints.torch_import import import_torch_schedule  # imports torch: only on this path

        return import_torch_schedule(spec[len(TORCH_PREFIX):], ranks, microbatches, chunks, placement)
    path = Path(spec)
    if not path.exists():
        raise HintError(
            f"unknown hint {spec!r}: not a built-in ({', '.join(BUILTIN_HINTS)}), not torch:SCHEDULE, "
            f"and no such file"
        )
    hint = load_hint(path, placement)
    for label, given, actual in (
        ("--stages", ranks, hint.shape.ranks),
        ("--chunks", chunks, hint.shape.chunks),
        ("--microbatches", microbatches, hint.shape.microbatches),
        ("--placement", placement, hint.shape.placement),
    ):
        if given is not None and given != actual:
            raise HintError(f"the file is for {label.lstrip('-')} {actual} but {label} {given} was asked", spec)
    return hint
