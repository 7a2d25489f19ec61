"""The process grid: what "rank" means once pipeline, tensor and data parallelism combine.

A job runs ``world = pp x tp x dp`` processes. Each has one *global rank*
(the process group's rank) and three coordinates:

* ``pipe`` -- its pipeline rank, ``0..pp-1``: the rank of the hint orders, of
  :class:`hints.deps.TaskGraph` and of every arbiter. The pipeline code
  never sees anything else.
* ``tp`` -- its index in its stage's tensor-parallel group, ``0..tp-1``.
  Member 0 is the group's *leader* ([Note: TP coordination] in
  :mod:`runtime.exec.tp_follow`).
* ``dp`` -- its data-parallel replica, ``0..dp-1``.

Layout: ``global = (dp * tp_size + tp) * pp + pipe``. The pipeline ranks of one
(TP member, replica) *slice* are consecutive, so the slice of the leaders of
replica 0 is global ranks ``0..pp-1``, exactly the ranks of a pipeline-only
job: traces, metrics and analyses of that slice read as they always did.

Links: a slice is a pipeline of its own. Pipeline messages go from a member
of one stage to the member with the same ``tp`` (and ``dp``) of the next, so
every member receives its own copy of the activations and gradients it needs
([Note: every member receives its own inputs] in :mod:`runtime.exec.tp_follow`). Each
leader also has one *decision link* to each follower of its group.

:class:`SliceTransport` is the transport as the executor sees it: peers
addressed by pipeline rank within the caller's slice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable


@dataclass(frozen=True)
class ProcessGrid:
    """Where one process sits in a ``pp x tp x dp`` job (``rank``: its global rank)."""

    pp: int
    tp: int = 1
    dp: int = 1
    rank: int = 0

    def __post_init__(self) -> None:
        if min(self.pp, self.tp, self.dp) < 1 or not 0 <= self.rank < self.world:
            raise ValueError(f"no rank {self.rank} in a grid of pp {self.pp} x tp {self.tp} x dp {self.dp}")

    @classmethod
    def of(cls, config, rank: int = 0) -> "ProcessGrid":
        """The grid of a :class:`runtime.config.RunConfig` (``stages`` pipeline ranks), seen from ``rank``."""
        return cls(config.ranks, config.tp, config.dp, rank)

    @property
    def world(self) -> int:
        return self.pp * self.tp * self.dp

    @property
    def pipe_rank(self) -> int:
        return self.rank % self.pp

    @property
    def tp_rank(self) -> int:
        return self.rank // self.pp % self.tp

    @property
    def dp_rank(self) -> int:
        return self.rank // (self.pp * self.tp)

    @property
    def is_leader(self) -> bool:
        """Member 0 of its TP group (with ``tp`` 1, every rank leads a group of one)."""
        return self.tp_rank == 0

    def global_rank(self, pipe: int, tp: int | None = None, dp: int | None = None) -> int:
        """The global rank at ``(pipe, tp, dp)``; ``tp`` and ``dp`` default to this process's."""
        tp = self.tp_rank if tp is None else tp
        dp = self.dp_rank if dp is None else dp
        return (dp * self.tp + tp) * self.pp + pipe

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """``(pipe, tp, dp)`` of a global rank."""
        return rank % self.pp, rank // self.pp % self.tp, rank // (self.pp * self.tp)

    @property
    def leader(self) -> int:
        """The global rank of this process's TP group leader."""
        return self.global_rank(self.pipe_rank, 0)

    @property
    def followers(self) -> list[int]:
        """The global ranks this process leads (empty unless it is a leader of a group of two or more)."""
        if not self.is_leader:
            return []
        return [self.global_rank(self.pipe_rank, t) for t in range(1, self.tp)]

    def tp_members(self, pipe: int, dp: int) -> list[int]:
        return [self.global_rank(pipe, t, dp) for t in range(self.tp)]

    def dp_members(self, pipe: int, tp: int) -> list[int]:
        return [self.global_rank(pipe, tp, d) for d in range(self.dp)]

    def links(self, pipeline_pairs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        """Every directed link of the job, as global ranks: ``pipeline_pairs`` (pipeline-rank links, from
        the task graph) in every slice, then each leader's decision link to each of its followers."""
        pairs = sorted({(a, b) for a, b in pipeline_pairs if a != b})
        links = [(self.global_rank(a, t, d), self.global_rank(b, t, d))
                 for d in range(self.dp) for t in range(self.tp) for a, b in pairs]
        return sorted(set(links) | set(self.decision_links()))

    def decision_links(self) -> list[tuple[int, int]]:
        return [(self.global_rank(pipe, 0, d), self.global_rank(pipe, t, d))
                for d in range(self.dp) for pipe in range(self.pp) for t in range(1, self.tp)]

    def describe(self) -> str:
        """``pipeline rank 1, tp 0/2, dp 1/2``: this process's coordinates, for logs."""
        return f"pipeline rank {self.pipe_rank}, tp {self.tp_rank}/{self.tp}, dp {self.dp_rank}/{self.dp}"


@dataclass
class GridGroups:
    """This process's tensor- and data-parallel process groups (None where the degree is 1)."""

    tp: Any = None
    dp: Any = None


def make_groups(grid: ProcessGrid, timeout=None) -> GridGroups:
    """Create every TP and DP group of the job (collective: every rank calls it, in one order) and return
    this process's. ``new_group`` is collective over the default group, so all ranks create all groups."""
    kwargs = {} if timeout is None else {"timeout": timeout}
    tp = [grid.tp_members(pipe, d) for d in range(grid.dp) for pipe in range(grid.pp)] if grid.tp > 1 else []
    dp = [grid.dp_members(pipe, t) for t in range(grid.tp) for pipe in range(grid.pp)] if grid.dp > 1 else []
    return GridGroups(tp=_own_group(grid.rank, tp, kwargs), dp=_own_group(grid.rank, dp, kwargs))


def _own_group(rank: int, member_lists: list[list[int]], kwargs: dict):
    """Create a group per member list (every rank, every list); the one ``rank`` belongs to, or None."""
    import torch.distributed as dist

    own = None
    for members in member_lists:
        group = dist.new_group(members, **kwargs)
        if rank in members:
            own = group
    return own


class SliceTransport:
    """A :class:`runtime.comm.transport.Transport` addressed by pipeline rank within this process's slice.

    ``send``, ``notify`` and ``posted`` take the pipeline rank of the destination; everything else (the inbox,
    ``wait_sent``, ``take_sent``) is the transport's own.
    """

    def __init__(self, transport, grid: ProcessGrid) -> None:
        self.transport, self.grid = transport, grid

    def send(self, dst: int, iteration: int, producer, tensors) -> None:
        self.transport.send(self.grid.global_rank(dst), iteration, producer, tensors)

    def notify(self, dst: int, iteration: int, producer, remaining: float, firm: bool) -> None:
        self.transport.notify(self.grid.global_rank(dst), iteration, producer, remaining, firm)

    def posted(self, dst: int, iteration: int, producer) -> None:
        self.transport.posted(self.grid.global_rank(dst), iteration, producer)

    def __getattr__(self, name: str):
        return getattr(self.transport, name)
