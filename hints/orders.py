"""Hint orders as data, and the built-in generators.

A *hint order* is, for each rank, the ordered list of the tasks that rank runs
(see :mod:`hints.tasks` for the index conventions). Under the ``fixed`` policy
a rank runs exactly that list; under ``ready`` the list only ranks the ready
tasks (lower position wins). Generators are pure functions of plain numbers:
no torch, no process group, no stage object.

Built-ins (``BUILTIN_HINTS``):

``gpipe``
    Every rank runs all its forwards, then all its backwards. Forwards go chunk
    by chunk (all microbatches through chunk 0, then chunk 1, ...), backwards
    in reverse chunk order, microbatches ascending. With one chunk this is
    torch's ``ScheduleGPipe``.
``1f1b``
    Non-interleaved one-forward-one-backward (PipeDream-flush): rank ``r``
    warms up with ``min(p-1-r, m)`` forwards, then alternates F and B, then
    drains. Needs ``chunks == 1``. Equals torch's ``Schedule1F1B``.
``interleaved-1f1b``
    Megatron's interleaved 1F1B with torch's relaxation of ``m % p == 0``
    (microbatches are taken in rounds of ``m // max(1, m // p)``; ``m`` must be
    a multiple of the number of rounds). Needs ``chunks >= 2``. Equals torch's
    ``ScheduleInterleaved1F1B``.
``bf``
    Breadth-first with looping placement (Lamy-Poirier, "Breadth-First
    Pipeline Parallelism", 2022): all microbatches through a chunk before the
    next chunk, then backwards in reverse chunk order and reverse microbatch
    order. Equals torch's ``ScheduleLoopedBFS``.
``bfw``
    Breadth-first *weighted*; see :func:`breadth_first_weighted` and
    [Note: bfw] below.
``cp``
    Critical path first: each rank's tasks by descending *bottom level* (a
    task's duration plus the longest path of durations and link latencies
    from it to the end of the iteration), on the split-backward graph, from
    *expected* durations. Classic list scheduling (HLFET, Adam, Chandy and
    Dickson 1974): the task with the most work still hanging behind it goes
    first. :mod:`hints.priorities` computes the bottom levels from the
    dependency model and a table of expected durations (what the caller
    brings, as it brings ``bfw``'s costs); :func:`by_priority` sorts by them.
``1f1b-light``, ``1f1b-heavy``
    1F1B (interleaved with chunks >= 2) with the microbatches sorted by the
    cost known before the iteration, lightest or heaviest first: the fixed
    order a user could run without readiness from the same costs ``bfw``
    reads ([Note: sorted 1F1B]). Same warm-ups, so the same memory, as
    ``1f1b``/``interleaved-1f1b``.
``zb``
    Zero-bubble with split backward (Qi et al., "Zero Bubble Pipeline
    Parallelism", 2023, the ZB-H1 idea): the 1F1B skeleton with ``I`` in place
    of ``B``, a warmup of ``(v-1)*round + (p-1-r)`` forwards, and each ``W``
    deferred behind the rank's next ``r`` input-gradient tasks, so the later
    ranks fill their drain bubble with weight gradients. With chunks >= 2 this
    equals torch's ``ScheduleInterleavedZeroBubble`` order.
``zbv``
    ZB-V (Qi et al., "Pipeline Parallelism with Controllable Memory", 2024,
    from the zero-bubble paper's V schedule): V placement, two chunks per
    rank, split backward; see [Note: zbv]. Equals torch's
    ``ScheduleZBVZeroBubble`` order.

``gpipe``, ``bf``, ``bfw`` and ``cp`` are built for either placement
(``--placement``); the 1F1B family (``1f1b``, ``interleaved-1f1b``, ``zb``)
is looping only and ``zbv`` V only ([Note: placement] in :mod:`hints.tasks`).

[Note: bfw]
    With variable microbatch cost (sequence length, image count) the tail of a
    pipeline is set by whichever heavy microbatch enters last. ``bfw`` is the
    breadth-first order with microbatches sorted by their estimated cost,
    heaviest first, in both the forward and the backward pass (ties keep index
    order). This is longest-processing-time-first list scheduling (Graham
    1969): starting the long jobs early lets short ones fill the gaps behind
    them, and leaves short jobs to drain the pipeline. The costs come from the
    workload model (estimated per-microbatch compute summed over stages);
    without costs every microbatch weighs the same and ``bfw`` runs
    microbatches in index order in both passes.

[Note: sorted 1F1B]
    Ordering by known cost is a lever of its own, and a fixed order gets it
    too: a 1F1B whose microbatch ``k`` is the ``k``-th lightest (or
    heaviest) by the workload's estimate holds exactly 1F1B's activation
    memory and needs no runtime. Relabelling microbatches keeps every
    dependency (they are per microbatch), so any 1F1B-family order stays
    valid. Lightest first fills and drains the pipeline with cheap
    microbatches and leaves the heavy ones to the steady state, where every
    rank is busy; heaviest first is Graham's LPT. These are the baselines
    readiness is credited against (``runtime.sched.baselines`` adds warm-ups
    that fill a larger budget); without costs both keep index order.

[Note: zbv]
    Rank ``r`` holds stage ``r`` (chunk 0, on the way down the ranks) and
    stage ``2p-1-r`` (chunk 1, on the way back). Its order: ``2(p-r)-1``
    chunk-0 forwards; ``r`` pairs (chunk-1 F, chunk-0 F); ``p-r`` triples
    (chunk-1 F, I, W); then the steady state, one chunk-0 F, I, W and one
    chunk-1 F, I, W per step; then a cool-down of ``r`` pairs of input
    gradients (chunk 0, chunk 1) and ``p-r`` chunk-0 (I, W), and the
    remaining weight gradients, chunk 1 first. It is built for at least
    ``2p-1`` microbatches and the extra ones are left out, as torch does.
    With ``F = I = W`` and ``m >= 2p-1`` no rank idles between its first
    task and its last, and every rank peaks at ``2p`` chunks in flight, the
    activation memory of 1F1B (``tests/unit/test_simulator.py``).

[Note: cost-ranked hints]
    Microbatch contents change every iteration, so an order of microbatch
    *indices* tuned on one iteration says nothing about the next. In a
    *cost-ranked* hint a task's microbatch number is a *slot*: slot 0 is the
    iteration's most expensive microbatch, slot ``m-1`` the cheapest (by
    predicted cost, ties by index). :func:`resolve_cost_ranked` turns it into
    an index hint for one iteration's costs; ``rrfp run`` does so every
    iteration and ``rrfp simulate`` for the table it replays. ``bfw`` is the
    simplest such order (breadth-first in slot order). The costs come from
    the hint's ``cost_model`` (:mod:`hints.costs`) applied to what each
    microbatch holds, or from the workload's expected costs when the hint
    carries no model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

from hints.errors import HintError
from hints.tasks import (
    LOOPING,
    PLACEMENTS,
    B,
    F,
    I,
    PipelineShape,
    Task,
    V,
    W,
    check_placement,
    cyclic_gc_paused,
)

if TYPE_CHECKING:
    from hints.costs import CostModel

RankOrders = list[Sequence[Task]]  # one order per rank (lists, or tuples when built whole)


MICROBATCH_ORDERS = ("index", "cost-ranked")


@dataclass(frozen=True)
class HintOrder:
    """Per-rank task orders for one shape, with a name and where it came from.

    ``microbatches`` says what a task's microbatch number means: ``index``
    (the microbatch itself) or ``cost-ranked`` (a slot: [Note: cost-ranked
    hints]); a cost-ranked hint may carry the ``cost_model`` that ranks them.
    """

    shape: PipelineShape
    orders: tuple[tuple[Task, ...], ...]
    name: str
    provenance: Mapping[str, object] = field(default_factory=dict)
    microbatches: str = "index"
    cost_model: "CostModel | None" = None

    @property
    def cost_ranked(self) -> bool:
        return self.microbatches == "cost-ranked"

    def hint_positions(self, rank: int) -> dict[Task, int]:
        """Task -> position in ``rank``'s order (lower runs earlier)."""
        return {task: pos for pos, task in enumerate(self.orders[rank])}

    def text_orders(self) -> list[list[str]]:
        return [[str(task) for task in order] for order in self.orders]


