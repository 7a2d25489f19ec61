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

Writing: :func:`save_torch_csv` writes any valid hint; :func:`export_torch_csv` writes only one torch can
run ([Note: a CSV torch can run]), which is what ``rrfp hints export --torch-csv`` and ``rrfp tune-hint
--target torch`` write; :func:`torch_schedule_notes` says how to run it (torch, torchtitan).

[Note: a CSV torch can run]
    torch's ``_PipelineScheduleRuntime`` runs a CSV in exactly its order, every step. ``_load_csv``
    validates it (``_validate_schedule``: every stage's microbatches, F before B, I before W, one rank
    per stage, which also gives the stage-to-rank map) and lowers it (``_add_send_recv``: in turns over
    the ranks, each rank's next action is placed once the producer of its input has been placed, with the
    send after the producer and the receive on the consumer's rank; when no rank can move it raises
    "Malformed compute schedule", inside the training job). An order that cannot complete when run in
    exactly its order is refused there, so rrfp refuses it before anything is written:

    * the fixed-order check the caller passes in (``runtime.sched.simulator.check_completes``, the one
      ``rrfp hints check`` runs; this package sits below ``runtime`` and cannot import it);
    * then, when torch imports, torch's own two passes on the CSV text as ``_load_csv`` parses it
      (:func:`check_torch_lowering`). Neither needs a process group: they are functions of the actions,
      the stage-to-rank map and the counts. ``_load_csv`` also runs ``_add_unshard_reshard`` and
      ``_add_reduce_grad`` between them; these add FSDP and gradient-reduction actions that wait for no
      input and send nothing, so they cannot change whether the lowering completes (and the first is
      quadratic in a rank's actions): they are left out.

    Both answer the same question on the same dependencies (a forward waits for the previous stage's
    forward, a backward for the next stage's), so torch's pass is a check of rrfp's, not a second rule.

    * and the last stage's forwards in microbatch order ([Note: torch's loss order]), which no lowering
      checks: torch runs an order that breaks it, and trains wrong or fails mid-step.
    A cost-ranked hint is refused as it is: its microbatch numbers are slots ([Note: cost-ranked hints]
    in :mod:`hints.orders`) that torch, which runs the same order every step, cannot re-rank; it must
    be bound to one iteration's costs first. The file is written atomically (:func:`write_text`):
    a refused or failed export leaves nothing behind.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Callable, Sequence

from hints.errors import HintError, UserError
from hints.orders import HintOrder, fused_in, relabelled
from hints.outputs import write_text
from hints.tasks import PLACEMENTS, PipelineShape, Task, V, check_placement
from hints.validate import validate_orders

# torch's action grammar (schedules._action_regex); non-compute actions are skipped.
_TORCH_ACTION_RE = re.compile(
    r"^(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)$"
)
_TORCH_COMPUTE = {"F", "B", "I", "W"}


# [Note: torch's loss order]
#     torch's runtime (``PipelineScheduleMulti._maybe_compute_loss`` / ``_maybe_get_loss``, torch 2.13) appends
#     each loss the last stage computes to a list, in the order its forwards run, and looks a microbatch's loss
#     up at its backward by the microbatch number: ``_internal_losses[mb]``. So the last stage must run its
#     forwards as microbatches 0, 1, 2, ...; an order that runs ``3F2`` before ``3F1`` backpropagates microbatch
#     1's backward through microbatch 2's loss (no error: wrong gradients; found by running random orders that
#     torch's lowering accepts in examples/torch_pipelining_job.py), or, when a backward comes before the loss
#     its number names, fails mid-step ("Loss for microbatch 3 is not available"), its peer then seeing only a
#     closed connection. Every microbatch's chain of tasks is the same, so renaming the microbatches
#     (:func:`in_torch_loss_order`: the k-th forward the last stage runs becomes microbatch k, on every stage)
#     gives the same order, with the same dependencies, memory and completion, that torch runs right; it then
#     takes the microbatches in that order. rrfp's own runtime keys every loss by its microbatch: for
#     ``rrfp run`` the order is free.


def last_stage_forwards(hint: HintOrder) -> list[int]:
    """The microbatches in the order the last stage runs their forwards."""
    last = hint.shape.stages - 1
    return [task.microbatch for task in hint.orders[hint.shape.rank_of(last)]
            if task.stage == last and task.kind.value == "F"]


def in_torch_loss_order(hint: HintOrder) -> tuple[HintOrder, list[int] | None]:
    """``hint`` with its microbatches renamed so the last stage runs its forwards as 0, 1, 2, ... ([Note:
    torch's loss order]), and ``renamed`` (``renamed[k]``: the microbatch of ``hint`` that is now ``k``); the
    hint itself and None when they already run so. A cost-ranked hint is returned as it is (its numbers are
    slots: :func:`check_runs_in_torch` refuses it)."""
    order = last_stage_forwards(hint)
    if hint.cost_ranked or order == sorted(order):
        return hint, None
    new = {old: k for k, old in enumerate(order)}
    provenance = {**hint.provenance, "renamed_microbatches": order}
    return HintOrder(hint.shape, relabelled(hint.orders, new), hint.name, provenance, hint.microbatches,
                     hint.cost_model), order


