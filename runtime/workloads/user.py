"""Your own model in ``rrfp run``: ``--workload package.module:factory``.

[Note: the model protocol]
    A *factory* is a function ``factory(ctx: ModelContext) -> PipelineModel``.
    It is called once per rank, with ``ctx.placement`` naming the
    ``(stage, chunk)`` pairs that rank holds (model stage ``k`` lives on rank
    ``k % ranks`` as its chunk ``k // ranks``), and once with every stage for
    the checks that run before any rank starts (modules built on the ``meta``
    device then) and for the single-process reference. It returns:

    * ``stages``: one ``torch.nn.Module`` per entry of ``ctx.placement``, in
      that order. A stage is called as ``module(inputs, batch)``: ``inputs``
      is the tuple of tensors the previous stage returned (empty for stage 0)
      and ``batch.tensors`` the microbatch's tensors; it returns a tuple of
      tensors, the last stage its model output. Build each stage from its
      stage number alone (e.g. under ``torch.manual_seed(ctx.seed + stage)``)
      so every rank and the reference build the same weights.
    * ``loss(outputs, batch) -> Tensor``: the last stage's output to a scalar
      loss (the runtime divides it by the microbatch count).
    * ``data``: an iterable of :class:`Batch`, one per microbatch, in
      training order (``microbatches`` per iteration). Every rank iterates
      its own copy, so it must yield the same sequence on every rank (seed it
      from ``ctx.seed``); only activations and gradients travel. Each
      :class:`Batch` carries its tensors and its cost features, ``tokens``
      and ``images``, which the ``bfw`` and ``cp`` hints rank microbatches by
      and the traces record for ``rrfp tune-hint``.
    * ``unit`` (``"tokens"`` or ``"samples"``) for throughput, and
      ``vision_stages``: how many leading stages encode images (their cost
      follows ``images``, the others' ``tokens``; 0 for a text model).

    * ``tp_plan`` (with ``--tp``, see [Note: tensor parallelism for a model
      you bring]): ``None`` when the factory shards its layers itself, or the
      ``torch.distributed.tensor.parallel`` plan rrfp applies to each stage.

    Resuming from a checkpoint skips the microbatches already trained
    (``step x microbatches`` items of ``data``), so the data stream resumes
    where it stopped. With ``--dp N`` every replica calls the factory with its
    own ``ctx.dp_rank`` and ``data`` yields that replica's share
    (``microbatches`` per iteration, as a ``DistributedSampler`` would cut
    it); the replicas' gradients are averaged, so the step is the one the
    ``N x microbatches`` microbatches of an iteration give together.

[Note: tensor parallelism for a model you bring]
    With ``--tp N`` the ranks of a stage's TP group hold one stage each, and
    the factory is told the group (``ctx.tp``, ``ctx.tp_rank``,
    ``ctx.tp_group``, ``ctx.tp_mesh``). It shards its stages one of two ways:

    * **a plan**: ``PipelineModel.tp_plan`` maps submodule names of a stage
      (``"blocks.*.mlp.up"``, the patterns ``parallelize_module`` takes) to
      ``ColwiseParallel``, ``RowwiseParallel``, ``SequenceParallel``... (one
      dict for every stage, or a callable ``stage -> dict``); the factory
      returns whole modules and rrfp applies the plan with
      ``parallelize_module(stage, ctx.tp_mesh, plan)``. Sharded parameters
      are then ``DTensor``s; the stage must return plain (local, replicated)
      tensors, as ``RowwiseParallel``'s default output is.
    * **Megatron style**: the factory builds each member's shard itself from
      ``ctx.tp_rank`` and ``ctx.tp_group`` (``rrfp.copy_to_group`` and
      ``rrfp.reduce_from_group`` are the two collectives' autograd
      functions) and declares what is sharded: a module holding sharded
      parameters has a ``tp_layout`` attribute, ``{parameter name: (dim,
      pieces)}`` ([Note: what says a parameter is sharded] in
      :mod:`runtime.workloads.tp_layers`).

    Either way the stages still see whole activations at their boundaries:
    only whole tensors travel between stages. Before the first iteration
    every rank runs its stages once, without gradients, on its first
    microbatch, and compares what they return with the unsharded model's
    shapes (traced on the ``meta`` device), so a plan that leaves an output
    sharded is an error naming the stage, not a silently wrong loss. The
    leader-follower coordination, the DP reducer and the checkpoints (whole
    tensors, each member writing its shard) work on these stages as on the
    built-in ones.

:class:`FactoryWorkload` adapts a factory to the runtime's
:class:`runtime.workloads.base.Workload`, the interface the executor, the
checkpoints and the single-process reference use, so a user's model runs
exactly where the built-in ones do.
"""