def heaviest_first(costs: Sequence[float]) -> list[int]:
    """Microbatch indices by descending cost, ties by index: slot ``k`` -> the ``k``-th heaviest microbatch."""
    return sorted(range(len(costs)), key=lambda mb: (-costs[mb], mb))


def lightest_to_heaviest(costs: Sequence[float]) -> list[int]:
    """Microbatch indices by ascending cost, ties by index: slot ``k`` -> the ``k``-th lightest microbatch."""
    return sorted(range(len(costs)), key=lambda mb: (costs[mb], mb))


def relabelled(orders, microbatch) -> tuple[tuple[Task, ...], ...]:
    """``orders`` (one per rank) with each task's microbatch ``k`` replaced by ``microbatch[k]``."""
    return tuple(tuple(Task(t.stage, t.kind, microbatch[t.microbatch]) for t in order) for order in orders)


def resolve_cost_ranked(hint: HintOrder, costs: Sequence[float]) -> HintOrder:
    """The index hint a cost-ranked ``hint`` means for microbatches of ``costs`` ([Note: cost-ranked hints]).

    An index hint is returned unchanged.
    """
    if not hint.cost_ranked:
        return hint
    if len(costs) != hint.shape.microbatches:
        raise HintError(f"needs one cost per microbatch: got {len(costs)} for {hint.shape.microbatches}", hint.name)
    microbatch = heaviest_first(costs)
    orders = relabelled(hint.orders, microbatch)
    provenance = {**hint.provenance, "resolved_from": "cost-ranked", "slot_to_microbatch": microbatch}
    return HintOrder(hint.shape, orders, hint.name, provenance)


