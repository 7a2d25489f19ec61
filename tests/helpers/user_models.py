"""Model factories for the tests of ``--workload package.module:factory`` ([Note: the model protocol])."""

from __future__ import annotations

import itertools

import torch
from torch import nn

from rrfp import Batch, ModelContext, PipelineModel


class Linear(nn.Module):
    def __init__(self, width: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.dropout = nn.Dropout(dropout)  # draws from this process's torch RNG, which checkpoints keep

    def forward(self, inputs, batch):
        x = batch.tensors["x"] if not inputs else inputs[0]
        return (self.dropout(torch.tanh(self.linear(x))),)


def _data(width: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    for index in itertools.count():
        rows = 2 + index % 3
        yield Batch({"x": torch.randn(rows, width, generator=generator)}, tokens=rows)


def _loss(outputs, batch):
    return (outputs[0] ** 2).mean()


def _model(ctx: ModelContext, width: int, loss=_loss, dropout: float = 0.0) -> PipelineModel:
    stages = []
    for stage, _ in ctx.placement:
        torch.manual_seed(ctx.seed + stage)
        stages.append(Linear(width, dropout))
    return PipelineModel(stages=stages, loss=loss, data=_data(width, ctx.seed), unit="samples")


def tiny(ctx: ModelContext) -> PipelineModel:
    return _model(ctx, 8)


def tiny_with_dropout(ctx: ModelContext) -> PipelineModel:
    return _model(ctx, 8, dropout=0.25)


def tiny_wider(ctx: ModelContext) -> PipelineModel:
    return _model(ctx, 16)


def one_stage_too_many(ctx: ModelContext) -> PipelineModel:
    model = _model(ctx, 8)
    model.stages.append(Linear(8))
    return model


def nan_at_iteration_2(ctx: ModelContext) -> PipelineModel:
    """Its loss is NaN at iteration 2 (every microbatch), finite otherwise."""

    def loss(outputs, batch):
        value = _loss(outputs, batch)
        return value * float("nan") if batch.iteration == 2 else value

    return _model(ctx, 8, loss)
