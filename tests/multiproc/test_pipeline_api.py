"""rrfp.ReadyPipeline driven from a user's own training script (torchrun, 2 ranks) trains like one process."""

from __future__ import annotations

import json

import pytest

from runtime.config import RunConfig
from runtime.run.launch import free_port
from runtime.config import run_shape
from runtime.workloads.make import reference_train
from tests.helpers.cli import run_rrfp


@pytest.mark.parametrize("hint", ["1f1b", "cp"])
def test_a_script_driving_ready_pipeline_matches_the_single_process_reference(tmp_path, hint):
    result = run_rrfp(tmp_path, "--nproc-per-node", "2", "--master-port", str(free_port()), "-m",
                      "tests.helpers.pipeline_script", str(tmp_path / "losses.json"), hint, "3",
                      module=("-m", "torch.distributed.run"), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    config = RunConfig(workload="tests.helpers.user_models:tiny", stages=2, microbatches=3, iters=3)
    expected, _ = reference_train(config, run_shape(config), 3)
    assert json.loads((tmp_path / "losses.json").read_text()) == pytest.approx(expected, rel=1e-5)


def test_ready_pipeline_refuses_stages_of_another_rank(tmp_path):
    import torch.distributed as dist

    from hints.errors import UserError
    from rrfp import ReadyPipeline

    with pytest.raises(UserError, match="init_process_group first"):
        ReadyPipeline({0: None}, None, microbatches=2)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        with pytest.raises(UserError, match=r"rank 0 holds model stages \[0\] of .*, but was given \[1\]"):
            ReadyPipeline({1: None}, None, microbatches=2)
    finally:
        dist.destroy_process_group()
