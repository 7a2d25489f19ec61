"""rrfp.ReadyPipeline driven from a user's own training script (torchrun, 2 ranks) trains like one process, whatever
its hint. What it refuses, in one process: tests/inproc/test_pipeline_api.py."""

from __future__ import annotations

import json

import pytest

from runtime.config import RunConfig, run_shape
from runtime.run.launch import free_port
from runtime.workloads.make import reference_train
from tests.helpers.cli import run_rrfp

HINTS = ["1f1b", "cp"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One torchrun job of 2 ranks whose script (tests/helpers/pipeline_script.py) trains the tiny model 3 steps
    through a ReadyPipeline with each of HINTS in turn, from the same start: the folder and the job's result."""
    root = tmp_path_factory.mktemp("script")
    result = run_rrfp(root, "--nproc-per-node", "2", "--master-port", str(free_port()), "-m",
                      "tests.helpers.pipeline_script", str(root / "losses.json"), ",".join(HINTS), "3",
                      module=("-m", "torch.distributed.run"), timeout=180)
    return root, result


@pytest.mark.parametrize("hint", HINTS)
def test_a_script_driving_ready_pipeline_matches_the_single_process_reference(trained, hint):
    tmp_path, result = trained
    assert result.returncode == 0, result.stderr[-3000:]
    config = RunConfig(workload="tests.helpers.user_models:tiny", ranks=2, microbatches=3, iters=3)
    expected, _ = reference_train(config, run_shape(config), 3)
    assert json.loads((tmp_path / "losses.json").read_text())[hint] == pytest.approx(expected, rel=1e-5)
