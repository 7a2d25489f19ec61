"""examples/hf_llama.py on real processes: ``rrfp run`` trains transformers' ``LlamaForCausalLM`` as the unsplit
model does (its own forward and backward), at pp=2 under fixed and ready, 1f1b and zb; at pp=2 x tp=2 with
transformers' TP plan; at pp=2 x dp=2 and pp=2 x tp=2 x dp=2; and a checkpoint loads back into ``LlamaForCausalLM``.

Each launch runs in a subprocess with a hard timeout (tests.helpers.jobs.run_jobs), so nothing here can hang.
One process: tests/inproc/test_hf_llama.py.
"""

from __future__ import annotations

import pytest
import torch

from examples.hf_llama import data, hf_name, llama_for_causal_lm, load_checkpoint
from runtime.config import RunConfig, run_shape
from tests.helpers.jobs import run_jobs

# the example imports transformers only as it builds a model, so the imports above work without it
pytest.importorskip("transformers", reason="examples/hf_llama.py needs the hf extra: pip install -e '.[hf]'")

WORKLOAD = "examples.hf_llama:build"
BASE = dict(workload=WORKLOAD, ranks=2, microbatches=4, iters=2, seed=3, layers_per_stage=2)
RTOL, ATOL = 1e-5, 1e-6  # the pipeline sums the microbatches' gradients in its own order
TP_RTOL, TP_ATOL = 2e-5, 2e-6  # sharded matmuls sum their partial products in another order too


