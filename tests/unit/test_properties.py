"""Property tests (hypothesis): random shapes, durations, hints and budgets.

For every case: each task runs exactly once, one task at a time per rank,
every dependency holds (with its transfer latency), the ``ready`` policy never
exceeds its memory budget and never deadlocks, and ``fixed`` either runs the
hint exactly or reports a deadlock (never hangs). Shapes are drawn with both
placements (a V shape has two chunks per rank), so the reservation rule's
proof for V ([Note: memory budget and chunk deadlock]) is checked too.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hints.deps import TaskGraph, prerequisites
from hints.errors import UserError
from hints.orders import applicable_builtins, builtin_hint
from hints.tasks import PLACEMENTS, PipelineShape, V
from runtime.sched.budget import MemoryBudget
from runtime.sched.results import ScheduleDeadlock
from runtime.sched.simulator import simulate
from tests.helpers.schedules import random_order_hint


def random_durations(graph: TaskGraph, seed: int, latency: float):
    rng = random.Random(seed)
    compute = [0.0 if rng.random() < 0.1 else rng.uniform(0.1, 3.0) for _ in range(len(graph))]
    transfer = [latency * rng.uniform(0.5, 1.5) if graph.remote_consumers[t] else 0.0 for t in range(len(graph))]
    return compute, transfer


def check_run(result, hint, compute, transfer, budgets):
    graph = result.graph
    shape = graph.shape
    executed = sorted(t for rank in result.executed for t in rank)
    assert executed == list(range(len(graph))), "every task runs exactly once"
    for rank, tids in enumerate(result.executed):
        assert all(graph.rank[t] == rank for t in tids)
        for before, after in zip(tids, tids[1:]):
            assert result.end[before] <= result.start[after] + 1e-12, "one task at a time"
        for t in tids:
            assert result.end[t] == pytest.approx(result.start[t] + compute[t])
    for tid, task in enumerate(graph.tasks):
        for need in prerequisites(task, shape):
            producer = graph.tid(need)
            delay = transfer[producer] if graph.rank[producer] != graph.rank[tid] else 0.0
            assert result.start[tid] >= result.end[producer] + delay - 1e-9, f"{task} started before {need}"
    if budgets is not None:
        for rank, tids in enumerate(result.executed):
            live = peak = 0
            for t in tids:  # sequential per rank: the walk order is the time order
                if graph.is_forward[t]:
                    live += 1
                    peak = max(peak, live)
                elif graph.frees[t]:
                    live -= 1
            assert peak <= budgets[rank], f"rank {rank} held {peak} > budget {budgets[rank]}"
            assert peak == result.peak_in_flight[rank]
    makespan = max(result.end) if result.end else 0.0
    assert result.makespan == makespan


placements = st.sampled_from(PLACEMENTS)


def chunks_for(placement: str, v: int) -> int:
    """A drawn chunk count, or the two chunks a V shape has."""
    return 2 if placement == V else v


def random_case(p: int, v: int, m: int, split: bool, seed: int, latency: float, placement: str):
    """A random structurally valid order of that shape (chunks as the placement allows), its compiled graph
    and random durations: ``(hint, graph, compute, transfer)``."""
    shape = PipelineShape(p, chunks_for(placement, v), m, split, placement)
    hint = random_order_hint(shape, seed)
    graph = TaskGraph.build(shape)
    return (hint, graph, *random_durations(graph, seed, latency))


@st.composite
def scenarios(draw):
    p = draw(st.integers(1, 5))
    placement = draw(placements)
    v = chunks_for(placement, draw(st.integers(1, 3)))
    m = draw(st.integers(1, 8))
    name = draw(st.sampled_from(list(applicable_builtins(p, v, m, placement=placement))))
    seed = draw(st.integers(0, 2**20))
    latency = draw(st.sampled_from([0.0, 0.0, 0.2, 1.0]))
    budget = draw(st.one_of(st.sampled_from(["1f1b", "2x", "1.5x"]), st.integers(v, v * m + 2).map(str)))
    return p, v, m, placement, name, seed, latency, budget


@given(scenarios())
def test_builtin_hints_under_both_policies(case):
    p, v, m, placement, name, seed, latency, budget_text = case
    hint = builtin_hint(name, p, v, m, costs=[random.Random(seed + i).random() for i in range(m)],
                        placement=placement)
    graph = TaskGraph.build(hint.shape)
    compute, transfer = random_durations(graph, seed, latency)
    fixed = simulate(hint, (compute, transfer), "fixed", graph=graph)
    check_run(fixed, hint, compute, transfer, None)
    for rank in range(p):
        assert tuple(fixed.executed_tasks(rank)) == hint.orders[rank]
    budget = MemoryBudget.parse(budget_text)
    ready = simulate(hint, (compute, transfer), "ready", budget, graph=graph)
    check_run(ready, hint, compute, transfer, budget.per_rank(hint.shape))


@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 6), st.booleans(), st.integers(0, 2**20),
       st.sampled_from([0.0, 0.5]), placements)
def test_random_orders_ready_never_deadlocks_fixed_reports(p, v, m, split, seed, latency, placement):
    # [Note: memory budget and chunk deadlock]: any structurally valid order, any budget that holds one
    # microbatch, either placement: the ready policy completes within the budget.
    hint, graph, compute, transfer = random_case(p, v, m, split, seed, latency, placement)
    v = hint.shape.chunks
    budget = [v + seed % (v * m)] * p  # anything from one microbatch (v slots) upwards
    ready = simulate(hint, (compute, transfer), "ready", budget, graph=graph)
    check_run(ready, hint, compute, transfer, budget)
    try:
        fixed = simulate(hint, (compute, transfer), "fixed", graph=graph)
    except ScheduleDeadlock as err:
        assert "cannot complete under the fixed policy" in str(err)
        assert "<--" in err.details  # the grid marks where a rank is stuck
    else:
        check_run(fixed, hint, compute, transfer, None)
        for rank in range(p):
            assert tuple(fixed.executed_tasks(rank)) == hint.orders[rank]


@given(st.integers(1, 4), st.integers(2, 4), st.integers(1, 6))
def test_budgets_below_one_microbatch_are_rejected(p, v, m):
    shape = PipelineShape(p, v, m)
    with pytest.raises(UserError, match="smallest that can complete"):
        MemoryBudget.parse(str(v - 1)).per_rank(shape)


def noisy_estimates(compute, transfer, seed: int):
    """What a lookahead rule would expect: the true durations off by up to 3x either way, or unknown."""
    rng = random.Random(seed + 1)
    guess = [None if rng.random() < 0.1 else c * rng.uniform(0.33, 3.0) for c in compute]
    return guess, [t * rng.uniform(0.0, 2.0) for t in transfer]


def unknown_as_zero(estimates):
    """The simulator's arrival predictions need numbers: an unknown duration predicts an instant arrival."""
    guess, latency = estimates
    return [0.0 if g is None else g for g in guess], latency


