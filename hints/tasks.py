"""The task model: pipeline shapes and the tasks a pipeline runs.

Convention used throughout rrfp
-------------------------------
* ``p`` ranks, ``v`` chunks per rank (virtual stages), ``m`` microbatches.
* The model is cut into ``S = p * v`` *model stages* ``0 .. S-1``; stage ``k``
  is chunk ``k // p`` of its rank. *Placement* says which rank
  ([Note: placement]):

  - ``looping`` (Megatron's interleaving, torch's looped schedules, the
    default): stage ``k`` lives on rank ``k % p``.
  - ``v`` (ZB-V, DualPipeV; torch's ``style="v"``): chunk ``c`` of rank ``r``
    is stage ``c*p + r`` for even ``c`` and ``c*p + (p-1-r)`` for odd ``c``.
    rrfp takes exactly two chunks: rank ``r`` holds stages ``r`` and
    ``2p-1-r``, so the first and last stages share rank 0 and the turn
    (stages ``p-1`` and ``p``) is on rank ``p-1``.

  Either way chunk 0 of every rank holds the stages ``0 .. p-1``, rank ``r``
  holding stage ``r``.
* A task is one unit of compute on one stage for one microbatch:
  ``F`` forward, ``B`` full backward, or, for a *split* backward (zero-bubble
  style), ``I`` (gradient with respect to the stage input, what the previous
  stage waits for) followed by ``W`` (gradient with respect to the weights,
  which nobody waits for). A shape either splits every backward or none.
* The canonical text of a task is torch's pipelining action grammar:
  ``<stage><kind><microbatch>`` such as ``2F0``, ``1B3``, ``0I2``, ``0W2``.
  That one form is used in hint files, traces, logs and error messages, and it
  parses back with :meth:`Task.parse`.

This module imports nothing heavier than the standard library.

[Note: cyclic GC and task-sized lists]
    A ``Task`` holds a ``Kind`` member, an object the cyclic garbage collector
    tracks, so every task tuple stays tracked. Phases that allocate per task
    (hint orders, the task graph, sampled tables, a simulation) trigger
    collections along the way, and the older ones traverse everything already
    built, so time grows faster than ``n`` (a graph build at 131k tasks took
    0.12 s with the collector on, 0.03 s with it off). Nothing these phases
    build refers back to itself, so they run under :func:`cyclic_gc_paused`;
    reference counting still frees everything, and the collector looks at
    what they kept once, when it resumes.

[Note: placement]
    Placement decides only which rank runs a stage; the dependency rule
    (``hints.deps``) is written on model stages and does not change. What
    follows from it: which messages cross ranks (in V the turn ``F(p-1) ->
    F(p)`` and ``B(p) -> B(p-1)`` stay on rank ``p-1``, and the loss, on
    stage ``2p-1``, is computed on rank 0), in which order a microbatch
    visits a rank's chunks, and so which orders make sense as hints (``zbv``
    and torch's V schedules are V orders; the 1F1B family is looping). A V
    shape has exactly two chunks per rank: the V orders rrfp knows (ZB-V,
    DualPipeV, torch's) are all two-chunk orders, and the memory budget's
    ``1f1b`` baseline for V is the ZB-V order's peak.
"""

from __future__ import annotations

import gc
import re
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import Iterator, NamedTuple, Sequence

from hints.errors import HintError, UserError, input_name


class Kind(str, Enum):
    """What a task computes. The values are torch's action letters."""

    FORWARD = "F"
    BACKWARD = "B"  # full backward: input and weight gradients together
    BACKWARD_INPUT = "I"  # split backward, part 1: gradient sent upstream
    BACKWARD_WEIGHT = "W"  # split backward, part 2: weight gradient only

    def __str__(self) -> str:  # "F", not "Kind.FORWARD"
        return self.value

    # Enum's own __hash__ is a Python function; tasks are hashed in hot loops. Hashing as the letter
    # (C-level) is also consistent with Kind.FORWARD == "F".
    __hash__ = str.__hash__

    @property
    def is_backward(self) -> bool:
        return self is not Kind.FORWARD


