"""The built-in training workloads of ``rrfp run`` (``gpt``, ``multimodal``, ``emulated``), cut into stages.

They follow the interface of :mod:`runtime.workloads.base` (data regenerated from the seed on any rank,
stage modules initialised from ``(seed, stage)``).

Workloads
---------
``gpt``
    A small pre-LN decoder-only transformer: token and position embeddings on
    stage 0, ``layers_per_stage`` blocks per stage, final norm and head on the
    last stage. Each microbatch holds ``samples`` sequences of one length,
    drawn from the language model of :mod:`runtime.durations.variability` scaled down
    for CPUs: lognormal with median 32 tokens, log-sd 0.5, clipped to
    [8, 128], multiple of 8 (``--seq-len N`` fixes it instead). Targets are a fixed function of the input token
    (``(t + 1) % vocab``), so the loss falls visibly within a few steps.
``multimodal``
    A ViT-style image encoder on the first quarter of the model stages (at
    least one): 16x16 RGB images cut into four 8x8 patches. The first
    language stage projects each image's patch embeddings to tokens and packs,
    per sample, its image tokens then its 16 text tokens into one sequence for
    the whole microbatch; causal blocks follow, and the loss covers text
    positions only. Each sample carries ``Poisson(1.5)`` images (at most 4),
    so both the encoder's work and the language sequence length vary per
    microbatch, including microbatches with no image at all.
``emulated``
    Real tensors through the real transport and a real tiny module (a 32-wide
    linear layer and tanh), but each task lasts the duration sampled by the
    simulator's variability models (``--emulate`` picks the model): the
    forward sleeps out its sampled time, and sleeping autograd nodes on the
    input and on the weight make ``B`` (or ``I`` and ``W`` separately) last
    theirs. Durations are sampled per iteration and written to the run
    directory, so ``rrfp simulate --durations`` can replay them.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from hints.tasks import PipelineShape
from runtime.config import EMULATED_WIDTH, RunConfig
from runtime.durations.variability import Durations, MicrobatchSpec, VariabilityModel, sample_durations, split_parts
from runtime.workloads.base import Microbatch, Workload, mix_seed

IMAGE_SIZE = 16
PATCH = 8
PATCHES = (IMAGE_SIZE // PATCH) ** 2
TEXT_TOKENS = 16


# -- transformer pieces --------------------------------------------------------


class Block(nn.Module):
    """Pre-LN transformer block."""

    def __init__(self, width: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, length, 3, self.heads, width // self.heads).unbind(2)
        attended = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=self.causal)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


# -- gpt -----------------------------------------------------------------------


class GPTStage(nn.Module):
    def __init__(self, config: RunConfig, stage: int, stages: int, max_len: int) -> None:
        super().__init__()
        self.first, self.last = stage == 0, stage == stages - 1
        width = config.hidden
        if self.first:
            self.embed = nn.Embedding(config.vocab, width)
            self.position = nn.Embedding(max_len, width)
        self.blocks = nn.ModuleList(Block(width, config.heads, causal=True) for _ in range(config.layers_per_stage))
        if self.last:
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, config.vocab)

    def forward(self, inputs: tuple[torch.Tensor, ...], batch: Microbatch) -> tuple[torch.Tensor, ...]:
        if self.first:
            tokens = batch.tensors["tokens"]
            h = self.embed(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        else:
            (h,) = inputs
        for block in self.blocks:
            h = block(h)
        if self.last:
            return (self.head(self.norm(h)),)
        return (h,)


class GPTWorkload(Workload):
    name = "gpt"

    def variability(self) -> VariabilityModel:
        fixed = self.config.seq_len
        if fixed is not None:  # fixed shapes, e.g. to compare with torch's pipelining schedules
            return VariabilityModel(workload="language", samples=self.config.samples, seq_len_median=fixed,
                                    seq_len_sigma=0.0, seq_len_min=fixed, seq_len_max=fixed)
        return VariabilityModel(workload="language", samples=self.config.samples, seq_len_median=32,
                                seq_len_sigma=0.5, seq_len_min=8, seq_len_max=128)

    def _build_stage(self, stage: int) -> nn.Module:
        return GPTStage(self.config, stage, self.stages, max_len=128)

    def _make_batch(self, iteration, spec, generator) -> Microbatch:
        tokens = torch.randint(0, self.config.vocab, (spec.samples, spec.seq_len), generator=generator)
        labels = (tokens + 1) % self.config.vocab
        return Microbatch(iteration, spec.index, spec, {"tokens": tokens, "labels": labels},
                          units=spec.samples * spec.seq_len)

    def loss(self, outputs, batch) -> torch.Tensor:
        (logits,) = outputs
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch.tensors["labels"].reshape(-1))


# -- multimodal ----------------------------------------------------------------


class VisionStage(nn.Module):
    def __init__(self, config: RunConfig, first: bool) -> None:
        super().__init__()
        self.first = first
        width = config.hidden
        if first:
            self.patch = nn.Linear(3 * PATCH * PATCH, width)
            self.position = nn.Parameter(torch.randn(PATCHES, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, config.heads, causal=False) for _ in range(config.layers_per_stage))

    def forward(self, inputs, batch) -> tuple[torch.Tensor, ...]:
        if self.first:
            images = batch.tensors["images"]  # [n, 3, 16, 16]
            patches = images.unfold(2, PATCH, PATCH).unfold(3, PATCH, PATCH)  # [n, 3, 2, 2, 8, 8]
            patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(images.shape[0], PATCHES, 3 * PATCH * PATCH)
            h = self.patch(patches) + self.position
        else:
            (h,) = inputs
        for block in self.blocks:
            h = block(h)
        return (h,)


class LanguageStage(nn.Module):
    def __init__(self, config: RunConfig, first: bool, last: bool, max_len: int) -> None:
        super().__init__()
        self.first, self.last = first, last
        width = config.hidden
        if first:
            self.project = nn.Linear(width, width)
            self.embed = nn.Embedding(config.vocab, width)
            self.position = nn.Embedding(max_len, width)
        self.blocks = nn.ModuleList(Block(width, config.heads, causal=True) for _ in range(config.layers_per_stage))
        if last:
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, config.vocab)

    def forward(self, inputs, batch) -> tuple[torch.Tensor, ...]:
        (h,) = inputs
        if self.first:
            image_tokens = self.project(h)  # [n_images, PATCHES, width]
            text = self.embed(batch.tensors["text"])  # [samples, TEXT_TOKENS, width]
            pieces, taken = [], 0
            for sample, count in enumerate(batch.spec.images):
                pieces.append(image_tokens[taken:taken + count].reshape(-1, text.shape[-1]))
                pieces.append(text[sample])
                taken += count
            packed = torch.cat(pieces)
            h = (packed + self.position(torch.arange(packed.shape[0], device=packed.device)))[None]
        for block in self.blocks:
            h = block(h)
        if self.last:
            return (self.head(self.norm(h)),)
        return (h,)


class MultimodalWorkload(Workload):
    name = "multimodal"

    def variability(self) -> VariabilityModel:
        return VariabilityModel(workload="multimodal", samples=self.config.samples, images_mean=1.5, images_max=4,
                                text_tokens=TEXT_TOKENS, image_tokens=PATCHES)

    @property
    def vision_stages(self) -> int:
        return self.variability().vision_stage_count(self.stages)

    def _build_stage(self, stage: int) -> nn.Module:
        vision = self.vision_stages
        if stage < vision:
            return VisionStage(self.config, first=stage == 0)
        max_len = self.config.samples * (4 * PATCHES + TEXT_TOKENS)
        return LanguageStage(self.config, first=stage == vision, last=stage == self.stages - 1, max_len=max_len)

    def _make_batch(self, iteration, spec, generator) -> Microbatch:
        images = torch.randn(spec.image_count, 3, IMAGE_SIZE, IMAGE_SIZE, generator=generator)
        text = torch.randint(0, self.config.vocab, (spec.samples, TEXT_TOKENS), generator=generator)
        labels = []
        for sample, count in enumerate(spec.images):
            labels.append(torch.full((count * PATCHES,), -100, dtype=torch.long))  # no loss on image positions
            labels.append((text[sample] + 1) % self.config.vocab)
        return Microbatch(iteration, spec.index, spec, {"images": images, "text": text, "labels": torch.cat(labels)},
                          units=spec.samples * TEXT_TOKENS)

    def loss(self, outputs, batch) -> torch.Tensor:
        (logits,) = outputs
        return F.cross_entropy(logits[0], batch.tensors["labels"], ignore_index=-100)


# -- emulated ------------------------------------------------------------------


class SleepInBackward(torch.autograd.Function):
    """Identity forward; its backward sleeps ``seconds`` (emulated backward work)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.seconds > 0:
            time.sleep(ctx.seconds)
        return grad, None


