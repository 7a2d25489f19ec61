"""Jobs on real ranks (gloo, CPU), many per launch, and their checks against the single-process reference.

A launch starts its ranks once and runs every job of its list in them, one after the other (starting ranks
is the slow part on 2 cores). It runs in the warm server (``tests.helpers.runtime_harness`` there; [Note: the
warm runner] in tests/helpers/warm.py) with a hard timeout, so a bug can fail a test but never hang CI. All jobs of a launch share its process grid (pipeline
ranks x ``--tp`` x ``--dp``): the first job's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from runtime.config import RunConfig, run_shape
from runtime.workloads.make import reference_train
from tests.helpers.warm import run_jobs_warm


def run_jobs(tmp_path: Path, nproc: int, jobs: list[dict], timeout: float = 30.0, limit: float = 600) -> dict:
    """Run ``jobs`` (``{"name", "config": RunConfig fields, "recorder"?}``) in one launch of ``nproc`` ranks;
    ``{rank: {job name: that rank's results}}``. ``timeout``: each rank's stall timeout; ``limit``: the whole
    launch's, in seconds. Job ``name`` writes under ``tmp_path / "run" / name``."""
    names = [job["name"] for job in jobs]
    assert len(set(names)) == len(names), f"two jobs of one launch share a name: {names}"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"nproc": nproc, "timeout": timeout, "jobs": jobs}))
    results = tmp_path / "results.pt"
    done = run_jobs_warm(spec, results, timeout=limit)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(results, weights_only=False)


def check_against_reference(results: dict, job: dict) -> None:
    """The job's gradients (every rank's, together) and losses equal the unpartitioned model's."""
    config = RunConfig(**job["config"])
    losses, grads = reference_train(config, run_shape(config), config.iters)
    got: dict[str, torch.Tensor] = {}
    for rank_results in results.values():
        got.update(rank_results[job["name"]]["grads"])
    assert got.keys() == grads.keys(), job["name"]
    for name, grad in grads.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-6, msg=f"{job['name']}: {name}")
    run_losses = results[0][job["name"]]["losses"]
    assert run_losses == pytest.approx(losses, rel=1e-5), job["name"]


def check_budget(results: dict, job: dict) -> None:
    """Under the ready policy no rank ever held more microbatches in flight than its budget."""
    for rank_results in results.values():
        r = rank_results[job["name"]]
        if job["config"]["policy"] == "ready":
            assert r["max_decision_in_flight"] <= r["budget"], job["name"]
            assert r["peak_in_flight"] <= r["budget"], job["name"]


def check_whole_against_reference(results: dict, job: dict, rtol: float, atol: float) -> None:
    """A ``--tp`` (and ``--dp``) job's losses, and its gradients with the TP shards put back together, equal the
    unsharded single-process model's (``reference_train`` with ``tp`` 1; a user's factory keeps ``dp``)."""
    config = RunConfig(**job["config"])
    losses, reference = reference_train(config.with_overrides(tp=1), run_shape(config), config.iters)
    got = whole_grads(results, job["name"])
    assert got.keys() == reference.keys(), job["name"]
    for key, grad in reference.items():
        torch.testing.assert_close(got[key], grad, rtol=rtol, atol=atol, msg=f"{job['name']}: {key}")
    assert results[0][job["name"]]["losses"] == pytest.approx(losses, rel=1e-5), job["name"]


def whole_grads(results: dict, name: str, field: str = "grads", step: int | None = None) -> dict[str, torch.Tensor]:
    """Each stage's gradients (``field`` "params": its parameters after optimizer step ``step``) with the TP
    members' shards put back together (replica 0's); replicated ones must agree across the members."""
    from runtime.workloads.tp_layers import unshard

    by_pipe: dict[int, list[dict]] = {}
    for rank in sorted(results):
        grid = results[rank][name]["grid"]
        by_pipe.setdefault((grid.dp_rank, grid.pipe_rank), []).append(results[rank][name])
    grads: dict[str, torch.Tensor] = {}
    for (dp, _), members in sorted(by_pipe.items()):
        if dp:
            continue
        sharded = members[0]["sharded"]
        values = [m[field] if step is None else m[field][step] for m in members]
        for key, leader in values[0].items():
            if key in sharded:
                grads[key] = unshard([v[key] for v in values], sharded[key])
            else:
                for follower in values[1:]:
                    torch.testing.assert_close(follower[key], leader, rtol=0, atol=0, msg=key)
                grads[key] = leader
    return grads
