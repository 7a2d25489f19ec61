"""benchmarks/cross_framework.py at tiny sizes: its JSON rows and the equal-memory pairing.

One real run (2 ranks over gloo, 4 microbatches of 2 ms emulated tasks, one measured iteration: about
10 s on 2 cores) of torch's ``ScheduleInterleavedZeroBubble`` against rrfp's ``zb`` on two chunks;
timings are not asserted, only what the rows say and that both runtimes trained the same model. Its plan
without a run: tests/unit/test_cross_framework.py; its bad input: tests/inproc/test_cross_framework_args.py.
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
