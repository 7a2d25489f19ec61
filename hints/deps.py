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
  is computed locally, ``B/I(k+1, i)`` (the output gradient, sent over a link:
  ``I`` when stage ``k+1`` splits its backward, ``B`` when it is fused).
* ``W(k, i)`` needs ``I(k, i)`` (same rank).

The rules name model stages, never ranks: placement ([Note: placement] in
:mod:`hints.tasks`) only decides which of these inputs cross a link. Under V
placement ``F(p-1, i) -> F(p, i)`` and ``B/I(p, i) -> B/I(p-1, i)`` stay on
rank ``p-1`` (the turn), and stage ``S-1``, whose backward needs no message,
is on rank 0.

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
from functools import cached_property
from itertools import chain, repeat

from hints.tasks import F, I, Kind, PipelineShape, Task, W, cyclic_gc_paused


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
    return (own_forward, Task(stage + 1, shape.upstream_backward_of(stage + 1), mb))


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
    arithmetic: ids run in *blocks* of the ``m`` microbatches of one (stage,
    kind), and ``blocks[b]`` is the (stage, kind) of ids ``b*m .. b*m+m-1``.
    Because no rule crosses microbatches, the graph is compiled from the
    prerequisites of microbatch 0 of every (stage, kind) and repeated for the
    others: a block's tasks all feed the same blocks, so consumers are stored
    per block as *offsets*, ``local_offsets[b]`` and ``remote_offsets[b]``:
    task ``t`` of block ``b`` feeds ``t + d`` for each ``d``. The hot loops
    use those (a few entries per block, always in cache, where per-task tuples
    would be ``n`` objects to build and to read from memory);
    ``local_consumers`` and ``remote_consumers`` per task id, like ``tasks``
    (task id -> :class:`Task`), are built on first use.
    """

    shape: PipelineShape
    blocks: list[tuple[int, Kind]]
    rank: list[int]
    prereq_count: list[int]
    local_offsets: list[tuple[int, ...]]
    remote_offsets: list[tuple[int, ...]]
    admits: list[bool]
    frees: list[bool]
    is_forward: list[bool]
    # The same per block (task id // m): what hot loops read, a few entries that stay in cache.
    block_rank: list[int]
    block_admits: list[bool]
    block_frees: list[bool]
    block_forward: list[bool]

    @classmethod
    @cyclic_gc_paused()  # [Note: cyclic GC and task-sized lists] in hints.tasks
    def build(cls, shape: PipelineShape) -> "TaskGraph":
        m = shape.microbatches
        first_ids = _first_ids(shape)
        stage_kinds: list[tuple[int, Kind]] = []  # the graph's blocks
        rank: list[int] = []
        admits: list[bool] = []
        frees: list[bool] = []
        is_forward: list[bool] = []
        prereq_count: list[int] = []
        # Consumers per block: a block is the m tasks of one (stage, kind), in task-id order.
        local_blocks: dict[int, list[int]] = {}
        remote_blocks: dict[int, list[int]] = {}
        for r in range(shape.ranks):
            for stage in shape.stages_of_rank(r):
                final = shape.final_backward_of(stage)
                for kind in shape.kinds_of(stage):
                    first = len(stage_kinds) * m
                    stage_kinds.append((stage, kind))
                    rank.extend(repeat(r, m))
                    admits.extend(repeat(kind is F and shape.chunk_of(stage) == 0, m))
                    frees.extend(repeat(kind is final, m))
                    is_forward.extend(repeat(kind is F, m))
                    needs = prerequisites(Task(stage, kind, 0), shape)
                    assert all(need.microbatch == 0 for need in needs), "rules must not cross microbatches"
                    prereq_count.extend(repeat(len(needs), m))
                    for need in needs:
                        producer = first_ids[need.kind][need.stage]
                        blocks = local_blocks if shape.rank_of(need.stage) == r else remote_blocks
                        blocks.setdefault(producer, []).append(first)
        return cls(
            shape=shape,
            blocks=stage_kinds,
            rank=rank,
            prereq_count=prereq_count,
            local_offsets=cls._offsets(local_blocks, len(stage_kinds), m),
            remote_offsets=cls._offsets(remote_blocks, len(stage_kinds), m),
            admits=admits,
            frees=frees,
            is_forward=is_forward,
            block_rank=rank[::m],
            block_admits=admits[::m],
            block_frees=frees[::m],
            block_forward=is_forward[::m],
        )

    @staticmethod
    def _offsets(blocks: dict[int, list[int]], count: int, m: int) -> list[tuple[int, ...]]:
        """Per block, the consumer offsets: block ``producer..producer+m`` feeds ``first..first+m``."""
        offsets: list[tuple[int, ...]] = [()] * count
        for producer, firsts in blocks.items():
            offsets[producer // m] = tuple(first - producer for first in firsts)
        return offsets

    @cached_property
    def local_consumers(self) -> list[tuple[int, ...]]:
        return self._consumers(self.local_offsets)

    @cached_property
    def remote_consumers(self) -> list[tuple[int, ...]]:
        return self._consumers(self.remote_offsets)

    @cached_property
    def remote_producers(self) -> list[list[int]]:
        """Per task id, the producers of its inputs on other ranks (one message each): the inverse of
        ``remote_consumers``."""
        producers: list[list[int]] = [[] for _ in range(len(self))]
        for producer, consumers in enumerate(self.remote_consumers):
            for consumer in consumers:
                producers[consumer].append(producer)
        return producers

    @cyclic_gc_paused()  # [Note: cyclic GC and task-sized lists] in hints.tasks
    def _consumers(self, offsets: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """Per task id, the consumer ids (from the per-block offsets)."""
        m = self.shape.microbatches
        return list(chain.from_iterable(
            zip(*(range(first + d, first + d + m) for d in deltas)) if deltas else repeat((), m)
            for first, deltas in zip(range(0, len(self), m), offsets)
        ))

    @cached_property
    @cyclic_gc_paused()  # [Note: cyclic GC and task-sized lists] in hints.tasks
    def tasks(self) -> list[Task]:
        """Per task id, the task."""
        m = self.shape.microbatches
        make_task = tuple.__new__  # Task(...) without NamedTuple's Python-level __new__
        return list(chain.from_iterable(map(make_task, repeat(Task, m), zip(repeat(stage), repeat(kind), range(m)))
                                        for stage, kind in self.blocks))

    def __len__(self) -> int:
        return len(self.rank)

    def tid(self, task: Task) -> int:
        """The id of ``task``; ``KeyError`` if the shape has no such task."""
        if not self.shape.contains(task):
            raise KeyError(f"task {task} is not part of {self.shape.describe()}")
        return self._first_ids[task.kind][task.stage] + task.microbatch

    def ids(self, tasks) -> list[int]:
        """Task ids of ``tasks`` (:meth:`tid` without its checks: it runs once per task per run)."""
        first = self._first_ids
        return [first[kind][stage] + mb for stage, kind, mb in tasks]

    @cached_property
    def _first_ids(self) -> dict:
        """kind -> stage -> the id of that (stage, kind)'s microbatch 0 (each block's first id)."""
        return _first_ids(self.shape)

    def links(self) -> set[tuple[int, int]]:
        """Directed ``(producer rank, consumer rank)`` pairs that carry messages in this shape."""
        rank, m = self.rank, self.shape.microbatches
        return {(rank[first], rank[first + d]) for first, offsets in zip(range(0, len(self), m), self.remote_offsets)
                for d in offsets}

    def consumers(self, tid: int) -> tuple[int, ...]:
        return self.local_consumers[tid] + self.remote_consumers[tid]


def _first_ids(shape: PipelineShape) -> dict:
    """kind -> stage -> the id of that (stage, kind)'s microbatch 0, -1 where the stage has no such kind
    (:meth:`PipelineShape.tasks` order: rank by rank, a rank's stages in chunk order, a stage's kinds in
    dependency order)."""
    first = {kind: [-1] * shape.stages for kind in shape.kinds}
    at = 0
    for rank in range(shape.ranks):
        for stage in shape.stages_of_rank(rank):
            for kind in shape.kinds_of(stage):
                first[kind][stage] = at
                at += shape.microbatches
    return first


__all__ = ["TaskGraph", "prerequisites"]