from __future__ import annotations

import importlib
import itertools
import statistics
import sys
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn

from hints.errors import UserError
from hints.tasks import PipelineShape
from runtime.durations.variability import Durations, MicrobatchSpec, VariabilityModel, expected_durations
from runtime.workloads.base import Microbatch, Workload


@dataclass(frozen=True, kw_only=True)
class ParallelGroups:
    """Where a rank sits in the TP and DP dimensions of the process grid, and those groups ([Note: tensor
    parallelism for a model you bring]); the groups are None where no process group exists (the checks before
    any rank starts, the single-process reference)."""

    tp: int = 1
    tp_rank: int = 0
    tp_group: Any = None
    dp: int = 1
    dp_rank: int = 0
    dp_group: Any = None

    def as_fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(ParallelGroups)}


@dataclass(frozen=True)
class ModelContext(ParallelGroups):
    """What a factory is told: the run's options, which stages to build, and (keywords, from
    :class:`ParallelGroups`) its place in the TP and DP dimensions."""

    config: Any  # runtime.config.RunConfig: hidden, layers_per_stage, vocab, seq_len, samples... as given
    ranks: int
    chunks: int
    microbatches: int
    placement: tuple[tuple[int, int], ...]  # (model stage, chunk) pairs to build, in this order
    seed: int
    device: torch.device = torch.device("cpu")

    @property
    def stages(self) -> int:
        """Model stages: ``ranks x chunks``."""
        return self.ranks * self.chunks

    @cached_property
    def tp_mesh(self):
        """A 1-D ``DeviceMesh`` of the TP group (None without one), for ``parallelize_module`` or DTensors."""
        if self.tp_group is None:
            return None
        from torch.distributed.device_mesh import DeviceMesh

        return DeviceMesh.from_group(self.tp_group, self.device.type)


@dataclass
class Batch:
    """One microbatch of a user's data: its tensors and cost features."""

    tensors: dict[str, torch.Tensor]
    tokens: int  # text tokens in the microbatch (cost feature)
    images: int = 0  # images in the microbatch (cost feature)
    units: int | None = None  # for throughput (default: tokens)

    def spec(self, index: int) -> MicrobatchSpec:
        """The cost features as microbatch ``index``'s :class:`MicrobatchSpec` (what bfw, cp and the traces read)."""
        return MicrobatchSpec(index, max(1, int(self.tokens)), 1, (int(self.images),) if self.images else ())


@dataclass
class PipelineModel:
    """What a factory returns ([Note: the model protocol])."""

    stages: list[nn.Module]
    loss: Callable[[tuple[torch.Tensor, ...], Any], torch.Tensor]
    data: Iterable[Batch]
    unit: str = "tokens"
    vision_stages: int = 0
    tp_plan: Any = None  # None, {submodule pattern: ParallelStyle}, or stage -> that dict


def load_factory(path: str, flag: str = "`workload`") -> Callable[[ModelContext], PipelineModel]:
    """``package.module:factory`` -> the callable; ``UserError`` when it does not import or is not callable.

    The current directory is searched first, as ``python -m`` does, so ``rrfp run`` finds a module
    beside the user.
    """
    module_name, _, name = path.partition(":")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # an ImportError, or anything the module raises while it loads
        raise UserError(f"cannot import {module_name}: {type(err).__name__}: {err}", flag) from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise UserError(f"{module_name} has no callable {name!r}", flag)
    return factory