def as_cost_ranked(hint: HintOrder, costs: Sequence[float], name: str | None = None,
                   cost_model: "CostModel | None" = None) -> HintOrder:
    """The cost-ranked hint that resolves to ``hint`` for ``costs`` (its microbatch numbers become slots).

    A hint tuned on some iterations carries to others this way: it says "the heaviest microbatch first",
    not "microbatch 7 first".
    """
    slot = {mb: k for k, mb in enumerate(heaviest_first(costs))}
    return HintOrder(hint.shape, relabelled(hint.orders, slot), name or hint.name, dict(hint.provenance), "cost-ranked",
                     cost_model)


# -- generators ----------------------------------------------------------


def gpipe(ranks: int, chunks: int, microbatches: int, placement: str = LOOPING) -> RankOrders:
    """All forwards chunk by chunk, then all backwards (reverse chunks, ascending microbatches)."""
    mbs = list(range(microbatches))
    return _breadth_first(PipelineShape(ranks, chunks, microbatches, placement=placement), mbs, mbs)


def breadth_first(ranks: int, chunks: int, microbatches: int, placement: str = LOOPING) -> RankOrders:
    """torch's LoopedBFS: forwards ascending, backwards in reverse chunk and microbatch order."""
    mbs = list(range(microbatches))
    return _breadth_first(PipelineShape(ranks, chunks, microbatches, placement=placement), mbs, mbs[::-1])


def breadth_first_weighted(
    ranks: int, chunks: int, microbatches: int, costs: Sequence[float] | None = None, placement: str = LOOPING
) -> RankOrders:
    """Breadth-first with the heaviest microbatches first in both passes ([Note: bfw])."""
    if costs is None:
        costs = [1.0] * microbatches
    if len(costs) != microbatches:
        raise HintError(f"bfw needs one cost per microbatch: got {len(costs)} for {microbatches}")
    heavy_first = heaviest_first(costs)
    return _breadth_first(PipelineShape(ranks, chunks, microbatches, placement=placement), heavy_first, heavy_first)