def drawn_hint(p: int, v: int, m: int, split: bool, seed: int, builtin: bool, placement: str):
    """A built-in of this shape with the drawn backward (``builtin``), else a random valid order."""
    hints = applicable_builtins(p, v, m, placement=placement) if builtin else {}
    shape = PipelineShape(p, v, m, split, placement)
    hints = [h for h in hints.values() if h.shape.split_backward == split] or [random_order_hint(shape, seed)]
    return hints[seed % len(hints)]


@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 6), st.booleans(), st.integers(0, 2**20),
       st.sampled_from([0.0, 0.5]), st.booleans(), placements)
def test_lookahead_never_deadlocks_and_keeps_the_budget(p, v, m, split, seed, latency, builtin, placement):
    # [Note: lookahead admission]: waits only on pending events, so whatever the estimates say, every
    # task runs, every dependency holds and the budget is kept; builtin and random orders alike.
    v = chunks_for(placement, v)
    hint = drawn_hint(p, v, m, split, seed, builtin, placement)
    graph = TaskGraph.build(hint.shape)
    compute, transfer = random_durations(graph, seed, latency)
    budget = [v + seed % (v * m)] * p
    guess, expected_latency = noisy_estimates(compute, transfer, seed)
    # The arbiter sees unknown estimates as None; the simulator's predictions use them as 0.
    result = simulate(hint, (compute, transfer), "lookahead", budget, graph=graph,
                      estimates=unknown_as_zero((guess, expected_latency)))
    check_run(result, hint, compute, transfer, budget)


@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 6), st.booleans(), st.integers(0, 2**20),
       st.sampled_from([0.0, 0.5]), st.booleans(), placements, st.booleans(),
       st.sampled_from(["each task", "backwards"]))
