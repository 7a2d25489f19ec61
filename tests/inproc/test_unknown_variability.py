"""benchmarks/unknown_variability.py's yardsticks (``--oracle``): where nothing varies, knowing every duration is
worth nothing and the revealed run is ready ``planned`` itself ([Note: what a revealed cost is worth] in the
script's docstring)."""

from __future__ import annotations

import statistics

import pytest

from hints.tasks import PipelineShape
from profiler.bench.cells import simulate_table
from runtime.durations.variability import VariabilityModel, sample_durations
from runtime.sched.budget import MemoryBudget
from runtime.sched.evaluate import planned_baseline
from tests.helpers.cli import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("benchmarks/unknown_variability.py")


def test_realized_costs_are_the_spent_seconds_in_the_tables_units(script):
    table = sample_durations(VariabilityModel(workload="vlm-mixed", jitter=0.3, unknown="cost-error=0.4"),
                             PipelineShape(4, 1, 16), 3)
    known = script.realized(table)
    spent = [sum(table.forward[s][k] + table.backward[s][k] for s in range(4)) for k in range(16)]
    assert sum(known.microbatch_costs) == pytest.approx(sum(table.microbatch_costs))
    assert [c / known.microbatch_costs[0] for c in known.microbatch_costs] == pytest.approx(
        [s / spent[0] for s in spent])
    assert known.expected() is known and known.forward == table.forward
    # the error is what separates the known cost from the realized one: the two orders differ
    assert sorted(range(16), key=known.microbatch_costs.__getitem__) != \
        sorted(range(16), key=table.microbatch_costs.__getitem__)


@pytest.mark.parametrize("budget", ["1f1b", "2x"])
def test_where_nothing_varies_knowing_is_worth_nothing(script, budget):
    rows = [r for r in script.MATRIX_ROWS if r.name in script.ROWS]
    seeds = [0, 1000]
    per_table = [simulate_table("vlm-mixed", 4, 0.0, seed, rows, [budget], keep_plans=True) for seed in seeds]
    oracle, revealed, control = script.oracle_over_planned("vlm-mixed", 4, 0.0, "", seeds, budget, per_table)
    assert oracle == 1.0
    ready = statistics.median(t["runs"][("fixed-planned", budget)]["makespan"] /
                              t["runs"][("ready-planned", budget)]["makespan"] for t in per_table)
    assert revealed == pytest.approx(ready, rel=1e-12)  # the plan on the realized durations is the plan itself
    assert control is not None  # another draw's plan: a different order, but one of the same shape here
    # what the yardsticks read from simulate_table (keep_plans) is the table it drew and the order it planned there
    shape = PipelineShape(4, 1, script.MICROBATCHES_PER_RANK * 4)
    for seed, ran in zip(seeds, per_table):
        table = sample_durations(VariabilityModel(workload="vlm-mixed", jitter=0.0), shape, seed)
        assert ran["tables"][1].forward == table.forward and ran["tables"][1].backward == table.backward
        assert ran["plans"][(1, budget)].orders == planned_baseline(shape, table, MemoryBudget.parse(budget)).orders