def sorted_one_f_one_b(ranks: int, chunks: int, microbatches: int, costs: Sequence[float] | None = None,
                       lightest_first: bool = True, warmups: Sequence[int] | None = None) -> RankOrders:
    """1F1B (interleaved with chunks >= 2) with microbatches sorted by cost ([Note: sorted 1F1B]).

    ``warmups``: forwards each rank runs before its first backward (default 1F1B's); a rank then holds
    ``min(warmup + 1, chunks * microbatches)`` microbatch-chunks at its peak.
    """
    if costs is None:
        costs = [1.0] * microbatches
    if len(costs) != microbatches:
        raise HintError(f"sorted 1F1B needs one cost per microbatch: got {len(costs)} for {microbatches}")
    if warmups is None:
        warmups = one_f_one_b_warmups(ranks, chunks, microbatches)
    if len(warmups) != ranks or any(w < 0 for w in warmups):
        raise HintError(f"sorted 1F1B needs a warm-up >= 0 per rank: got {list(warmups)} for {ranks} ranks")
    order = lightest_to_heaviest(costs) if lightest_first else heaviest_first(costs)
    return list(relabelled((_one_f_one_b_rank(rank, ranks, chunks, microbatches, warmups[rank], None)
                            for rank in range(ranks)), order))


def one_f_one_b_warmups(ranks: int, chunks: int, microbatches: int) -> list[int]:
    """Per rank, the forwards 1F1B (interleaved with chunks >= 2) runs before its first backward."""
    if chunks == 1:
        return [ranks - 1 - rank for rank in range(ranks)]
    per_round = microbatches_per_round(ranks, microbatches)
    return [(chunks - 1) * per_round + 2 * (ranks - 1 - rank) for rank in range(ranks)]


def _lightest_first_1f1b(ranks: int, chunks: int, microbatches: int, costs: Sequence[float] | None = None
                         ) -> RankOrders:
    return sorted_one_f_one_b(ranks, chunks, microbatches, costs, lightest_first=True)


def _heaviest_first_1f1b(ranks: int, chunks: int, microbatches: int, costs: Sequence[float] | None = None
                         ) -> RankOrders:
    return sorted_one_f_one_b(ranks, chunks, microbatches, costs, lightest_first=False)


def _breadth_first(shape: PipelineShape, forward_mbs: Sequence[int], backward_mbs: Sequence[int]) -> RankOrders:
    orders: RankOrders = []
    for rank in range(shape.ranks):
        stages = shape.stages_of_rank(rank)
        order = [Task(stage, F, mb) for stage in stages for mb in forward_mbs]
        order += [Task(stage, B, mb) for stage in reversed(stages) for mb in backward_mbs]
        orders.append(order)
    return orders


def by_priority(
    ranks: int, chunks: int, microbatches: int, priorities: Mapping[Task, Sequence[float]] | None = None,
    placement: str = LOOPING,
) -> RankOrders:
    """Each rank's tasks (split backward) by descending priority; equal priorities keep task-id order.

    ``priorities`` maps every task to a comparable key, higher first (for ``cp``: its bottom level,
    then its reverse topological position, which keeps all ranks consistent with one topological
    order so the hint completes in fixed order).
    """
    if priorities is None:
        raise HintError("cp ranks tasks by their critical path, so it needs expected task durations: "
                        "use it with rrfp simulate or rrfp run (which know the workload)")
    shape = PipelineShape(ranks, chunks, microbatches, split_backward=True, placement=placement,
                          fused_stages=fused_in(priorities))
    orders: RankOrders = []
    for rank in range(ranks):
        tasks = list(shape.tasks_of_rank(rank))  # task-id order
        missing = next((t for t in tasks if t not in priorities), None)
        if missing is not None:
            raise HintError(f"no priority for task {missing}")
        # descending keys; a stable sort keeps equal ones in task-id order, reversed or not
        orders.append(sorted(tasks, key=priorities.__getitem__, reverse=True))
    return orders