def build_model(factory, ctx: ModelContext, flag: str = "`workload`") -> PipelineModel:
    """Call the factory and check what it returned against ``ctx``."""
    try:
        model = factory(ctx)
    except UserError:
        raise
    except Exception as err:
        raise UserError(f"the factory raised {type(err).__name__}: {err}", flag) from None
    if not isinstance(model, PipelineModel):
        raise UserError(f"the factory must return a runtime.workloads.user.PipelineModel, got {type(model).__name__}",
                        flag)
    stages = list(model.stages)
    if len(stages) != len(ctx.placement):
        wanted = ", ".join(str(stage) for stage, _ in ctx.placement)
        raise UserError(f"the factory returned {len(stages)} stage modules for {len(ctx.placement)} model stages "
                        f"({wanted})", flag)
    for (stage, _), module in zip(ctx.placement, stages):
        if not isinstance(module, nn.Module):
            raise UserError(f"stage {stage} is a {type(module).__name__}, not a torch.nn.Module", flag)
    if model.unit not in ("tokens", "samples"):
        raise UserError(f"unit must be tokens or samples, got {model.unit!r}", flag)
    if not 0 <= model.vision_stages < max(2, ctx.stages):
        raise UserError(f"vision_stages must be between 0 and {ctx.stages - 1}, got {model.vision_stages}", flag)
    if model.tp_plan is not None and not (isinstance(model.tp_plan, dict) or callable(model.tp_plan)):
        raise UserError(f"tp_plan must be a dict of submodule -> ParallelStyle or a function of the stage, got "
                        f"{type(model.tp_plan).__name__}", flag)
    model.stages = stages
    return model


def stage_plan(model: PipelineModel, stage: int, module: nn.Module, flag: str = "`workload`") -> dict:
    """Stage ``stage``'s TP plan ({} without one), checked against ``module``: every key must name a submodule
    (``*`` matches one name, as in ``parallelize_module``) and every value be a ``ParallelStyle``."""
    from fnmatch import fnmatchcase

    from torch.distributed.tensor.parallel import ParallelStyle

    plan = model.tp_plan
    if plan is None:
        return {}
    try:
        plan = plan(stage) if callable(plan) and not isinstance(plan, dict) else plan
    except Exception as err:
        raise UserError(f"tp_plan({stage}) raised {type(err).__name__}: {err}", flag) from None
    if not isinstance(plan, dict):
        raise UserError(f"tp_plan({stage}) must return a dict of submodule -> ParallelStyle, got "
                        f"{type(plan).__name__}", flag)
    names = [name.split(".") for name, _ in module.named_modules() if name]
    for key, style in plan.items():
        if not isinstance(style, ParallelStyle):
            raise UserError(f"stage {stage}'s tp_plan maps {key!r} to a {type(style).__name__}, not a "
                            "torch.distributed.tensor.parallel ParallelStyle", flag)
        atoms = str(key).split(".")
        if not any(len(n) == len(atoms) and all(fnmatchcase(a, p) for a, p in zip(n, atoms)) for n in names):
            children = ", ".join(name for name, _ in module.named_children()) or "none"
            raise UserError(f"stage {stage}'s tp_plan names {key!r}, which is no submodule of its "
                            f"{type(module).__name__} (its children: {children})", flag)
    return plan


def _is_sharded(module: nn.Module, plan: dict) -> bool:
    from runtime.workloads.tp_layers import sharded_layouts

    return bool(plan) or bool(sharded_layouts(module))


def check_factory(config) -> None:
    """Before any rank starts, on the ``meta`` device: the factory imports and returns one module per model
    stage; the stages fit together (the first microbatch goes through them all: :func:`stage_shapes`); and
    with ``--tp`` each stage's plan names its submodules, or the factory sharded something itself."""
    from runtime.config import run_shape

    shape = run_shape(config)
    factory = load_factory(config.workload)
    with torch.device("meta"):
        model = build_model(factory, _context(config, shape, range(shape.stages)))
    stage_shapes(model, next(iter(model.data), None))
    if config.tp == 1:
        return
    groups = ParallelGroups(tp=config.tp, dp=config.dp)
    with torch.device("meta"):
        model = build_model(factory, _context(config, shape, range(shape.stages), groups=groups))
    if not any(_is_sharded(module, stage_plan(model, stage, module))
               for stage, module in enumerate(model.stages)):
        raise UserError(f"{config.workload} shards nothing under `tp` {config.tp}: give PipelineModel.tp_plan, or "
                        "shard the layers from ctx.tp_rank/ctx.tp_group and declare them in a tp_layout attribute "
                        "(docs/runtime.md, \"Your own model\")", "`tp`")


