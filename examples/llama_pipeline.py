"""A small Llama-style decoder, cut into pipeline stages for ``rrfp run`` ([Note: the model protocol]).

Run it from the repository root (no make, CPU is enough)::

    rrfp run --workload examples.llama_pipeline:build --ranks 2 --microbatches 4 --iters 10
    rrfp run --workload examples.llama_pipeline:build -p 2 -v 2 -m 8 --hint cp --checkpoint-every 5

The model: token embedding on the first stage; ``--layers-per-stage``
decoder layers per model stage (RMSNorm, rotary position embeddings,
causal multi-head attention, SwiGLU feed-forward, no biases); final RMSNorm
and the output head on the last stage. ``--hidden``, ``--heads`` and
``--vocab`` size it. The data: sequences of varying length (16 to 64 tokens,
``--samples`` per microbatch) that count up from a random start modulo the
vocabulary, so the next token is learnable and the loss falls within a few
steps. Each microbatch reports its token count, which the ``bfw`` and ``cp``
hints rank microbatches by.
"""

from __future__ import annotations

import random
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from rrfp import Batch, ModelContext, PipelineModel

MIN_LEN, MAX_LEN = 16, 64


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of ``x`` [batch, heads, length, head width]."""
    length, width = x.shape[-2], x.shape[-1]
    frequencies = 1.0 / (10000 ** (torch.arange(0, width, 2, device=x.device, dtype=torch.float32) / width))
    angles = torch.outer(torch.arange(length, device=x.device, dtype=torch.float32), frequencies)
    cos, sin = angles.cos(), angles.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class DecoderLayer(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attention_norm = RMSNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=False)
        self.mlp_norm = RMSNorm(width)
        hidden = 4 * width * 2 // 3  # SwiGLU keeps the parameter count of a 4x MLP
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = (t.transpose(1, 2) for t in
                   self.qkv(self.attention_norm(x)).view(batch, length, 3, self.heads, -1).unbind(2))
        attended = F.scaled_dot_product_attention(rotary(q), rotary(k), v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, length, width))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class LlamaStage(nn.Module):
    """One model stage: ``module(inputs, batch) -> (hidden,)``, or ``(logits,)`` on the last stage."""

    def __init__(self, ctx: ModelContext, stage: int) -> None:
        super().__init__()
        c = ctx.config
        self.first, self.last = stage == 0, stage == ctx.stages - 1
        if self.first:
            self.embed = nn.Embedding(c.vocab, c.hidden)
        self.layers = nn.ModuleList(DecoderLayer(c.hidden, c.heads) for _ in range(c.layers_per_stage))
        if self.last:
            self.norm = RMSNorm(c.hidden)
            self.head = nn.Linear(c.hidden, c.vocab, bias=False)

    def forward(self, inputs: tuple[torch.Tensor, ...], batch) -> tuple[torch.Tensor, ...]:
        h = self.embed(batch.tensors["tokens"]) if self.first else inputs[0]
        for layer in self.layers:
            h = layer(h)
        return (self.head(self.norm(h)),) if self.last else (h,)


def loss(outputs: tuple[torch.Tensor, ...], batch) -> torch.Tensor:
    (logits,) = outputs
    return F.cross_entropy(logits.flatten(0, 1), batch.tensors["labels"].flatten())


def data(vocab: int, samples: int, seed: int) -> Iterator[Batch]:
    """Endless microbatches, the same on every rank (seeded)."""
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    while True:
        length = rng.randrange(MIN_LEN, MAX_LEN + 1, 8)
        start = torch.randint(0, vocab, (samples, 1), generator=generator)
        sequence = (start + torch.arange(length + 1)) % vocab
        yield Batch({"tokens": sequence[:, :-1], "labels": sequence[:, 1:]}, tokens=samples * length)


def build(ctx: ModelContext) -> PipelineModel:
    """The factory ``rrfp run --workload examples.llama_pipeline:build`` calls."""
    stages = []
    for stage, _chunk in ctx.placement:
        torch.manual_seed(ctx.seed * 1000 + stage)  # a stage's weights depend on its number only
        stages.append(LlamaStage(ctx, stage))
    return PipelineModel(stages=stages, loss=loss, data=data(ctx.config.vocab, ctx.config.samples, ctx.seed))
