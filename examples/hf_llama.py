"""A Hugging Face ``LlamaForCausalLM`` cut into pipeline stages for ``rrfp run`` ([Note: the model protocol]).

Needs the ``hf`` extra (``pip install -e '.[hf]'``: transformers 5). Run it from the repository root; nothing is
downloaded, the weights are random (docs/huggingface.md)::

    rrfp run --workload examples.hf_llama:build -p 2 -m 4 --iters 10
    rrfp run --workload examples.hf_llama:build -p 2 -m 4 --iters 10 --tp 2      # transformers' own TP plan
    rrfp run --workload examples.hf_llama:build -p 2 -m 4 --iters 10 --dp 2

The model is transformers' ``LlamaForCausalLM``, built from a ``LlamaConfig`` sized by the run's options
(``--hidden``, ``--heads``, ``--layers-per-stage``, ``--vocab``, ``--seq-len``) and seeded from ``--seed``, so
every rank and the single-process reference build the same weights. The stages hold its own modules
([Note: cutting LlamaForCausalLM]); ``hf_name`` maps rrfp's parameter names back to the unsplit model's,
``load_checkpoint`` reads a run's checkpoint into a ``LlamaForCausalLM``, and ``tp_plan`` turns
``LlamaConfig.base_model_tp_plan`` into torch's parallel styles.

[Note: cutting LlamaForCausalLM]
    Model stage ``k`` of ``S`` holds decoder layers ``k x L .. k x L + L-1`` (``L`` = ``--layers-per-stage``,
    ``S x L`` layers in all); stage 0 also the token embedding, stage ``S-1`` the final norm and ``lm_head``.
    Only the hidden states ``[batch, length, hidden]`` travel between stages. What ``LlamaModel.forward``
    computes once before its layers, each stage computes again from the sequence it receives, with the same
    transformers code: position ids ``0..length-1``, the rotary embedding's ``(cos, sin)`` (a
    ``LlamaRotaryEmbedding`` per stage: buffers only, no parameters) and the causal mask
    (``masking_utils.create_causal_mask``, which under SDPA is ``None`` and lets attention be causal by itself).
    The loss is the model's own ``loss_function`` (``ForCausalLMLoss``: labels shifted by one inside, mean over
    the predicted tokens), so a microbatch's loss is exactly ``LlamaForCausalLM(input_ids, labels=labels).loss``.
    The stage modules keep the unsplit model's submodule names (``embed_tokens``, ``layers``, ``norm``,
    ``lm_head``), so the TP plan's keys and the name mapping are the model's own, re-rooted. Word embeddings are
    never tied: the embedding and ``lm_head`` live on different ranks.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Iterable, Iterator

import torch
from torch import nn

from hints.errors import UserError
from rrfp import Batch, ModelContext, PipelineModel

WHERE = "`workload`"  # where the factory's errors point: rrfp run prints them as --workload
MIN_LEN, MAX_LEN, LEN_STEP = 16, 64, 8  # sequence lengths without --seq-len
MULTIPLE_OF = 16  # Llama rounds its MLP width up to a multiple of this


def _transformers():
    """transformers' Llama pieces; a UserError naming the extra when it is not installed."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
        from transformers.masking_utils import create_causal_mask
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    except ImportError as err:
        raise UserError(f"examples.hf_llama needs transformers (pip install -e '.[hf]'): {err}", WHERE) from None
    return LlamaConfig, LlamaForCausalLM, LlamaRotaryEmbedding, create_causal_mask


def max_length(config) -> int:
    """The longest sequence the data stream yields: ``--seq-len``, or ``MAX_LEN``."""
    return config.seq_len or MAX_LEN


