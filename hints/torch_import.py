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

Only looping placement is supported (stage ``k`` on rank ``k % p``): torch's
V-shaped schedules (``ZBVZeroBubble``, ``DualPipeV``) are refused with a
clear error, as are fused ``OVERLAP_F_B`` actions.
"""

from __future__ import annotations

import warnings
from collections import defaultdict

from hints.errors import HintError
from hints.hintfile import hint_from_task_orders
from hints.orders import HintOrder
from hints.tasks import Kind, Task

# torch schedule names accepted by `rrfp hints import` (torch's own names, case-insensitive).
TORCH_SCHEDULES = (
    "1F1B",
    "GPipe",
    "Interleaved1F1B",
    "LoopedBFS",
    "InterleavedZeroBubble",
)
_V_SHAPED = {"zbvzerobubble", "dualpipev"}


def import_torch_schedule(name: str, ranks: int, microbatches: int, chunks: int = 1) -> HintOrder:
    """The per-rank order of torch schedule ``name`` (``1F1B``, ``ScheduleGPipe``, ...) as a hint."""
    key = name.removeprefix("Schedule") if name.lower().startswith("schedule") else name
    if key.lower() in _V_SHAPED:
        raise HintError(
            f"torch schedule {name!r} places stages in a V shape; rrfp supports looping placement only"
        )
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
    if single and chunks != 1:
        raise HintError(f"torch schedule {name!r} runs one stage per rank; use --chunks 1")
    if not single and chunks < 2:
        raise HintError(f"torch schedule {name!r} runs several stages per rank; use --chunks >= 2")
    try:
        actions = get_schedule_ops(schedule_class, ranks, microbatches, chunks)
    except Exception as err:  # torch raises ValueError/AssertionError/RuntimeError for bad shapes
        raise HintError(f"torch could not build {name!r} for {ranks} ranks x {chunks} chunks, "
                        f"{microbatches} microbatches: {err}") from None

    orders: list[list[Task]] = []
    for rank, rank_actions in enumerate(actions):
        order = []
        for action in rank_actions:
            if action is None:
                continue
            letter = action.computation_type.value
            if letter == "OVERLAP_F_B":
                raise HintError(f"torch schedule {name!r} fuses forward and backward (OVERLAP_F_B); not supported")
            if letter not in "FBIW" or action.microbatch_index is None:
                continue
            order.append(Task(action.stage_index, Kind(letter), action.microbatch_index))
        orders.append(order)

    provenance: dict[str, object] = {"source": f"torch.distributed.pipelining.{schedule_class.__name__}"}
    try:
        import torch

        provenance["torch"] = torch.__version__
    except ImportError:  # pragma: no cover
        pass
    if single:
        orders, repaired = _number_by_issue_order(orders)
        if repaired:
            provenance["renumbered"] = repaired
    return hint_from_task_orders(orders, f"torch {schedule_class.__name__}", f"torch-{key.lower()}", provenance)


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