def torch_csv_text(hint: HintOrder) -> str:
    """``hint`` in torch's ``compute_only`` CSV: one row per rank, one action per cell."""
    text = io.StringIO(newline="")
    csv.writer(text).writerows(hint.text_orders())
    return text.getvalue()


def save_torch_csv(hint: HintOrder, path: str | Path) -> None:
    """Write ``hint`` as torch's CSV, whatever it is; :func:`export_torch_csv` writes only what torch can run."""
    write_text(path, torch_csv_text(hint))


def export_torch_csv(hint: HintOrder, path: str | Path, completes: Callable[[HintOrder], None]) -> str | None:
    """Write ``hint`` as torch's CSV only if torch can run it ([Note: a CSV torch can run]), else nothing.

    ``completes`` raises a :class:`UserError` when the hint cannot complete in fixed order
    (``runtime.sched.simulator.check_completes``). Returns the torch version whose lowering accepted the CSV,
    or None when torch does not import. Every refusal is one :class:`HintError` naming the hint.
    """
    check_runs_in_torch(hint, completes)
    text = torch_csv_text(hint)
    version = check_torch_lowering(hint, text)
    write_text(path, text)
    return version


def check_runs_in_torch(hint: HintOrder, completes: Callable[[HintOrder], None]) -> None:
    """The torch-free part of [Note: a CSV torch can run]: an index hint that completes in fixed order."""
    where = f"hint {hint.name}"
    if hint.cost_ranked:
        raise HintError("is cost-ranked: its microbatch numbers are slots re-ranked by each iteration's costs, "
                        "but torch runs one CSV in the same order every step; bind it to one iteration's costs "
                        "first (`freeze_iteration`)", where)
    order = last_stage_forwards(hint)
    if order != sorted(order):
        stage = hint.shape.stages - 1
        first = next(k for k, mb in enumerate(order) if mb != k)
        raise HintError(f"runs {stage}F{order[first]} before {stage}F{first}, but torch looks the last stage's "
                        f"losses up by the order its forwards ran, so they must run as microbatches 0, 1, 2, ... "
                        f"(else wrong gradients); rename its microbatches (in_torch_loss_order does) for the same "
                        f"order, which torch runs right", where)
    try:
        completes(hint)
    except UserError as err:
        raise HintError(f"torch runs a CSV in exactly its order, and this order {err.what}; nothing written "
                        f"(rrfp hints check draws where each rank waits)", where) from None