def fused_in(tasks: Iterable[Task]) -> frozenset[int]:
    """The stages that have a whole backward ``B`` among ``tasks`` (in a split shape: its fused stages)."""
    return frozenset(task.stage for task in tasks if task.kind is B)


def microbatches_per_round(ranks: int, microbatches: int) -> int:
    """torch's interleaving round: ``m // max(1, m // p)``; ``m`` must divide evenly into rounds."""
    rounds = max(1, microbatches // ranks)
    if microbatches % rounds:
        raise HintError(
            f"interleaved orders take microbatches in {rounds} rounds, so the microbatch count "
            f"must be a multiple of {rounds}; got {microbatches} (try {rounds * (microbatches // rounds)} "
            f"or {rounds * (microbatches // rounds + 1)})"
        )
    return microbatches // rounds


def _one_f_one_b_rank(
    rank: int,
    ranks: int,
    chunks: int,
    microbatches: int,
    warmup: int,
    weight_lag: int | None,
) -> Sequence[Task]:
    """One rank's 1F1B-family order (the shape of torch's ``_get_1f1b_rank_ops``, without idle slots).

    Steps ``0 .. warmup-1`` are forwards; then each step is a forward followed by
    a backward; the last ``warmup`` steps are backwards only. With
    ``weight_lag`` set, backwards are split into ``I`` + ``W`` and the ``W`` of
    a backward step is issued ``weight_lag`` backward steps later (the rest at
    the end).
    """
    total = chunks * microbatches
    warmup = min(warmup, total)
    per_round = microbatches_per_round(ranks, microbatches) if chunks > 1 else microbatches
    forwards = _in_rounds(rank, ranks, chunks, microbatches, per_round, F, reverse=False)
    backwards = _in_rounds(rank, ranks, chunks, microbatches, per_round, B if weight_lag is None else I,
                           reverse=True)
    steady = total - warmup  # steps with a forward and a backward
    if weight_lag is None:
        steady_steps = chain.from_iterable(zip(forwards[warmup:], backwards))
        return tuple(chain(forwards[:warmup], steady_steps, backwards[steady:]))  # HintOrder keeps tuples
    weights = [_task(Task, (stage, W, mb)) for stage, _, mb in backwards]
    order = forwards[:warmup]
    for j, backward in enumerate(backwards):  # backward step j is step warmup + j
        if j < steady:
            order.append(forwards[warmup + j])
        order.append(backward)
        if j >= weight_lag:
            order.append(weights[j - weight_lag])
    return order + weights[max(0, total - weight_lag):]


_task = tuple.__new__  # Task(...) without NamedTuple's Python-level __new__, for orders built task by task


def _in_rounds(rank: int, ranks: int, chunks: int, microbatches: int, per_round: int, kind, reverse: bool
               ) -> list[Task]:
    """A rank's tasks of ``kind`` in 1F1B order: rounds of ``per_round`` microbatches, each round through the
    next chunk (``reverse``: from the last chunk down), microbatches ascending within each chunk."""
    tasks: list[Task] = []
    for round_ in range(chunks * microbatches // per_round):
        chunk = chunks - 1 - round_ % chunks if reverse else round_ % chunks
        first = (round_ // chunks) * per_round
        tasks.extend(map(_task, repeat(Task, per_round),
                         zip(repeat(chunk * ranks + rank), repeat(kind), range(first, first + per_round))))
    return tasks


def one_f_one_b(ranks: int, chunks: int, microbatches: int) -> RankOrders:
    """Non-interleaved 1F1B; needs one chunk per rank."""
    if chunks != 1:
        raise HintError(
            f"1f1b runs one chunk per rank (got `chunks` {chunks}); use interleaved-1f1b for chunks >= 2"
        )
    return [_one_f_one_b_rank(rank, ranks, 1, microbatches, warmup, None)
            for rank, warmup in enumerate(one_f_one_b_warmups(ranks, 1, microbatches))]


def interleaved_one_f_one_b(ranks: int, chunks: int, microbatches: int) -> RankOrders:
    """Megatron/torch interleaved 1F1B; needs two or more chunks per rank."""
    if chunks < 2:
        raise HintError("interleaved-1f1b needs `chunks` >= 2; use 1f1b for one chunk per rank")
    return [_one_f_one_b_rank(rank, ranks, chunks, microbatches, warmup, None)
            for rank, warmup in enumerate(one_f_one_b_warmups(ranks, chunks, microbatches))]


def zero_bubble(ranks: int, chunks: int, microbatches: int) -> RankOrders:
    """ZB-H1-style split-backward 1F1B; W deferred by ``rank`` backward steps."""
    per_round = microbatches_per_round(ranks, microbatches) if chunks > 1 else microbatches
    return [
        _one_f_one_b_rank(
            rank, ranks, chunks, microbatches, (chunks - 1) * per_round + (ranks - 1 - rank), rank
        )
        for rank in range(ranks)
    ]


def zero_bubble_v(ranks: int, chunks: int, microbatches: int) -> RankOrders:
    """ZB-V ([Note: zbv]): V placement, two chunks per rank, split backward (torch's ``ScheduleZBVZeroBubble``)."""
    if chunks != 2:
        raise HintError(f"zbv places two chunks on each rank in a V (2p = {2 * ranks} stages); "
                        f"got `chunks` {chunks}")
    return [_zbv_rank(rank, ranks, microbatches) for rank in range(ranks)]


def _zbv_rank(rank: int, ranks: int, microbatches: int) -> list[Task]:
    """One rank's ZB-V order: built for at least ``2p-1`` microbatches, then the extra ones left out."""
    built = max(2 * ranks - 1, microbatches)
    down, up = rank, 2 * ranks - 1 - rank  # chunk 0 (the way down the ranks) and chunk 1 (the way back)
    issued = {(stage, kind): 0 for stage in (down, up) for kind in (F, I, W)}
    order: list[Task] = []

    def issue(stage: int, *kinds) -> None:
        for kind in kinds:
            order.append(Task(stage, kind, issued[(stage, kind)]))
            issued[(stage, kind)] += 1

    for _ in range(2 * (ranks - rank) - 1):  # warm-up: chunk-0 forwards until the V turns back here
        issue(down, F)
    for _ in range(rank):
        issue(up, F)
        issue(down, F)
    for _ in range(ranks - rank):  # chunk 1 starts its backwards; its W fills the wait for chunk 0's
        issue(up, F, I, W)
    while issued[(up, F)] < issued[(down, F)] or issued[(down, F)] < built:  # steady state
        if issued[(down, F)] < built:
            issue(down, F)
        issue(down, I, W)
        issue(up, F, I, W)
    for _ in range(rank):  # cool-down: input gradients first, weight gradients fill the drain
        issue(down, I)
        issue(up, I)
    for _ in range(ranks - rank):
        issue(down, I, W)
    while issued[(up, W)] < issued[(up, I)]:
        issue(up, W)
    while issued[(down, W)] < issued[(down, I)]:
        issue(down, W)
    return [task for task in order if task.microbatch < microbatches]


def one_f_one_b_family(ranks: int, chunks: int, microbatches: int, warmup_offset: int = 0,
                       weight_lag: Callable[[int], int] | None = None) -> HintOrder:
    """A member of the 1F1B family, for tuning: 1F1B (``interleaved-1f1b`` with chunks >= 2, ``zb``'s
    warm-up when split) with every rank's warm-up changed by ``warmup_offset`` forwards, and with
    ``weight_lag(rank)`` set, a split backward whose ``W`` trails its ``I`` by that many backward steps.

    ``warmup_offset=0, weight_lag=lambda r: r`` is ``zb``; ``weight_lag=None`` with offset 0 is
    ``1f1b``/``interleaved-1f1b``. More warm-up holds more microbatches in flight; less makes ranks
    alternate sooner.
    """
    per_round = microbatches_per_round(ranks, microbatches) if chunks > 1 else microbatches
    split = weight_lag is not None

    def warmup(rank: int) -> int:
        base = (chunks - 1) * per_round + (1 if split or chunks == 1 else 2) * (ranks - 1 - rank)
        return max(0, base + warmup_offset)

    orders = tuple(tuple(_one_f_one_b_rank(rank, ranks, chunks, microbatches, warmup(rank),
                                           weight_lag(rank) if split else None)) for rank in range(ranks))
    lag = "" if not split else f", W lag {[weight_lag(r) for r in range(min(ranks, 4))]}..."
    name = f"{'zb' if split else '1f1b'}-family(warmup {warmup_offset:+d}{lag})"
    return HintOrder(PipelineShape(ranks, chunks, microbatches, split), orders, name,
                     {"generator": "one_f_one_b_family", "warmup_offset": warmup_offset})


# -- registry ------------------------------------------------------------


@dataclass(frozen=True)
class BuiltinHint:
    name: str
    summary: str
    generator: Callable[..., RankOrders]
    split_backward: bool = False
    takes_costs: bool = False  # per-microbatch estimated costs (bfw)
    takes_priorities: bool = False  # a priority per task, computed from the task graph (cp)
    chunks: str = "any"  # human-readable requirement, for `rrfp hints list`
    placements: tuple[str, ...] = (LOOPING,)  # the first is the default; more: the generator takes placement=

    @property
    def placement(self) -> str:
        """Its own placement, what it is built for when none is asked."""
        return self.placements[0]

    @cyclic_gc_paused()  # [Note: cyclic GC and task-sized lists] in hints.tasks
    def build(
        self,
        ranks: int,
        chunks: int,
        microbatches: int,
        costs: Sequence[float] | None = None,
        priorities: Mapping[Task, Sequence[float]] | None = None,
        placement: str | None = None,
    ) -> HintOrder:
        placement = self.placements[0] if placement is None else check_placement(placement, "`placement`")
        if placement not in self.placements:
            raise HintError(f"{self.name} places stages {_PLACED[self.placements[0]]}; it has no "
                            f"{placement} order (use `placement` {self.placements[0]}, or a hint for {placement})")
        # cp's priorities say which stages keep a whole backward ([Note: which stages split])
        fused = fused_in(priorities) if self.takes_priorities and priorities is not None else frozenset()
        shape = PipelineShape(ranks, chunks, microbatches, self.split_backward, placement, fused)
        extra = {"placement": placement} if len(self.placements) > 1 else {}
        if self.takes_costs:
            rank_orders = self.generator(ranks, chunks, microbatches, costs, **extra)
        elif self.takes_priorities:
            rank_orders = self.generator(ranks, chunks, microbatches, priorities, **extra)
        else:
            rank_orders = self.generator(ranks, chunks, microbatches, **extra)
        provenance: dict[str, object] = {"generator": self.name}
        if self.takes_costs and costs is not None:
            provenance["costs"] = [float(c) for c in costs]
        return HintOrder(shape, tuple(tuple(o) for o in rank_orders), self.name, provenance)


_PLACED = {LOOPING: "in a loop (stage k on rank k % p)", V: "in a V (rank r holds stages r and 2p-1-r)"}
assert set(_PLACED) == set(PLACEMENTS)

BUILTIN_HINTS: dict[str, BuiltinHint] = {
    hint.name: hint
    for hint in (
        BuiltinHint("gpipe", "all forwards, then all backwards (chunk by chunk)", gpipe, placements=(LOOPING, V)),
        BuiltinHint("1f1b", "one-forward-one-backward after a warmup (PipeDream-flush)", one_f_one_b, chunks="1"),
        BuiltinHint(
            "interleaved-1f1b", "Megatron's interleaved 1F1B over virtual stages",
            interleaved_one_f_one_b, chunks=">= 2",
        ),
        BuiltinHint("bf", "breadth-first (torch LoopedBFS with looping placement)", breadth_first,
                    placements=(LOOPING, V)),
        BuiltinHint(
            "bfw", "breadth-first, heaviest microbatches first (needs workload costs)",
            breadth_first_weighted, takes_costs=True, placements=(LOOPING, V),
        ),
        BuiltinHint(
            "1f1b-light", "1F1B (interleaved for chunks >= 2), lightest microbatches first (needs workload costs)",
            _lightest_first_1f1b, takes_costs=True,
        ),
        BuiltinHint(
            "1f1b-heavy", "1F1B (interleaved for chunks >= 2), heaviest microbatches first (needs workload costs)",
            _heaviest_first_1f1b, takes_costs=True,
        ),
        BuiltinHint(
            "zb", "zero-bubble 1F1B: split backward, W deferred into the drain (ZB-H1)",
            zero_bubble, split_backward=True,
        ),
        BuiltinHint(
            "zbv", "zero-bubble V: two chunks per rank in a V, split backward (ZB-V)",
            zero_bubble_v, split_backward=True, chunks="2", placements=(V,),
        ),
        BuiltinHint(
            "cp", "critical path first: longest remaining path to the end, from expected durations",
            by_priority, split_backward=True, takes_priorities=True, placements=(LOOPING, V),
        ),
    )
}


def builtin_hint(
    name: str,
    ranks: int,
    chunks: int,
    microbatches: int,
    costs: Sequence[float] | None = None,
    priorities: Mapping[Task, Sequence[float]] | None = None,
    placement: str | None = None,
) -> HintOrder:
    """Build a built-in hint by name; unknown names raise :class:`HintError` listing the choices.

    ``placement`` None is the hint's own (V for ``zbv``, looping for the others).
    """
    hint = BUILTIN_HINTS.get(name)
    if hint is None:
        raise HintError(f"unknown hint {name!r}; built-ins are {', '.join(BUILTIN_HINTS)}")
    return hint.build(ranks, chunks, microbatches, costs, priorities, placement)


def applicable_builtins(
    ranks: int, chunks: int, microbatches: int, costs: Sequence[float] | None = None,
    priorities: Mapping[Task, Sequence[float]] | None = None, placement: str = LOOPING,
) -> dict[str, HintOrder]:
    """Every built-in that can be generated for this shape (with this placement), built (used by ``--compare``).

    ``cp`` is included only when ``priorities`` are given.
    """
    built = {}
    for name, hint in BUILTIN_HINTS.items():
        if (hint.takes_priorities and priorities is None) or placement not in hint.placements:
            continue
        try:
            built[name] = hint.build(ranks, chunks, microbatches, costs, priorities, placement)
        except HintError:
            continue
    return built


def baseline_hint_name(chunks: int, placement: str = LOOPING) -> str:
    """The fixed order every speedup is measured against: 1F1B (interleaved when chunks >= 2), or ZB-V for V.

    Its per-rank peak in flight is also what the ``1f1b`` memory budget allows (``runtime.sched.arbiter``).
    """
    if placement == V:
        return "zbv"
    return "1f1b" if chunks == 1 else "interleaved-1f1b"


def peak_in_flight(order: Sequence[Task], shape: PipelineShape) -> int:
    """Most microbatch-chunks forwarded and not yet finished along one rank's order."""
    live = peak = 0
    for task in order:
        if task.kind is F:
            live += 1
            peak = max(peak, live)
        elif task.kind is shape.final_backward_of(task.stage):
            live -= 1
    return peak


__all__ = [
    "BUILTIN_HINTS",
    "BuiltinHint",
    "HintOrder",
    "MICROBATCH_ORDERS",
    "as_cost_ranked",
    "heaviest_first",
    "lightest_to_heaviest",
    "relabelled",
    "resolve_cost_ranked",
    "applicable_builtins",
    "baseline_hint_name",
    "breadth_first",
    "breadth_first_weighted",
    "builtin_hint",
    "by_priority",
    "gpipe",
    "interleaved_one_f_one_b",
    "microbatches_per_round",
    "one_f_one_b_family",
    "one_f_one_b",
    "one_f_one_b_warmups",
    "peak_in_flight",
    "sorted_one_f_one_b",
    "zero_bubble",
    "zero_bubble_v",
]
