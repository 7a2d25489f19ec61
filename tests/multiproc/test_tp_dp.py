"""``--tp`` and ``--dp`` on real processes (gloo, CPU, 4 ranks): the single-process reference, one order per
TP group (from the traces), identical replicas after every step.

Each launch runs in a subprocess with a hard timeout (tests.helpers.jobs.run_jobs), so a coordination bug fails
these tests and never hangs them. Jobs of one process grid share a launch: the TP jobs one, the DP jobs another.
"""

from __future__ import annotations

import json

import pytest
import torch

from profiler.analysis.tp import follow_latency
from profiler.trace.reader import read_trace
from runtime.config import RunConfig, run_shape
from runtime.workloads.make import reference_train
from tests.helpers.cli import run_cli
from tests.helpers.jobs import check_whole_against_reference, run_jobs, whole_grads
from tests.helpers.trace_compare import assert_same_both_ways

TRACE = "profiler.trace.recorder:TraceRecorder"
RTOL, ATOL = 2e-5, 2e-6  # sharded matmuls sum their partial products in another order than the whole layer


def tp_jobs() -> list[dict]:
    jobs = []
    for workload in ("gpt", "multimodal"):
        for policy, hint in (("ready", "zb"), ("fixed", "1f1b")):
            config = dict(workload=workload, ranks=2, tp=2, microbatches=4, hint=hint, policy=policy, iters=2,
                          jitter=0.5, seed=5, **({"memory_budget": "2x"} if policy == "ready" else {}))
            jobs.append({"name": f"{workload}-{policy}", "config": config, "recorder": TRACE})
    return jobs


EMULATED_TP = {"name": "emu", "config": dict(workload="emulated", ranks=2, tp=2, microbatches=4, iters=2,
                                              forward_time=0.004, hint="zb", memory_budget="2x", jitter=0.3)}


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    """The traced TP jobs (tp_jobs) and the emulated model under --tp 2, in one launch of 4 ranks: the traced jobs,
    every job's results, and the folder (job NAME wrote under it, in run/NAME)."""
    path = tmp_path_factory.mktemp("tp")
    jobs = tp_jobs()
    return jobs, run_jobs(path, 4, [*jobs, EMULATED_TP], timeout=30.0), path


def test_tp_matches_single_process_with_per_rank_jitter(tp_run):
    jobs, results, _ = tp_run
    for job in jobs:
        check_whole_against_reference(results, job, RTOL, ATOL)


def test_tp_traces_read_the_same_with_the_compiled_walk(tp_run, monkeypatch):
    # every rank's tasks, decisions and messages (members), as a real TP run writes them
    jobs, _, path = tp_run
    for job in jobs:
        assert_same_both_ways(path / "run" / job["name"], monkeypatch)


def test_tp_groups_run_one_order_from_the_traces(tp_run):
    jobs, results, path = tp_run
    for job in jobs:
        frames = read_trace(path / "run" / job["name"])
        members = frames.members
        assert sorted(members["rank"].unique().to_list()) == [0, 1, 2, 3]
        for (pipe, iteration), group in members.group_by(["pipe_rank", "iteration"]):
            orders = {rank: rows.sort("start_ns")["task"].to_list()
                      for (rank,), rows in group.group_by(["rank"])}
            assert len(orders) == 2 and len({tuple(o) for o in orders.values()}) == 1, (job["name"], orders)
        decisions = frames.member_decisions
        followers = decisions.filter(pl_col("tp_rank") == 1)
        leaders = decisions.filter(pl_col("tp_rank") == 0)
        # every follower decision names the leader decision it followed, and started after it was made
        assert followers["index"].null_count() == 0 and followers.height == leaders.height
        assert (followers["time_ns"] >= followers["leader_ns"]).all()
        assert leaders["announce_ns"].null_count() == 0
        # the analyses read the leaders' slice only: a pipeline of 2 ranks
        assert sorted(frames.tasks["rank"].unique().to_list()) == [0, 1]
        per_decision, per_rank = follow_latency(frames)
        assert per_rank["rank"].to_list() == [0, 2, 1, 3] and per_decision.height == followers.height
        assert (per_decision["follow_ns"] >= per_decision["delivery_ns"]).all()
        lags = per_rank.filter(pl_col("tp_rank") == 1)["input_lag_us"]
        assert lags.null_count() == 0 and lags.abs().max() < 5e6  # every follower's inputs paired with its leader's


