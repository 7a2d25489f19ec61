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

    Resuming from a checkpoint skips the microbatches already trained
    (``step x microbatches`` items of ``data``), so the data stream resumes
    where it stopped.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn

from hints.errors import UserError
from hints.tasks import PipelineShape
from runtime.durations.variability import Durations, MicrobatchSpec, VariabilityModel, expected_durations
from runtime.workloads.base import Microbatch, Workload


@dataclass(frozen=True)
class ModelContext:
    """What a factory is told: the run's options and which stages to build."""

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


@dataclass
class Batch:
    """One microbatch of a user's data: its tensors and cost features."""

    tensors: dict[str, torch.Tensor]
    tokens: int  # text tokens in the microbatch (cost feature)
    images: int = 0  # images in the microbatch (cost feature)
    units: int | None = None  # for throughput (default: tokens)


@dataclass
class PipelineModel:
    """What a factory returns ([Note: the model protocol])."""

    stages: list[nn.Module]
    loss: Callable[[tuple[torch.Tensor, ...], Any], torch.Tensor]
    data: Iterable[Batch]
    unit: str = "tokens"
    vision_stages: int = 0


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
    model.stages = stages
    return model


def check_factory(config) -> None:
    """Before any rank starts: the factory imports, and returns one module per model stage (built on ``meta``)."""
    from runtime.config import run_shape

    shape = run_shape(config)
    factory = load_factory(config.workload)
    with torch.device("meta"):
        build_model(factory, _context(config, shape, range(shape.stages)))


def _context(config, shape: PipelineShape, stages: Iterable[int], device=torch.device("cpu")) -> ModelContext:
    return ModelContext(config, shape.ranks, shape.chunks, shape.microbatches,
                        tuple((k, shape.chunk_of(k)) for k in stages), config.seed, device)


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
        spec = MicrobatchSpec(index, max(1, int(item.tokens)), 1, (int(item.images),) if item.images else ())
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
    microbatches, an iteration at a time and in order.
    """

    def __init__(self, config, shape: PipelineShape, device: torch.device | None = None) -> None:
        super().__init__(config, shape, device, loss=None)
        self.name = config.workload
        self._factory = load_factory(config.workload)
        self._model: PipelineModel | None = None
        self._built: dict[int, nn.Module] = {}
        self._data: Iterator[Batch] | None = None
        self._consumed = 0  # microbatches taken from the iterator so far
        self._skip = 0  # microbatches the run has already trained on (a resumed run)

    def prepare(self, stages: Iterable[int]) -> None:
        """Call the factory for ``stages`` (this rank's); :meth:`build_stage` then hands their modules out."""
        stages = sorted(stages)
        with torch.random.fork_rng(devices=[]):  # whatever the factory draws, this process's RNG stays as it was
            self._model = build_model(self._factory, _context(self.config, self.shape, stages, self.device))
        self._built = dict(zip(stages, self._model.stages))
        self.unit, self.loss_fn, self.vision_stages = self._model.unit, self._model.loss, self._model.vision_stages

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


__all__ = ["Batch", "BatchWorkload", "FactoryWorkload", "ModelContext", "PipelineModel", "check_factory", "load_factory"]