class EmulatedStage(nn.Module):
    """A 32-wide linear layer whose forward and backward last the sampled durations."""

    def __init__(self, workload: "EmulatedWorkload", stage: int) -> None:
        super().__init__()
        self.workload, self.stage = workload, stage
        self.linear = nn.Linear(EMULATED_WIDTH, EMULATED_WIDTH)

    def forward(self, inputs, batch, linear=None) -> tuple[torch.Tensor, ...]:
        """``linear(x, sleep_input, sleep_weight)``: the layer itself (default :meth:`_linear`; a TP shard
        brings its own, :class:`runtime.workloads.tp_layers.ParallelEmulatedStage`)."""
        began = time.perf_counter()
        table = self.workload.durations(batch.iteration)
        k, i = self.stage, batch.index
        backward = table.backward[k][i]
        # A full B traverses both nodes (half of B each); split backwards take I and W: recorded, or
        # B/2 and (split_overhead - 1/2) x B ([Note: split backward durations] in runtime.durations.variability).
        if table.input_grad and table.weight_grad:
            input_part, weight_part = table.input_grad[k][i], table.weight_grad[k][i]
        elif k in self.workload.split_stages:
            input_part, weight_part = split_parts(backward, table.split_overhead)
        else:
            input_part = backward / 2
            weight_part = backward - input_part
        (x,) = inputs
        y = (linear or self._linear)(x, lambda t: SleepInBackward.apply(t, input_part),
                                     lambda t: SleepInBackward.apply(t, weight_part))
        remaining = table.forward[k][i] - (time.perf_counter() - began)
        if remaining > 0:
            time.sleep(remaining)
        return (y,)

    def _linear(self, x: torch.Tensor, sleep_input, sleep_weight) -> torch.Tensor:
        return torch.tanh(F.linear(sleep_input(x), sleep_weight(self.linear.weight), self.linear.bias))


