"""The distributed runtime on real processes (gloo, CPU): same results as one process, reordering, budgets.

Each launch runs many jobs in one set of processes (starting ranks is the
slow part on 2 cores) inside a subprocess with a hard timeout, so a bug can
fail these tests but never hang CI.
"""

from __future__ import annotations

import pytest
import torch

from hints.orders import applicable_builtins, builtin_hint
from runtime.config import RunConfig
from runtime.config import run_shape
from tests.helpers.jobs import check_against_reference, check_budget, run_jobs

ITERS = 2


def matrix(stages: int, microbatches: int) -> list[dict]:
    """Every built-in (cp included) x fixed and ready; ready looks ahead on multimodal, is greedy on gpt."""
    jobs = []
    for workload, lookahead in (("gpt", False), ("multimodal", True)):
        for chunks in (1, 2):
            for hint in [*applicable_builtins(stages, chunks, microbatches), "cp"]:
                for policy in ("fixed", "ready"):
                    config = dict(workload=workload, stages=stages, chunks=chunks, microbatches=microbatches,
                                  hint=hint, policy=policy, iters=ITERS, seed=stages)
                    if policy == "ready":
                        config["lookahead"] = lookahead
                    jobs.append({"name": f"{workload}-v{chunks}-{hint}-{policy}", "config": config})
    return jobs


@pytest.fixture(scope="module")
def two_stage(tmp_path_factory):
    jobs = matrix(2, 4)
    return jobs, run_jobs(tmp_path_factory.mktemp("two"), 2, jobs)


@pytest.fixture(scope="module")
def four_stage(tmp_path_factory):
    jobs = matrix(4, 8)
    return jobs, run_jobs(tmp_path_factory.mktemp("four"), 4, jobs)


@pytest.mark.parametrize("launched", ["two_stage", "four_stage"])
def test_every_hint_and_policy_matches_single_process(launched, request):
    jobs, results = request.getfixturevalue(launched)
    assert len(jobs) == 48  # 2 workloads x (6 hints with 1 chunk + 6 with 2 chunks) x 2 policies
    for job in jobs:
        check_against_reference(results, job)
        check_budget(results, job)


def test_fixed_runs_the_hint_exactly(four_stage):
    jobs, results = four_stage
    for job in jobs:
        c = job["config"]
        if c["policy"] != "fixed":
            continue
        if c["hint"] in ("bfw", "cp"):
            continue  # rebuilt per iteration from that iteration's expected costs
        hint = builtin_hint(c["hint"], c["stages"], c["chunks"], c["microbatches"])
        for rank, rank_results in results.items():
            assert rank_results[job["name"]]["executed"] == [str(t) for t in hint.orders[rank]], job["name"]


def test_readiness_first_reorders_and_still_matches(tmp_path):
    # 1B0 on rank 1 is held up; rank 0's hint head is 0B0, but with a 2x budget it may run
    # 0F2 first. Results must not change.
    base = dict(workload="gpt", stages=2, microbatches=4, hint="1f1b", iters=2, memory_budget="2x",
                delay={"1B0": 0.3})
    jobs = [{"name": "ready", "config": {**base, "policy": "ready"}},
            {"name": "fixed", "config": {**base, "policy": "fixed"}}]
    results = run_jobs(tmp_path, 2, jobs)
    hint = [str(t) for t in builtin_hint("1f1b", 2, 1, 4).orders[0]]
    ready_order = results[0]["ready"]["executed"]
    assert results[0]["fixed"]["executed"] == hint
    assert ready_order != hint
    assert ready_order.index("0F2") < ready_order.index("0B0")
    for job in jobs:
        check_against_reference(results, job)
    # It used the room the 2x budget gives (fixed 1F1B holds at most 2 on rank 0), and no more.
    assert results[0]["fixed"]["peak_in_flight"] == 2
    assert 2 < results[0]["ready"]["peak_in_flight"] <= results[0]["ready"]["budget"] == 4


def test_training_curve_matches_over_several_steps(tmp_path):
    jobs = [{"name": f"{w}-{p}", "config": dict(workload=w, stages=2, chunks=2, microbatches=4, hint="zb",
                                                   policy=p, iters=4, memory_budget="2x", lr=3e-3)}
            for w in ("gpt", "multimodal") for p in ("fixed", "ready")]
    results = run_jobs(tmp_path, 2, jobs)
    for job in jobs:
        check_against_reference(results, job)
        losses = results[0][job["name"]]["losses"]
        assert losses[-1] < losses[0]  # it trains