@contextmanager
def cyclic_gc_paused():
    """Pause the cyclic garbage collector for one allocation-heavy phase ([Note: cyclic GC and task-sized lists]).

    Restores the collector's previous state, so phases nest; usable as a decorator.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


F = Kind.FORWARD
B = Kind.BACKWARD
I = Kind.BACKWARD_INPUT  # noqa: E741 - torch's own letter
W = Kind.BACKWARD_WEIGHT

_TASK_RE = re.compile(r"^\s*(\d+)([FBIW])(\d+)\s*$")


class Task(NamedTuple):
    """One unit of pipeline work: ``kind`` of model stage ``stage`` on microbatch ``microbatch``.

    A ``NamedTuple`` so it is immutable, hashable, cheap, and orders by
    (stage, kind, microbatch) when sorted.
    """

    stage: int
    kind: Kind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.microbatch}"

    def __repr__(self) -> str:
        return f"Task({self})"

    @staticmethod
    def parse(text: str) -> "Task":
        """Parse the canonical form (``2F0``); raises :class:`HintError` on anything else."""
        match = _TASK_RE.match(text) if isinstance(text, str) else None
        if match is None:
            raise HintError(
                f"{text!r} is not a task; expected <stage><F|B|I|W><microbatch>, e.g. 2F0"
            )
        return Task(int(match.group(1)), Kind(match.group(2)), int(match.group(3)))


LOOPING, V = "looping", "v"
PLACEMENTS = (LOOPING, V)


def check_placement(placement: object, where: str = "placement") -> str:
    """``placement`` if it is one of :data:`PLACEMENTS`, else a :class:`UserError` naming them."""
    if placement not in PLACEMENTS:
        raise UserError(f"{placement!r} is not a placement; choose from {', '.join(PLACEMENTS)}", where)
    return placement  # type: ignore[return-value]


def _ranges(stages) -> str:
    """``{0, 1, 2, 5}`` -> ``0-2, 5``."""
    runs: list[list[int]] = []
    for s in sorted(stages):
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def ranges(values: Sequence[int]) -> str:
    """Whole numbers in ascending order, runs written as ranges: ``[1, 2, 3, 7]`` as ``1..3, 7`` (stages,
    iterations)."""
    runs: list[list[int]] = []
    for value in values:
        if runs and value == runs[-1][-1] + 1:
            runs[-1].append(value)
        else:
            runs.append([value])
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}..{run[-1]}" for run in runs)


def default_chunks(placement: str) -> int:
    """Chunks per rank when none are given: 2 under V placement (the only count it takes), else 1."""
    return 2 if placement == V else 1


# [Note: shape limits]
#     A shape is refused above these sizes, before anything is built for it: beyond them a mistyped
#     number (``-m 100000000``) would fill the machine's memory for minutes instead of failing (a ready
#     simulation of 8,388,608 tasks took 153 s and 4.7 GB on the 2-core VM; memory and time grow about
#     linearly, so ``MAX_TASKS`` is about a quarter of that). They are four times every figure rrfp
#     reports (256 ranks x 1024 microbatches is 524,288 tasks) and above any pipeline run today
#     (thousands of ranks, chunks of a handful).
MAX_RANKS = 8192
MAX_CHUNKS = 64
MAX_TASKS = 1 << 21  # 2,097,152


@dataclass(frozen=True, slots=True)
class PipelineShape:
    """``ranks`` x ``chunks`` model stages placed ``placement`` ([Note: placement]), and ``microbatches``.

    ``split_backward`` says whether backwards are split into ``I`` + ``W``: every stage's, except the stages in
    ``fused_stages``, whose backward stays one ``B`` (a split that costs more than the bubble it fills is not
    worth it: the ``cp`` hint decides per stage, [Note: which stages split] in :mod:`hints.priorities`).
    """

    ranks: int
    chunks: int
    microbatches: int
    split_backward: bool = False
    placement: str = LOOPING
    fused_stages: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        for name in ("ranks", "chunks", "microbatches"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"must be a whole number >= 1, got {value!r}", f"shape {name}")
        for name, most in (("ranks", MAX_RANKS), ("chunks", MAX_CHUNKS)):  # [Note: shape limits]
            if getattr(self, name) > most:
                raise UserError(f"at most {most:,}, got {getattr(self, name):,}", input_name(name))
        tasks = self.ranks * self.chunks * self.microbatches * (3 if self.split_backward else 2)
        if tasks > MAX_TASKS:
            raise UserError(f"{self.microbatches:,} microbatches on {self.ranks * self.chunks:,} stages make "
                            f"{tasks:,} tasks; rrfp takes at most {MAX_TASKS:,} ([Note: shape limits] in "
                            f"hints/tasks.py)", input_name("microbatches"))
        check_placement(self.placement, "shape placement")
        fused = self.fused_stages
        if not isinstance(fused, frozenset):
            object.__setattr__(self, "fused_stages", frozenset(fused))
        if fused and not self.split_backward:
            raise UserError("fused stages are the exceptions of a split backward; this shape splits none",
                            "shape fused_stages")
        bad = next((s for s in sorted(fused, key=repr) if not isinstance(s, int) or isinstance(s, bool)
                    or not 0 <= s < self.ranks * self.chunks), None)
        if bad is not None:
            raise UserError(f"{bad!r} is not a stage of {self.ranks * self.chunks}", "shape fused_stages")
        if self.placement == V and self.chunks != 2:  # the caller's chunk count at fault, named as its input
            raise UserError(f"V placement holds 2 chunks per rank (stages r and 2p-1-r); got {self.chunks}",
                            input_name("chunks"))

    # -- placement ---------------------------------------------------------
    @property
    def stages(self) -> int:
        return self.ranks * self.chunks

    def rank_of(self, stage: int) -> int:
        chunk, position = divmod(stage, self.ranks)
        return self.ranks - 1 - position if self.placement == V and chunk % 2 else position

    def chunk_of(self, stage: int) -> int:
        return stage // self.ranks

    def stage_of(self, rank: int, chunk: int) -> int:
        position = self.ranks - 1 - rank if self.placement == V and chunk % 2 else rank
        return chunk * self.ranks + position

    def stages_of_rank(self, rank: int) -> list[int]:
        """The rank's stages in chunk order."""
        return [self.stage_of(rank, chunk) for chunk in range(self.chunks)]

    # -- task kinds --------------------------------------------------------
    def splits(self, stage: int) -> bool:
        """Whether ``stage``'s backward is split into ``I`` + ``W``."""
        return self.split_backward and stage not in self.fused_stages

    def backward_kinds_of(self, stage: int) -> tuple[Kind, ...]:
        """The backward kinds each microbatch of ``stage`` has, in dependency order."""
        return (I, W) if self.splits(stage) else (B,)

    def upstream_backward_of(self, stage: int) -> Kind:
        """The backward kind of ``stage`` whose output the previous stage waits for (B, or I when split)."""
        return I if self.splits(stage) else B

    def final_backward_of(self, stage: int) -> Kind:
        """The last task of a (stage, microbatch); its end frees the stashed activations."""
        return W if self.splits(stage) else B

    def kinds_of(self, stage: int) -> tuple[Kind, ...]:
        return (F, *self.backward_kinds_of(stage))

    @property
    def kinds(self) -> tuple[Kind, ...]:
        """Every kind some stage has, in the order F, B, I, W."""
        return tuple(k for k in (F, B, I, W) if any(k in self.kinds_of(s) for s in range(self.stages)))

    @property
    def split_stages(self) -> tuple[int, ...]:
        return tuple(s for s in range(self.stages) if self.splits(s))

    # -- enumeration -------------------------------------------------------
    def tasks_of_rank(self, rank: int) -> Iterator[Task]:
        for stage in self.stages_of_rank(rank):
            for kind in self.kinds_of(stage):
                for mb in range(self.microbatches):
                    yield Task(stage, kind, mb)

    def tasks(self) -> Iterator[Task]:
        for rank in range(self.ranks):
            yield from self.tasks_of_rank(rank)

    def tasks_of(self, rank: int) -> int:
        """How many tasks ``rank`` runs."""
        return self.microbatches * sum(len(self.kinds_of(s)) for s in self.stages_of_rank(rank))

    @property
    def tasks_per_rank(self) -> int:
        """The most tasks one rank runs (every rank's count when no stage is fused)."""
        return max(self.tasks_of(r) for r in range(self.ranks))

    @property
    def total_tasks(self) -> int:
        return self.microbatches * sum(len(self.kinds_of(s)) for s in range(self.stages))

    def contains(self, task: Task) -> bool:
        return (
            0 <= task.stage < self.stages
            and 0 <= task.microbatch < self.microbatches
            and task.kind in self.kinds_of(task.stage)
        )

    def describe(self) -> str:
        split = ", split backward" if self.split_backward else ""
        if self.fused_stages:
            split += f" (fused at stage{'s' if len(self.fused_stages) > 1 else ''} {_ranges(self.fused_stages)})"
        placed = " (V)" if self.placement == V else ""
        return f"{self.ranks} ranks x {self.chunks} chunks{placed}, {self.microbatches} microbatches{split}"

    def split_stages_text(self) -> str:
        """The split stages as ranges (``2-7``), or ``none``."""
        return _ranges(self.split_stages) or "none"

    def describe_backward(self) -> str:
        """Which stages split their backward, in words."""
        split = self.split_stages
        if not split:
            return "whole (B) at every stage"
        if len(split) == self.stages:
            return "split (I + W) at every stage"
        return f"split (I + W) at stages {_ranges(split)}, whole (B) at {_ranges(self.fused_stages)}"

    def with_split(self, split: bool) -> "PipelineShape":
        """This shape with every backward split (``True``) or none (``False``)."""
        return PipelineShape(self.ranks, self.chunks, self.microbatches, split, self.placement)

    def to_json(self) -> dict:
        data = {
            "ranks": self.ranks,
            "chunks": self.chunks,
            "microbatches": self.microbatches,
            "split_backward": self.split_backward,
            "placement": self.placement,
        }
        if self.fused_stages:
            data["fused_stages"] = sorted(self.fused_stages)
        return data
