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


# -- tensor parallelism ([Note: tensor parallelism for a model you bring]) ------------------------------------


class MLPStage(nn.Module):
    """A residual MLP block after a norm; stage 0 also embeds ``x`` with a linear layer."""

    def __init__(self, width: int, first: bool) -> None:
        super().__init__()
        self.embed = nn.Linear(width, width) if first else None
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, inputs, batch):
        x = self.embed(batch.tensors["x"]) if self.embed is not None else inputs[0]
        return (x + self.down(torch.nn.functional.gelu(self.up(self.norm(x)))),)


def _mlp_stages(ctx: ModelContext, width: int) -> list[nn.Module]:
    stages = []
    for stage, _ in ctx.placement:
        torch.manual_seed(ctx.seed + stage)
        stages.append(MLPStage(width, stage == 0))
    return stages


def _replica_data(ctx: ModelContext, width: int):
    """Each replica its own stream ([Note: the model protocol]): seeded from the replica."""
    return _data(width, ctx.seed * 1000 + ctx.dp_rank)


def mlp_plan(ctx: ModelContext) -> PipelineModel:
    """The MLP stages with a torch TP plan: ``up`` column-parallel, ``down`` row-parallel."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return PipelineModel(stages=_mlp_stages(ctx, 8), loss=_loss, data=_replica_data(ctx, 8), unit="samples",
                         tp_plan={"up": ColwiseParallel(), "down": RowwiseParallel()})


class _ColumnParallel(nn.Module):
    """Megatron's column-parallel linear: this member's rows of the weight and bias."""

    tp_layout = {"weight": (0, 1), "bias": (0, 1)}

    def __init__(self, whole: nn.Linear, ctx: ModelContext) -> None:
        super().__init__()
        part = whole.out_features // ctx.tp
        rows = slice(ctx.tp_rank * part, (ctx.tp_rank + 1) * part)
        self.weight = nn.Parameter(whole.weight.detach()[rows].clone())
        self.bias = nn.Parameter(whole.bias.detach()[rows].clone())
        self.group = ctx.tp_group

    def forward(self, x):
        from rrfp import copy_to_group

        return torch.nn.functional.linear(copy_to_group(x, self.group), self.weight, self.bias)


class _RowParallel(nn.Module):
    """Megatron's row-parallel linear: this member's columns of the weight; partial sums reduced, then the bias."""

    tp_layout = {"weight": (1, 1)}

    def __init__(self, whole: nn.Linear, ctx: ModelContext) -> None:
        super().__init__()
        part = whole.in_features // ctx.tp
        self.weight = nn.Parameter(whole.weight.detach()[:, ctx.tp_rank * part:(ctx.tp_rank + 1) * part].clone())
        self.bias = nn.Parameter(whole.bias.detach().clone())
        self.group = ctx.tp_group

    def forward(self, x):
        from rrfp import reduce_from_group

        return reduce_from_group(torch.nn.functional.linear(x, self.weight), self.group) + self.bias


def mlp_megatron(ctx: ModelContext) -> PipelineModel:
    """The same MLP stages, sharded by the factory itself (Megatron style) when ``ctx.tp > 1``."""
    stages = _mlp_stages(ctx, 8)
    if ctx.tp > 1:
        for stage in stages:
            stage.up, stage.down = _ColumnParallel(stage.up, ctx), _RowParallel(stage.down, ctx)
    return PipelineModel(stages=stages, loss=_loss, data=_replica_data(ctx, 8), unit="samples")


def mlp_no_tp(ctx: ModelContext) -> PipelineModel:
    """The MLP stages with neither a plan nor sharding of its own: refused under --tp."""
    return PipelineModel(stages=_mlp_stages(ctx, 8), loss=_loss, data=_replica_data(ctx, 8), unit="samples")


def plan_names_a_missing_module(ctx: ModelContext) -> PipelineModel:
    from torch.distributed.tensor.parallel import ColwiseParallel

    model = mlp_plan(ctx)
    model.tp_plan = {"up": ColwiseParallel(), "mlp.down": ColwiseParallel()}
    return model


def plan_leaves_output_sharded(ctx: ModelContext) -> PipelineModel:
    """Each stage a linear layer made column-parallel: its output is this member's columns only."""
    from torch.distributed.tensor.parallel import ColwiseParallel

    model = _model(ctx, 8)
    model.tp_plan = {"linear": ColwiseParallel()}
    return model


class _Narrow(nn.Module):
    def __init__(self, width_in: int, width_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width_in, width_out)

    def forward(self, inputs, batch):
        x = batch.tensors["x"] if not inputs else inputs[0]
        return (torch.tanh(self.linear(x)),)


def stages_disagree(ctx: ModelContext) -> PipelineModel:
    """Stage 0 returns 8 features, stage 1 takes 16."""
    stages = [_Narrow(8, 8) if stage == 0 else _Narrow(16, 8) for stage, _ in ctx.placement]
    return PipelineModel(stages=stages, loss=_loss, data=_data(8, ctx.seed), unit="samples")
