"""Tensor-parallel layers: a stage's blocks sharded over its TP group (coordination: :mod:`runtime.exec.tp_follow`).

Sharding (gpt and multimodal blocks, Megatron's layout): attention heads and
the MLP's hidden units are split across the group. ``qkv`` and the MLP's
first linear are column-parallel (each member computes its heads / units),
``proj`` and the MLP's second linear row-parallel (partial sums, all-reduced
on the group, then the bias). The input of each column-parallel pair passes
:class:`_CopyToGroup` (identity forward, all-reduce of the gradient
backward), its output :class:`_ReduceFromGroup` (all-reduce forward,
identity backward). Embeddings, norms and the head stay whole on every
member; their gradients are identical across the group, so every member's
optimizer keeps them identical. Why not DTensor: see docs/runtime.md
("Tensor parallelism").
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from runtime.workloads.builtin import Block, EmulatedStage


class _CopyToGroup(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient on the TP group backward (Megatron's ``f``)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromGroup(torch.autograd.Function):
    """All-reduce on the TP group forward; identity backward (Megatron's ``g``)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group) -> torch.Tensor:
        tensor = tensor.contiguous().clone()
        dist.all_reduce(tensor, group=group)
        return tensor

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def copy_to_group(tensor: torch.Tensor, group) -> torch.Tensor:
    return _CopyToGroup.apply(tensor, group)


def reduce_from_group(tensor: torch.Tensor, group) -> torch.Tensor:
    return _ReduceFromGroup.apply(tensor, group)


class TPShard:
    """Where a member sits in its TP group: ``rank`` of ``size`` members, and the group's process group."""

    def __init__(self, rank: int, size: int, group) -> None:
        self.rank, self.size, self.group = rank, size, group

    def rows(self, total: int) -> slice:
        """This member's contiguous part of ``total`` (divisible by ``size``)."""
        part = total // self.size
        return slice(self.rank * part, (self.rank + 1) * part)


# Sharded parameters, per module class: parameter name -> (dim, pieces). A member's tensor is cut into
# ``pieces`` equal chunks along ``dim``; the full tensor is, piece by piece, the members' chunks in order.
BLOCK_LAYOUT = {"qkv.weight": (0, 3), "qkv.bias": (0, 3), "proj.weight": (1, 1), "mlp.0.weight": (0, 1),
                "mlp.0.bias": (0, 1), "mlp.2.weight": (1, 1)}


def _shard(tensor: torch.Tensor, layout: tuple[int, int], shard: TPShard) -> nn.Parameter:
    dim, pieces = layout
    chunks = tensor.detach().chunk(pieces, dim)
    return nn.Parameter(torch.cat([c.narrow(dim, shard.rows(c.shape[dim]).start, c.shape[dim] // shard.size)
                                   for c in chunks], dim).clone())


def unshard(shards: list[torch.Tensor], layout: tuple[int, int]) -> torch.Tensor:
    """The whole tensor from every member's shard, in member order (inverse of the sharding)."""
    dim, pieces = layout
    split = [s.chunk(pieces, dim) for s in shards]
    return torch.cat([torch.cat([member[p] for member in split], dim) for p in range(pieces)], dim)


class ParallelBlock(nn.Module):
    """A :class:`runtime.workloads.builtin.Block` sharded over a TP group (same parameter names, sharded tensors)."""

    tp_layout = BLOCK_LAYOUT

    def __init__(self, block: nn.Module, shard: TPShard) -> None:
        super().__init__()
        if block.heads % shard.size:
            raise ValueError(f"{block.heads} heads cannot be split over tp {shard.size}")
        self.shard, self.causal = shard, block.causal
        self.heads = block.heads // shard.size
        self.head_dim = block.qkv.in_features // block.heads
        self.norm1, self.norm2 = block.norm1, block.norm2
        self.qkv, self.proj = nn.Linear(1, 1), nn.Linear(1, 1)
        self.mlp = nn.Sequential(nn.Linear(1, 1), nn.GELU(), nn.Linear(1, 1))
        whole = dict(block.named_parameters())
        for name in ("qkv.weight", "qkv.bias", "proj.weight", "proj.bias", "mlp.0.weight", "mlp.0.bias",
                     "mlp.2.weight", "mlp.2.bias"):
            module_name, _, attribute = name.rpartition(".")
            value = (_shard(whole[name], self.tp_layout[name], shard) if name in self.tp_layout
                     else nn.Parameter(whole[name].detach().clone()))
            setattr(self.get_submodule(module_name), attribute, value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        group = self.shard.group
        batch, length, _ = x.shape
        h = copy_to_group(self.norm1(x), group)
        q, k, v = self.qkv(h).view(batch, length, 3, self.heads, self.head_dim).unbind(2)
        attended = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=self.causal)
        attended = attended.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim)
        x = x + reduce_from_group(F.linear(attended, self.proj.weight), group) + self.proj.bias
        fc1, act, fc2 = self.mlp
        h = act(fc1(copy_to_group(self.norm2(x), group)))
        return x + reduce_from_group(F.linear(h, fc2.weight), group) + fc2.bias


def shard_stage(module: nn.Module, shard: TPShard) -> nn.Module:
    """``module`` (a whole stage, as :meth:`runtime.workloads.base.Workload.build_stage` makes it) with its
    transformer blocks sharded over ``shard``'s group, or, for the emulated stage, its linear layer."""
    if isinstance(module, EmulatedStage):
        return ParallelEmulatedStage(module, shard)
    for name, child in list(module.named_modules()):
        if isinstance(child, Block):
            parent_name, _, attribute = name.rpartition(".")
            setattr(module.get_submodule(parent_name), attribute, ParallelBlock(child, shard))
    return module


def sharded_layouts(module: nn.Module) -> dict[str, tuple[int, int]]:
    """``{parameter name: (dim, pieces)}`` for the sharded parameters of a stage (see :func:`unshard`).

    [Note: what says a parameter is sharded]
        A parameter is this TP member's shard of a whole tensor when either

        * a module holding it declares it in a ``tp_layout`` attribute,
          ``{name within that module: (dim, pieces)}``: the built-in
          :class:`ParallelBlock` and :class:`ParallelEmulatedStage`, and the
          Megatron-style layers a user's factory shards itself; or
        * it is a ``DTensor`` placed ``Shard(dim)`` on a 1-D mesh (a
          ``tp_plan`` applied with ``parallelize_module``): layout ``(dim, 1)``.

        Everything else is whole on every member. The layouts are what the
        checkpoints ([Note: checkpoint keys] in :mod:`runtime.run.checkpoint`),
        the gradient collection of the tests and :func:`unshard` go by.
    """
    out = {}
    for prefix, child in module.named_modules():
        for name, layout in (getattr(child, "tp_layout", None) or {}).items():
            out[f"{prefix}.{name}" if prefix else name] = tuple(layout)
    for name, parameter in module.named_parameters():
        dim = dtensor_shard_dim(parameter)
        if dim is not None:
            out[name] = (dim, 1)
    return out


def is_dtensor(tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def dtensor_shard_dim(tensor) -> int | None:
    """The dimension a DTensor is sharded on over its 1-D mesh (None: not a DTensor, or replicated)."""
    if not is_dtensor(tensor):
        return None
    (placement,) = tensor.placements
    return placement.dim if placement.is_shard() else None


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """This member's part of ``tensor``: a DTensor's local tensor (same storage), any other tensor itself."""
    return tensor._local_tensor if is_dtensor(tensor) else tensor


def stage_sharded_layouts(modules: dict[int, nn.Module], prefix: str = "") -> dict[str, tuple[int, int]]:
    """``{"<prefix><stage>.<parameter>": layout}`` of the sharded parameters of a rank's stage modules."""
    return {f"{prefix}{stage}.{name}": layout
            for stage, m in modules.items() for name, layout in sharded_layouts(m).items()}


class ParallelEmulatedStage(nn.Module):
    """The emulated stage over a TP group: a row-parallel linear layer (each member its share of the input
    features, partial outputs all-reduced on the group: a real collective in ``F``, and one in the input's
    gradient in ``B``/``I``), sleeping the sampled durations like the whole stage does."""

    tp_layout = {"linear.weight": (1, 1)}

    def __init__(self, stage: nn.Module, shard: TPShard) -> None:
        super().__init__()
        self.inner = stage  # its sampled durations and sleeping forward
        self.shard = shard
        self.linear = nn.Linear(1, 1)
        self.linear.weight = _shard(stage.linear.weight, self.tp_layout["linear.weight"], shard)
        self.linear.bias = nn.Parameter(stage.linear.bias.detach().clone())
        del stage.linear

    def forward(self, inputs, batch) -> tuple[torch.Tensor, ...]:
        return self.inner.forward(inputs, batch, linear=self._linear)

    def _linear(self, x: torch.Tensor, sleep_input, sleep_weight) -> torch.Tensor:
        x = copy_to_group(x, self.shard.group)[:, self.shard.rows(x.shape[1])]
        partial = F.linear(sleep_input(x), sleep_weight(self.linear.weight))
        return torch.tanh(reduce_from_group(partial, self.shard.group) + self.linear.bias)


__all__ = ["Announcer", "FollowerArbiter", "ParallelBlock", "ParallelEmulatedStage", "TPShard", "member_arbiter",
           "shard_stage", "sharded_layouts", "unshard"]
