"""Tests of runtime.sched.bounds: exact values on uniform pipelines, Jackson's rule against the
closed form, and validity (bound <= simulated makespan) for every built-in hint and policy."""

from __future__ import annotations

import itertools
import random
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hints.deps import TaskGraph, prerequisites
from hints.orders import applicable_builtins
from hints.tasks import PLACEMENTS, PipelineShape, V
from runtime.durations.variability import Durations
from runtime.sched.bounds import (
    LowerBound,
    bound_family,
    hint_bound,
    jackson_preemptive_bound,
    makespan_lower_bound,
    split_bound,
)
from runtime.sched.budget import MemoryBudget
from runtime.sched.results import ScheduleDeadlock
from runtime.sched.simulator import simulate
from tests.helpers.schedules import random_order_hint, unit_durations


def uniform_table(shape: PipelineShape, forward: float = 1.0, backward: float = 2.0,
                  latency: float = 0.0) -> Durations:
    stages, m = shape.stages, shape.microbatches
    return Durations(
        stages, m,
        forward=[[forward] * m for _ in range(stages)],
        backward=[[backward] * m for _ in range(stages)],
        send_forward=[[latency if k < stages - 1 else 0.0] * m for k in range(stages)],
        send_backward=[[latency if k > 0 else 0.0] * m for k in range(stages)],
        microbatch_costs=[1.0] * m,
        source="uniform",
    )


def random_table(shape: PipelineShape, seed: int, latency: float, recorded_split: bool) -> Durations:
    """Random F, B (or recorded I and W, with B = I + W), some zeros; random latencies, some zero."""
    rng = random.Random(seed)
    stages, m = shape.stages, shape.microbatches

    def work() -> list[list[float]]:
        return [[0.0 if rng.random() < 0.15 else rng.uniform(0.1, 3.0) for _ in range(m)] for _ in range(stages)]

    def latencies(sends: range) -> list[list[float]]:
        return [[latency * rng.uniform(0.0, 1.5) if k in sends and rng.random() < 0.8 else 0.0 for _ in range(m)]
                for k in range(stages)]

    forward = work()
    input_grad = weight_grad = None
    if recorded_split:
        input_grad, weight_grad = work(), work()
        backward = [[i + w for i, w in zip(ii, ww)] for ii, ww in zip(input_grad, weight_grad)]
    else:
        backward = work()
    return Durations(stages, m, forward, backward, latencies(range(stages - 1)), latencies(range(1, stages)),
                     [rng.random() for _ in range(m)], input_grad, weight_grad, source=f"random {seed}")


# -- exact values -------------------------------------------------------------
#
# Uniform F = 1, B = 2, no latency, one chunk (1F1B shapes), p ranks, m microbatches.
# Unsplit, rank r holds m jobs F (release r, tail 3p-1-r) and m jobs B (release 3p-2-2r,
# tail 2r); the job sets are "all" (r + 3m + 2r), "all F" (m + 3p-1) and "all B" (3p-2 + 2m),
# so the bound is 3(m + p - 1), the 1F1B makespan (tight), and the critical path F*p + B*p = 3p.
# Split (I = W = 1): F (release r, tail 2p-r), I (release 2p-1-r, tail r+1), W (release
# 2p-r, tail 0); "all" gives 3m + r and "I and W" 2m + 2p-1-r, so the bound is
# max(3m + p - 1, 2m + 2p - 1) and the critical path F*p + I*p + W = 2p + 1.

@pytest.mark.parametrize("p, m, value, binding", [
    (1, 1, 3, "critical path"), (1, 5, 15, "rank 0"), (4, 1, 12, "critical path"),
    (4, 2, 15, "rank 3"), (4, 4, 21, "rank 3"), (4, 8, 33, "rank 3"), (3, 7, 27, "rank 2"),
])
def test_unsplit_uniform_1f1b_shapes(p, m, value, binding):
    graph = TaskGraph.build(PipelineShape(p, 1, m))
    bound = makespan_lower_bound(graph, *unit_durations(graph))
    assert bound.value == value == 3 * (m + p - 1)
    assert bound.critical_path == 3 * p
    assert bound.binding == binding


@pytest.mark.parametrize("p, m, value, binding", [
    (1, 1, 3, "critical path"), (1, 5, 15, "rank 0"), (4, 1, 9, "critical path"),
    (4, 2, 11, "rank 0"), (4, 4, 15, "rank 0"), (4, 8, 27, "rank 3"), (8, 32, 103, "rank 7"),
])
def test_split_bound_uniform_1f1b_shapes(p, m, value, binding):
    shape = PipelineShape(p, 1, m)
    bound = split_bound(shape, uniform_table(shape))
    assert bound.value == value == max(3 * m + p - 1, 2 * m + 2 * p - 1)
    assert bound.critical_path == 2 * p + 1
    assert bound.binding == binding
    assert len(bound.rank_bounds) == p