def check_torch_lowering(hint: HintOrder, text: str) -> str | None:
    """Run the two passes torch's ``_PipelineScheduleRuntime._load_csv`` runs on ``text`` (``hint``'s CSV) and
    return torch's version, or None when torch (or one of the two) is not there to ask.

    [Note: a CSV torch can run]: ``_validate_schedule``, then ``_add_send_recv`` on the same actions. A
    refusal is one :class:`HintError` naming the first rank that cannot move, its step and its action.
    """
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. numpy missing: nothing to do with the schedule
            import torch
            from torch.distributed.pipelining import schedules
    except ImportError:
        return None
    validate = getattr(schedules, "_validate_schedule", None)
    lower = getattr(schedules, "_add_send_recv", None)
    action = getattr(schedules, "_Action", None)
    if validate is None or lower is None or action is None:
        return None
    version = str(torch.__version__)
    shape, where = hint.shape, f"hint {hint.name}"
    rows = list(csv.reader(io.StringIO(text, newline="")))
    try:
        actions = {rank: [action.from_str(cell) for cell in row] for rank, row in enumerate(rows)}
        stage_to_rank = validate(actions, shape.ranks, shape.stages, shape.microbatches)
    except (AssertionError, RuntimeError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise HintError(f"torch {version} refuses the CSV (_validate_schedule): {first}; nothing written",
                        where) from None
    remaining = {rank: [a for a in row if a is not None] for rank, row in actions.items()}
    lengths = {rank: len(row) for rank, row in remaining.items()}
    try:
        lower(remaining, stage_to_rank=stage_to_rank.__getitem__, num_stages=shape.stages)
    except (AssertionError, KeyError) as err:  # _add_send_recv pops what it placed: the heads are stuck
        stuck = sorted(rank for rank, row in remaining.items() if row)
        if not stuck:
            raise HintError(f"torch {version} cannot lower the CSV (_add_send_recv): {err}; nothing written",
                            where) from None
        first, head = stuck[0], remaining[stuck[0]][0]
        others = f" (and {len(stuck) - 1} more rank{'s' if len(stuck) > 2 else ''})" if len(stuck) > 1 else ""
        raise HintError(f"torch {version} cannot lower the CSV (_add_send_recv: Malformed compute schedule): no "
                        f"rank can move; first: rank {first} at step {lengths[first] - len(remaining[first])} on "
                        f"{head}{_awaited(head, shape.stages)}{others}; nothing written", where) from None
    return version


def _awaited(action, stages: int) -> str:
    """What a stuck torch action waits for, in words: its input's producer (torch's _ready_to_schedule)."""
    kind, stage, microbatch = action.computation_type.value, action.stage_index, action.microbatch_index
    if kind == "F" and stage > 0:
        return f" (waits for {stage - 1}F{microbatch})"
    if kind in ("B", "I") and stage < stages - 1:
        return f" (waits for {stage + 1}I{microbatch} or {stage + 1}B{microbatch})"
    return ""


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


def torch_schedule_name(shape: PipelineShape) -> str:
    """The torch schedule (a ``get_schedule_class`` name) whose stage placement is ``shape``'s.

    torchtitan builds each rank's stages from ``pipeline_parallel_schedule`` even when a CSV gives the
    order: in a V only for ZBVZeroBubble and DualPipeV, one stage per rank for a single-stage schedule
    (1F1B), two (or ``pipeline_parallel_layers_per_stage``'s count) for the others.
    """
    if shape.placement == V:
        return "ZBVZeroBubble"
    if shape.chunks == 1:
        return "1F1B"
    return "InterleavedZeroBubble" if shape.split_backward else "Interleaved1F1B"


def torch_schedule_notes(hint: HintOrder, csv_path: str, torch_version: str | None, frozen: str = "") -> str:
    """How to run ``hint``'s CSV at ``csv_path`` in torch and torchtitan (``torch_schedule.md``): the schedule
    class whose placement matches, the microbatch count, torchtitan's options and torch's five lines."""
    shape = hint.shape
    p, v, m, name = shape.ranks, shape.chunks, shape.microbatches, torch_schedule_name(shape)
    if shape.placement == V:
        where = f"a V: rank r holds stages r and {2 * p - 1} - r"
    elif v == 1:
        where = "one stage per rank: rank r holds stage r"
    else:
        where = "looping: rank r holds stages " + ", ".join(["r"] + [f"r + {k * p}" for k in range(1, v)])
    checked = (f"torch {torch_version}'s lowering (_validate_schedule, _add_send_recv) accepts it"
               if torch_version else "torch did not import here, so its lowering was not run")
    lines = [
        f"# Running {hint.name} in torch",
        "",
        f"- CSV: `{csv_path}` (torch's compute_only format, one row per pipeline rank).",
        f"- Shape: {shape.describe()}.",
        f"- Stage placement: {where}, as torch's `Schedule{name}` places them; build each rank's stages so.",
        f"- Microbatches: {m} per step; torch's `n_microbatches` (torchtitan's microbatch count) must be {m}.",
        f"- Checked: it completes in exactly this order (`rrfp hints check`); {checked}; the last stage runs its "
        f"forwards as microbatches 0, 1, 2, ..., as torch's loss lookup needs.",
        f"- torch runs this one order every step, whatever each step's microbatches cost.{frozen}",
        "",
        "## torchtitan",
        "",
        "Command-line overrides (the same keys go under `[parallelism]` in a TOML config):",
        "",
        "```sh",
        f"--parallelism.pipeline_parallel_degree {p} \\",
        f"--parallelism.pipeline_parallel_schedule {name} \\",
        f"--parallelism.pipeline_parallel_schedule_csv {csv_path} \\",
        f"--parallelism.num_pp_microbatches {m}",
        "```",
        "",
        f"`pipeline_parallel_schedule` only places the stages (torchtitan puts them in a V for ZBVZeroBubble and "
        f"DualPipeV alone); the CSV decides the order. torchtitan releases without `num_pp_microbatches` take "
        f"`training.local_batch_size / parallelism.pipeline_parallel_microbatch_size` microbatches: make it {m}.",
    ]
    if v > 2:
        lines.append(f"Set `parallelism.pipeline_parallel_layers_per_stage` so the model splits into {p * v} stages "
                     f"({v} per rank; torchtitan builds 2 per rank for a multi-stage schedule otherwise).")
    lines += [
        "",
        "## torch",
        "",
        "```python",
        "from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime",
        f"# stages: this rank's PipelineStage objects, placed as Schedule{name} places them",
        f"schedule = _PipelineScheduleRuntime(stages, n_microbatches={m}, loss_fn=loss_fn)",
        f"schedule._load_csv({csv_path!r})",
        "schedule.step(inputs, target=targets, losses=losses)  # inputs on stage 0's rank, targets on the last's",
        "```",
    ]
    return "\n".join(lines) + "\n"
