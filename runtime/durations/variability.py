"""Variability models: how long each task and each transfer takes.

Shared by the simulator (``rrfp simulate``) and, later, the runtime's emulated
workload, so a simulated run and an emulated run can face the same sampled
durations. Everything is seeded and deterministic.

Units and conventions
---------------------
* Times are seconds (floats).
* ``forward_time`` is the forward time of one *rank's share* of the model for
  a typical microbatch; with ``v`` chunks per rank each model stage holds
  ``1/v`` of that share, so changing ``--chunks`` keeps total compute fixed.
* A backward costs ``backward_ratio`` times its forward. When a hint splits
  backwards, ``I`` takes half of the sampled ``B`` and ``W`` the rest of
  ``split_overhead`` times it (by default the workload's measured figure,
  1.05 for the language models and 1.06 for the vision-language ones, 1.0,
  a free split, for ``uniform``; [Note: split backward cost by preset] in
  :mod:`runtime.durations.presets` and [Note: split backward durations] in
  :meth:`Durations.for_graph`).

Workloads (``workload=``)
-------------------------
``uniform``
    Every stage and microbatch costs exactly ``forward_time`` (before jitter).
``language``
    Each microbatch holds ``samples`` sequences of one length ``L``
    (length-bucketed batching). ``L`` is lognormal with median
    ``seq_len_median`` and log-sd ``seq_len_sigma``, clipped to
    ``[seq_len_min, seq_len_max]`` and rounded to a multiple of 8. A stage
    costs ``(1 - attention) * x + attention * x**2`` with ``x = L /
    seq_len_median``: linear (MLP, projections) plus quadratic (attention)
    terms, so the median-length microbatch costs exactly ``forward_time``.
``multimodal``
    Each of ``samples`` samples carries ``Poisson(images_mean)`` images,
    clipped to ``images_max``. The first ``vision_stages`` model stages (by
    default a quarter, at least one) run the image encoder: their cost is the
    microbatch's image count over its expected count (an image-free microbatch
    still costs ``0.02`` for launch overhead). The language stages see text
    plus ``image_tokens`` tokens per image and cost that token count over its
    expected value.

``legacy-language``, ``legacy-multimodal``
    The same two models by their preset names (``language`` and
    ``multimodal`` stay accepted: existing traces, hint files and job files
    name them).
``pretrain-packed``, ``sft-chat``, ``vlm-mixed``, ``vlm-video``
    Presets calibrated to published dataset statistics, with one cost model
    (linear per token, attention quadratic in each document or sample,
    encoder per tile or frame): :mod:`runtime.durations.presets` and docs/workloads.md.
    ``cost_table`` draws their samples from a user's table instead
    ([Note: cost tables]). A stage costs its cost over the preset's mean, so
    the *mean* microbatch costs ``forward_time``.

Noise on top of any workload: ``jitter`` multiplies every task by a mean-one
lognormal with log-sd ``jitter``; with probability ``straggler_prob`` a task
is slowed ``straggler_slowdown`` times. Each cross-rank transfer takes
``comm_latency`` times a mean-one lognormal with log-sd ``comm_jitter``.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field, fields
from itertools import chain
from typing import Callable, Sequence

from hints.deps import TaskGraph
from hints.errors import UserError, input_name
from hints.tasks import B, F, I, PipelineShape
from runtime.durations.presets import (
    ENCODER_FLOOR,
    PRESETS,
    WORKLOAD_NAMES,
    CostTable,
    SampleContent,
    _poisson,
    canonical,
    default_split_overhead,
)
from runtime.durations.ranges import NUMBER_RANGES, check_number
from runtime.durations.unknown import Unknown

WORKLOADS = WORKLOAD_NAMES


@dataclass(frozen=True)
class VariabilityModel:
    """All knobs of the duration models (see the module docstring)."""

    workload: str = "uniform"
    forward_time: float = 0.010
    backward_ratio: float = 2.0
    jitter: float = 0.0
    straggler_prob: float = 0.0
    straggler_slowdown: float = 4.0
    comm_latency: float = 0.0
    comm_jitter: float = 0.0
    samples: int | None = None  # per microbatch; None becomes the preset's own (runtime.durations.presets), else 4
    seq_len_median: int = 1024
    seq_len_sigma: float = 0.7
    seq_len_min: int = 128
    seq_len_max: int = 8192
    attention: float = 0.3
    images_mean: float = 2.0
    images_max: int = 12
    vision_stages: int | None = None
    text_tokens: int = 256
    image_tokens: int = 144
    cost_table: CostTable | None = None  # presets only: samples drawn from a user's table
    # I + W over B ([Note: split backward durations]); None becomes the workload's own
    # ([Note: split backward cost by preset] in runtime.durations.presets)
    split_overhead: float | None = None
    # variability no scheduler knows beforehand ([Note: unknown variability] in runtime.durations.unknown)
    unknown: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "unknown", Unknown.parse(self.unknown).spec())  # canonical, checked
        if self.workload not in WORKLOADS:
            raise UserError(f"unknown workload {self.workload!r}; choose from {', '.join(WORKLOADS)}", "`workload`")
        if self.split_overhead is None:
            object.__setattr__(self, "split_overhead", default_split_overhead(self.workload))
        if self.samples is None:
            object.__setattr__(self, "samples", self.preset.samples if self.preset is not None else 4)
        if self.cost_table is not None and self.preset is None:
            raise UserError(f"a cost table is costed with a preset's cost model; choose one of "
                            f"{', '.join(PRESETS)}, not {self.workload!r}", "`workload`")
        if self.cost_table is not None:
            self.cost_table.means(self.preset)  # a table the preset cannot weigh is refused here, not mid-run
        for name in NUMBER_RANGES:  # [Note: number ranges] in runtime.durations.ranges
            if name != "task_overhead":
                check_number(name, getattr(self, name))
        for name in ("seq_len_sigma", "attention", "images_mean"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0 or not math.isfinite(value):
                raise UserError(f"must be a finite number >= 0, got {value!r}", input_name(name))
        if self.attention > 1.0:
            raise UserError(f"must be between 0 and 1, got {self.attention!r}", "`attention`")
        for name in ("samples", "seq_len_min", "seq_len_max", "seq_len_median", "text_tokens", "image_tokens"):
            if getattr(self, name) < 1:
                raise UserError(f"must be >= 1, got {getattr(self, name)!r}", input_name(name))
        if self.seq_len_min > self.seq_len_max:
            raise UserError("`seq_len_min` is above `seq_len_max`", "`seq_len_min`")
        check_split_overhead(self.split_overhead)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @property
    def kind(self) -> str:
        """The workload's canonical name (``language`` -> ``legacy-language``)."""
        return canonical(self.workload)

    @property
    def unknowns(self) -> Unknown:
        """The parsed ``unknown`` levels."""
        return Unknown.parse(self.unknown)

    @property
    def preset(self):
        """The :class:`runtime.durations.presets.Preset` of a preset workload, else None (uniform and legacy)."""
        return PRESETS.get(self.workload)

    def preset_means(self) -> tuple[float, float]:
        """Mean language-model and encoder cost of one sample: over the cost table, or the preset's reference."""
        preset = self.preset
        if self.cost_table is None:
            return preset.reference_means()
        return self.cost_table.means(preset)

    def vision_stage_count(self, stages: int) -> int:
        preset = self.preset
        if self.kind != "legacy-multimodal" and not (preset is not None and preset.encoder):
            return 0
        if self.vision_stages is not None:
            if not 1 <= self.vision_stages < max(2, stages):
                raise UserError(f"must be between 1 and {stages - 1} for {stages} stages", "`vision_stages`")
            return self.vision_stages
        return max(1, stages // 4) if stages > 1 else 1


def check_split_overhead(value: object, where: str = "`split_overhead`") -> None:
    """A split backward does at least the fused one's work: ``split_overhead`` is a finite number >= 1, and at
    most :data:`~runtime.durations.ranges.SPLIT_OVERHEAD_MAX` ([Note: number ranges])."""
    check_number("split_overhead", value, where)


def split_parts(backward: float, split_overhead: float) -> tuple[float, float]:
    """``(I, W)`` of a split backward whose fused ``B`` lasts ``backward`` ([Note: split backward durations])."""
    return backward * 0.5, backward * (split_overhead - 0.5)  # for_graph computes the same products per row


@dataclass(frozen=True)
class MicrobatchSpec:
    """What one microbatch holds: the data generators of the runtime use the same numbers."""

    index: int
    seq_len: int  # tokens per sequence (language); text tokens per sample (multimodal); longest sample (presets)
    samples: int
    images: tuple[int, ...] = ()  # images per sample (multimodal); encoder tiles + frames per sample (presets)
    contents: tuple[SampleContent, ...] = ()  # presets: what each sample holds

    @property
    def image_count(self) -> int:
        return sum(self.images)

    def features(self) -> dict[str, float]:
        """What a cost model reads (:mod:`hints.costs`): the microbatch's tokens and images.

        Legacy models: text tokens and images. Presets: every token the language model sees (text and
        visual) and every encoder input (image tiles and video frames).
        """
        if self.contents:
            return {"tokens": float(sum(c.tokens for c in self.contents)), "images": float(self.image_count)}
        return {"tokens": float(self.samples * self.seq_len), "images": float(self.image_count)}


def sample_microbatches(model: VariabilityModel, microbatches: int, seed: int) -> list[MicrobatchSpec]:
    """The per-microbatch contents for ``seed`` (independent of the noise streams)."""
    rng = random.Random(f"{seed}:microbatches")
    if model.preset is not None:
        return _preset_microbatches(model, microbatches, rng)
    kind = model.kind
    specs = []
    for mb in range(microbatches):
        if kind == "legacy-language":
            length = rng.lognormvariate(math.log(model.seq_len_median), model.seq_len_sigma)
            length = min(model.seq_len_max, max(model.seq_len_min, int(round(length / 8.0)) * 8))
            specs.append(MicrobatchSpec(mb, max(length, model.seq_len_min), model.samples))
        elif kind == "legacy-multimodal":
            images = tuple(min(model.images_max, _poisson(rng, model.images_mean)) for _ in range(model.samples))
            specs.append(MicrobatchSpec(mb, model.text_tokens, model.samples, images))
        else:
            specs.append(MicrobatchSpec(mb, model.seq_len_median, model.samples))
    return specs


def _preset_microbatches(model: VariabilityModel, microbatches: int, rng: random.Random) -> list[MicrobatchSpec]:
    """Samples from the preset's generator, or rows of the cost table drawn with replacement."""
    if model.cost_table is not None:
        rows = model.cost_table.contents(model.preset)
        count = len(rows)
        draw = lambda: rows[int(rng.random() * count)]  # noqa: E731 - one draw per sample
    else:
        draw = model.preset.sampler(rng)
    specs = []
    for mb in range(microbatches):
        contents = tuple(draw() for _ in range(model.samples))
        specs.append(MicrobatchSpec(mb, max(c.tokens for c in contents), model.samples,
                                    tuple(c.encoder_units for c in contents), contents))
    return specs


def stage_cost(model: VariabilityModel, spec: MicrobatchSpec, stage: int, stages: int) -> float:
    """Relative forward cost of ``stage`` on this microbatch (1.0 = a typical microbatch)."""
    kind = model.kind
    preset = model.preset
    if preset is not None:
        lm_mean, encoder_mean = model.preset_means()
        if stage < model.vision_stage_count(stages):
            expected = model.samples * encoder_mean
            return max(ENCODER_FLOOR, spec.image_count / expected) if expected > 0 else ENCODER_FLOOR
        return sum(map(preset.lm_cost, spec.contents)) / (model.samples * lm_mean)
    if kind == "legacy-language":
        x = spec.seq_len / model.seq_len_median
        return (1.0 - model.attention) * x + model.attention * x * x
    if kind == "legacy-multimodal":
        if stage < model.vision_stage_count(stages):
            expected = model.samples * model.images_mean
            return max(0.02, spec.image_count / expected) if expected > 0 else 0.02
        tokens = spec.samples * spec.seq_len + spec.image_count * model.image_tokens
        expected = model.samples * (model.text_tokens + model.images_mean * model.image_tokens)
        return tokens / expected
    return 1.0


def _stage_cost_rows(
    model: VariabilityModel, specs: list[MicrobatchSpec], stages: int
) -> tuple[list[list[float]], list[int]]:
    """:func:`stage_cost` of every (stage, microbatch), as distinct rows and each stage's row.

    A stage's cost depends on the stage only through whether it runs the image
    encoder, so each kind of stage is computed once: ``rows[row_of[k]][i]`` is
    the cost of stage ``k`` on microbatch ``i``.
    """
    vision = model.vision_stage_count(stages)
    rows: list[list[float]] = []
    row_of_kind: dict[bool, int] = {}
    row_of: list[int] = []
    for k in range(stages):
        if (k < vision) not in row_of_kind:
            row_of_kind[k < vision] = len(rows)
            rows.append([stage_cost(model, spec, k, stages) for spec in specs])
        row_of.append(row_of_kind[k < vision])
    return rows, row_of


def _microbatch_costs(rows: list[list[float]], row_of: list[int]) -> list[float]:
    """Per microbatch, its cost summed over the stages (in stage order)."""
    return [sum(column) for column in zip(*(rows[r] for r in row_of))]


@dataclass
class Durations:
    """Sampled (or recorded) durations for a pipeline of ``stages`` model stages.

    ``forward[k][i]`` and ``backward[k][i]`` are seconds for ``F(k, i)`` and
    the full ``B(k, i)``; ``input_grad`` / ``weight_grad`` hold ``I`` and ``W``
    when known separately (recorded split backwards). ``send_forward[k][i]``
    is the latency of the activation ``F(k, i)`` sends downstream,
    ``send_backward[k][i]`` of the gradient ``B/I(k, i)`` sends upstream.
    """

    stages: int
    microbatches: int
    forward: list[list[float]]
    backward: list[list[float]]
    send_forward: list[list[float]]
    send_backward: list[list[float]]
    microbatch_costs: list[float]
    input_grad: list[list[float]] | None = None
    weight_grad: list[list[float]] | None = None
    source: str = "model"
    specs: list[MicrobatchSpec] = field(default_factory=list)
    features: list[dict[str, float]] | None = None  # per microbatch, when recorded (else from specs)
    # See expected(): the expectation, a function computing it (sampled tables), or None (recorded).
    expectation: "Durations | Callable[[], Durations] | None" = field(default=None, repr=False)
    split_overhead: float = 1.0  # I + W over B when I and W are not recorded (the model's)

    def for_graph(self, graph: TaskGraph) -> tuple[list[float], list[float]]:
        """Per task id: compute seconds, and the latency of the message it sends (0 if none).

        [Note: split backward durations] A split hint's ``I`` and ``W`` take
        the recorded ``I``/``W`` when the table has them, otherwise half of
        ``I = B/2`` and ``W = (split_overhead - 1/2) x B`` (:func:`split_parts`;
        the emulated workload sleeps the same); a full-backward hint's ``B`` is
        the table's ``B``, or ``I + W`` when only those were recorded.
        ``split_overhead`` (a :class:`VariabilityModel` knob; by default the
        workload's measured figure, 1.0 for ``uniform``: [Note: split backward
        cost by preset] in :mod:`runtime.durations.presets`, which has the
        measurement) is what splitting costs on real models: at 75d0c13
        (``W`` starts from the gradients ``I`` saved, [Note: split backward in
        the runtime] in :mod:`runtime.exec.split_backward`) 1.05 (gpt) and 1.06
        (multimodal) on the stage with an input gradient, with ``I`` at
        0.60-0.68 of ``B``. The model keeps ``I = B/2`` and puts the
        overhead on ``W``: it sends the input gradient a little earlier than
        the real split does, and the total is the measured one.
        (Earlier splits: 1.14 and 1.33 at 97ce934; the runtime's first split,
        whose ``W`` walked the whole graph again, 1.57 and 1.65.)
        Stage 0 computes no input gradient on the real
        models (``I`` about 0, ``(I + W) / B`` 0.97 and 1.18). The emulated
        workload's stage 0 does (its input is a leaf that wants a gradient),
        so one factor serves every stage (:data:`runtime.durations.presets.MEASURED_SPLIT_OVERHEAD`). A
        recorded table with only ``B`` carries no model: its split stays free.
        """
        shape = graph.shape
        if shape.stages != self.stages or shape.microbatches != self.microbatches:
            raise UserError(
                f"durations cover {self.stages} stages x {self.microbatches} microbatches but the run has "
                f"{shape.stages} x {shape.microbatches}",
                self.source,
            )
        # Task ids run in blocks of the m microbatches of one (stage, kind) (TaskGraph.blocks), so each
        # block is one row of the table.
        m = self.microbatches
        weight_share = self.split_overhead - 0.5  # split_parts, one product per task
        no_messages = [0.0] * m
        compute_rows, transfer_rows = [], []
        for stage, kind in graph.blocks:
            if kind is F:
                compute_rows.append(self.forward[stage])
                transfer_rows.append(self.send_forward[stage])
            elif kind is B:
                compute_rows.append(self.backward[stage])
                transfer_rows.append(self.send_backward[stage])
            elif kind is I:
                compute_rows.append(self.input_grad[stage] if self.input_grad
                                    else [value * 0.5 for value in self.backward[stage]])
                transfer_rows.append(self.send_backward[stage])
            else:
                compute_rows.append(self.weight_grad[stage] if self.weight_grad
                                    else [value * weight_share for value in self.backward[stage]])
                transfer_rows.append(no_messages)
        compute = list(chain.from_iterable(compute_rows))
        transfer = list(chain.from_iterable(transfer_rows))
        if len(compute) != len(graph) or len(transfer) != len(graph):
            raise UserError(f"every row of the table must hold {m} microbatches", self.source)
        return compute, transfer

    def microbatch_features(self) -> list[dict[str, float]] | None:
        """Per microbatch, what it held (``tokens``, ``images``), or None when the table does not say."""
        if self.features is not None:
            return self.features
        if len(self.specs) == self.microbatches:
            return [spec.features() for spec in self.specs]
        return None

    def expected(self) -> "Durations":
        """What a scheduler may know before the iteration runs: expected durations and latencies.

        [Note: expected durations] For a table sampled from a model, the
        model's expectation: each task's cost from what the microbatch holds
        (sequence length, image count: known before the iteration starts, as
        ``bfw`` uses them) times the mean of the noise (jitter is mean-one,
        stragglers add ``prob * (slowdown - 1)``), and the mean latency. For a
        recorded table, the mean per (stage, kind) over its microbatches and
        the mean latency per (stage, direction). Never the sampled or
        recorded value of the task itself: rules and hints that use
        expectations (lookahead, ``cp``, ``bfw``) get no oracle. (A recorded
        table says nothing of what each microbatch held, so its expected
        per-microbatch costs are all equal.)
        """
        if self.expectation is None:
            self.expectation = self._means()
        elif callable(self.expectation):
            self.expectation = self.expectation()
        return self.expectation

    def _means(self) -> "Durations":
        m = self.microbatches

        def flat(rows):
            return [[sum(row) / m] * m for row in rows]

        # Per-microbatch costs of a recorded table are recorded values too: without a model of what
        # each microbatch holds, every microbatch is expected to cost the same.
        means = Durations(
            self.stages, m, flat(self.forward), flat(self.backward), flat(self.send_forward),
            flat(self.send_backward), [1.0] * m,
            input_grad=flat(self.input_grad) if self.input_grad else None,
            weight_grad=flat(self.weight_grad) if self.weight_grad else None,
            source=f"mean per (stage, kind) of {self.source}", features=self.microbatch_features(),
            split_overhead=self.split_overhead,
        )
        means.expectation = means
        return means

    def total_compute(self) -> float:
        return sum(map(sum, self.forward)) + sum(map(sum, self.backward))


def durations_from_rows(shape: PipelineShape, rows: dict[str, list[list[float]]], send_forward: list[list[float]],
                        send_backward: list[list[float]], source: str) -> Durations:
    """A table of what a run of ``shape`` realized: ``rows[kind][stage][microbatch]`` seconds of each ``F``, ``B``,
    ``I`` and ``W`` it ran (``rows`` is changed in place), and its messages' latencies.

    A split stage's ``B`` is its ``I + W``; a fused stage of a split shape ran ``B`` only, so its ``I`` and
    ``W`` are halves of it (its graph never reads them; the table stays complete). A microbatch's cost is its
    ``F + B`` over the stages. What a trace's iteration (:mod:`profiler.analysis.realized`) and ``--policy
    auto``'s gathered iteration (:mod:`runtime.run.auto`) both become.
    """
    stages, m = shape.stages, shape.microbatches
    for k in range(stages):
        if shape.splits(k):
            rows["B"][k] = [i + w for i, w in zip(rows["I"][k], rows["W"][k])]
        elif shape.split_backward:
            rows["I"][k] = [b / 2 for b in rows["B"][k]]
            rows["W"][k] = [b / 2 for b in rows["B"][k]]
    costs = [sum(rows["F"][k][i] + rows["B"][k][i] for k in range(stages)) for i in range(m)]
    return Durations(stages, m, rows["F"], rows["B"], send_forward, send_backward, costs,
                     input_grad=rows["I"] if shape.split_backward else None,
                     weight_grad=rows["W"] if shape.split_backward else None, source=source)


def expected_durations(model: VariabilityModel, shape: PipelineShape, specs: list[MicrobatchSpec],
                       source: str = "") -> Durations:
    """The model's expectation for microbatches holding ``specs`` ([Note: expected durations]).

    Each task costs what its microbatch's contents make it cost, times the
    mean of the noise; each transfer the mean latency. This is what a
    scheduler may know before the iteration runs (``bfw``, ``cp``, lookahead).
    """
    stages, m = shape.stages, shape.microbatches
    per_stage = model.forward_time / shape.chunks
    rows, row_of = _stage_cost_rows(model, specs, stages)
    noise_mean = 1.0 + model.straggler_prob * (model.straggler_slowdown - 1.0)  # jitter is mean-one
    forward_rows = [[per_stage * cost * noise_mean for cost in row] for row in rows]
    backward_rows = [[model.backward_ratio * value for value in row] for row in forward_rows]
    forward = [list(forward_rows[r]) for r in row_of]
    backward = [list(backward_rows[r]) for r in row_of]
    unknown = model.unknowns
    if unknown.active:  # [Note: unknown variability]: their means, never their draws
        for k, factor in enumerate(unknown.expected_factors(shape, model.vision_stage_count(stages))):
            forward[k] = [value * factor for value in forward[k]]
            backward[k] = [value * factor for value in backward[k]]
    extra = unknown.internode_mean(per_stage)
    estimated = _microbatch_costs(rows, row_of)
    expected = Durations(stages, m, forward, backward,
                         [[model.comm_latency + (extra if unknown.crosses_hosts(shape, k) else 0.0) if k < stages - 1
                           else 0.0] * m for k in range(stages)],
                         [[model.comm_latency + (extra if unknown.crosses_hosts(shape, k - 1) else 0.0) if k > 0
                           else 0.0] * m for k in range(stages)],
                         estimated, source=source or f"expectation of the {model.workload} model", specs=specs,
                         split_overhead=model.split_overhead)
    expected.expectation = expected  # what is known beforehand of an expectation is the expectation itself
    return expected


def _noisy(bases: list[float], draw, mu: float, sigma: float, prob: float, slowdown: float) -> list[float]:
    """Each base times a lognormal (``mu``, ``sigma``), then times ``slowdown`` with probability ``prob``.

    ``draw`` is a ``random.Random``'s ``random``. The values and the draws are those of
    ``base * exp(rng.normalvariate(mu, sigma))`` (Kinderman and Monahan's ratio of uniforms, as
    CPython writes it; no draw when ``sigma`` is 0) followed by ``rng.random() < prob`` (none when
    ``prob`` is 0): that code inlined, so that a task costs no Python call (a tested equality).
    """
    if sigma <= 0 and prob <= 0:
        return list(bases)
    log, exp, magic = math.log, math.exp, random.NV_MAGICCONST
    out = []
    append = out.append
    for value in bases:
        if sigma > 0:
            while True:
                u1 = draw()
                u2 = 1.0 - draw()
                z = magic * (u1 - 0.5) / u2
                if z * z / 4.0 <= -log(u2):
                    break
            value = value * exp(mu + z * sigma)
        if prob > 0 and draw() < prob:
            value = value * slowdown
        append(value)
    return out


def task_noise(bases: list[float], draw, jitter: float, straggler_prob: float,
               straggler_slowdown: float) -> list[float]:
    """The task noise of the module docstring on each of ``bases``: times a mean-one lognormal with log-sd
    ``jitter``, then ``straggler_slowdown`` times with probability ``straggler_prob``.

    ``draw`` is a ``random.Random``'s ``random``; per base, the jitter's draws, then the straggler's (none
    for a knob at 0). The model's one writing: :func:`sample_durations` and the runtime's injected noise on
    real workloads (:mod:`runtime.run.noise`) both draw through it.
    """
    return _noisy(bases, draw, -jitter * jitter / 2.0, jitter, straggler_prob, straggler_slowdown)


def transfer_latencies(count: int, draw, comm_latency: float, comm_jitter: float) -> list[float]:
    """``count`` transfer latencies: ``comm_latency`` times a mean-one lognormal with log-sd ``comm_jitter``
    (no draw when the latency or the jitter is 0). ``draw`` as for :func:`task_noise`."""
    if comm_latency == 0:
        return [0.0] * count
    return _noisy([comm_latency] * count, draw, -comm_jitter ** 2 / 2.0, comm_jitter, 0.0, 1.0)


def sample_durations(model: VariabilityModel, shape: PipelineShape, seed: int) -> Durations:
    """Sample every task's duration and every transfer's latency for ``shape`` under ``model``."""
    stages, m = shape.stages, shape.microbatches
    specs = sample_microbatches(model, m, seed)
    noise = random.Random(f"{seed}:noise")
    comm = random.Random(f"{seed}:comm")
    per_stage = model.forward_time / shape.chunks
    # [Note: sampling order] Every draw comes from `noise` (task durations: all forwards stage by
    # stage, then all backwards; per task the jitter, then the straggler draw) or `comm` (latencies:
    # all activations, then all gradients), in that order, so a seed always gives the same table.
    # Durations are drawn by _noisy, which makes random.Random's own draws without a Python call per
    # task.

    def noisy(bases: list[float]) -> list[float]:
        return task_noise(bases, noise.random, model.jitter, model.straggler_prob, model.straggler_slowdown)

    def latencies(count: int) -> list[float]:
        return transfer_latencies(count, comm.random, model.comm_latency, model.comm_jitter)

    rows, row_of = _stage_cost_rows(model, specs, stages)
    forward_bases = [[per_stage * cost for cost in row] for row in rows]
    backward_per_stage = model.backward_ratio * per_stage
    backward_bases = [[backward_per_stage * cost for cost in row] for row in rows]
    forward = [noisy(forward_bases[r]) for r in row_of]
    backward = [noisy(backward_bases[r]) for r in row_of]
    send_forward = [latencies(m) if k < stages - 1 else [0.0] * m for k in range(stages)]
    send_backward = [latencies(m) if k > 0 else [0.0] * m for k in range(stages)]
    unknown = model.unknowns
    if unknown.active:  # [Note: unknown variability]: own streams, so the draws above are unchanged
        factors = unknown.compute_factors(shape, model.vision_stage_count(stages), seed)
        if factors is not None:
            forward = [[value * f for value, f in zip(row, fs)] for row, fs in zip(forward, factors)]
            backward = [[value * f for value, f in zip(row, fs)] for row, fs in zip(backward, factors)]
        extra = unknown.extra_latencies(shape, model.forward_time, seed)
        if extra is not None:
            send_forward = [[a + b for a, b in zip(row, more)] for row, more in zip(send_forward, extra[0])]
            send_backward = [[a + b for a, b in zip(row, more)] for row, more in zip(send_backward, extra[1])]
    estimated = _microbatch_costs(rows, row_of)
    return Durations(stages, m, forward, backward, send_forward, send_backward, estimated,
                     source=f"{model.workload} model, seed {seed}", specs=specs, split_overhead=model.split_overhead,
                     expectation=lambda: expected_durations(model, shape, specs,
                                                            f"expectation of the {model.workload} model, seed {seed}"))


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Population standard deviation over the mean (0 for a mean of 0): how much a cost varies."""
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean > 0 else 0.0


def describe_workload(model: VariabilityModel, microbatches: int, seed: int) -> dict[str, float | int | str | None]:
    """What ``rrfp simulate --describe`` prints: statistics of ``microbatches`` microbatches sampled at ``seed``.

    ``cost_cv`` and ``heaviest_over_mean`` are of a language stage's cost (every stage for models without
    an encoder), ``encoder_cv`` of an encoder stage's (None without one); the content statistics are None
    where the workload has no such content. Nothing here is a constant: all of it is measured on the draw.
    """
    specs = sample_microbatches(model, microbatches, seed)
    stages = 8
    vision = model.vision_stage_count(stages)
    language = [stage_cost(model, spec, stages - 1, stages) for spec in specs]
    encoder = [stage_cost(model, spec, 0, stages) for spec in specs] if vision else None

    mean_language = sum(language) / len(language)
    contents = [c for spec in specs for c in spec.contents]
    images = sum(c.images for c in contents)
    videos = [c for c in contents if c.frames]
    spans = [span for c in contents for span in c.spans]
    tokens = [spec.features()["tokens"] for spec in specs]
    return {
        "workload": model.workload, "microbatches": microbatches, "seed": seed, "samples": model.samples,
        "cost_cv": coefficient_of_variation(language), "heaviest_over_mean": max(language) / mean_language if mean_language else 1.0,
        "encoder_cv": coefficient_of_variation(encoder) if encoder else None,
        "tokens_per_microbatch": sum(tokens) / len(tokens),
        "text_only_share": (sum(1 for c in contents if c.kind == "text") / len(contents)
                            if contents and model.preset.encoder else None),
        "tiles_per_image": sum(c.tiles for c in contents) / images if images else None,
        "frames_per_video": sum(c.frames for c in videos) / len(videos) if videos else None,
        "documents_per_sequence": len(spans) / len(contents) if spans else None,
        "mean_document": sum(spans) / len(spans) if spans else None,
        "source": str(model.cost_table) if model.cost_table is not None else f"{model.workload} model",
    }
