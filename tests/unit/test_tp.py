"""TP coordination without processes ([Note: TP coordination] in runtime/exec/tp_follow.py), the grid, and sharding.

The model: ``p`` pipeline ranks, each a TP group of ``T`` members. Every task
of a group holds a collective, so it ends only when all members of its group
run it at once; members running *different* tasks at once is the hazard
(mismatched collectives: a hang or corrupted sums). Messages travel in one
FIFO per directed link, data between counterpart members and decisions from
a leader to its followers; which link delivers next is drawn at random, so
every member sees its own arrival order. After each event every idle member
asks its arbiter, as the executor's loop does.
"""

from __future__ import annotations

import random
from collections import deque

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hints.deps import TaskGraph
from hints.orders import builtin_hint
from hints.tasks import Task
from runtime.comm.grid import ProcessGrid
from runtime.exec.tp_follow import Announcer, FollowerArbiter
from runtime.sched.budget import MemoryBudget
from runtime.sched.rules import make_arbiter
from runtime.workloads.tp_layers import unshard


class Mismatch(AssertionError):
    """Members of one TP group ran different tasks at once (their collectives would not match)."""


class Deadlock(AssertionError):
    pass


def run_group_model(hint, members: int, rule: str, budget: str, pick, coordinated: bool = True):
    """Run one iteration of the model; returns each member's executed task ids, ``[rank][member]``.

    ``pick(n)`` chooses which of ``n`` possible events happens next (hypothesis draws, or a seeded RNG).
    """
    shape = hint.shape
    graph = TaskGraph.build(shape)
    budgets = MemoryBudget.parse(budget).per_rank(shape) if rule != "fixed" else [None] * shape.ranks
    links: dict[tuple, deque] = {}  # (src, dst) member -> FIFO of ("data", tid) / ("decision", index, task)

    def post(src, dst, message):
        links.setdefault((src, dst), deque()).append(message)

    arbiters = {}
    for rank in range(shape.ranks):
        order = hint.orders[rank]
        for member in range(members):
            if member == 0 or not coordinated:
                arbiter = make_arbiter(rule, graph, rank, order, budgets[rank], estimates=[1.0] * len(graph))
                if coordinated and members > 1:
                    arbiter = Announcer(arbiter, lambda index, task, _ns, rank=rank: [
                        post((rank, 0), (rank, t), ("decision", index, task)) for t in range(1, members)])
            else:
                arbiter = FollowerArbiter(graph, rank, order)
            arbiters[rank, member] = arbiter
    running: dict[tuple, int | None] = dict.fromkeys(arbiters)
    executed: dict[tuple, list[int]] = {key: [] for key in arbiters}

    def decide_all():
        for key, arbiter in arbiters.items():
            if running[key] is None and not arbiter.done:
                running[key] = arbiter.choose(0.0)

    decide_all()
    while not all(a.done for a in arbiters.values()):
        events = [("deliver", link) for link, fifo in sorted(links.items()) if fifo]
        for rank in range(shape.ranks):
            tasks = {running[rank, t] for t in range(members)}
            if None not in tasks and len(tasks) > 1:
                raise Mismatch(f"rank {rank}: members run {sorted(str(graph.tasks[t]) for t in tasks)} at once")
            if tasks != {None} and len(tasks) == 1:
                events.append(("finish", rank))
        if not events:
            raise Deadlock({key: [str(graph.tasks[t]) for t in done] for key, done in executed.items()})
        kind, where = events[pick(len(events))]
        if kind == "deliver":
            src, dst = where
            message = links[where].popleft()
            if message[0] == "data":
                arbiters[dst].available(message[1])
            else:
                arbiters[dst].follow(message[1], message[2])
        else:
            tid = running[where, 0]
            for member in range(members):
                key = (where, member)
                arbiters[key].finish(tid)
                executed[key].append(tid)
                running[key] = None
                for consumer in graph.remote_consumers[tid]:
                    post(key, (graph.rank[consumer], member), ("data", tid))
        decide_all()
    return {rank: [executed[rank, t] for t in range(members)] for rank in range(shape.ranks)}, graph


HINTS = [("1f1b", 1), ("zb", 1), ("interleaved-1f1b", 2), ("gpipe", 1)]


@given(hint_index=st.integers(0, len(HINTS) - 1), ranks=st.integers(2, 3), members=st.integers(2, 3),
       rule=st.sampled_from(["fixed", "greedy", "lookahead"]), budget=st.sampled_from(["1f1b", "2x", "8"]),
       data=st.data())
