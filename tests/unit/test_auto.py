"""``--policy auto`` ([Note: the auto policy] in runtime.sched.auto) and the realized tables it replays."""

from __future__ import annotations

import pytest

from hints.deps import TaskGraph
from hints.tasks import PipelineShape
from runtime.durations.variability import VariabilityModel, sample_durations
from runtime.run.auto import realized_table
from runtime.sched.auto import AutoPolicy, _Observed, simulate_auto
from runtime.sched.budget import MemoryBudget
from runtime.sched.evaluate import resolve
from runtime.sched.rules import RULES
from runtime.sched.simulator import simulate

pytestmark = pytest.mark.unit

LOOKAHEAD = RULES["lookahead"]


def policy_with(observed, budget="1f1b") -> AutoPolicy:
    policy = AutoPolicy(LOOKAHEAD, MemoryBudget.parse(budget))
    policy.observed = list(observed)
    return policy


def hint_1f1b():
    return resolve("1f1b", 4, 1, 8)


def test_first_iterations_run_ready():
    policy = policy_with([])
    assert policy.decide(0, hint_1f1b()).rule == "lookahead"
    policy.observed = [_Observed(ready=2.0, fixed=1.0, ran="lookahead", realized=None, forecast_error=None)]
    decision = policy.decide(1, hint_1f1b())  # fixed looks 2x faster, but no prediction was checked yet
    assert decision.rule == "lookahead" and "no prediction checked" in decision.reason


def test_switches_to_fixed_only_beyond_the_measured_error():
    seen = [_Observed(1.10, 1.00, "lookahead", None, 0.02), _Observed(1.10, 1.00, "lookahead", None, 0.02)]
    decision = policy_with(seen).decide(2, hint_1f1b())
    assert decision.rule == "fixed" and decision.error == pytest.approx(0.02)
    noisy = [_Observed(1.10, 1.00, "lookahead", None, 0.15), _Observed(1.10, 1.00, "lookahead", None, 0.15)]
    assert policy_with(noisy).decide(2, hint_1f1b()).rule == "lookahead"
    # the replay's own error counts too: realized 1.3 s where the replay of what ran said 1.1 s
    off = [_Observed(1.10, 1.00, "lookahead", 1.3, 0.0), _Observed(1.10, 1.00, "lookahead", 1.3, 0.0)]
    decision = policy_with(off).decide(2, hint_1f1b())
    assert decision.rule == "lookahead" and decision.error == pytest.approx(0.2 / 1.3)


def test_never_fixed_when_the_fixed_order_exceeds_the_budget():
    gpipe = resolve("gpipe", 4, 1, 8)  # every forward first: 8 in flight on rank 0, over 1F1B's 4
    seen = [_Observed(2.0, 1.0, "lookahead", None, 0.0)] * 2
    decision = policy_with(seen).decide(2, gpipe)
    assert decision.rule == "lookahead" and "more than the budget" in decision.reason
    assert policy_with(seen, "8").decide(2, gpipe).rule == "fixed"  # 8 slots on every rank fit it


def test_simulate_auto_takes_the_chosen_rules_makespans_and_counts_switches():
    shape = PipelineShape(8, 2, 32)
    model = VariabilityModel(workload="sft-chat", jitter=0.1)
    tables = [sample_durations(model, shape, seed) for seed in range(5)]
    pairs = [(resolve("interleaved-1f1b", 8, 2, 32, table), table) for table in tables]
    rows, policy = simulate_auto(pairs, LOOKAHEAD, MemoryBudget.parse("1f1b"))
    assert len(rows) == 5 and rows[0].decision.rule == "lookahead"
    for row, (hint, table) in zip(rows, pairs):
        assert row.ready == simulate(hint, table, LOOKAHEAD, MemoryBudget.parse("1f1b")).makespan
        assert row.fixed == simulate(hint, table, "fixed").makespan
        assert row.makespan == (row.fixed if row.decision.rule == "fixed" else row.ready)
    assert policy.switches == sum(1 for a, b in zip(rows, rows[1:]) if a.decision.rule != b.decision.rule)
    assert [r.decision for r in rows] == policy.decisions


@pytest.mark.parametrize("hint_name, chunks", [("1f1b", 1), ("zb", 1), ("cp", 1), ("zbv", 2)])
def test_realized_table_gives_back_the_per_task_durations(hint_name, chunks):
    """What rrfp run gathers (per task id: compute, latency of its message) becomes a table whose for_graph is
    those same lists: the replay sees exactly what ran."""
    shape = PipelineShape(4, chunks, 8, placement="v" if hint_name == "zbv" else "looping")
    table = sample_durations(VariabilityModel(workload="sft-chat", jitter=0.2, comm_latency=0.002), shape, 1)
    hint = resolve(hint_name, 4, chunks, 8, table, shape.placement)
    graph = TaskGraph.build(hint.shape)
    compute, transfer = table.for_graph(graph)
    rebuilt = realized_table(graph, compute, transfer)
    assert rebuilt.for_graph(graph) == (compute, transfer)