def test_trace_follow_shows_the_latency_per_decision(tp_run):
    _, _, path = tp_run
    run = path / "run" / "gpt-ready"
    done = run_cli(path, "trace", "follow", str(run), "--iterations", "0:", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert {r["rank"] for r in data["ranks"]} == {0, 1, 2, 3}
    # 2 followers x 2 iterations x (F, I, W) x 4 microbatches
    assert data["total"] == 2 * 2 * 12 and all(d["follow_ns"] > 0 for d in data["decisions"])
    human = run_cli(path, "trace", "follow", str(run))
    assert human.returncode == 0 and "followed decisions" in human.stdout


def pl_col(name: str):
    import polars as pl

    return pl.col(name)


def test_dp_replicas_stay_identical_and_match_the_doubled_batch(tmp_path):
    jobs = [{"name": f"{workload}-dp", "config": dict(workload=workload, ranks=2, dp=2, microbatches=4, iters=3,
                                                       hint="zb", memory_budget="2x", seed=9, lr=3e-3)}
            for workload in ("gpt", "multimodal")]
    results = run_jobs(tmp_path, 4, jobs, timeout=30.0)
    for job in jobs:
        name = job["name"]
        config = RunConfig(**job["config"])
        doubled = config.with_overrides(dp=1, microbatches=2 * config.microbatches)
        losses, reference = reference_train(doubled, run_shape(doubled), config.iters)
        assert results[0][name]["losses"] == pytest.approx(losses, rel=1e-5), name
        for rank, rank_results in results.items():
            for key, grad in rank_results[name]["grads"].items():
                torch.testing.assert_close(grad, reference[key], rtol=RTOL, atol=ATOL, msg=f"{name} rank {rank}")
        for pipe in range(config.ranks):  # replica 1's ranks are pipe + ranks
            for step, (mine, other) in enumerate(zip(results[pipe][name]["params"],
                                                     results[pipe + config.ranks][name]["params"])):
                assert mine.keys() == other.keys()
                for key in mine:
                    assert torch.equal(mine[key], other[key]), f"{name} step {step}: {key} differs across replicas"
        metrics = results[0][name]["metrics"]
        assert all(len(m["dp_reduce_seconds"]) == 4 and max(m["dp_reduce_seconds"]) > 0 for m in metrics)


def test_emulated_runs_with_tp(tp_run):
    _, results, _ = tp_run
    orders = [results[rank]["emu"]["executed"] for rank in range(4)]
    assert orders[0] == orders[2] and orders[1] == orders[3]  # rank 2 follows rank 0, rank 3 follows rank 1
    assert results[0]["emu"]["sharded"] == {"0.linear.weight": (1, 1)}
    assert results[0]["emu"]["grads"]["0.linear.weight"].shape == (32, 16)


def test_tp_and_dp_together_match_the_doubled_batch(tmp_path):
    """pp=2 x tp=2 x dp=2 (8 processes): the replica's TP groups put back together give the reference's
    gradients for twice the batch, and the replicas' shards stay identical."""
    config = dict(workload="gpt", ranks=2, tp=2, dp=2, microbatches=4, iters=2, jitter=0.3, seed=2)
    results = run_jobs(tmp_path, 8, [{"name": "both", "config": config}], timeout=40.0)
    run = RunConfig(**config)
    doubled = run.with_overrides(tp=1, dp=1, microbatches=8)
    losses, reference = reference_train(doubled, run_shape(doubled), run.iters)
    assert results[0]["both"]["losses"] == pytest.approx(losses, rel=1e-5)
    got = whole_grads(results, "both")
    assert got.keys() == reference.keys()
    for key, grad in reference.items():
        torch.testing.assert_close(got[key], grad, rtol=RTOL, atol=ATOL, msg=key)
    for rank in range(4):  # replica 1 of global rank r is r + 4
        for mine, other in zip(results[rank]["both"]["params"], results[rank + 4]["both"]["params"]):
            assert all(torch.equal(mine[key], other[key]) for key in mine)