def reference(config: RunConfig, microbatches: int, iters: int):
    """The unsplit ``LlamaForCausalLM`` trained on the same microbatches by its own forward and backward, each
    loss divided by ``microbatches``, with rrfp run's AdamW: every iteration's loss, the first iteration's
    gradients and the parameters at the end, by transformers' names."""
    model = llama_for_causal_lm(config, run_shape(config).stages, config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    stream = data(config, config.seed, microbatches)
    losses, first_grads = [], {}
    for iteration in range(iters):
        total = 0.0
        for _ in range(microbatches):
            batch = next(stream)
            loss = model(batch.tensors["input_ids"], labels=batch.tensors["labels"]).loss / microbatches
            loss.backward()
            total += loss.item()
        losses.append(total)
        if iteration == 0:
            first_grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return losses, first_grads, {name: p.detach().clone() for name, p in model.named_parameters()}


def gathered_grads(results: dict, name: str, layers_per_stage: int, like: dict
                   ) -> tuple[dict[str, torch.Tensor], set[str]]:
    """The job's first-iteration gradients by transformers' names, replica 0's TP shards put back together, and
    the names of the sharded ones.

    A TP member holds a slice of a sharded parameter along one dimension (``ColwiseParallel``: the output
    features, ``RowwiseParallel``: the input features): the one where its size differs from the whole's.
    """
    members: dict[str, list[torch.Tensor]] = {}
    for rank in sorted(results):  # global rank order: TP members in member order
        job = results[rank][name]
        if job["grid"].dp_rank:
            continue
        for key, grad in job["grads"].items():
            members.setdefault(hf_name(key, layers_per_stage), []).append(grad)
    grads, sharded = {}, set()
    for key, shards in members.items():
        whole = like[key].shape
        if shards[0].shape == whole:  # replicated (or whole on every member): all must agree
            for other in shards[1:]:
                torch.testing.assert_close(other, shards[0], rtol=0, atol=0, msg=key)
            grads[key] = shards[0]
        else:
            (dim,) = [d for d, size in enumerate(shards[0].shape) if size != whole[d]]
            grads[key] = torch.cat(shards, dim)
            sharded.add(key)
    return grads, sharded


def assert_grads(got: dict, expected: dict, what: str, rtol: float = RTOL, atol: float = ATOL) -> None:
    assert sorted(got) == sorted(expected), what
    for key, grad in expected.items():
        torch.testing.assert_close(got[key], grad, rtol=rtol, atol=atol, msg=f"{what}: {key}")


PP_JOBS = [{"name": f"{policy}-{hint}", "config": dict(BASE, policy=policy, hint=hint,
                                                        **({"checkpoint_every": 2} if hint == "1f1b" else {}))}
           for policy in ("fixed", "ready") for hint in ("1f1b", "zb")]


@pytest.fixture(scope="module")
def pp_run(tmp_path_factory):
    """Every PP_JOBS job in one launch of 2 ranks: the results and the folder (job NAME ran in run/NAME)."""
    path = tmp_path_factory.mktemp("hf-pp")
    return run_jobs(path, 2, PP_JOBS, timeout=60.0), path


def test_rrfp_run_trains_llama_for_causal_lm_as_its_own_forward_and_backward(pp_run):
    results, _ = pp_run
    losses, grads, _ = reference(RunConfig(**BASE), BASE["microbatches"], BASE["iters"])
    for job in PP_JOBS:
        got, sharded = gathered_grads(results, job["name"], BASE["layers_per_stage"], grads)
        assert_grads(got, grads, job["name"])
        assert not sharded
        assert results[0][job["name"]]["losses"] == pytest.approx(losses, rel=1e-5), job["name"]


def test_a_checkpoint_loads_back_into_llama_for_causal_lm(pp_run):
    _, path = pp_run
    _, _, trained = reference(RunConfig(**BASE), BASE["microbatches"], BASE["iters"])
    for job in PP_JOBS:
        if "checkpoint_every" not in job["config"]:
            continue
        run = path / "run" / job["name"]
        for where in (run, run / "checkpoints" / "step-00000002"):  # a run: its latest checkpoint
            model, step = load_checkpoint(where)
            assert step == 2 and sorted(dict(model.named_parameters())) == sorted(trained)
            for key, parameter in model.named_parameters():
                torch.testing.assert_close(parameter, trained[key], rtol=RTOL, atol=ATOL, msg=f"{where}: {key}")


def test_pp2_x_tp2_with_transformers_tp_plan_matches_the_unsplit_model(tmp_path):
    jobs = [{"name": f"tp-{policy}-{hint}", "config": dict(BASE, tp=2, policy=policy, hint=hint)}
            for policy, hint in (("fixed", "1f1b"), ("ready", "zb"))]
    results = run_jobs(tmp_path, 4, jobs, timeout=60.0)
    losses, grads, _ = reference(RunConfig(**BASE), BASE["microbatches"], BASE["iters"])
    for job in jobs:
        got, sharded = gathered_grads(results, job["name"], BASE["layers_per_stage"], grads)
        assert_grads(got, grads, job["name"], TP_RTOL, TP_ATOL)
        # each member held half of every projection: HF's attention ran on its 2 local heads of 4
        assert sharded == {key for key in grads if key.endswith("_proj.weight")}, sharded
        assert results[0][job["name"]]["losses"] == pytest.approx(losses, rel=1e-5), job["name"]


def test_pp2_x_dp2_trains_the_unsplit_model_on_both_replicas_shares(tmp_path):
    job = {"name": "dp-ready-zb", "config": dict(BASE, dp=2, policy="ready", hint="zb")}
    results = run_jobs(tmp_path, 4, [job], timeout=60.0)
    doubled = RunConfig(**BASE)
    losses, grads, _ = reference(doubled, 2 * BASE["microbatches"], BASE["iters"])
    for rank, rank_results in results.items():  # after the reduction every replica holds the whole gradient
        dp_rank = rank_results[job["name"]]["grid"].dp_rank
        got = {hf_name(key, BASE["layers_per_stage"]): grad for key, grad in rank_results[job["name"]]["grads"].items()}
        expected = {key: grads[key] for key in got}
        assert_grads(got, expected, f"rank {rank} (replica {dp_rank})")
    assert results[0][job["name"]]["losses"] == pytest.approx(losses, rel=1e-5)


def test_pp2_x_tp2_x_dp2_matches_the_unsplit_model_on_both_replicas_shares(tmp_path):
    """8 processes: replica 0's TP shards put back together give the unsplit model's gradient of both replicas'
    microbatches (after the DP reduction), with transformers' TP plan."""
    job = {"name": "tp-dp-ready-1f1b", "config": dict(BASE, tp=2, dp=2, policy="ready", hint="1f1b")}
    results = run_jobs(tmp_path, 8, [job], timeout=60.0)
    losses, grads, _ = reference(RunConfig(**BASE), 2 * BASE["microbatches"], BASE["iters"])
    got, sharded = gathered_grads(results, job["name"], BASE["layers_per_stage"], grads)
    assert_grads(got, grads, job["name"], TP_RTOL, TP_ATOL)
    assert sharded == {key for key in grads if key.endswith("_proj.weight")}, sharded
    assert results[0][job["name"]]["losses"] == pytest.approx(losses, rel=1e-5)