def llama_config(config, stages: int, tp: int = 1):
    """The ``LlamaConfig`` of a run: ``config`` is the run's options (``ctx.config``), ``stages`` its model stages."""
    LlamaConfig = _transformers()[0]  # (RunConfig has checked that `heads` divides `hidden`)
    intermediate = MULTIPLE_OF * math.ceil(8 * config.hidden // 3 / MULTIPLE_OF)
    if config.heads % tp or intermediate % tp:
        raise UserError(f"{tp} must divide the Llama model's {config.heads} attention heads (`heads`) and its "
                        f"MLP width {intermediate}: tensor parallelism splits both", "`tp`")
    return LlamaConfig(vocab_size=config.vocab, hidden_size=config.hidden, intermediate_size=intermediate,
                       num_hidden_layers=stages * config.layers_per_stage, num_attention_heads=config.heads,
                       num_key_value_heads=config.heads, max_position_embeddings=max_length(config),
                       tie_word_embeddings=False)  # [Note: cutting LlamaForCausalLM]


def llama_for_causal_lm(config, stages: int, seed: int):
    """The unsplit ``LlamaForCausalLM`` the stages are cut from: the same weights on every call with ``seed``.

    Also the reference to compare with: its own forward and backward are what the pipeline must reproduce.
    The caller's torch RNG is left as it was.
    """
    LlamaForCausalLM = _transformers()[1]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(llama_config(config, stages))


class HFLlamaStage(nn.Module):
    """One model stage of a ``LlamaForCausalLM``: ``module(inputs, batch) -> (hidden,)``, ``(logits,)`` on the last.

    Holds the unsplit model's own modules under their own names ([Note: cutting LlamaForCausalLM]).
    """

    def __init__(self, model, stage: int, stages: int, layers_per_stage: int) -> None:
        super().__init__()
        _, _, LlamaRotaryEmbedding, self._causal_mask = _transformers()
        self.config = model.config  # after the model's init: it names the attention implementation (sdpa)
        self.first, self.last = stage == 0, stage == stages - 1
        if self.first:
            self.embed_tokens = model.model.embed_tokens
        first_layer = stage * layers_per_stage
        self.layers = nn.ModuleList(model.model.layers[first_layer:first_layer + layers_per_stage])
        self.rotary_emb = LlamaRotaryEmbedding(config=self.config)
        if self.last:
            self.norm = model.model.norm
            self.lm_head = model.lm_head

    def forward(self, inputs: tuple[torch.Tensor, ...], batch) -> tuple[torch.Tensor, ...]:
        hidden = self.embed_tokens(batch.tensors["input_ids"]) if self.first else inputs[0]
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        mask = self._causal_mask(config=self.config, inputs_embeds=hidden, attention_mask=None, cache=None,
                                 position_ids=positions)
        position_embeddings = self.rotary_emb(hidden, position_ids=positions)
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=mask, position_embeddings=position_embeddings,
                           position_ids=positions)
        return (self.lm_head(self.norm(hidden)),) if self.last else (hidden,)


def cut(model, stages: Iterable[int], count: int, layers_per_stage: int) -> list[HFLlamaStage]:
    """Model stages ``stages`` of ``count`` of ``model`` (a ``LlamaForCausalLM``), holding its own modules: a
    change to a stage's parameters is a change to the model's."""
    return [HFLlamaStage(model, stage, count, layers_per_stage) for stage in stages]


def hf_name(name: str, layers_per_stage: int) -> str:
    """rrfp's ``"<stage>.<parameter>"`` name (gradients, ``ReadyPipeline`` modules) -> ``LlamaForCausalLM``'s.

    ``"1.layers.0.mlp.up_proj.weight"`` with 2 layers per stage -> ``"model.layers.2.mlp.up_proj.weight"``;
    ``"0.embed_tokens.weight"`` -> ``"model.embed_tokens.weight"``; the last stage's ``"norm.weight"`` ->
    ``"model.norm.weight"`` and ``"lm_head.weight"`` -> ``"lm_head.weight"``. A checkpoint's key
    ``model.stage<k>.<parameter>`` is the same name once ``load_into_unsplit`` has put it on stage ``k``.
    """
    stage, _, rest = name.partition(".")
    if not stage.isdigit() or not rest:
        raise UserError(f"{name!r} is not a '<stage>.<parameter>' name", "hf_name")
    root, _, inner = rest.partition(".")
    if root == "lm_head":
        return rest
    if root in ("embed_tokens", "norm"):
        return f"model.{rest}"
    if root == "layers":
        index, _, leaf = inner.partition(".")
        return f"model.layers.{int(stage) * layers_per_stage + int(index)}.{leaf}"
    raise UserError(f"{name!r} names no parameter of a LlamaForCausalLM stage", "hf_name")


def hf_state_dict(stages, layers_per_stage: int) -> dict[str, torch.Tensor]:
    """The unsplit model's state dict from stage modules (a list, or a dict stage -> module): what
    ``LlamaForCausalLM.load_state_dict`` takes, e.g. after ``rrfp.load_into_unsplit(run, stages)``."""
    modules = stages.items() if isinstance(stages, dict) else enumerate(stages)
    return {hf_name(f"{stage}.{key}", layers_per_stage): tensor for stage, module in modules
            for key, tensor in module.state_dict().items()}


