"""examples/hf_llama.py in one process: its stages, chained, are transformers' unsplit ``LlamaForCausalLM``.

The loss and every gradient equal the unsplit model's own forward and backward, bit for bit; the name
mapping covers every parameter once and loads the stages back into ``LlamaForCausalLM``; the TP plan is
transformers' own, keyed onto every stage; the data stream gives each DP replica its share. On real processes
(``rrfp run``, ``--tp``, ``--dp``): tests/multiproc/test_hf_llama.py.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from examples.hf_llama import build, data, hf_name, hf_state_dict, llama_for_causal_lm, tp_plan
from hints.errors import UserError
from runtime.config import RunConfig, run_shape
from runtime.workloads.user import ModelContext, check_factory

# the example imports transformers only as it builds a model, so the imports above work without it
pytest.importorskip("transformers", reason="examples/hf_llama.py needs the hf extra: pip install -e '.[hf]'")

WORKLOAD = "examples.hf_llama:build"


def context(config: RunConfig, stages=None) -> ModelContext:
    """What ``rrfp run`` tells the factory; every stage unless ``stages`` is given."""
    shape = run_shape(config)
    stages = range(shape.stages) if stages is None else stages
    return ModelContext(config, shape.ranks, shape.chunks, shape.microbatches,
                        tuple((k, shape.chunk_of(k)) for k in stages), config.seed)


def chained_loss(model, batch) -> torch.Tensor:
    outputs: tuple = ()
    for stage in model.stages:
        outputs = stage(outputs, batch)
    return model.loss(outputs, batch)


@pytest.mark.parametrize("options", [dict(ranks=2, layers_per_stage=2),
                                     dict(ranks=2, chunks=2, layers_per_stage=1, hint="interleaved-1f1b"),
                                     dict(ranks=3, layers_per_stage=1, seq_len=24, samples=3, seed=7)])
def test_the_chained_stages_are_the_unsplit_model_bit_for_bit(options):
    config = RunConfig(workload=WORKLOAD, microbatches=3, **options)
    ctx = context(config)
    model = build(ctx)
    reference = llama_for_causal_lm(config, ctx.stages, config.seed)
    for batch in itertools.islice(model.data, 3):  # gradients accumulate over the microbatches, as in a step
        loss = chained_loss(model, batch)
        expected = reference(batch.tensors["input_ids"], labels=batch.tensors["labels"]).loss
        assert torch.equal(loss, expected)
        loss.backward()
        expected.backward()
    by_name = dict(reference.named_parameters())
    mapped = {hf_name(f"{stage}.{name}", config.layers_per_stage): parameter
              for stage, module in enumerate(model.stages) for name, parameter in module.named_parameters()}
    assert sorted(mapped) == sorted(by_name)  # every parameter of LlamaForCausalLM, once
    for name, parameter in mapped.items():
        assert torch.equal(parameter, by_name[name]), name
        assert torch.equal(parameter.grad, by_name[name].grad), name


def test_only_hidden_states_travel_and_the_loss_shifts_the_labels():
    config = RunConfig(workload=WORKLOAD, ranks=2, microbatches=2)
    model = build(context(config))
    batch = next(iter(model.data))
    tokens = batch.tensors["input_ids"]
    (hidden,) = model.stages[0]((), batch)
    assert hidden.shape == (*tokens.shape, config.hidden)
    (logits,) = model.stages[1]((hidden,), batch)
    # the last position predicts nothing: the loss is the next-token cross-entropy of the others
    manual = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    torch.testing.assert_close(model.loss((logits,), batch), manual)


def test_a_rank_builds_the_reference_weights_of_its_own_stages():
    config = RunConfig(workload=WORKLOAD, ranks=2, chunks=2, microbatches=2, hint="interleaved-1f1b")
    whole = build(context(config)).stages
    rank1 = build(context(config, [1, 3])).stages  # rank 1 of 2 holds model stages 1 and 3
    for mine, reference in zip(rank1, (whole[1], whole[3])):
        assert mine.state_dict().keys() == reference.state_dict().keys()
        for key, tensor in mine.state_dict().items():
            assert torch.equal(tensor, reference.state_dict()[key]), key
    assert not hasattr(rank1[0], "embed_tokens") and hasattr(rank1[1], "lm_head")


def test_trained_stages_load_back_into_llama_for_causal_lm():
    config = RunConfig(workload=WORKLOAD, ranks=2, microbatches=2, layers_per_stage=2)
    model = build(context(config))
    optimizer = torch.optim.SGD([p for stage in model.stages for p in stage.parameters()], lr=0.5)
    for batch in itertools.islice(model.data, 2):
        chained_loss(model, batch).backward()
        optimizer.step()
    unsplit = llama_for_causal_lm(config, 2, config.seed + 1)  # other weights, overwritten by the stages'
    unsplit.load_state_dict(hf_state_dict(model.stages, config.layers_per_stage))
    batch = next(iter(model.data))
    with torch.no_grad():
        assert torch.equal(unsplit(batch.tensors["input_ids"], labels=batch.tensors["labels"]).loss,
                           chained_loss(model, batch))


@pytest.mark.parametrize("name", ["lm_head.weight", "x.layers.0.mlp.up_proj.weight", "0.rotary_emb.inv_freq.x",
                                  "1.other.weight"])
def test_a_name_that_is_no_stage_parameter_is_refused(name):
    with pytest.raises(UserError, match="hf_name"):
        hf_name(name, 1)


def test_the_tp_plan_is_transformers_own_on_every_stage():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    config = RunConfig(workload=WORKLOAD, ranks=2, microbatches=2, layers_per_stage=2)
    model = build(context(config))
    llama = model.stages[0].config
    plan = tp_plan(llama)
    assert plan.keys() == llama.base_model_tp_plan.keys()
    for key, style in plan.items():
        expected = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}[llama.base_model_tp_plan[key]]
        assert type(style) is expected, key
    for stage in model.stages:  # each key names Linear layers of every stage, as parallelize_module matches it
        names = dict(stage.named_modules())
        for key in plan:
            matches = [n for n in names if _matches(key, n)]
            assert len(matches) == config.layers_per_stage, key
            assert all(isinstance(names[n], torch.nn.Linear) for n in matches), key


def _matches(pattern: str, name: str) -> bool:
    """``parallelize_module``'s rule: dot-separated atoms, each matched with fnmatch."""
    from fnmatch import fnmatch

    atoms, parts = pattern.split("."), name.split(".")
    return len(atoms) == len(parts) and all(fnmatch(part, atom) for part, atom in zip(parts, atoms))