def test_one_microbatch_with_latency_is_the_critical_path():
    # Forwards: 4 * 1 + 3 hops; backwards: 4 * 2 + 3 hops.
    graph = TaskGraph.build(PipelineShape(4, 1, 1))
    bound = makespan_lower_bound(graph, *unit_durations(graph, latency=0.5))
    assert bound.value == bound.critical_path == 4 + 8 + 2 * 3 * 0.5
    assert bound.binding == "critical path"


@given(st.integers(1, 3), st.integers(1, 6), st.booleans(), st.integers(0, 2**20))
def test_one_rank_bound_is_the_total_work(v, m, split, seed):
    shape = PipelineShape(1, v, m, split)
    graph = TaskGraph.build(shape)
    compute, transfer = random_table(shape, seed, 0.0, split).for_graph(graph)
    assert makespan_lower_bound(graph, compute, transfer).value == pytest.approx(sum(compute), rel=1e-12)


@given(st.integers(1, 4), st.integers(1, 3), st.booleans(), st.integers(0, 2**20), st.sampled_from([0.0, 0.7]))
def test_one_microbatch_bound_is_the_critical_path(p, v, split, seed, latency):
    # With one microbatch a rank's tasks form a chain of heads, so they never compete; except a
    # split backward with v > 1, where W of a later chunk competes with I of an earlier one.
    split = split and v == 1
    shape = PipelineShape(p, v, 1, split)
    graph = TaskGraph.build(shape)
    bound = makespan_lower_bound(graph, *random_table(shape, seed, latency, False).for_graph(graph))
    assert bound.value == pytest.approx(bound.critical_path, rel=1e-12)


def test_rejects_durations_of_the_wrong_length():
    graph = TaskGraph.build(PipelineShape(2, 1, 2))
    with pytest.raises(ValueError, match="one compute and one transfer time per task"):
        makespan_lower_bound(graph, [1.0] * len(graph), [0.0])


# -- Jackson's preemptive rule against the closed form -------------------------

def closed_form(release, processing, tail) -> float:
    """1|r_j,pmtn|max(C_j + q_j): max over job sets S of min r + sum p + min q."""
    jobs = range(len(release))
    return max(
        (min(release[j] for j in subset) + sum(processing[j] for j in subset) + min(tail[j] for j in subset)
         for size in range(1, len(release) + 1) for subset in itertools.combinations(jobs, size)),
        default=0.0,
    )


small_jobs = st.lists(st.tuples(st.integers(0, 8), st.integers(0, 4), st.integers(0, 8)), max_size=7)


@given(small_jobs)
def test_jackson_matches_the_closed_form(jobs):
    release, processing, tail = ([float(x) for x in column] for column in zip(*jobs)) if jobs else ([], [], [])
    assert jackson_preemptive_bound(release, processing, tail) == closed_form(release, processing, tail)


def heads_and_tails_by_recursion(graph: TaskGraph, compute, transfer):
    """Longest paths straight from deps.prerequisites, independent of bounds.py's passes."""
    shape = graph.shape
    consumers: dict[int, list[int]] = {t: [] for t in range(len(graph))}
    for tid, task in enumerate(graph.tasks):
        for need in prerequisites(task, shape):
            consumers[graph.tid(need)].append(tid)

    def edge(producer: int, consumer: int) -> float:
        return transfer[producer] if graph.rank[producer] != graph.rank[consumer] else 0.0

    @cache
    def head(tid: int) -> float:
        needs = (graph.tid(need) for need in prerequisites(graph.tasks[tid], shape))
        return max((head(n) + compute[n] + edge(n, tid) for n in needs), default=0.0)

    @cache
    def tail(tid: int) -> float:
        return max((edge(tid, c) + compute[c] + tail(c) for c in consumers[tid]), default=0.0)

    return [head(t) for t in range(len(graph))], [tail(t) for t in range(len(graph))]