def stage_shapes(model: PipelineModel, first: Batch | None) -> list[list[tuple[int, ...]]] | None:
    """The shapes each stage of ``model`` (every stage, in order, unsharded) returns for microbatch ``first``,
    traced on the ``meta`` device: a stage that cannot take what the one before returns is a ``UserError``
    naming both. None when ``first`` is missing or a stage cannot run on ``meta`` (an op that reads values)."""
    from runtime.workloads.base import Microbatch

    if not isinstance(first, Batch):
        return None
    tensors = {name: t.to("meta") for name, t in first.tensors.items() if isinstance(t, torch.Tensor)}
    spec = first.spec(0)
    batch = Microbatch(0, 0, spec, tensors, 1)
    shapes, inputs = [], ()
    with torch.no_grad():
        for stage, module in enumerate(model.stages):
            try:
                outputs = module(inputs, batch)
            except (NotImplementedError, RuntimeError) as err:
                if "meta" in str(err) or isinstance(err, NotImplementedError):
                    return None  # data-dependent: nothing can be told on meta
                raise _disagree(stage, module, inputs, err) from None
            except Exception as err:
                raise _disagree(stage, module, inputs, err) from None
            if not isinstance(outputs, tuple) or not all(isinstance(o, torch.Tensor) for o in outputs):
                raise UserError(f"stage {stage} ({type(module).__name__}) must return a tuple of tensors, got "
                                f"{type(outputs).__name__}", "`workload`")
            shapes.append([tuple(o.shape) for o in outputs])
            inputs = outputs
    return shapes


def _disagree(stage: int, module: nn.Module, inputs: tuple, err: Exception) -> UserError:
    given = ", ".join(str(list(t.shape)) for t in inputs) or "no tensors"
    after = f"stage {stage - 1}'s outputs ({given})" if stage else "the first microbatch"
    return UserError(f"stage {stage} ({type(module).__name__}) cannot take {after}: {type(err).__name__}: "
                     f"{str(err).splitlines()[0] if str(err) else ''}", "`workload`")


def check_tp_outputs(model: PipelineModel, placement, expected: list[list[tuple[int, ...]]], first: Batch,
                     device: torch.device, flag: str = "`workload`") -> None:
    """Each of this rank's (sharded) stages, run once without gradients on microbatch ``first`` and on zeros
    of the shapes the stage before returns, must return what the unsharded stage does (``expected``, from
    :func:`stage_shapes`): plain tensors of the same shapes. A collective of the TP group: every member runs it,
    with its stages in the same order ([Note: tensor parallelism for a model you bring])."""
    from runtime.workloads.base import Microbatch
    from runtime.workloads.tp_layers import is_dtensor

    spec = first.spec(0)
    batch = Microbatch(0, 0, spec, {n: t.to(device) for n, t in first.tensors.items()}, 1)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        for (stage, _), module in zip(placement, model.stages):
            inputs = tuple(torch.zeros(shape, device=device) for shape in expected[stage - 1]) if stage else ()
            try:
                outputs = module(inputs, batch)
            except Exception as err:
                raise UserError(f"stage {stage} ({type(module).__name__}) fails under its TP sharding: "
                                f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}", flag) from None
            for index, (got, want) in enumerate(zip(outputs, expected[stage])):
                if is_dtensor(got):
                    raise UserError(f"stage {stage} ({type(module).__name__}) returns output {index} as a DTensor "
                                    f"under `tp`: its tp_plan must end in plain tensors (use_local_output, "
                                    f"RowwiseParallel's default)", flag)
                if tuple(got.shape) != tuple(want):
                    raise UserError(f"stage {stage} ({type(module).__name__}) returns output {index} as "
                                    f"{list(got.shape)} under `tp` where the unsharded stage gives {list(want)}: "
                                    "its TP sharding leaves the output sharded (end with RowwiseParallel, or "
                                    "gather it)", flag)