def test_tp_must_divide_the_heads_and_the_mlp():
    from examples.hf_llama import llama_config

    config = RunConfig(workload=WORKLOAD, ranks=2, hidden=96, heads=6)
    assert llama_config(config, 2, tp=2).intermediate_size == 256
    with pytest.raises(UserError, match=r"3 must divide .* 6 attention heads .* MLP width 256") as err:
        llama_config(config, 2, tp=3)  # 3 heads' worth each, but 256 MLP units do not split in 3
    assert err.value.where == "`tp`"


def test_the_dp_replicas_share_the_stream_of_one_replica_with_more_microbatches():
    config = RunConfig(workload=WORKLOAD, ranks=2, microbatches=2, samples=1)
    whole = list(itertools.islice(data(config, 3, microbatches=4), 8))  # 2 iterations of 4
    shares = [list(itertools.islice(data(config, 3, microbatches=2, dp=2, dp_rank=d), 4)) for d in range(2)]
    for iteration in range(2):
        expected = whole[4 * iteration:4 * iteration + 4]
        got = shares[0][2 * iteration:2 * iteration + 2] + shares[1][2 * iteration:2 * iteration + 2]
        for mine, reference in zip(got, expected):
            assert torch.equal(mine.tensors["input_ids"], reference.tensors["input_ids"])
            assert mine.tokens == reference.tokens
    lengths = {b.tensors["input_ids"].shape[1] for b in whole}
    assert len(lengths) > 1 and all(b.tokens == b.tensors["input_ids"].numel() for b in whole)


def test_the_checks_build_every_stage_on_meta():
    config = RunConfig(workload=WORKLOAD, ranks=2, layers_per_stage=2)
    check_factory(config)  # what rrfp run does before any rank starts: no error, nothing allocated
    with torch.device("meta"):
        model = build(context(config))
    assert all(p.is_meta for stage in model.stages for p in stage.parameters())


def test_a_folder_that_is_no_run_is_no_checkpoint(tmp_path):
    from examples.hf_llama import load_checkpoint

    (tmp_path / "checkpoints" / "step-00000002").mkdir(parents=True)
    for where in (tmp_path, tmp_path / "checkpoints" / "step-00000002"):
        with pytest.raises(UserError, match="not a run of rrfp run"):
            load_checkpoint(where)
