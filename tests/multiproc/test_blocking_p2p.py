"""``--p2p blocking`` on real processes (gloo, CPU): [Note: blocking p2p in the runtime] in runtime.exec.executor.

One launch of 4 ranks runs every job (starting ranks is the slow part on 2 cores), inside a subprocess with
a hard timeout (tests.helpers.jobs). What is refused before any rank starts: tests/unit/test_blocking_p2p.py and
tests/inproc/test_run_args.py.
"""

from __future__ import annotations

import polars as pl
import pytest
import torch

from tests.helpers.jobs import check_against_reference, run_jobs

GPT = dict(workload="gpt", ranks=4, microbatches=6, policy="fixed", iters=2, seed=3, jitter=0.5)
JOBS = [
    {"name": "async", "config": GPT},
    {"name": "blocking", "config": {**GPT, "p2p": "blocking"}},
    {"name": "blocking-zb", "config": {**GPT, "hint": "zb", "p2p": "blocking"}},
    # Emulated: tasks sleep their sampled durations, so ranks really wait for one another; traced.
    {"name": "traced", "recorder": "profiler.trace.recorder:TraceRecorder",
     "config": dict(workload="emulated", emulate="multimodal", ranks=4, microbatches=8, policy="fixed",
                    p2p="blocking", iters=2, seed=1, forward_time=0.004, jitter=0.3)},
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("blocking")
    return root, run_jobs(root, 4, JOBS)


@pytest.mark.parametrize("name", ["async", "blocking", "blocking-zb"])
def test_blocking_gives_the_reference_loss_and_gradients(results, name):
    _, got = results
    check_against_reference(got, next(job for job in JOBS if job["name"] == name))


def test_blocking_gives_async_fixed_results_bit_for_bit(results):
    # Same order, same accumulation: the protocol changes only when tasks start.
    _, got = results
    for rank in range(4):
        assert got[rank]["blocking"]["executed"] == got[rank]["async"]["executed"]
        for key, grad in got[rank]["async"]["grads"].items():
            assert torch.equal(got[rank]["blocking"]["grads"][key], grad), key
    assert got[0]["blocking"]["losses"] == got[0]["async"]["losses"]


def test_only_blocking_ranks_wait_for_receivers(results):
    _, got = results
    assert all(got[rank]["async"]["rendezvous_waits"] == 0 for rank in range(4))
    # Every rank but the last sends forwards, and its receiver is often busy: some wait must show.
    assert sum(got[rank]["blocking"]["rendezvous_waits"] for rank in range(4)) > 0


def test_the_trace_reads_the_same_with_the_compiled_walk(results, monkeypatch):
    from tests.helpers.trace_compare import assert_same_both_ways

    root, _ = results
    assert_same_both_ways(root / "run" / "traced", monkeypatch)  # the rendezvous slices among them


def test_the_trace_records_the_waits_and_bubbles_name_them(results):
    from profiler.analysis.bubbles import BUBBLE_COLUMNS, bubbles, idle_segments
    from profiler.analysis.summary import summary
    from profiler.trace.reader import read_trace

    root, _ = results
    frames = read_trace(root / "run" / "traced")
    assert next(iter(frames.meta.values()))["p2p"] == "blocking"
    assert summary(frames)["p2p"] == "blocking"
    waits = frames.rendezvous
    assert waits.height > 0 and (waits["end_ns"] >= waits["start_ns"]).all()
    # Each wait names the messages it waited for, as <producer>-><rank>, on the rank that sent them.
    for rank, text in waits.select("rank", "messages").iter_rows():
        for message in text.split():
            producer, destination = message.split("->")
            assert int(destination) in (rank - 1, rank + 1), message
    totals = bubbles(frames)
    assert totals["rendezvous_ns"].sum() > 0
    segments = idle_segments(frames)
    assert "rendezvous" in segments["cause"].to_list()
    # Every nanosecond still falls in exactly one category.
    total = totals.select(pl.sum_horizontal("busy_ns", *BUBBLE_COLUMNS) - pl.col("makespan_ns"))
    assert total.to_series().abs().max() <= 1