def apply_tp_plans(model: PipelineModel, ctx: ModelContext, flag: str = "`workload`") -> None:
    """``parallelize_module`` each of ``model``'s stages with its plan, over the context's TP mesh."""
    from torch.distributed.tensor.parallel import parallelize_module

    for (stage, _), module in zip(ctx.placement, model.stages):
        plan = stage_plan(model, stage, module, flag)
        if plan:
            parallelize_module(module, ctx.tp_mesh, plan)


def _context(config, shape: PipelineShape, stages: Iterable[int], device=torch.device("cpu"),
             groups: ParallelGroups | None = None) -> ModelContext:
    return ModelContext(config, shape.ranks, shape.chunks, shape.microbatches,
                        tuple((k, shape.chunk_of(k)) for k in stages), config.seed, device,
                        **(groups or ParallelGroups()).as_fields())


class BatchWorkload(Workload):
    """Microbatches given as :class:`Batch` objects an iteration at a time, their costs from their features.

    What a user's model needs beyond the base :class:`runtime.workloads.base.Workload`:
    :meth:`batches` says where an iteration's :class:`Batch` list comes from
    (a factory's data iterator, or the caller of :class:`runtime.run.pipeline.ReadyPipeline`).
    """

    def __init__(self, config, shape: PipelineShape, device: torch.device | None, loss, unit: str = "tokens",
                 vision_stages: int = 0) -> None:
        super().__init__(config, shape, unit=unit, device=device or torch.device("cpu"))
        self.loss_fn, self.vision_stages = loss, vision_stages
        self._iteration = -1
        self._current: list[Microbatch] = []

    def batches(self, iteration: int) -> list[Batch]:
        raise NotImplementedError

    def _pull(self, iteration: int) -> list[Microbatch]:
        if iteration != self._iteration:
            items = list(self.batches(iteration))
            if len(items) != self.shape.microbatches:
                raise RuntimeError(f"iteration {iteration} has {len(items)} microbatches, not "
                                   f"{self.shape.microbatches}")
            self._current = [self._microbatch(iteration, index, item) for index, item in enumerate(items)]
            self._iteration = iteration
        return self._current

    def _microbatch(self, iteration: int, index: int, item: Batch) -> Microbatch:
        if not isinstance(item, Batch):
            raise RuntimeError(f"a microbatch must be a runtime.workloads.user.Batch, got {type(item).__name__}")
        spec = item.spec(index)
        tensors = {name: t.to(self.device) for name, t in item.tensors.items()}
        units = item.units if item.units is not None else int(item.tokens)
        return Microbatch(iteration, index, spec, tensors, units)

    def batch(self, iteration: int, mb: int) -> Microbatch:
        return self._pull(iteration)[mb]

    def loss(self, outputs, batch) -> torch.Tensor:
        return self.loss_fn(outputs, batch)

    def variability(self) -> VariabilityModel:
        c, vision = self.config, self.vision_stages
        if vision:
            return VariabilityModel(workload="multimodal", forward_time=c.forward_time, samples=1,
                                    vision_stages=vision, text_tokens=c.seq_len or 32, image_tokens=1)
        return VariabilityModel(workload="language", forward_time=c.forward_time, samples=1)

    def expected(self, iteration: int) -> Durations:
        specs = [b.spec for b in self._pull(iteration)]
        model = self.variability()
        if model.workload == "language":  # costs relative to this iteration's median microbatch
            median = max(1, int(statistics.median(s.seq_len for s in specs)))
            model = VariabilityModel(workload="language", forward_time=model.forward_time, samples=1,
                                     seq_len_median=median, seq_len_min=1, seq_len_max=median)
        return expected_durations(model, self.shape, specs, source="the microbatches' cost features")


