"""Import a ``torch.distributed.pipelining`` schedule as a hint order.

torch builds its per-rank action lists (``pipeline_order``) from the schedule
class, the rank count and the microbatch count alone; we instantiate the class
exactly as torch's own visualizer does (``_schedule_visualizer.get_schedule_ops``,
which stands in mock stages) and map its compute actions onto rrfp tasks:
``F``/``B``/``I``/``W`` keep their letters, idle slots and ``REDUCE_GRAD`` are
dropped. torch is imported lazily, only here.

[Note: torch single-stage numbering]
    In torch 2.13 ``Schedule1F1B._get_pipeline_order`` numbers the last rank's
    forwards ``1..m`` instead of ``0..m-1`` (with no warmup forwards its
    counter is pre-incremented). The executor, ``_step_microbatches``, runs
    them ``0..m-1``. Single-stage torch schedules always issue each pass's
    microbatches in index order, so for them we take each task's microbatch
    number from its issue order. This is a no-op on a correct order; when it
    changes something the hint's provenance says where.

The placement ([Note: placement] in :mod:`hints.tasks`) is read off the
stage ids torch puts on each rank (:func:`hints.files.torch_csv.infer_placement`):
looping for the looped schedules, V for ``ZBVZeroBubble`` and ``DualPipeV``
(two stages per rank, so ``--chunks`` defaults to 2 for them).

[Note: DualPipeV as rrfp tasks]
    DualPipeV issues two things rrfp's task model does not have. An
    ``OVERLAP_F_B`` action runs a forward and a full backward of two chunks
    at once (in DeepSeek's runtime, one's compute hides the other's
    communication); rrfp runs its two sub-actions one after the other, in
    torch's order. And it mixes full backwards (``B``) with split ones
    (``I`` + ``W``) in one schedule, where an rrfp shape splits every
    backward or none: the hint is split, and each ``B`` becomes ``I``
    followed at once by ``W``, the same work in the same slot, whose input
    gradient leaves after ``I`` instead of after the whole ``B`` (a
    schedule of the unsplit graph becomes one of the split graph that is no
    slower, as in ``runtime.sched.bounds.split_bound``). The provenance records
    both (``overlapped_pairs_run_in_turn``, ``full_backwards_split``).
"""

from __future__ import annotations

import warnings
from collections import defaultdict

from hints.errors import HintError
from hints.files.torch_csv import hint_from_task_orders
from hints.files.torch_names import TORCH_SCHEDULES, V_SCHEDULES
from hints.orders import HintOrder
from hints.tasks import I, Kind, Task, V, W


def import_torch_schedule(name: str, ranks: int, microbatches: int, chunks: int | None = None,
                          placement: str | None = None) -> HintOrder:
    """The per-rank order of torch schedule ``name`` (``1F1B``, ``ScheduleGPipe``, ...) as a hint.

    ``chunks`` None is 1 for a single-stage schedule and 2 for the others; ``placement``, when given, must
    be the one torch's stage ids follow.
    """
    key = name.removeprefix("Schedule") if name.lower().startswith("schedule") else name
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
            from torch.distributed.pipelining import schedules as torch_schedules
            from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
    except ImportError as err:  # pragma: no cover - torch is a dependency
        raise HintError(f"cannot import torch's pipelining schedules: {err}") from None
    try:
        schedule_class = torch_schedules.get_schedule_class(key)
    except ValueError:
        raise HintError(
            f"unknown torch schedule {name!r}; supported: {', '.join(TORCH_SCHEDULES)}"
        ) from None
    single = issubclass(schedule_class, torch_schedules.PipelineScheduleSingle)
    if chunks is None:
        chunks = 1 if single else 2
    if single and chunks != 1:
        raise HintError(f"torch schedule {name!r} runs one stage per rank; use `chunks` 1")
    if not single and chunks < 2:
        raise HintError(f"torch schedule {name!r} runs several stages per rank; use `chunks` >= 2")
    try:
        actions = get_schedule_ops(schedule_class, ranks, microbatches, chunks)
    except Exception as err:  # torch raises ValueError/AssertionError/RuntimeError for bad shapes
        raise HintError(f"torch could not build {name!r} for {ranks} ranks x {chunks} chunks, "
                        f"{microbatches} microbatches: {err}") from None

    orders: list[list[Task]] = []
    overlapped = 0
    for rank, rank_actions in enumerate(actions):
        order = []
        for action in rank_actions:
            if action is None:
                continue
            parts = action.sub_actions if action.sub_actions else (action,)
            overlapped += len(parts) > 1  # [Note: DualPipeV as rrfp tasks]
            for part in parts:
                letter = part.computation_type.value
                if letter in ("F", "B", "I", "W") and part.microbatch_index is not None:
                    order.append(Task(part.stage_index, Kind(letter), part.microbatch_index))
        orders.append(order)
    orders, split_backwards = _split_full_backwards(orders)

    provenance: dict[str, object] = {"source": f"torch.distributed.pipelining.{schedule_class.__name__}"}
    if overlapped:
        provenance["overlapped_pairs_run_in_turn"] = overlapped
    if split_backwards:
        provenance["full_backwards_split"] = split_backwards
    try:
        import torch

        provenance["torch"] = torch.__version__
    except ImportError:  # pragma: no cover
        pass
    if single:
        orders, repaired = _number_by_issue_order(orders)
        if repaired:
            provenance["renumbered"] = repaired
    if placement is None and key.lower() in V_SCHEDULES:
        placement = V  # checked against torch's stage ids; on one rank both placements fit, and it is V's
    return hint_from_task_orders(orders, f"torch {schedule_class.__name__}", f"torch-{key.lower()}", provenance,
                                 placement)


def _split_full_backwards(orders: list[list[Task]]) -> tuple[list[list[Task]], int]:
    """[Note: DualPipeV as rrfp tasks]: in an order that splits some backwards, every ``B`` becomes ``I``, ``W``."""
    if not any(task.kind in (I, W) for order in orders for task in order):
        return orders, 0
    count = 0
    split: list[list[Task]] = []
    for order in orders:
        tasks = []
        for task in order:
            if task.kind is Kind.BACKWARD:
                tasks += [Task(task.stage, I, task.microbatch), Task(task.stage, W, task.microbatch)]
                count += 1
            else:
                tasks.append(task)
        split.append(tasks)
    return split, count


def _number_by_issue_order(orders: list[list[Task]]) -> tuple[list[list[Task]], list[str]]:
    """[Note: torch single-stage numbering]: the k-th task of a (stage, kind) is microbatch k."""
    renumbered: list[list[Task]] = []
    changes: list[str] = []
    for order in orders:
        issued: dict[tuple[int, Kind], int] = defaultdict(int)
        fixed = []
        for task in order:
            mb = issued[(task.stage, task.kind)]
            issued[(task.stage, task.kind)] += 1
            if mb != task.microbatch:
                changes.append(f"{task}->{Task(task.stage, task.kind, mb)}")
            fixed.append(Task(task.stage, task.kind, mb))
        renumbered.append(fixed)
    return renumbered, changes