def test_lookahead_waits_as_often_as_it_can_and_still_completes(p, v, m, split, seed, latency, builtin, placement,
                                                                at_peak, slow):
    # [Note: lookahead admission], both heads: estimates that make the rule wait whenever it may. A task
    # estimated at 100 s (far more than any task takes) never ends by a prediction; one at 0 always does.
    # Either each task is one or the other at random, or every backward is slow and every forward instant
    # (so the tasks that end in time are often admissions the budget holds back). A wait for a forward or a
    # backward head must still end on its arrival or its wake-up: every task runs, every dependency holds,
    # and the budget is kept, under the reservation rule (drawn budgets) and [Note: safe-state admission]
    # (the hint's own fixed peak per rank).
    from runtime.sched.fixed_order import order_peaks

    v = chunks_for(placement, v)
    hint = drawn_hint(p, v, m, split, seed, builtin, placement)
    graph = TaskGraph.build(hint.shape)
    compute, transfer = random_durations(graph, seed, latency)
    if at_peak:
        budget = [max(v, peak) for peak in order_peaks(graph, [graph.ids(order) for order in hint.orders])]
    else:
        budget = [v + seed % (v * m)] * p
    rng = random.Random(seed + 2)
    if slow == "each task":
        guess = [rng.choice([0.0, 100.0]) for _ in range(len(graph))]
    else:
        guess = [0.0 if graph.is_forward[t] else 100.0 for t in range(len(graph))]
    result = simulate(hint, (compute, transfer), "lookahead", budget, graph=graph, record=True,
                      estimates=(guess, [t * rng.uniform(0.0, 2.0) for t in transfer]))
    check_run(result, hint, compute, transfer, budget)
    assert sorted(graph.tid(d.chosen) for d in result.decisions) == list(range(len(graph)))


@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 6), st.booleans(), st.integers(0, 2**20),
       st.sampled_from([0.0, 0.5]), st.sampled_from([0.0, 0.3]), placements)
def test_fixed_without_events_equals_the_event_loop(p, v, m, split, seed, latency, overhead, placement):
    # [Note: exact order without events]: record=False takes the arithmetic path, record=True the event
    # loop; every time, order and peak must be the same (and a deadlock is reported either way).
    v = chunks_for(placement, v)
    shape = PipelineShape(p, v, m, split, placement)
    builtins = [h for h in applicable_builtins(p, v, m, placement=placement).values()
                if h.shape.split_backward == split]
    hint = builtins[seed % len(builtins)] if builtins and seed % 3 else random_order_hint(shape, seed)
    graph = TaskGraph.build(hint.shape)
    compute, transfer = random_durations(graph, seed, latency)
    outcomes = []
    for record in (False, True):
        try:
            result = simulate(hint, (compute, transfer), "fixed", graph=graph, record=record, overhead=overhead)
        except ScheduleDeadlock as err:
            outcomes.append(str(err))
        else:
            outcomes.append((result.makespan, result.start, result.end, result.executed, result.busy,
                             result.peak_in_flight))
    assert outcomes[0] == outcomes[1]


def check_rendezvous(result, async_result, compute, transfer, overhead):
    """[Note: blocking p2p] holds in ``result``: each message completes at max(send, receive posted) +
    latency; its consumer starts no earlier, nor does its producer's next task; never before async."""
    graph = result.graph
    before, after = {}, {}
    for tids in result.executed:
        for earlier, later in zip(tids, tids[1:]):
            before[later], after[earlier] = earlier, later
    for producer, consumers in enumerate(graph.remote_consumers):
        for consumer in consumers:
            posted = result.end[before[consumer]] if consumer in before else 0.0
            done = max(result.end[producer], posted) + transfer[producer]
            assert result.start[consumer] >= done + overhead - 1e-9
            if producer in after:
                assert result.start[after[producer]] >= done + overhead - 1e-9
    for tid in range(len(graph)):
        assert result.start[tid] >= async_result.start[tid] - 1e-9
    assert result.makespan >= async_result.makespan - 1e-12


@given(st.integers(1, 6), st.integers(1, 12), st.integers(0, 2**20), st.sampled_from([0.0, 0.2, 1.0]),
       st.sampled_from([0.0, 0.3]), st.booleans())
def test_blocking_1f1b_is_never_faster_than_async(p, m, seed, latency, overhead, split):
    # 1F1B (and ZB-H1, its split form) never deadlock under blocking p2p; on any durations the rule holds
    # message by message, and no task starts earlier than with buffered links.
    hint = builtin_hint("zb" if split else "1f1b", p, 1, m)
    graph = TaskGraph.build(hint.shape)
    compute, transfer = random_durations(graph, seed, latency)
    async_result = simulate(hint, (compute, transfer), "fixed", graph=graph, overhead=overhead)
    result = simulate(hint, (compute, transfer), "fixed", graph=graph, overhead=overhead, p2p="blocking")
    check_run(result, hint, compute, transfer, None)
    for rank in range(p):
        assert tuple(result.executed_tasks(rank)) == hint.orders[rank]
    check_rendezvous(result, async_result, compute, transfer, overhead)


