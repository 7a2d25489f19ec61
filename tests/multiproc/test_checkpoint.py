"""Checkpoints end to end: a resumed run continues bit for bit, bad resumes are refused, NaN never checkpointed.

Real ranks (2 processes, gloo), small models, a hard timeout on every run. Runs that several tests read are
module fixtures. Bad --resume and --checkpoint-every input with no run behind it: tests/inproc/test_run_args.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import polars as pl
import pytest

from hints.errors import UserError
from runtime.config import RunConfig
from runtime.run import checkpoint
from runtime.run.launch import free_port
from tests.helpers.cli import REPO, child_env, one_error_line, run_cli
from tests.helpers.processes import alive, status, wait_for
from tests.helpers.warm import run_warm

GPT = ("run", "--workload", "gpt", "-p", "2", "-m", "4", "--seq-len", "16", "--hidden", "32", "--policy", "fixed")
TINY = ("run", "--workload", "tests.helpers.user_models:tiny", "-p", "2", "-m", "3", "--policy", "fixed")


def losses(run) -> list[float]:
    return pl.read_parquet(run / "metrics.parquet")["loss"].to_list()


@pytest.fixture(scope="module")
def gpt_runs(tmp_path_factory):
    """An uninterrupted 10-iteration run ("whole": the reference of every resumed gpt run here, which trains the
    same iterations; nothing in a run depends on how many follow), and one that stopped after 2 (checkpoint at
    2, "part")."""
    root = tmp_path_factory.mktemp("gpt")
    whole = run_warm(root, *GPT, "--iters", "10", "--out", "whole")
    assert whole.returncode == 0, whole.stderr
    first = run_warm(root, *GPT, "--iters", "2", "--checkpoint-every", "2", "--out", "part")
    assert first.returncode == 0, first.stderr
    return root


def test_a_resumed_run_continues_bit_for_bit(gpt_runs):
    root = gpt_runs
    assert [p.name for p in (root / "part" / "checkpoints").iterdir()] == ["step-00000002"]
    shutil.copytree(root / "part", root / "resumed")  # the other tests resume "part" itself
    resumed = run_warm(root, "run", "--resume", "resumed", "--iters", "4", "--json")
    assert resumed.returncode == 0, resumed.stderr
    run = root / "resumed"
    assert losses(run) == losses(root / "whole")[:4]  # exact: the same floats; iterations 0-1 kept from before
    assert pl.read_parquet(run / "metrics.parquet")["iteration"].to_list() == [0, 1, 2, 3]
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-00000004"]  # the older one replaced
    assert (run / "trace-before-step-2" / "trace.pftrace").exists()  # the first attempt's trace kept
    assert json.loads((run / "config.json").read_text())["iters"] == 4


@pytest.mark.parametrize("grid", [("--tp", "2"), ("--dp", "2")])
def test_tp_and_dp_runs_resume_bit_for_bit_from_one_sharded_deduplicated_checkpoint(tmp_path, grid):
    whole = run_warm(tmp_path, *GPT, *grid, "--iters", "3", "--out", "whole")
    assert whole.returncode == 0, whole.stderr
    part = run_warm(tmp_path, *GPT, *grid, "--iters", "2", "--checkpoint-every", "2", "--out", "part")
    assert part.returncode == 0, part.stderr
    from torch.distributed.checkpoint import FileSystemReader

    path = checkpoint.latest(tmp_path / "part")
    metadata = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    qkv = metadata["model.stage0.blocks.0.qkv.weight"]
    assert list(qkv.size) == ([3, 32, 32] if grid[0] == "--tp" else [96, 32])  # the whole tensor, one key
    # --tp: each member wrote its half; --dp: both replicas hold it and one copy is written
    assert len(qkv.chunks) == (2 if grid[0] == "--tp" else 1)
    resumed = run_warm(tmp_path, "run", "--resume", "part", "--iters", "3")
    assert resumed.returncode == 0, resumed.stderr
    assert losses(tmp_path / "part") == losses(tmp_path / "whole")


def test_a_user_model_resumes_its_data_stream_and_rng_bit_for_bit(tmp_path):
    # bfw ranks each iteration's microbatches by their cost features, read before the checkpoint is loaded;
    # dropout draws from each rank's torch RNG, which the checkpoint restores
    model = ("--workload", "tests.helpers.user_models:tiny_with_dropout", "--hint", "bfw")
    whole = run_warm(tmp_path, *TINY, *model, "--iters", "4", "--out", "whole")
    assert whole.returncode == 0, whole.stderr
    part = run_warm(tmp_path, *TINY, *model, "--iters", "3", "--checkpoint-every", "2", "--out", "part")
    assert part.returncode == 0, part.stderr
    resumed = run_warm(tmp_path, "run", "--resume", "part", "--iters", "4")
    assert resumed.returncode == 0, resumed.stderr
    assert losses(tmp_path / "part") == losses(tmp_path / "whole")


@pytest.mark.parametrize("args, message", [
    (("--microbatches", "8"), "step-00000002 is a checkpoint of another shape: microbatches 4 there, 8 here"),
    (("--hidden", "64"), "step-00000002 is a checkpoint of another model: hidden 32 there, 64 here"),
    (("--iters", "2"), "step-00000002 has already trained 2 iterations and the run has 2; give --iters > 2"),
    (("--out", "elsewhere"), "a resumed run continues in its own directory; drop --out"),
])
def test_resuming_another_shape_or_model_is_refused_before_anything_is_written(gpt_runs, args, message):
    before = sorted(p.relative_to(gpt_runs) for p in gpt_runs.rglob("*"))
    line = one_error_line(run_cli(gpt_runs, "run", "--resume", "part", *args))
    assert line == f"error: --resume: {message}", line
    assert sorted(p.relative_to(gpt_runs) for p in gpt_runs.rglob("*")) == before


@pytest.fixture(scope="module")
def tiny_checkpointed(tmp_path_factory):
    """The tiny user model trained 2 iterations with a checkpoint after each: the folder (the run is "t" there)
    and its result. Read by the next two tests; the one that changes it works on a copy."""
    root = tmp_path_factory.mktemp("tiny")
    return root, run_warm(root, *TINY, "--iters", "2", "--checkpoint-every", "1", "--out", "t")


def test_a_checkpoint_of_another_model_is_found_by_its_parameters(tiny_checkpointed, monkeypatch):
    tmp_path, run = tiny_checkpointed
    assert run.returncode == 0, run.stderr
    path = checkpoint.latest(tmp_path / "t")
    wider = RunConfig(workload="tests.helpers.user_models:tiny_wider", ranks=2, microbatches=3)
    monkeypatch.chdir(REPO)  # where the factory's module is found
    with pytest.raises(UserError, match=r"another model: stage0.linear.bias is \[8\] there, \[16\] here"):
        checkpoint._check_parameters(wider, path, "--resume")


def test_a_partial_checkpoint_is_never_taken_for_one(tiny_checkpointed, tmp_path):
    root, run = tiny_checkpointed
    assert run.returncode == 0, run.stderr
    shutil.copytree(root / "t", tmp_path / "t")  # the other test reads the run as it was left
    folder = tmp_path / "t" / "checkpoints"
    complete = checkpoint.latest(tmp_path / "t")
    assert complete.name == "step-00000002"
    # What a crash mid-write leaves: DCP files in a temporary directory, or (never renamed) no manifest.
    shutil.copytree(complete, folder / ".tmp-step-00000003")
    (folder / ".tmp-step-00000003" / checkpoint.MANIFEST).unlink()
    shutil.copytree(complete, folder / "step-00000009")
    (folder / "step-00000009" / checkpoint.MANIFEST).unlink()
    assert checkpoint.latest(tmp_path / "t") == complete
    resumed = run_warm(tmp_path, "run", "--resume", "t", "--iters", "3")
    assert resumed.returncode == 0, resumed.stderr
    assert not (folder / ".tmp-step-00000003").exists()  # cleared before the first iteration


def test_a_nan_loss_stops_the_run_and_is_never_checkpointed(tmp_path):
    args = ("run", "--workload", "tests.helpers.user_models:nan_at_iteration_2", "-p", "2", "-m", "3", "--iters", "4",
            "--checkpoint-every", "1")
    stopped = run_warm(tmp_path, *args, "--out", "s")
    assert stopped.returncode == 1
    assert "NonFiniteLoss: the loss is nan at iteration 2; stopped before the optimizer step" in stopped.stderr
    assert checkpoint.latest(tmp_path / "s").name == "step-00000002"  # iterations 0 and 1 only
    skipped = run_warm(tmp_path, *args, "--skip-nonfinite", "--out", "k")
    assert skipped.returncode == 0, skipped.stderr
    metrics = pl.read_parquet(tmp_path / "k" / "metrics.parquet")
    assert metrics["skipped_step"].to_list() == [False, False, True, False]
    assert metrics["loss"][3] is not None and metrics["loss"][3] == metrics["loss"][3]  # finite again
    assert checkpoint.latest(tmp_path / "k").name == "step-00000004"
    assert all(seconds > 0 for seconds in metrics["checkpoint_seconds"].to_list())  # one write per iteration


def test_torchrun_restarts_a_killed_job_from_its_last_checkpoint(gpt_runs, tmp_path):
    env = child_env()
    job = (*GPT[1:], "--iters", "10", "--checkpoint-every", "3", "--delay", "0F0=0.05", "--out", "r")
    process = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                "--max-restarts", "1", "--monitor-interval", "0.1", "--master-port", str(free_port()),
                                "-m", "rrfp_cli", "run", *job], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    run = tmp_path / "r"
    try:
        victim = wait_for(lambda: checkpoint.latest(run) is not None and (s := status(run, 1))
                          and s["iteration"] is not None and s["iteration"] >= 4 and s, timeout=120,
                          what="a checkpoint, and rank 1 in iteration 4")
        os.kill(victim["pid"], signal.SIGKILL)
        _, stderr = process.communicate(timeout=180)
    finally:
        if process.poll() is None:  # never leave torchrun behind
            os.killpg(process.pid, signal.SIGKILL)
        for rank in (0, 1):  # nor its ranks: the agent starts each in a session of its own
            if (s := status(run, rank)) and alive(s["pid"]):
                os.kill(s["pid"], signal.SIGKILL)
    assert process.returncode == 0, stderr[-3000:]
    metrics = pl.read_parquet(run / "metrics.parquet")
    assert metrics["iteration"].to_list() == list(range(10))
    assert list(run.glob("trace-before-step-*")), "the restarted job did not resume from a checkpoint"
    assert metrics["loss"].to_list() == losses(gpt_runs / "whole")  # the uninterrupted run of the same 10
    assert checkpoint.latest(run).name == "step-00000009"