class EmulatedWorkload(Workload):
    name = "emulated"

    def __init__(self, config: RunConfig, shape: PipelineShape, device: torch.device | None = None,
                 replica: int = 0, replicas: int = 1) -> None:
        super().__init__(config, shape, unit="samples", device=device or torch.device("cpu"), replica=replica,
                         replicas=replicas)
        self._durations: dict[int, Durations] = {}

    def variability(self) -> VariabilityModel:
        return self.config.variability

    def durations(self, iteration: int) -> Durations:
        if iteration not in self._durations:
            if len(self._durations) > 2:
                self._durations.pop(min(self._durations))
            self._durations[iteration] = sample_durations(self.variability(), self.shape,
                                                          mix_seed(self.config.seed, iteration))
        return self._durations[iteration]

    def _specs(self, iteration: int) -> list[MicrobatchSpec]:
        return self.durations(iteration).specs

    def expected(self, iteration: int) -> Durations:
        return self.durations(iteration).expected()

    def _build_stage(self, stage: int) -> nn.Module:
        return EmulatedStage(self, stage)

    def _make_batch(self, iteration, spec, generator) -> Microbatch:
        x = torch.randn(spec.samples, EMULATED_WIDTH, generator=generator)
        return Microbatch(iteration, spec.index, spec, {"x": x}, units=spec.samples)

    def first_inputs(self, batch: Microbatch) -> tuple[torch.Tensor, ...]:
        # The input is a leaf that wants a gradient, so stage 0's I (or B) traverses its sleeping node too.
        return (batch.tensors["x"],)

    def loss(self, outputs, batch) -> torch.Tensor:
        (y,) = outputs
        return (y * y).mean()


WORKLOADS = {"gpt": GPTWorkload, "multimodal": MultimodalWorkload, "emulated": EmulatedWorkload}