@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 6), st.booleans(), st.integers(0, 2**20),
       st.sampled_from([0.0, 0.5]), placements)
def test_blocking_random_orders_complete_or_report(p, v, m, split, seed, latency, placement):
    # Any structurally valid order either completes under the rule or is reported (never hangs); one that
    # completes under blocking p2p completes async too (the rule only adds waits).
    hint, graph, compute, transfer = random_case(p, v, m, split, seed, latency, placement)
    try:
        result = simulate(hint, (compute, transfer), "fixed", graph=graph, p2p="blocking")
    except ScheduleDeadlock as err:
        assert "cannot complete with blocking p2p" in str(err)
        assert "<--" in err.details
        return
    async_result = simulate(hint, (compute, transfer), "fixed", graph=graph)
    check_run(result, hint, compute, transfer, None)
    check_rendezvous(result, async_result, compute, transfer, 0.0)


@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 6), st.booleans(), st.integers(0, 2**20),
       st.sampled_from([0.0, 0.5]), st.booleans(), placements, st.sampled_from(["greedy", "lookahead"]))
def test_safe_state_admission_never_deadlocks_and_keeps_the_budget(p, v, m, split, seed, latency, builtin,
                                                                    placement, rule):
    # [Note: safe-state admission]: budgets at or a little above the hint's own fixed peak per rank, so the
    # arbiters test every forward against the fixed continuation; every task runs, the budget holds.
    from runtime.sched.fixed_order import completes_within, order_peaks

    v = chunks_for(placement, v)
    hint = drawn_hint(p, v, m, split, seed, builtin, placement)
    graph = TaskGraph.build(hint.shape)
    orders = [graph.ids(order) for order in hint.orders]
    rng = random.Random(seed)
    budget = [max(v, peak + rng.choice([0, 0, 1, 3])) for peak in order_peaks(graph, orders)]
    compute, transfer = random_durations(graph, seed, latency)
    estimates = unknown_as_zero(noisy_estimates(compute, transfer, seed))
    result = simulate(hint, (compute, transfer), rule, budget, graph=graph, estimates=estimates)
    check_run(result, hint, compute, transfer, budget)
    try:
        simulate(hint, (compute, transfer), "fixed", graph=graph)
    except ScheduleDeadlock:
        assert not completes_within(graph, orders, budget)
    else:
        assert completes_within(graph, orders, budget)


@given(st.integers(1, 4), st.integers(1, 3), st.integers(2, 6), st.integers(0, 2**20), placements,
       st.sampled_from([0, 1, 2, 5, None]))
def test_safe_state_test_equals_the_continuations_peak(p, v, m, seed, placement, near):
    # The test's answer is the definition: the hint order continued from the state (started positions
    # removed) stays within the budget once the forward at h starts too. Positions start in a random order
    # through the arbiter's own _start; windows narrower than the default ([Note: safe-state admission]) send
    # most of them, and most queries, to the tree.
    from runtime.sched.arbiter import ReadyArbiter

    v = chunks_for(placement, v)
    hint = random_order_hint(PipelineShape(p, v, m, True, placement), seed)
    graph = TaskGraph.build(hint.shape)
    rng = random.Random(seed)
    rank = seed % p
    arbiter = ReadyArbiter(graph, rank, hint.orders[rank], budget=v * m, safe=True)
    if near is not None:
        arbiter._near = near
    change = [1 if graph.is_forward[t] else (-1 if graph.frees[t] else 0) for t in arbiter.tids]
    started = set()
    for h in rng.sample(range(len(change)), rng.randrange(len(change))):
        started.add(h)
        arbiter._start(h)
        if rng.random() < 0.3:  # a query between starts brings the tree up to date part way
            arbiter.continuation_peak()
    remaining = [change[k] for k in range(len(change)) if k not in started]
    committed = max(0, max(itertools.accumulate(remaining), default=0))  # the continuation's own peak
    assert arbiter.continuation_peak() == committed
    arbiter.in_flight = rng.randrange(arbiter.budget - committed + 1)  # a state the invariant admits
    for h, d in enumerate(change):
        if d != 1 or h in started:
            continue
        rest = [change[k] for k in range(len(change)) if k not in started and k != h]
        live = arbiter.in_flight + 1
        peak = live
        for x in rest:
            live += x
            peak = max(peak, live)
        assert arbiter.safe_to_start(h) == (peak <= arbiter.budget)
