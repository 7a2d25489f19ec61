"""A model of your own under ``--tp`` and ``--dp`` ([Note: tensor parallelism for a model you bring]): its gradients
equal the unsplit single-process model's at pp2 x tp2, pp2 x dp2 and pp2 x tp2 x dp2, whether the factory gives a
torch TP plan (``parallelize_module``, DTensor parameters) or shards its layers itself (Megatron style), under the
ready and fixed policies with 1f1b and zb; a checkpoint of a TP run loads into the unsplit model.

What is refused before any rank starts, in one process: tests/inproc/test_user_model_parallel.py.
"""

from __future__ import annotations

import torch

from runtime.config import RunConfig, run_shape
from tests.helpers.jobs import check_whole_against_reference, run_jobs, whole_grads

RTOL, ATOL = 2e-5, 2e-6  # sharded matmuls sum their partial products in another order than the whole layer
PLAN, MEGATRON = "tests.helpers.user_models:mlp_plan", "tests.helpers.user_models:mlp_megatron"
POLICIES = [("ready", "zb"), ("fixed", "1f1b"), ("ready", "1f1b"), ("fixed", "zb")]


def _jobs(factories, grid: dict, policies=POLICIES, **extra) -> list[dict]:
    return [{"name": f"{factory.rpartition(':')[2]}-{policy}-{hint}",
             "config": dict(workload=factory, ranks=2, microbatches=4, iters=2, hint=hint, policy=policy, seed=3,
                            lr=3e-3, **grid, **extra)}
            for factory in factories for policy, hint in policies]


def _check(results: dict, jobs: list[dict]) -> None:
    for job in jobs:
        check_whole_against_reference(results, job, RTOL, ATOL)
        config = RunConfig(**job["config"])
        if config.dp > 1:  # the replicas hold the same parameters after every step
            for rank, mine in results.items():
                other = results.get(rank + config.ranks * config.tp)
                if mine[job["name"]]["grid"].dp_rank == 0 and other is not None:
                    for a, b in zip(mine[job["name"]]["params"], other[job["name"]]["params"]):
                        assert all(torch.equal(a[k], b[k]) for k in a), job["name"]


def test_tp_with_a_plan_or_own_sharding_matches_the_unsplit_model(tmp_path):
    jobs = _jobs([PLAN, MEGATRON], {"tp": 2})
    results = run_jobs(tmp_path, 4, jobs, timeout=30.0)
    _check(results, jobs)
    # the plan's sharded parameters are DTensors on the ranks, collected as their shards
    assert results[0][jobs[0]["name"]]["sharded"]["0.up.weight"] == (0, 1)
    assert results[0][jobs[0]["name"]]["grads"]["0.up.weight"].shape == (16, 8)


def test_a_checkpoint_of_a_tp_run_loads_into_the_unsplit_model(tmp_path):
    import rrfp
    from runtime.workloads.make import make_workload

    jobs = _jobs([PLAN, MEGATRON], {"tp": 2}, policies=[("ready", "zb")], checkpoint_every=2)
    results = run_jobs(tmp_path, 4, jobs, timeout=30.0)
    for job in jobs:
        config = RunConfig(**job["config"])
        workload = make_workload(config.with_overrides(tp=1), run_shape(config))
        stages = [workload.build_stage(stage) for stage in range(run_shape(config).stages)]
        assert rrfp.load_into_unsplit(tmp_path / "run" / job["name"], stages) == 2
        trained = whole_grads(results, job["name"], field="params", step=1)
        loaded = {f"{stage}.{name}": p for stage, m in enumerate(stages) for name, p in m.named_parameters()}
        assert loaded.keys() == trained.keys()
        for key, value in trained.items():
            assert torch.equal(loaded[key].detach(), value), f"{job['name']}: {key}"


def test_dp_with_a_model_of_your_own_matches_the_replicas_batches(tmp_path):
    jobs = _jobs([PLAN], {"dp": 2})
    _check(run_jobs(tmp_path, 4, jobs, timeout=30.0), jobs)


def test_tp_and_dp_together_with_a_model_of_your_own(tmp_path):
    jobs = _jobs([PLAN], {"tp": 2, "dp": 2}, policies=[("ready", "zb")]) + _jobs(
        [MEGATRON], {"tp": 2, "dp": 2}, policies=[("fixed", "1f1b")])
    _check(run_jobs(tmp_path, 8, jobs, timeout=40.0, limit=600), jobs)


def test_a_plan_that_leaves_an_output_sharded_is_bad_input_before_any_step(tmp_path):
    from tests.helpers.cli import one_error_line
    from tests.helpers.warm import run_warm

    result = run_warm(tmp_path, "run", "--workload", "tests.helpers.user_models:plan_leaves_output_sharded",
                      "-p", "2", "--tp", "2", "-m", "4", "--iters", "2", "--out", "x", "--json")
    line = one_error_line(result)
    assert "(Linear) returns output 0 as [2, 4] under --tp where the unsharded stage gives [2, 8]: its TP " \
           "sharding leaves the output sharded" in line
    assert not (tmp_path / "x" / "metrics.jsonl").exists()  # no step ran


def test_a_tp_plan_run_resumed_from_its_checkpoint_continues_bit_for_bit(tmp_path):
    import json

    from tests.helpers.warm import run_warm

    args = ("run", "--workload", PLAN, "-p", "2", "--tp", "2", "-m", "4", "--json")
    whole = run_warm(tmp_path, *args, "--iters", "4", "--out", "whole")
    cut = run_warm(tmp_path, *args, "--iters", "2", "--checkpoint-every", "1", "--out", "cut")
    assert whole.returncode == 0 and cut.returncode == 0, whole.stderr + cut.stderr
    resumed = run_warm(tmp_path, "run", "--resume", "cut", "--iters", "4", "--json")
    assert resumed.returncode == 0, resumed.stderr

    def losses(result):
        return [m["loss"] for m in json.loads(result.stdout)["jobs"][0]["metrics"]]

    assert losses(resumed) == losses(whole)[2:]
