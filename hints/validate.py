"""Structural checks of a hint order, and the rank-by-step grid used in reports.

Structure is what can be checked one rank at a time: every task of the shape
appears exactly once, on the rank that owns its stage, and within a rank no
task comes before a task of its own stage that it needs. Which tasks those
are is the dependency model's to say (:func:`hints.deps.prerequisites`,
followed within the stage: a backward needs its forward, ``W`` needs ``I``
and, through it, the forward); nothing here restates the rule. Whether the
ranks' orders together can *complete* under the fixed policy is a question
for the whole graph and is answered by
``runtime.sched.simulator.check_completes``.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from hints.deps import prerequisites
from hints.errors import HintError
from hints.tasks import F, PipelineShape, Task


def validate_orders(
    shape: PipelineShape, orders: Sequence[Sequence[Task]], where: str = "hint"
) -> None:
    """Raise :class:`HintError` naming ``where``, the rank and the task for the first problem."""
    if len(orders) != shape.ranks:
        raise HintError(f"has orders for {len(orders)} ranks but the shape has {shape.ranks}", where)
    for rank, order in enumerate(orders):
        _validate_rank(shape, rank, order, f"{where}: rank {rank}")


def _validate_rank(shape: PipelineShape, rank: int, order: Sequence[Task], where: str) -> None:
    position: dict[Task, int] = {}
    for step, task in enumerate(order):
        if not shape.contains(task):
            raise HintError(f"task {task} (step {step}) is outside the shape ({shape.describe()})", where)
        owner = shape.rank_of(task.stage)
        if owner != rank:
            raise HintError(
                f"task {task} (step {step}) belongs to rank {owner} (stage {task.stage} of {shape.stages}, "
                f"{shape.placement} placement)",
                where,
            )
        if task in position:
            raise HintError(f"task {task} appears twice (steps {position[task]} and {step})", where)
        position[task] = step
    if len(position) != shape.tasks_of(rank):
        missing = [task for task in shape.tasks_of_rank(rank) if task not in position]
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise HintError(f"task {missing[0]}{more} missing", where)
    # Rules never cross microbatches (hints.deps), so what a task needs on its stage is read once, for microbatch 0.
    needs = {(stage, kind): [needed.kind for needed in reversed(_needed_on_stage(Task(stage, kind, 0), shape))]
             for stage in shape.stages_of_rank(rank) for kind in shape.backward_kinds_of(stage)}  # forward first
    for stage in shape.stages_of_rank(rank):
        for mb in range(shape.microbatches):
            for kind in shape.backward_kinds_of(stage):
                task = Task(stage, kind, mb)
                for needed in (Task(stage, needed_kind, mb) for needed_kind in needs[(stage, kind)]):
                    if position[task] < position[needed]:
                        raise HintError(_out_of_order(task, position[task], needed, position[needed]), where)


def _needed_on_stage(task: Task, shape: PipelineShape) -> list[Task]:
    """The tasks of ``task``'s own stage it needs, directly or through each other (nearest first)."""
    chain: list[Task] = []
    todo = [task]
    while todo:
        for needed in prerequisites(todo.pop(), shape):
            if needed.stage == task.stage and needed not in chain:
                chain.append(needed)
                todo.append(needed)
    return chain


def _out_of_order(task: Task, step: int, needed: Task, needed_step: int) -> str:
    if needed.kind is F:
        return f"task {task} (step {step}) comes before its forward {needed} (step {needed_step})"
    return (f"task {task} comes before {needed}; a weight gradient needs the input gradient's pass first")


def format_grid(
    rows: Sequence[Sequence[object]],
    marks: Mapping[int, int] | None = None,
    width: int = 24,
) -> str:
    """Rank-by-step text grid (one row per rank), like torch's ``_format_pipeline_order`` turned sideways.

    ``marks`` maps a rank to the step to flag; the flagged cell is shown as
    ``>cell<`` and the view is windowed around it so long orders stay readable.
    Without marks the first ``width`` steps are shown.
    """
    marks = dict(marks or {})
    longest = max((len(r) for r in rows), default=0)
    focus = min(marks.values()) if marks else 0
    start = max(0, min(focus - width // 2, longest - width))
    stop = min(longest, start + width)
    cells = [
        [_cell(row, step, marks.get(rank)) for step in range(start, stop)]
        for rank, row in enumerate(rows)
    ]
    col_width = max([len(c) for row in cells for c in row] + [len(str(stop - 1)) + 1])
    label_width = len(f"rank {len(rows) - 1}")
    header = " " * label_width + " | " + " ".join(f"{'s' + str(s):<{col_width}}" for s in range(start, stop))
    lines = [header]
    for rank, row in enumerate(cells):
        text = " ".join(f"{c:<{col_width}}" for c in row)
        suffix = f"  <-- step {marks[rank]}" if rank in marks else ""
        lines.append(f"{'rank ' + str(rank):<{label_width}} | {text}{suffix}".rstrip())
    if start > 0 or stop < longest:
        lines.append(f"(steps {start}..{stop - 1} of {longest})")
    return "\n".join(lines)


def _cell(row: Sequence[object], step: int, mark: int | None) -> str:
    text = "" if step >= len(row) or row[step] is None else str(row[step])
    return f">{text}<" if mark == step else text
