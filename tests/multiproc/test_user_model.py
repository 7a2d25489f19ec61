"""``--workload package.module:factory``: the Llama-style example trains under plain ``rrfp run`` like one process."""

from __future__ import annotations

import json

import pytest
import torch

from runtime.config import RunConfig
from runtime.config import run_shape
from runtime.workloads.make import reference_train
from tests.helpers.cli import run_rrfp

LLAMA = "examples.llama_pipeline:build"


@pytest.mark.parametrize("extra", [("--policy", "fixed"), ("--chunks", "2", "--hint", "cp")])
def test_the_llama_example_matches_the_single_process_reference(tmp_path, extra):
    result = run_rrfp(tmp_path, "run", "--workload", LLAMA, "-p", "2", "-m", "4", "--iters", "3", *extra,
                      "--out", "l", "--json")
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)["jobs"][0]
    assert job["unit"] == "tokens/s" and job["loss_last"] < job["loss_first"]
    chunks = 2 if "--chunks" in extra else 1
    config = RunConfig(workload=LLAMA, stages=2, chunks=chunks, microbatches=4, iters=3)
    expected, _ = reference_train(config, run_shape(config), 3)
    assert [row["loss"] for row in job["metrics"]] == pytest.approx(expected, rel=1e-5)
    assert (tmp_path / "l" / "trace.pftrace").exists()


def test_cost_features_reach_the_cost_ranked_hints():
    from runtime.workloads.make import make_workload

    config = RunConfig(workload="tests.helpers.user_models:tiny", stages=2, microbatches=3)
    workload = make_workload(config, run_shape(config))
    workload.prepare([0])
    rows = [workload.batch(0, mb).spec.seq_len for mb in range(3)]
    assert rows == [2, 3, 4]  # the tiny model's microbatches hold 2, 3, 4 rows and report them as tokens
    expected = workload.expected(0)
    assert expected.forward[0][0] < expected.forward[0][1] < expected.forward[0][2]


def test_what_a_factory_returns_is_checked_in_one_line(monkeypatch):
    from hints.errors import UserError
    from runtime.workloads.user import ModelContext, PipelineModel, build_model

    ctx = ModelContext(RunConfig(), ranks=2, chunks=1, microbatches=2, placement=((0, 0), (1, 0)), seed=0)

    def raising(ctx):
        raise ValueError("no such checkpoint of my own")

    with pytest.raises(UserError, match="the factory raised ValueError: no such checkpoint of my own"):
        build_model(raising, ctx)
    with pytest.raises(UserError, match="must return a runtime.workloads.user.PipelineModel, got dict"):
        build_model(lambda ctx: {}, ctx)
    with pytest.raises(UserError, match="stage 1 is a str, not a torch.nn.Module"):
        build_model(lambda ctx: PipelineModel([torch.nn.Linear(1, 1), "layer"], None, []), ctx)
    with pytest.raises(UserError, match="unit must be tokens or samples, got 'images'"):
        build_model(lambda ctx: PipelineModel([torch.nn.Linear(1, 1)] * 2, None, [], unit="images"), ctx)