@st.composite
def tiny_shapes(draw):
    """Shapes with at most 7 tasks per rank, so every job set of a rank can be enumerated."""
    split = draw(st.booleans())
    v = draw(st.integers(1, 2))
    kinds = 3 if split else 2
    m = draw(st.integers(1, max(1, 7 // (v * kinds))))
    return PipelineShape(draw(st.integers(1, 3)), v, m, split)


@given(tiny_shapes(), st.integers(0, 2**20), st.sampled_from([0.0, 0.5]))
def test_rank_bounds_match_the_closed_form(shape, seed, latency):
    graph = TaskGraph.build(shape)
    compute, transfer = random_table(shape, seed, latency, shape.split_backward).for_graph(graph)
    bound = makespan_lower_bound(graph, compute, transfer)
    head, tail = heads_and_tails_by_recursion(graph, compute, transfer)
    assert bound.critical_path == pytest.approx(max(h + c + q for h, c, q in zip(head, compute, tail)))
    for rank in range(shape.ranks):
        tids = [t for t in range(len(graph)) if graph.rank[t] == rank]
        expected = closed_form([head[t] for t in tids], [compute[t] for t in tids], [tail[t] for t in tids])
        assert bound.rank_bounds[rank] == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert bound.value == max(bound.critical_path, *bound.rank_bounds)


# -- validity: no hint, policy or budget beats the bound ------------------------

@settings(max_examples=120)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 6), st.booleans(), st.booleans(),
       st.integers(0, 2**20), st.sampled_from([0.0, 0.0, 0.3, 1.0]), st.sampled_from(PLACEMENTS))
def test_no_schedule_beats_the_bound(p, v, m, split, recorded_split, seed, latency, placement):
    v = 2 if placement == V else v  # a V shape has two chunks per rank
    shape = PipelineShape(p, v, m, split, placement)
    table = random_table(shape, seed, latency, recorded_split)
    bound = split_bound(shape, table)
    assert isinstance(bound, LowerBound)

    hints = list(applicable_builtins(p, v, m, costs=table.microbatch_costs, placement=placement).values())
    hints.append(random_order_hint(shape, seed))  # the drawn split flag, any order
    budgets = [MemoryBudget.parse("1f1b"), MemoryBudget.parse("2x")]
    for hint in hints:
        graph = TaskGraph.build(hint.shape)
        runs = [("ready", budget) for budget in budgets] + [("fixed", None)]
        for policy, budget in runs:
            try:
                result = simulate(hint, table, policy, budget, graph=graph)
            except ScheduleDeadlock:
                assert hint.name.startswith("random") and policy == "fixed"  # random orders may deadlock
                continue
            assert bound.value <= result.makespan + 1e-9, (hint.name, policy, budget)


@settings(max_examples=80)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 6), st.booleans(), st.integers(0, 2**20),
       st.sampled_from([0.0, 0.3, 1.0]), st.sampled_from([1.0, 1.0, 1.6]), st.sampled_from(PLACEMENTS))
def test_no_schedule_of_a_family_beats_its_bound(p, v, m, recorded_split, seed, latency, overhead, placement):
    """[Note: bound per hint family]: each hint's own-graph bound holds for every policy and budget, and is at
    least the universal one (a charged split, ``overhead`` > 1, only raises it)."""
    from dataclasses import replace

    v = 2 if placement == V else v
    shape = PipelineShape(p, v, m, False, placement)
    table = random_table(shape, seed, latency, recorded_split)
    if not recorded_split:
        table = replace(table, split_overhead=overhead)
    universal = split_bound(shape, table)
    hints = list(applicable_builtins(p, v, m, costs=table.microbatch_costs, placement=placement).values())
    for hint in hints:
        graph = TaskGraph.build(hint.shape)
        family = hint_bound(hint.shape, table, graph)
        assert family.value >= universal.value - 1e-9, hint.name
        for policy, budget in (("ready", MemoryBudget.parse("1f1b")), ("ready", MemoryBudget.parse("2x")),
                               ("fixed", None)):
            result = simulate(hint, table, policy, budget, graph=graph)
            assert family.value <= result.makespan + 1e-9, (hint.name, bound_family(hint.shape), policy, budget)


def test_the_full_backward_bound_is_tighter_where_the_gradient_waits_for_the_whole_backward():
    """Two stages, one microbatch, F = 1 and B = 2 everywhere: with full backwards the chain is F0 F1 B1 B0 = 6;
    the free split lets stage 0's backward start when stage 1's I (1) ends: 1 + 1 + 1 + 1 + 1 = 5."""
    shape = PipelineShape(2, 1, 1)
    table = Durations(2, 1, [[1.0], [1.0]], [[2.0], [2.0]], [[0.0], [0.0]], [[0.0], [0.0]], [1.0])
    assert hint_bound(shape, table).value == pytest.approx(6.0)
    assert split_bound(shape, table).value == pytest.approx(5.0)
    assert bound_family(shape) == "full-backward"
    assert bound_family(shape.with_split(True)) == "split"
    assert bound_family(PipelineShape(6, 1, 2, True, fused_stages=frozenset({0, 1, 2, 4}))) == \
        "split except stages 0..2,4"
