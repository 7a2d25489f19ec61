"""benchmarks/cross_framework.py at tiny sizes: its JSON rows and the equal-memory pairing.

One real run (2 ranks over gloo, 4 microbatches of 2 ms emulated tasks, one measured iteration: about
10 s on 2 cores) of torch's ``ScheduleInterleavedZeroBubble`` against rrfp's ``zb`` on two chunks;
timings are not asserted, only what the rows say and that both runtimes trained the same model.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers.cli import REPO, run_rrfp

SCRIPT = ("benchmarks/cross_framework.py",)


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("xf") / "rows.json"
    result = run_rrfp(REPO, "--stages", "2", "--microbatches", "4", "--iters", "1", "--warmup", "1",
                      "--cases", "uniform", "--forward-time", "0.002", "--schedules", "ScheduleInterleavedZeroBubble",
                      "--hints", "--json", str(out), module=SCRIPT, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| torch | ScheduleInterleavedZeroBubble | 2 |" in result.stdout  # the Markdown is still printed
    return json.loads(out.read_text())


def test_rows_cover_each_torch_schedule_and_its_rrfp_pair(rows):
    labels = sorted((row["system"], row["schedule"], row["policy"], row["chunks"]) for row in rows)
    assert labels == [
        ("rrfp", "1f1b", "fixed", 1), ("rrfp", "1f1b", "ready", 1),
        ("rrfp", "zb", "fixed", 2), ("rrfp", "zb", "ready", 2),
        ("torch", "Schedule1F1B", "fixed", 1), ("torch", "ScheduleInterleavedZeroBubble", "fixed", 2),
    ]
    for row in rows:
        assert row["case"] == "uniform" and row["measured_iters"] == 1
        assert row["min_step_s"] <= row["median_step_s"] <= row["max_step_s"] and row["median_step_s"] > 0
        assert row["throughput"] > 0 and row["unit"] == "samples/s"
        assert set(row["speedups"]) == {"vs_torch_1f1b", "vs_rrfp_fixed_1f1b", "vs_torch_paired",
                                        "vs_rrfp_fixed_same_hint"}


def test_ready_runs_at_the_paired_torch_schedules_peak(rows):
    by = {(row["system"], row["schedule"], row["policy"]): row for row in rows}
    torch_zb = by[("torch", "ScheduleInterleavedZeroBubble", "fixed")]
    fixed_zb, ready_zb = by[("rrfp", "zb", "fixed")], by[("rrfp", "zb", "ready")]
    # torch's ZB1P order holds (v-1) * round + p = 1 * 2 + 2 = 4 microbatch-chunks on every rank.
    assert torch_zb["peak_in_flight"] == 4 and torch_zb["peak_by_construction"]
    assert ready_zb["budget"] == "4" and ready_zb["equal_memory"]
    assert ready_zb["peak_in_flight"] <= 4
    assert fixed_zb["peak_in_flight"] == 4  # the same order as torch's, measured
    for row in (fixed_zb, ready_zb):
        assert row["paired_with"] == "ScheduleInterleavedZeroBubble" and row["placement"] == "looping"
        assert row["speedups"]["vs_torch_paired"] == pytest.approx(
            torch_zb["median_step_s"] / row["median_step_s"])
    assert ready_zb["speedups"]["vs_rrfp_fixed_same_hint"] == pytest.approx(
        fixed_zb["median_step_s"] / ready_zb["median_step_s"])
    assert fixed_zb["speedups"]["vs_rrfp_fixed_same_hint"] is None
    # 1F1B's own peaks are rrfp's 1f1b budget.
    assert by[("rrfp", "1f1b", "ready")]["budget"] == "1f1b"
    # Same model, data and loss scaling on both sides.
    assert fixed_zb["last_loss"] == pytest.approx(torch_zb["last_loss"], rel=1e-5)
    assert by[("rrfp", "1f1b", "fixed")]["last_loss"] == pytest.approx(
        by[("torch", "Schedule1F1B", "fixed")]["last_loss"], rel=1e-5)


@pytest.mark.parametrize("args, message", [
    (("--stages", "2", "--microbatches", "1"), "need --stages >= 2"),
    (("--layers-per-rank", "3"), "--layers-per-rank must be a positive multiple"),
    (("--stages", "2", "--microbatches", "5", "--schedules", "ScheduleInterleavedZeroBubble"),
     "multiple of the number of rounds"),
    (("--schedules", "ScheduleNope"), "invalid choice"),
])
def test_bad_input_is_one_error_line_and_exit_2(args, message):
    tiny = ("--cases", "uniform", "--iters", "1", "--forward-time", "0.001", "--hints")  # should it run after all
    result = run_rrfp(REPO, *tiny, *args, module=SCRIPT, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr


def test_extra_hint_rows_at_unequal_memory_are_marked(tmp_path, monkeypatch):
    """[Note: equal memory pairs]: ready at a budget against a fixed order that holds more is marked ``*``."""
    from profiler.bench import external as xf
    from runtime.config import RunConfig

    case = xf.Case("uniform", False, RunConfig(workload="emulated", emulate="uniform", stages=4, microbatches=16))
    plan = xf.plan_case(case, ["Schedule1F1B"], ["1f1b", "bf", "zb"], ["1f1b", "2x"], 2, tmp_path)
    equal = {name: s.equal_memory for name, s in plan.structures.items() if s.paired_with is None}
    assert equal["ready-bf-v1@1f1b"] is False and equal["ready-bf-v1@2x"] is False  # bf fixed keeps all 16
    assert equal["ready-zb-v1@2x"] is False  # zb fixed holds 4 on the last rank, 2x allows 2
    assert equal["ready-1f1b-v1@2x"] is True
    assert plan.structures["ready-1f1b-v1@1f1b"].equal_memory  # paired with Schedule1F1B