def test_coordinated_members_run_one_order_and_never_deadlock(hint_index, ranks, members, rule, budget, data):
    name, chunks = HINTS[hint_index]
    hint = builtin_hint(name, ranks, chunks, 2 * ranks)
    pick = lambda n: data.draw(st.integers(0, n - 1))  # noqa: E731 - the arrival order, per event
    orders, graph = run_group_model(hint, members, rule, budget, pick)
    for rank, by_member in orders.items():
        assert sorted(by_member[0]) == sorted(graph.ids(hint.orders[rank])), "every task ran once"
        assert all(order == by_member[0] for order in by_member), f"rank {rank}: members ran different orders"


def test_uncoordinated_members_reach_mismatched_collectives():
    """The hazard is real in the model: members choosing readiness-first on their own diverge."""
    hint = builtin_hint("1f1b", 3, 1, 6)
    mismatches = 0
    for seed in range(40):
        rng = random.Random(seed)
        try:
            run_group_model(hint, 2, "greedy", "8", lambda n: rng.randrange(n), coordinated=False)
        except (Mismatch, Deadlock):
            mismatches += 1
    assert mismatches > 0
    # ... and the same draws, coordinated, always agree
    for seed in range(40):
        rng = random.Random(seed)
        orders, _ = run_group_model(hint, 2, "greedy", "8", lambda n: rng.randrange(n))
        assert all(by_member[0] == by_member[1] for by_member in orders.values())


def test_follower_runs_decisions_in_order_once_inputs_arrive():
    hint = builtin_hint("1f1b", 2, 1, 4)
    graph = TaskGraph.build(hint.shape)
    follower = FollowerArbiter(graph, 1, hint.orders[1], record=True)
    assert follower.choose() is None  # no decision yet, although 1F0 is... not ready either
    follower.follow(0, Task.parse("1F0"), decided_ns=5, arrived_ns=7)
    assert follower.choose() is None  # decided, but its input has not arrived here
    follower.available(graph.tid(Task.parse("0F0")))
    follower.available(graph.tid(Task.parse("0F1")))  # 1F1 ready too, but not decided
    assert graph.tasks[follower.choose()] == Task.parse("1F0")
    assert follower.choose() is None
    decision = follower.decisions[-1]
    assert (decision.index, decision.leader_ns, decision.decision_arrived_ns) == (0, 5, 7)
    with pytest.raises(RuntimeError, match="expected 1"):
        follower.follow(2, Task.parse("1F1"))
    with pytest.raises(RuntimeError, match="task of pipeline rank 0"):
        follower.follow(1, Task.parse("0F1"))


def test_grid_layout_and_links():
    grid = ProcessGrid(pp=4, tp=2, dp=2, rank=13)
    assert (grid.pipe_rank, grid.tp_rank, grid.dp_rank) == (1, 1, 1)
    assert grid.global_rank(1) == 13 and grid.leader == 9 and grid.followers == []
    assert ProcessGrid(4, 2, 2, 9).followers == [13]
    assert [ProcessGrid(4, 2, 2, r).coordinates(r) for r in (0, 5, 8)] == [(0, 0, 0), (1, 1, 0), (0, 0, 1)]
    assert ProcessGrid(4, 2, 1).tp_members(3, 0) == [3, 7] and ProcessGrid(4, 1, 2).dp_members(2, 0) == [2, 6]
    links = ProcessGrid(2, 2, 1).links([(0, 1), (1, 0)])
    assert links == [(0, 1), (0, 2), (1, 0), (1, 3), (2, 3), (3, 2)]  # slices 0-1 and 2-3, decisions 0->2, 1->3
    with pytest.raises(ValueError):
        ProcessGrid(2, 2, 1, rank=4)


def test_unshard_inverts_the_shard_layout():
    from runtime.workloads.tp_layers import TPShard, _shard

    whole = torch.arange(24.0).reshape(12, 2)
    for layout in ((0, 3), (0, 1), (1, 1)):
        source = whole if layout[0] == 0 else whole.T.contiguous()
        shards = [_shard(source, layout, TPShard(r, 2, None)).detach() for r in range(2)]
        assert torch.equal(unshard(shards, layout), source)
    q, k, v = whole.chunk(3)  # qkv: member 0 holds the first half of each of q, k, v
    assert torch.equal(_shard(whole, (0, 3), TPShard(0, 2, None)).detach(), torch.cat([q[:2], k[:2], v[:2]]))
