"""torch's per-rank schedule CSV, and hints built from per-rank task orders (their shape and placement inferred).

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
import re
from pathlib import Path
from typing import Sequence

from hints.errors import HintError
from hints.files.hint_json import write_text
from hints.orders import HintOrder, fused_in
from hints.tasks import PLACEMENTS, PipelineShape, Task, V, check_placement
from hints.validate import validate_orders

# torch's action grammar (schedules._action_regex); non-compute actions are skipped.
_TORCH_ACTION_RE = re.compile(
    r"^(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)$"
)
_TORCH_COMPUTE = {"F", "B", "I", "W"}


def save_torch_csv(hint: HintOrder, path: str | Path) -> None:
    text = io.StringIO(newline="")
    csv.writer(text).writerows(hint.text_orders())
    write_text(path, text.getvalue())


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
    # A split schedule whose stage runs whole backwards (B): that stage is fused (PipelineShape.fused_stages).
    shape = PipelineShape(ranks, stages // ranks, microbatches, split, placement, fused_in(tasks) if split else ())
    validate_orders(shape, orders, where)
    return HintOrder(shape, tuple(tuple(o) for o in orders), name, provenance)


def infer_placement(orders: Sequence[Sequence[Task]], chunks: int, where: str, stated: str | None = None) -> str:
    """The placement whose stage-to-rank mapping ``orders`` (one list per rank) follow.

    ``stated`` is checked; otherwise looping is preferred where both fit (one rank). A mapping that follows
    no placement is a :class:`HintError` naming a stage that is on the wrong rank for each of them.
    """
    ranks = len(orders)
    candidates = [check_placement(stated, "`placement`")] if stated is not None else list(PLACEMENTS)
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