def test_emulated_runs_and_writes_replayable_durations(tmp_path):
    config = dict(workload="emulated", stages=2, microbatches=4, iters=2, forward_time=0.004, hint="zb",
                  memory_budget="2x", emulate="multimodal", jitter=0.2)
    results = run_jobs(tmp_path, 2, [{"name": "emu", "config": config}])
    metrics = results[0]["emu"]["metrics"]
    assert [m["iteration"] for m in metrics] == [0, 1]
    assert all(m["unit"] == "samples/s" and m["throughput"] > 0 for m in metrics)
    import polars as pl

    table = pl.read_parquet(tmp_path / "run" / "emu" / "durations.parquet")
    assert table.columns == ["iteration", "stage", "kind", "microbatch", "duration"]
    assert table.height == 2 * 2 * 4 * 2


def v_jobs(stages: int, microbatches: int, workloads: tuple[str, ...]) -> list[dict]:
    """V placement ([Note: placement] in hints.tasks): zbv in fixed order and ready (with and without
    lookahead), torch's DualPipeV in fixed order, and gpipe placed in a V, ready."""
    jobs = []
    for workload in workloads:
        base = dict(workload=workload, stages=stages, microbatches=microbatches, iters=ITERS, seed=stages,
                    forward_time=0.002)
        runs = [("zbv-fixed", dict(hint="zbv", policy="fixed")),
                ("zbv-ready", dict(hint="zbv", policy="ready", lookahead=True)),
                ("zbv-greedy-2x", dict(hint="zbv", policy="ready", lookahead=False, memory_budget="2x")),
                ("dualpipev-fixed", dict(hint="torch:DualPipeV", policy="fixed")),
                ("gpipe-v-ready", dict(hint="gpipe", placement="v", policy="ready"))]
        jobs += [{"name": f"{workload}-{name}", "config": {**base, **extra}} for name, extra in runs]
    return jobs


@pytest.mark.parametrize("stages,microbatches,workloads", [(2, 4, ("gpt", "emulated", "multimodal")),
                                                           (4, 8, ("gpt",))])
def test_v_placement_matches_single_process(tmp_path, stages, microbatches, workloads):
    # The turn (stages p-1 and p) hands off on rank p-1 without a message, and the loss is computed on
    # rank 0 (stage 2p-1): results must still equal the unpartitioned model's.
    jobs = v_jobs(stages, microbatches, workloads)
    results = run_jobs(tmp_path, stages, jobs)
    zbv = builtin_hint("zbv", stages, 2, microbatches)
    for job in jobs:
        check_against_reference(results, job)
        check_budget(results, job)
        assert run_shape(RunConfig(**job["config"])).placement == "v"
        if job["name"].endswith("zbv-fixed"):
            for rank, rank_results in results.items():
                assert rank_results[job["name"]]["executed"] == [str(t) for t in zbv.orders[rank]], job["name"]
        # Rank 0 ran the last model stage (the loss) and rank p-1 both stages of the turn.
        assert f"{2 * stages - 1}F0" in results[0][job["name"]]["executed"]
        assert {f"{stages - 1}F0", f"{stages}F0"} <= set(results[stages - 1][job["name"]]["executed"])


@pytest.mark.parametrize("split, overhead", [(False, 1.6), (True, 1.0), (True, 1.6)])
def test_emulated_stage_sleeps_the_split_overhead_in_w(monkeypatch, split, overhead):
    """[Note: split backward durations]: a split backward sleeps B/2 in I and (overhead - 1/2) x B in W; a full
    B sleeps B whatever the overhead."""
    import runtime.workloads.builtin as workloads
    from runtime.workloads.make import make_workload

    config = RunConfig(workload="emulated", emulate="uniform", stages=2, microbatches=2, forward_time=0.001,
                       split_overhead=overhead)
    workload = make_workload(config, run_shape(config))
    workload.split_backward = split
    stage = workload.build_stage(1)
    batch = workload.batch(0, 0)
    x = torch.randn(2, 32, requires_grad=True)
    (y,) = stage((x,), batch)
    slept: list[float] = []
    monkeypatch.setattr(workloads.time, "sleep", slept.append)
    backward = workload.durations(0).backward[1][0]
    if split:
        torch.autograd.grad(y.sum(), [x], retain_graph=True)  # I
        assert slept == [pytest.approx(backward / 2)]
        torch.autograd.grad(y.sum(), [stage.linear.weight])  # W
        assert slept[1:] == [pytest.approx(backward * (overhead - 0.5))]
    else:
        y.sum().backward()
        assert sorted(slept) == [pytest.approx(backward / 2)] * 2
