"""benchmarks/cross_framework.py's plan, without running it: rows at unequal memory are marked. Its rows from a real
run: tests/multiproc/test_cross_framework.py; its bad input: tests/inproc/test_cross_framework_args.py."""

from __future__ import annotations


def test_extra_hint_rows_at_unequal_memory_are_marked(tmp_path, monkeypatch):
    """[Note: equal memory pairs]: ready at a budget against a fixed order that holds more is marked ``*``."""
    from profiler.bench import external as xf
    from runtime.config import RunConfig

    case = xf.Case("uniform", False, RunConfig(workload="emulated", emulate="uniform", ranks=4, microbatches=16))
    plan = xf.plan_case(case, ["Schedule1F1B"], ["1f1b", "bf", "zb"], ["1f1b", "2x"], 2, tmp_path)
    equal = {name: s.equal_memory for name, s in plan.structures.items() if s.paired_with is None}
    assert equal["ready-bf-v1@1f1b"] is False and equal["ready-bf-v1@2x"] is False  # bf fixed keeps all 16
    assert equal["ready-zb-v1@2x"] is False  # zb fixed holds 4 on the last rank, 2x allows 2
    assert equal["ready-1f1b-v1@2x"] is True
    assert plan.structures["ready-1f1b-v1@1f1b"].equal_memory  # paired with Schedule1F1B