def load_checkpoint(path: str | Path):
    """An ``rrfp run`` checkpoint of this model as a ``LlamaForCausalLM``, on one process: ``(model, step)``.

    ``path`` is a run (job) directory, whose latest checkpoint is read, or one of its
    ``checkpoints/step-<N>`` directories. The run's ``config.json`` sizes the model; its stages are cut from
    it and ``rrfp.load_into_unsplit`` writes the checkpoint into them, so into the model (TP shards are
    stored whole, so a ``--tp`` run loads the same way).
    """
    import rrfp
    from runtime.config import RunConfig, run_shape

    given = Path(path)
    run = next((d for d in (given, *given.parents[:2]) if (d / "config.json").is_file()), None)
    if run is None:
        raise UserError("no config.json here or two levels up: not a run of rrfp run", str(given))
    config = RunConfig(**json.loads((run / "config.json").read_text()))
    count = run_shape(config).stages
    model = llama_for_causal_lm(config, count, config.seed)
    step = rrfp.load_into_unsplit(given, cut(model, range(count), count, config.layers_per_stage))
    return model, step


def tp_plan(llama) -> dict:
    """``LlamaConfig.base_model_tp_plan`` as torch parallel styles, keyed inside a stage module.

    transformers' plan names ``LlamaModel``'s submodules (``layers.*.self_attn.q_proj``); a stage keeps
    ``layers`` under the same name, so a key is re-rooted onto it unchanged, and every stage gets the same plan.
    ``colwise`` -> ``ColwiseParallel()`` (output sharded by heads or MLP units), ``rowwise`` ->
    ``RowwiseParallel()`` (partial sums all-reduced). HF's attention reshapes with ``-1`` heads, so it runs
    on the local share of the heads as it is.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {}
    for key, style in llama.base_model_tp_plan.items():
        if style not in styles or not key.startswith("layers."):
            raise UserError(f"transformers' TP plan entry {key!r}: {style!r} has no place in a stage here",
                            "tp_plan")
        plan[key] = styles[style]()
    return plan


def data(config, seed: int, microbatches: int, dp: int = 1, dp_rank: int = 0) -> Iterator[Batch]:
    """Endless microbatches, the same on every rank (seeded); with ``dp`` replicas, replica ``dp_rank``'s share.

    The stream is one of ``dp x microbatches`` per iteration, and replica ``d`` takes items
    ``d x microbatches .. (d+1) x microbatches - 1`` of each, so ``--dp N`` trains what one replica does on
    ``N x microbatches``. A microbatch is ``--samples`` rows of one length (``--seq-len``, or 16..64 in steps
    of 8) counting up from a random token modulo the vocabulary (learnable, so the loss falls); ``labels``
    are the tokens themselves, as ``LlamaForCausalLM`` shifts them.
    """
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    while True:
        for replica in range(dp):
            for _ in range(microbatches):
                length = config.seq_len or rng.randrange(MIN_LEN, MAX_LEN + 1, LEN_STEP)
                start = torch.randint(0, config.vocab, (config.samples, 1), generator=generator)
                tokens = (start + torch.arange(length)) % config.vocab
                if replica == dp_rank:
                    yield Batch({"input_ids": tokens, "labels": tokens}, tokens=config.samples * length)


def build(ctx: ModelContext) -> PipelineModel:
    """The factory ``rrfp run --workload examples.hf_llama:build`` calls."""
    c = ctx.config
    llama_config(c, ctx.stages, ctx.tp)  # the sizes are checked before anything is built
    model = llama_for_causal_lm(c, ctx.stages, ctx.seed)
    stages = cut(model, [stage for stage, _chunk in ctx.placement], ctx.stages, c.layers_per_stage)
    loss_function, vocab = model.loss_function, model.config.vocab_size

    def loss(outputs: tuple[torch.Tensor, ...], batch) -> torch.Tensor:
        return loss_function(logits=outputs[0], labels=batch.tensors["labels"], vocab_size=vocab)

    # rrfp applies the plan under --tp (parallelize_module on each stage, ctx.tp_mesh); it is ignored otherwise
    return PipelineModel(stages=stages, loss=loss, data=data(c, ctx.seed, ctx.microbatches, ctx.dp, ctx.dp_rank),
                         unit="tokens", tp_plan=tp_plan(model.config))