class FactoryWorkload(BatchWorkload):
    """A user's factory as a :class:`runtime.workloads.base.Workload` ([Note: the model protocol]).

    The factory is called once, for the stages this process builds
    (:meth:`prepare`; all of them when nothing was prepared, as in the
    single-process reference), and that call's data iterator feeds the
    microbatches, an iteration at a time and in order. ``groups`` says where
    the process sits in the TP and DP dimensions (the factory is told; with
    a TP group its plan is applied and its stages' outputs checked).
    """

    shards_itself = True  # the worker applies no built-in sharding: the factory or its tp_plan does

    def __init__(self, config, shape: PipelineShape, device: torch.device | None = None,
                 groups: ParallelGroups | None = None) -> None:
        super().__init__(config, shape, device, loss=None)
        self.name = config.workload
        self.groups = groups or ParallelGroups()
        self._factory = load_factory(config.workload)
        self._model: PipelineModel | None = None
        self._built: dict[int, nn.Module] = {}
        self._data: Iterator[Batch] | None = None
        self._consumed = 0  # microbatches taken from the iterator so far
        self._skip = 0  # microbatches the run has already trained on (a resumed run)

    def prepare(self, stages: Iterable[int]) -> None:
        """Call the factory for ``stages`` (this rank's); :meth:`build_stage` then hands their modules out."""
        stages = sorted(stages)
        ctx = _context(self.config, self.shape, stages, self.device, self.groups)
        with torch.random.fork_rng(devices=[]):  # whatever the factory draws, this process's RNG stays as it was
            self._model = build_model(self._factory, ctx)
        self._built = dict(zip(stages, self._model.stages))
        self.unit, self.loss_fn, self.vision_stages = self._model.unit, self._model.loss, self._model.vision_stages
        if self.groups.tp_group is not None and stages:
            apply_tp_plans(self._model, ctx)
            self._check_tp_outputs(ctx)

    def _check_tp_outputs(self, ctx: ModelContext) -> None:
        """[Note: tensor parallelism for a model you bring]: this rank's sharded stages against the unsharded
        model's shapes, on this replica's first microbatch (read ahead and put back)."""
        first = self._peek()
        if first is None:
            return
        with torch.device("meta"), torch.random.fork_rng(devices=[]):
            whole = build_model(self._factory, _context(self.config, self.shape, range(self.shape.stages),
                                                        groups=ParallelGroups(dp=self.groups.dp,
                                                                              dp_rank=self.groups.dp_rank)))
        expected = stage_shapes(whole, first)
        if expected is not None:
            check_tp_outputs(self._model, ctx.placement, expected, first, self.device)

    def _peek(self) -> Batch | None:
        """The next microbatch of the data stream, left in it."""
        if self._data is None:
            self._data = iter(self._model.data)
        first = next(self._data, None)
        if first is not None:
            self._data = itertools.chain([first], self._data)
        return first

    def build_stage(self, stage: int) -> nn.Module:
        if stage not in self._built:  # nothing prepared for it (the reference, the checks): build every stage
            self.prepare(range(self.shape.stages))
        return self._built.pop(stage)

    def resume_at(self, step: int) -> None:
        """The run resumes at iteration ``step``: skip what the first ``step`` iterations consumed.

        Iteration 0 may have been read already (a cost-ranked hint's shape is found from it): the skip
        counts what was taken.
        """
        self._skip = step * self.shape.microbatches
        self._iteration = step - 1

    def batches(self, iteration: int) -> list[Batch]:
        if iteration != self._iteration + 1:
            raise RuntimeError(f"the data iterator is read in order: iteration {iteration} asked for after "
                               f"{self._iteration}")
        if self._data is None:
            if self._model is None:
                self.prepare([])
            self._data = iter(self._model.data)
        if self._consumed < self._skip:
            skipped = sum(1 for _ in itertools.islice(self._data, self._skip - self._consumed))
            self._consumed += skipped
        items = list(itertools.islice(self._data, self.shape.microbatches))
        self._consumed += len(items)
        if len(items) < self.shape.microbatches:
            m = self.shape.microbatches
            raise RuntimeError(f"the data stream of {self.name} ran out at iteration {iteration} (it gave "
                               f"{len(items)} of {m} microbatches): PipelineModel.data must yield iterations x microbatches = "
                               f"{self.config.iters} x {m} = {self.config.iters * m} items")
        return items


__all__ = ["Batch", "BatchWorkload", "FactoryWorkload", "ModelContext", "ParallelGroups", "PipelineModel",
           "apply_tp_plans", "check_factory", "load_factory", "stage_plan", "stage_shapes"]
