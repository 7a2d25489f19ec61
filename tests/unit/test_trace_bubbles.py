"""Idle time by cause ([Note: bubble categories]): budget-held, dispatch and true misalignment apart, and the
optimizer step as its own category."""

from __future__ import annotations

import polars as pl
import pytest

from profiler.analysis.bubbles import BUBBLE_COLUMNS, bubbles, misalignment_gaps, split_gap
from profiler.analysis.summary import summary
from profiler.analysis.windows import iteration_windows
from profiler.trace.reader import read_trace
from tests.helpers.trace_builder import MISALIGNED, ONE_F_ONE_B, US, build_run

INF = float("inf")


@pytest.mark.parametrize("gap,want", [
    # a, b, next ready, other (budget allowed) ready, other (held back) ready, dispatch -> categories
    ((10, 41, 40, 0, INF, 0.5), dict(dependency_ns=0, budget_held_ns=0, dispatch_ns=1, misalignment_ns=30)),
    ((10, 41, 40, 0, INF, 2), dict(dependency_ns=0, budget_held_ns=0, dispatch_ns=2, misalignment_ns=29)),
    ((10, 41, 40, INF, 0, 0), dict(dependency_ns=0, budget_held_ns=30, dispatch_ns=1, misalignment_ns=0)),
    ((10, 41, 40, 20, 0, 0), dict(dependency_ns=0, budget_held_ns=10, dispatch_ns=1, misalignment_ns=20)),
    ((10, 41, 40, 25, INF, 0), dict(dependency_ns=15, budget_held_ns=0, dispatch_ns=1, misalignment_ns=15)),
    ((10, 40, 40, INF, INF, 5), dict(dependency_ns=30, budget_held_ns=0, dispatch_ns=0, misalignment_ns=0)),
    ((10, 14, 13, 11, INF, 5), dict(dependency_ns=1, budget_held_ns=0, dispatch_ns=3, misalignment_ns=0)),
    ((10, 20, 0, 0, INF, 1), dict(dependency_ns=0, budget_held_ns=0, dispatch_ns=10, misalignment_ns=0)),
])
def test_a_gap_splits_by_what_was_ready(gap, want):
    got = split_gap(*gap)
    assert {k: got[k] for k in want} == want
    assert sum(want.values()) == gap[1] - gap[0]


def test_idle_that_the_budget_held_back_is_not_misalignment(tmp_path):
    # MISALIGNED's rank 0 idles 10..40 with 0F1 ready: under a budget that held 0F1 back it is budget-held.
    frames = read_trace(build_run(tmp_path / "held", **MISALIGNED, policy="ready", held_back={"0B0": ("0F1",)}))
    rank0 = bubbles(frames).filter(pl.col("rank") == 0).row(0, named=True)
    assert (rank0["budget_held_ns"], rank0["misalignment_ns"], rank0["dependency_ns"]) == (30 * US, 0, 25 * US)
    assert misalignment_gaps(frames).height == 0
    free = read_trace(build_run(tmp_path / "free", **MISALIGNED))
    assert misalignment_gaps(free).row(0, named=True)["misaligned_from_ns"] == 10 * US


def test_every_nanosecond_is_in_one_category(tmp_path):
    frames = read_trace(build_run(tmp_path / "m", **MISALIGNED, iterations=2, period_us=150,
                                  steps={0: (116, 120, 130), 1: (93, 97, 130)}))
    frame = bubbles(frames)
    total = frame.select(pl.sum_horizontal("busy_ns", *BUBBLE_COLUMNS) - pl.col("makespan_ns")).to_series()
    assert total.to_list() == [0] * frame.height


def test_the_optimizer_step_is_its_own_category(tmp_path):
    frames = read_trace(build_run(tmp_path / "s", **ONE_F_ONE_B, steps={0: (91, 95, 99), 1: (68, 72, 99)}))
    assert frames.steps.select("rank", "start_ns", "barrier_ns", "end_ns").rows() == [
        (0, 91 * US, 95 * US, 99 * US), (1, 68 * US, 72 * US, 99 * US)]
    rank0, rank1 = bubbles(frames).sort("rank").to_dicts()
    assert rank0["makespan_ns"] == 99 * US  # the iteration ends with the last barrier
    assert (rank0["step_ns"], rank0["drain_ns"]) == (4 * US, 5 * US)
    assert (rank1["step_ns"], rank1["drain_ns"]) == (4 * US, 28 * US)  # the barrier waits for rank 0: drain
    assert summary(frames)["idle_share"]["step"] == pytest.approx(8 / (2 * 99 - 115))
    assert iteration_windows(frames).row(0, named=True)["makespan_ns"] == 90 * US  # tasks only
