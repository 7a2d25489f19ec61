"""A checkpoint of ``rrfp run`` loaded into the unsplit model on one process ([Note: loading a checkpoint into the
unsplit model] in runtime/run/checkpoint.py): a TP run's shards and a user model's chunks land on the unsplit
model's parameter names, equal to the single-process reference's after the same steps, and give the run's loss.

Real ranks (gloo, at most 4 processes), tiny models, the warm runner's hard timeout.
"""

from __future__ import annotations

import polars as pl
import pytest
import torch

import rrfp
from hints.errors import UserError
from runtime.config import RunConfig, run_shape
from runtime.run import checkpoint
from runtime.workloads.make import make_optimizer, make_workload
from tests.helpers.warm import run_warm

GPT = dict(workload="gpt", ranks=2, microbatches=4, seq_len=16, hidden=32, policy="fixed")
TINY = dict(workload="tests.helpers.user_models:tiny", ranks=2, chunks=2, microbatches=4, hint="interleaved-1f1b",
            policy="fixed")
STEPS = 2  # the checkpoint is taken after STEPS iterations; the run trains one more


def _args(config: dict) -> list[str]:
    return [f"--{name.replace('_', '-')}={value}" for name, value in config.items()]


def _unsplit(config: RunConfig):
    """The unsplit model of ``config`` (one whole module per model stage) and its workload (data, loss)."""
    shape = run_shape(config)
    workload = make_workload(config, shape)
    return [workload.build_stage(stage) for stage in range(shape.stages)], workload, shape


def _reference_after(config: RunConfig, steps: int) -> list[torch.nn.Module]:
    """The unsplit model trained ``steps`` iterations on one process, as ``rrfp run`` trains it (mean loss over the
    microbatches, the run's AdamW)."""
    stages, workload, shape = _unsplit(config)
    optimizer = make_optimizer([p for m in stages for p in m.parameters()], config)
    for iteration in range(steps):
        for mb in range(shape.microbatches):
            batch = workload.batch(iteration, mb)
            outputs = workload.first_inputs(batch)
            for module in stages:
                outputs = module(outputs, batch)
            (workload.loss(outputs, batch) / shape.microbatches).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return stages


def _loss(config: RunConfig, stages, iteration: int) -> float:
    """The unsplit model's loss on ``iteration``'s microbatches (the mean over them, as ``rrfp run`` reports it)."""
    _, workload, shape = _unsplit(config)
    for earlier in range(iteration):  # a factory's data stream is read in order
        workload.batch(earlier, 0)
    total = 0.0
    with torch.no_grad():
        for mb in range(shape.microbatches):
            batch = workload.batch(iteration, mb)
            outputs = workload.first_inputs(batch)
            for module in stages:
                outputs = module(outputs, batch)
            total += float(workload.loss(outputs, batch)) / shape.microbatches
    return total


@pytest.mark.parametrize("model, grid", [(GPT, ("--tp", "2")), (TINY, ())], ids=["gpt-pp2-tp2", "user-pp2-v2"])
def test_a_checkpoint_loads_into_the_unsplit_model(tmp_path, model, grid):
    result = run_warm(tmp_path, "run", *_args(model), *grid, "--iters", str(STEPS + 1), "--checkpoint-every",
                      str(STEPS), "--out", "r")
    assert result.returncode == 0, result.stderr
    config = RunConfig(**model)  # the unsplit model: no TP
    stages, _, _ = _unsplit(config)
    assert rrfp.load_into_unsplit(tmp_path / "r", stages) == STEPS  # a run directory: its latest checkpoint
    # atol: a tenth of one AdamW step (lr 1e-3). AdamW divides by the gradient's size, so where a gradient is
    # rounding noise (attention's k bias: softmax ignores it) TP's other summation order moves a parameter by a
    # part of a step; a parameter put in the wrong place is off by its whole value
    expected = _reference_after(config, STEPS)
    for stage, (loaded, reference) in enumerate(zip(stages, expected)):
        for (name, value), (_, want) in zip(loaded.state_dict().items(), reference.state_dict().items()):
            torch.testing.assert_close(value, want, rtol=1e-5, atol=1e-4, msg=lambda m: f"stage{stage}.{name}: {m}")
    # the run's own loss at the iteration after the checkpoint: the q/k/v rows of a TP key in the unsplit order
    run_loss = pl.read_parquet(tmp_path / "r" / "metrics.parquet")["loss"][STEPS]
    assert _loss(config, stages, STEPS) == pytest.approx(run_loss, rel=1e-5)
    # another model is refused, naming a key
    other = {"hidden": 64} if model is GPT else {"workload": "tests.helpers.user_models:tiny_wider"}
    wider = RunConfig(**{**model, **other})
    with pytest.raises(UserError, match=r"not a checkpoint of this model: model\.stage0\.\S+ is \[") as err:
        checkpoint.load_into_unsplit(checkpoint.latest(tmp_path / "r"), _unsplit(wider)[0])
    assert "step-00000002" in str(err.value)


def test_a_directory_without_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(UserError, match="neither an rrfp checkpoint"):
        checkpoint.load_into_unsplit(tmp_path, [])
