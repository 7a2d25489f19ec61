"""rrfp.ReadyPipeline on a process group of a larger job ([Note: a pipeline inside a larger job] in
runtime/run/pipeline.py).

* examples/pp_in_dp.py under torchrun, 4 processes (2 data-parallel replicas x 2 pipeline stages): rrfp's pipelines
  on the sub-groups {0,1} and {2,3} give, step for step and replica by replica, the losses of the same job on
  torch's PipelineStage + Schedule1F1B, and of the arithmetic done in this process without any pipeline.
* tests/helpers/pipeline_script.py --group, 3 processes: a pipeline on a 1-D DeviceMesh of global ranks {1, 2}
  (pipeline rank = global rank - 1) trains like the single-process reference while rank 0 takes part in nothing,
  and rank 0, handed what it holds of that group (the GroupMember.NON_GROUP_MEMBER that new_group gave it, the
  mesh), gets a UserError naming ReadyPipeline for each.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from runtime.config import RunConfig, run_shape
from runtime.run.launch import free_port
from runtime.workloads.make import reference_train
from tests.helpers.cli import REPO, child_env, load_script

HINTS = ["1f1b", "zb", "cp"]
STEPS = 4
TORCH = "torch-1f1b"


def _torchrun(root, nproc: int, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node NPROC ARGS`` in ``root``, behind a hard timeout that ends its ranks too (a
    session of its own, killed as a whole: a rank stuck in a collective would otherwise outlive the test)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port",
               str(free_port()), *args]
    with subprocess.Popen(command, cwd=root, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            pytest.fail(f"torchrun {' '.join(args)} did not end within {timeout:.0f} s:\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory):
    """The example run with every hint of HINTS in turn, then with --torch: {schedule: its losses}, and the
    results of the two torchrun jobs."""
    root = tmp_path_factory.mktemp("pp-in-dp")
    script = str(REPO / "examples" / "pp_in_dp.py")
    ready = _torchrun(root, 4, script, "--hint", ",".join(HINTS), "--steps", str(STEPS), "--losses", "rrfp.json")
    torch_run = _torchrun(root, 4, script, "--torch", "--steps", str(STEPS), "--losses", "torch.json")
    losses = {}
    for result, name in ((ready, "rrfp.json"), (torch_run, "torch.json")):
        assert result.returncode == 0, result.stderr[-3000:]
        losses.update(json.loads((root / name).read_text()))
    return losses


def _unpipelined_losses(steps: int) -> list[list[float]]:
    """The example's job as plain arithmetic in this process: each replica's mean loss over its microbatches,
    the gradient of the mean over both replicas' (what averaging over the DP group gives), AdamW."""
    example = load_script("examples/pp_in_dp.py")
    args = example.parse_args(["--steps", str(steps)])
    replicas = 2
    stages = [example.build_stage(stage, args.width, args.seed) for stage in range(example.STAGES)]
    model = torch.nn.Sequential(*stages)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    losses = []
    for step in range(steps):
        each = []
        for replica in range(replicas):
            x, y = example.step_data(step, replica, replicas, args)
            pieces = [example.mse(model(xs), ys) for xs, ys in zip(x.split(args.samples), y.split(args.samples))]
            each.append(sum(pieces) / len(pieces))
        (sum(each) / replicas).backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append([float(value.detach()) for value in each])
    return losses


@pytest.mark.parametrize("hint", HINTS)
def test_pipelines_on_sub_groups_match_torch_pipelining_step_for_step(example_runs, hint):
    assert len(example_runs[TORCH]) == STEPS
    for step, (ours, theirs) in enumerate(zip(example_runs[hint], example_runs[TORCH])):
        assert ours == pytest.approx(theirs, rel=1e-5), f"step {step}"


def test_the_example_computes_what_its_docstring_says(example_runs):
    # Both pipelines could share a mistake of the script's (each replica's share of the data, the DP mean): the
    # same arithmetic without any pipeline or process group says they do not. The replicas' losses differ (their
    # own data), and fall.
    expected = _unpipelined_losses(STEPS)
    for step, (ours, reference) in enumerate(zip(example_runs["1f1b"], expected)):
        assert ours == pytest.approx(reference, rel=1e-5), f"step {step}"
    assert expected[0][0] != pytest.approx(expected[0][1], rel=1e-3)
    assert sum(expected[-1]) < sum(expected[0])


@pytest.fixture(scope="module")
def group_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("script-group")
    result = _torchrun(root, 3, "-m", "tests.helpers.pipeline_script", str(root / "losses.json"), "1f1b,cp", "3",
                       "--group")
    return root, result


def test_a_pipeline_on_a_group_trains_while_a_rank_outside_it_takes_part_in_nothing(group_run):
    root, result = group_run
    assert result.returncode == 0, result.stderr[-3000:]
    config = RunConfig(workload="tests.helpers.user_models:tiny", ranks=2, microbatches=3, iters=3)
    expected, _ = reference_train(config, run_shape(config), 3)
    for hint, losses in json.loads((root / "losses.json").read_text()).items():
        assert losses == pytest.approx(expected, rel=1e-5), hint


def test_a_rank_outside_the_group_is_refused_before_anything_runs(group_run):
    root, result = group_run
    assert result.returncode == 0, result.stderr[-3000:]
    refused = (root / "losses.json.refused").read_text().splitlines()
    assert len(refused) == 2, refused
    assert refused[0].startswith("ReadyPipeline: group= is GroupMember.NON_GROUP_MEMBER: global rank 0 is not in "
                                 "the group"), refused
    assert refused[1].startswith("ReadyPipeline: global rank 0 is not in the DeviceMesh given as group= (global "
                                 "ranks [1, 2])"), refused
