"""The workload interface: a model cut into stage modules, and the data each microbatch regenerates.

Every workload generates its own data from the seed (no downloads), and every
rank can regenerate any microbatch locally: the first stage reads its inputs,
the last stage its labels, and only activations and gradients travel between
ranks. Stage modules are initialised from ``(seed, stage)``, so the runtime
and the single-process reference (:func:`runtime.workloads.make.reference_train`)
build bit-identical models whichever rank holds a stage.

A stage module is called as ``module(inputs, batch)`` where ``inputs`` is the
tuple of tensors received from the previous stage (empty for stage 0) and
``batch`` the locally regenerated :class:`Microbatch`; it returns a tuple of
tensors (for the last stage, the model output fed to :meth:`Workload.loss`).
The built-in models are in :mod:`runtime.workloads.builtin`, a user's factory in
:mod:`runtime.workloads.user`; :func:`runtime.workloads.make.make_workload` picks one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import torch
from torch import nn

from hints.tasks import PipelineShape
from runtime.config import RunConfig
from runtime.durations.variability import (
    Durations,
    MicrobatchSpec,
    VariabilityModel,
    expected_durations,
    sample_microbatches,
)


def mix_seed(*parts: int) -> int:
    """A stable 63-bit seed from integers (for torch generators and random.Random)."""
    value = 0x9E3779B97F4A7C15
    for part in parts:
        value = (value ^ (part + 0x9E3779B97F4A7C15 + (value << 6) + (value >> 2))) & ((1 << 64) - 1)
    return value & ((1 << 63) - 1)


@dataclass
class Microbatch:
    """One microbatch's data, regenerated identically on every rank."""

    iteration: int
    index: int
    spec: MicrobatchSpec
    tensors: dict[str, torch.Tensor]
    units: int  # tokens (gpt, multimodal) or samples (emulated), for throughput


@dataclass
class Workload:
    """Base: shape, data cache and the interface the executor and the reference use."""

    config: RunConfig
    shape: PipelineShape
    unit: str = "tokens"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    _batches: dict = field(default_factory=dict, repr=False)
    # Data parallelism: replica ``replica`` of ``replicas`` trains microbatches replica*m .. replica*m + m-1 of an
    # iteration of replicas*m microbatches, the reference's data with ``microbatches = replicas x m``.
    replica: int = 0
    replicas: int = 1
    # The stages whose backward this job's hint splits (set by the worker once the hint is known): the emulated
    # workload's split sleeps split_overhead x B in all ([Note: split backward durations]).
    split_stages: frozenset[int] = frozenset()

    name = "base"

    @property
    def stages(self) -> int:
        return self.shape.stages

    def init_seed(self, stage: int) -> int:
        return mix_seed(self.config.seed, 7919, stage)

    def prepare(self, stages) -> None:
        """This process will build ``stages`` (a user's factory builds them at once; built-ins need nothing)."""

    def resume_at(self, step: int) -> None:
        """The run resumes at iteration ``step`` (built-ins regenerate any iteration's data: nothing to do)."""

    def build_stage(self, stage: int) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.init_seed(stage))
            return self._build_stage(stage)

    def batch(self, iteration: int, mb: int) -> Microbatch:
        key = (iteration, mb)
        if key not in self._batches:
            if len(self._batches) > 4 * self.shape.microbatches:
                self._batches.clear()  # keep about one iteration's worth
            specs = self._specs(iteration)
            index = self.replica * self.shape.microbatches + mb  # in the whole batch of all replicas
            generator = torch.Generator().manual_seed(mix_seed(self.config.seed, iteration, index))
            batch = self._make_batch(iteration, specs[mb], generator)  # generated on the CPU: same data anywhere
            if self.device.type != "cpu":
                batch.tensors = {name: t.to(self.device) for name, t in batch.tensors.items()}
            self._batches[key] = batch
        return self._batches[key]

    def loss(self, outputs: tuple[torch.Tensor, ...], batch: Microbatch) -> torch.Tensor:
        raise NotImplementedError

    def first_inputs(self, batch: Microbatch) -> tuple[torch.Tensor, ...]:
        """Stage 0's inputs that take part in autograd like a received activation (default none)."""
        return ()

    def variability(self) -> VariabilityModel:
        raise NotImplementedError

    def _specs(self, iteration: int) -> list[MicrobatchSpec]:
        m = self.shape.microbatches
        specs = _cached_specs(self.variability(), m * self.replicas, mix_seed(self.config.seed, iteration))
        return specs[self.replica * m:(self.replica + 1) * m]

    def _build_stage(self, stage: int) -> nn.Module:
        raise NotImplementedError

    def _make_batch(self, iteration: int, spec: MicrobatchSpec, generator: torch.Generator) -> Microbatch:
        raise NotImplementedError

    def durations(self, iteration: int) -> Durations | None:
        """Sampled task durations (emulated workload only)."""
        return None

    def expected(self, iteration: int) -> Durations:
        """What is known of ``iteration``'s costs before it runs ([Note: expected durations])."""
        return expected_durations(self.variability(), self.shape, self._specs(iteration))


@lru_cache(maxsize=64)
def _cached_specs(model: VariabilityModel, microbatches: int, seed: int) -> list[MicrobatchSpec]:
    return sample_microbatches(model, microbatches, seed)

