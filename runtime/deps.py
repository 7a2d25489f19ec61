"""The one dependency model: which task's output each task needs.

Everything that asks "may this task run now?" (hint validation, the
simulator, the distributed runtime's arbiter) uses :func:`prerequisites` through
the compiled :class:`TaskGraph`; the rule is written nowhere else.

Rules (``S`` model stages, see :mod:`hints.tasks` for conventions):

* ``F(0, i)`` needs nothing: the microbatch's input is local data.
* ``F(k, i)`` needs ``F(k-1, i)`` (the activation, sent over a link when the
  two stages sit on different ranks).
* ``B(k, i)`` (or ``I(k, i)`` when the backward is split) needs its own
  ``F(k, i)`` (the stashed activations) and, unless ``k == S-1`` where the loss
  is computed locally, ``B/I(k+1, i)`` (the output gradient, sent over a link).
* ``W(k, i)`` needs ``I(k, i)`` (same rank).

Task ids
--------
:class:`TaskGraph` numbers the tasks of a shape ``0 .. n-1`` (rank by rank,
in :meth:`PipelineShape.tasks` order) so the hot loops of the simulator and
the arbiter work on lists of ints instead of hashing tasks. The id is an index
into ``graph.tasks``, nothing more; it never leaves the process (files, traces
and logs use the task's canonical text).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat

from hints.tasks import F, I, PipelineShape, Task, W


def prerequisites(task: Task, shape: PipelineShape) -> tuple[Task, ...]:
    """The tasks whose outputs ``task`` consumes (see the module docstring)."""
    stage, kind, mb = task
    if kind is F:
        return (Task(stage - 1, F, mb),) if stage > 0 else ()
    if kind is W:
        return (Task(stage, I, mb),)
    own_forward = Task(stage, F, mb)
    if stage == shape.stages - 1:
        return (own_forward,)
    return (own_forward, Task(stage + 1, shape.upstream_backward, mb))


@dataclass(eq=False)
class TaskGraph:
    """The dependency model compiled for one shape, indexed by task id.

    ``local_consumers[t]`` lists the tasks on ``t``'s rank that need ``t``'s
    output; ``remote_consumers[t]`` those on other ranks (each one message over
    the link between the two ranks). ``admits[t]`` marks a microbatch's first
    task on its rank (the chunk-0 forward), where the memory budget admits a
    microbatch; ``frees[t]`` marks the last task of a (stage, microbatch),
    whose end frees its activations.

    Task ids follow :meth:`PipelineShape.tasks` order, so :meth:`tid` is
    arithmetic. Because no rule crosses microbatches, the graph is compiled
    from the prerequisites of microbatch 0 of every (stage, kind) and repeated
    for the others.
    """

    shape: PipelineShape
    tasks: list[Task]
    rank: list[int]
    prereq_count: list[int]
    local_consumers: list[tuple[int, ...]]
    remote_consumers: list[tuple[int, ...]]
    admits: list[bool]
    frees: list[bool]
    is_forward: list[bool]

    @classmethod
    def build(cls, shape: PipelineShape) -> "TaskGraph":
        m = shape.microbatches
        kind_slot = {kind: i for i, kind in enumerate(shape.kinds)}
        final = shape.final_backward
        tasks: list[Task] = []
        rank: list[int] = []
        admits: list[bool] = []
        frees: list[bool] = []
        is_forward: list[bool] = []
        prereq_count: list[int] = []
        # Consumers per block: a block is the m tasks of one (stage, kind), in task-id order.
        local_blocks: dict[int, list[int]] = {}
        remote_blocks: dict[int, list[int]] = {}
        make_task = tuple.__new__  # Task(...) without NamedTuple's Python-level __new__
        for r in range(shape.ranks):
            for stage in shape.stages_of_rank(r):
                for kind in shape.kinds:
                    first = len(tasks)
                    tasks.extend(map(make_task, repeat(Task, m), zip(repeat(stage), repeat(kind), range(m))))
                    rank.extend(repeat(r, m))
                    admits.extend(repeat(kind is F and stage < shape.ranks, m))
                    frees.extend(repeat(kind is final, m))
                    is_forward.extend(repeat(kind is F, m))
                    needs = prerequisites(Task(stage, kind, 0), shape)
                    assert all(need.microbatch == 0 for need in needs), "rules must not cross microbatches"
                    prereq_count.extend(repeat(len(needs), m))
                    for need in needs:
                        producer = cls._tid(shape, kind_slot, need.stage, need.kind, 0)
                        blocks = local_blocks if shape.rank_of(need.stage) == r else remote_blocks
                        blocks.setdefault(producer, []).append(first)
        return cls(
            shape=shape,
            tasks=tasks,
            rank=rank,
            prereq_count=prereq_count,
            local_consumers=cls._expand(local_blocks, len(tasks), m),
            remote_consumers=cls._expand(remote_blocks, len(tasks), m),
            admits=admits,
            frees=frees,
            is_forward=is_forward,
        )

    @staticmethod
    def _expand(blocks: dict[int, list[int]], n: int, m: int) -> list[tuple[int, ...]]:
        """Per task id, the consumer ids: block ``producer..producer+m`` feeds ``first..first+m``."""
        consumers: list[tuple[int, ...]] = [()] * n
        for producer, firsts in blocks.items():
            consumers[producer:producer + m] = zip(*(range(first, first + m) for first in firsts))
        return consumers

    @staticmethod
    def _tid(shape: PipelineShape, kind_slot: dict, stage: int, kind, mb: int) -> int:
        per_chunk = len(kind_slot) * shape.microbatches
        return (stage % shape.ranks) * shape.chunks * per_chunk + (stage // shape.ranks) * per_chunk \
            + kind_slot[kind] * shape.microbatches + mb

    def __len__(self) -> int:
        return len(self.tasks)

    def tid(self, task: Task) -> int:
        """The id of ``task``; ``KeyError`` if the shape has no such task."""
        if not self.shape.contains(task):
            raise KeyError(f"task {task} is not part of {self.shape.describe()}")
        return self._tid(self.shape, self._kind_slot, task.stage, task.kind, task.microbatch)

    @property
    def _kind_slot(self) -> dict:
        return {kind: i for i, kind in enumerate(self.shape.kinds)}

    def ids(self, tasks) -> list[int]:
        """Task ids of ``tasks`` (the arithmetic of :meth:`tid`, inlined: it runs once per task per run)."""
        slot = self._kind_slot
        p, m = self.shape.ranks, self.shape.microbatches
        per_chunk = len(slot) * m
        per_rank = self.shape.chunks * per_chunk
        return [(stage % p) * per_rank + (stage // p) * per_chunk + slot[kind] * m + mb
                for stage, kind, mb in tasks]

    def links(self) -> set[tuple[int, int]]:
        """Directed ``(producer rank, consumer rank)`` pairs that carry messages in this shape."""
        rank = self.rank
        return {(rank[t], rank[c]) for t, consumers in enumerate(self.remote_consumers) for c in consumers}

    def consumers(self, tid: int) -> tuple[int, ...]:
        return self.local_consumers[tid] + self.remote_consumers[tid]


__all__ = ["TaskGraph", "prerequisites"]
