"""``--workload package.module:factory``: the Llama-style example trains under plain ``rrfp run`` like one process.
A factory's checks and its cost features, in one process: tests/inproc/test_workloads.py."""

from __future__ import annotations

import json

import pytest

from runtime.config import RunConfig, run_shape
from runtime.workloads.make import reference_train
from tests.helpers.warm import run_warm

LLAMA = "examples.llama_pipeline:build"


@pytest.mark.parametrize("extra", [("--policy", "fixed"), ("--chunks", "2", "--hint", "cp")])
def test_the_llama_example_matches_the_single_process_reference(tmp_path, extra):
    result = run_warm(tmp_path, "run", "--workload", LLAMA, "-p", "2", "-m", "4", "--iters", "3", *extra,
                      "--out", "l", "--json")
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)["jobs"][0]
    assert job["unit"] == "tokens/s" and job["loss_last"] < job["loss_first"]
    chunks = 2 if "--chunks" in extra else 1
    config = RunConfig(workload=LLAMA, ranks=2, chunks=chunks, microbatches=4, iters=3)
    expected, _ = reference_train(config, run_shape(config), 3)
    assert [row["loss"] for row in job["metrics"]] == pytest.approx(expected, rel=1e-5)
    assert (tmp_path / "l" / "trace.pftrace").exists()
