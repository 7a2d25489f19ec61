"""Named workload presets: what the samples of a microbatch hold, and what a microbatch costs.

A preset is a generator of *samples* calibrated to published dataset
statistics (docs/workloads.md lists each figure, its source, and which
figures are assumptions) plus one cost model shared by every preset. The
simulator (:mod:`runtime.durations.variability`), the emulated workload
(``rrfp run --workload emulated --emulate PRESET``) and ``rrfp tune-hint
--workload PRESET`` all draw microbatches here.

Conventions
-----------
* A microbatch holds ``samples`` samples (``VariabilityModel.samples``; by
  default the preset's own :attr:`Preset.samples`). For
  ``pretrain-packed`` a sample is one packed sequence of ``sequence`` tokens.
* A sample (:class:`SampleContent`) has ``text`` tokens, ``images`` images cut
  into ``tiles`` encoder tiles, ``frames`` video frames, the ``visual_tokens``
  the language model sees for them, and its attention ``spans``: the
  documents of a packed sequence (document-masked attention), or empty for
  one span over the whole sample.

Cost model
----------
With ``T_s = text_s + visual_s`` the language-model tokens of sample ``s``
and ``l`` its attention spans (``(T_s,)`` when ``spans`` is empty)::

    language stages:  C_lm  = sum_s [ T_s + sum_l l^2 / attention_length ]
    encoder stages:   C_enc = sum_s (tiles_s + frames_s)

``attention_length`` is the span at which a token's attention costs as much
as its linear layers: per layer, causal attention does about ``2 l^2 h``
FLOPs against ``24 l h^2`` for the projections and MLP, so it is ``12 h``
(49,152 for ``h = 4096``, an assumption: a 7-8B model). A stage costs its
``C`` over the preset's mean ``C`` of a microbatch (an encoder stage at least
``0.02``, launch overhead, as the legacy multimodal model). The mean is taken
over :data:`REFERENCE_SAMPLES` samples drawn with a fixed seed (the same for
every run), or over every row of a cost table.

[Note: cost tables]
    ``--cost-table FILE`` replaces a preset's sample generator by rows a user
    extracted from their own data (``examples/cost_table.py``): each sample of
    a microbatch is a row drawn uniformly with replacement (seeded), costed
    with the preset's cost model. The format is documented in
    docs/workloads.md; :func:`load_cost_table` names the row and column of any
    problem.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from hints.errors import UserError

LEGACY_ALIASES = {"language": "legacy-language", "multimodal": "legacy-multimodal"}
REFERENCE_SAMPLES = 8192
ENCODER_FLOOR = 0.02  # an encoder stage with nothing to encode still launches its kernels


@dataclass(frozen=True)
class SampleContent:
    """One sample (or one packed sequence); see the module docstring."""

    kind: str  # text, image, multi-image, video or packed
    text: int
    images: int = 0
    tiles: int = 0
    frames: int = 0
    visual_tokens: int = 0
    spans: tuple[int, ...] = ()

    @property
    def tokens(self) -> int:
        return self.text + self.visual_tokens

    @property
    def encoder_units(self) -> int:
        return self.tiles + self.frames

    def attention_square(self) -> int:
        return sum(span * span for span in self.spans) if self.spans else self.tokens * self.tokens


@dataclass(frozen=True)
class Lengths:
    """A lognormal length (``median``, log-sd ``sigma``) clipped to ``[low, high]``, a whole number."""

    median: float
    sigma: float
    low: int
    high: int

    def draw(self, rng: random.Random) -> int:
        value = rng.lognormvariate(math.log(self.median), self.sigma)
        return min(self.high, max(self.low, int(round(value))))


@dataclass(frozen=True)
class Preset:
    """A named sample generator and the parameters of its cost model."""

    name: str
    summary: str
    samples: int = 1  # samples per microbatch unless the model says otherwise
    mix: tuple[tuple[str, float], ...] = (("text", 1.0),)  # kind -> share of samples
    text: tuple[tuple[str, Lengths], ...] = ()  # kind -> text tokens of such a sample
    sequence: int = 0  # packing length (pretrain-packed); 0: no packing
    documents: Lengths | None = None  # document lengths that fill packed sequences
    tiles: tuple[tuple[int, float], ...] = ((1, 1.0),)  # tiles per image -> probability
    tokens_per_tile: int = 576
    images_extra_mean: float = 0.0  # multi-image samples hold 2 + Poisson(this) images ...
    images_max: int = 16  # ... at most this many, each one tile
    durations: tuple[tuple[float, float, float], ...] = ()  # video: (share, shortest s, longest s)
    fps: float = 1.0
    frames_max: int = 64
    tokens_per_frame: int = 196
    attention_length: float = 49152.0
    split_overhead: float = 1.0  # I + W over B of a split backward ([Note: split backward cost by preset])

    @property
    def encoder(self) -> bool:
        """Does this preset run an image encoder (vision stages)?"""
        return any(kind in ("image", "multi-image", "video") for kind, _ in self.mix)

    def text_lengths(self, kind: str) -> Lengths:
        return dict(self.text)[kind]

    def sampler(self, rng: random.Random):
        """A function drawing one sample from ``rng`` (a packing preset keeps its leftover document)."""
        if self.sequence:
            return _Packer(self, rng).draw
        kinds = [kind for kind, _ in self.mix]
        cumulative = list(_accumulate([share for _, share in self.mix]))
        tile_values = [count for count, _ in self.tiles]
        tile_cumulative = list(_accumulate([p for _, p in self.tiles]))
        duration_cumulative = list(_accumulate([share for share, _, _ in self.durations]))

        def pick(values, bounds):
            u = rng.random() * bounds[-1]
            for value, bound in zip(values, bounds):
                if u < bound:
                    return value
            return values[-1]

        def draw() -> SampleContent:
            kind = pick(kinds, cumulative)
            text = self.text_lengths(kind).draw(rng)
            if kind == "text":
                return SampleContent(kind, text)
            if kind == "image":
                tiles = pick(tile_values, tile_cumulative)
                return SampleContent(kind, text, 1, tiles, 0, tiles * self.tokens_per_tile)
            if kind == "multi-image":
                images = min(self.images_max, 2 + _poisson(rng, self.images_extra_mean))
                return SampleContent(kind, text, images, images, 0, images * self.tokens_per_tile)
            _, shortest, longest = pick(self.durations, duration_cumulative)
            seconds = rng.uniform(shortest, longest)
            frames = max(1, min(self.frames_max, int(seconds * self.fps)))
            return SampleContent(kind, text, 0, 0, frames, frames * self.tokens_per_frame)

        return draw

    def reference_means(self) -> tuple[float, float]:
        """Mean language-model and encoder cost of one sample (see the module docstring)."""
        return _reference_means(self)

    def lm_cost(self, content: SampleContent) -> float:
        return content.tokens + content.attention_square() / self.attention_length


class _Packer:
    """Documents cut into sequences of ``preset.sequence`` tokens; a document longer than the room left
    continues in the next sequence, where it attends only to its own piece (document-masked attention)."""

    def __init__(self, preset: Preset, rng: random.Random) -> None:
        self.preset, self.rng, self.leftover = preset, rng, 0

    def draw(self) -> SampleContent:
        room, spans = self.preset.sequence, []
        while room > 0:
            length = self.leftover or self.preset.documents.draw(self.rng)
            piece = min(length, room)
            spans.append(piece)
            room -= piece
            self.leftover = length - piece
        return SampleContent("packed", self.preset.sequence, spans=tuple(spans))


def _accumulate(values):
    total = 0.0
    for value in values:
        total += value
        yield total


def _poisson(rng: random.Random, mean: float) -> int:
    """Knuth's method (small means); the legacy multimodal model draws with it too (runtime.durations.variability)."""
    if mean <= 0:
        return 0
    limit, k, product = math.exp(-mean), 0, rng.random()
    while product > limit:
        k += 1
        product *= rng.random()
    return k


@lru_cache(maxsize=None)
def _reference_means(preset: Preset) -> tuple[float, float]:
    draw = preset.sampler(random.Random(f"{preset.name}:reference"))
    return mean_costs(preset, [draw() for _ in range(REFERENCE_SAMPLES)])


def mean_costs(preset: Preset, contents: list[SampleContent]) -> tuple[float, float]:
    """Mean language-model and encoder cost of one of ``contents`` under ``preset``'s cost model."""
    return (sum(map(preset.lm_cost, contents)) / len(contents),
            sum(c.encoder_units for c in contents) / len(contents))


# -- the presets (figures and sources: docs/workloads.md) ----------------------------------------

# [Note: split backward cost by preset]
#     What a split backward costs, ``(I + W) / B``, on the real models of this repository, at 75d0c13 (``W``
#     starts from the gradients ``I`` saved, a linear layer's ``W`` runs its weight's matmul without an engine
#     call, ``I`` computes the sums over the tokens: norms' scales and shifts, linear layers' biases): the
#     stage that computes an input gradient, ``I`` and ``W`` exactly as a rank runs them (their Python
#     included) against the fused ``B`` on the same module and inputs, side by side in one thread
#     (``benchmarks/split_cost.py --no-runs --pairs 25 --warmup 2 --stages 2 --hidden 256 --seq-len 128
#     --samples 4 --layers-per-stage 2``, with and without ``--accumulate``, three runs each; the median of
#     the six medians: gpt 1.019-1.094, multimodal 1.042-1.085; docs/benchmarks/split-cost.md). From cebc923
#     the defaults were 1.08 and 1.09, the same measurement at 84ac35e. Until 84ac35e the defaults came from
#     the run part of the same script (``(I + W) / B`` of the tasks in ``rrfp run``
#     traces: 1.14 and 1.33 at 97ce934, 1.57 and 1.65 for the split before f5e1052); on the 2-core VM two
#     ranks and their transport threads share the cores, and three identical run parts at 84ac35e gave gpt
#     1.074, 1.140, 1.107 and multimodal 1.153, 1.217, 0.911: too wide to set a default to a few percent,
#     while the side-by-side kernels agree within 0.02-0.05. What a task costs the runtime around its
#     computation (the decision, recording it, waking) is not the split's: ``--task-overhead`` charges it to
#     every task. No device was lent when they were measured: CUDA figures are not in them. Every
#     workload model charges its kind's figure by default, so a zero-bubble hint is not credited with a
#     free split: language presets (pretrain-packed, sft-chat, legacy-language) the gpt figure,
#     vision-language presets (vlm-mixed, vlm-video, legacy-multimodal) the multimodal figure. ``uniform``
#     keeps 1.0: it is the textbook model with no network behind it (fixed task costs, ``I = W = B/2`` as
#     the zero-bubble schedules assume), the reference on which schedule structure and the golden
#     makespans are stated, and no paper row reads it (profiler.bench.matrix.PAPER_KIND). ``--split-overhead F``
#     overrides any of them; a recorded table keeps what it recorded.
MEASURED_SPLIT_OVERHEAD = {"gpt": 1.05, "multimodal": 1.06}
_LANGUAGE_SPLIT = MEASURED_SPLIT_OVERHEAD["gpt"]
_VISION_SPLIT = MEASURED_SPLIT_OVERHEAD["multimodal"]

_CHAT = Lengths(median=700, sigma=0.9, low=32, high=16384)  # sft-chat: one conversation

PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("pretrain-packed", "8k packing of web documents, document-masked attention",
           sequence=8192, documents=Lengths(median=300, sigma=1.25, low=16, high=131072),
           split_overhead=_LANGUAGE_SPLIT),
    Preset("sft-chat", "chat fine-tuning conversations (UltraChat, Tulu-3), one per sample", samples=4,
           text=(("text", _CHAT),), split_overhead=_LANGUAGE_SPLIT),
    Preset("vlm-mixed", "vision-language mix: text-only, AnyRes/dynamic-tile images, interleaved "
           "documents, video",
           mix=(("text", 0.30), ("image", 0.4675), ("multi-image", 0.0825), ("video", 0.15)),
           text=(("text", _CHAT), ("image", Lengths(250, 1.0, 8, 8192)),
                 ("multi-image", Lengths(450, 0.8, 16, 8192)), ("video", Lengths(150, 1.0, 8, 4096))),
           tiles=((1, 0.20), (3, 0.20), (5, 0.45), (10, 0.10), (13, 0.05)),
           images_extra_mean=2.0,
           durations=((0.45, 5.0, 30.0), (0.20, 30.0, 60.0), (0.18, 60.0, 120.0), (0.17, 120.0, 180.0)),
           frames_max=64, split_overhead=_VISION_SPLIT),
    Preset("vlm-video", "video instruction data (LLaVA-Video-178K durations), frames at 1 fps",
           mix=(("video", 1.0),), text=(("video", Lengths(150, 1.0, 8, 4096)),),
           durations=((0.45, 5.0, 30.0), (0.20, 30.0, 60.0), (0.18, 60.0, 120.0), (0.17, 120.0, 180.0)),
           frames_max=180, split_overhead=_VISION_SPLIT),
)}

PRESET_NAMES = tuple(PRESETS)
CANONICAL_WORKLOADS = ("uniform", "legacy-language", "legacy-multimodal", *PRESET_NAMES)  # each model once
WORKLOAD_NAMES = (*CANONICAL_WORKLOADS, *LEGACY_ALIASES)


def canonical(workload: str) -> str:
    """``language``/``multimodal`` are aliases of the legacy presets."""
    return LEGACY_ALIASES.get(workload, workload)


# Every workload's default (I + W) / B, by canonical name ([Note: split backward cost by preset]).
SPLIT_OVERHEAD: dict[str, float] = {"uniform": 1.0, "legacy-language": _LANGUAGE_SPLIT,
                                    "legacy-multimodal": _VISION_SPLIT,
                                    **{name: preset.split_overhead for name, preset in PRESETS.items()}}


def default_split_overhead(workload: str) -> float:
    """The split backward's ``(I + W) / B`` that ``workload`` charges unless told otherwise."""
    return SPLIT_OVERHEAD[canonical(workload)]


# -- cost tables ([Note: cost tables]) ----------------------------------------------------------

COST_TABLE_COLUMNS = ("text_tokens", "images", "tiles", "frames", "visual_tokens", "documents")


@dataclass(frozen=True)
class CostTable:
    """Samples read from a user's table (hashable, so models holding one can be cached).

    Its hash and its mean costs per preset are computed once: a table may hold a million rows, and
    models holding it are hashed and costed once per microbatch."""

    path: str
    rows: tuple[tuple[int, int, int, int, int | None, tuple[int, ...]], ...]
    _means: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.path, self.rows)))

    def __hash__(self) -> int:
        return self._hash

    def means(self, preset: Preset) -> tuple[float, float]:
        """:func:`mean_costs` over the table's rows, read as ``preset`` reads them."""
        if preset.name not in self._means:
            lm, encoder = mean_costs(preset, self.contents(preset))
            if lm <= 0:
                raise UserError(f"its samples have no language-model tokens (text or visual), so {preset.name}'s "
                                f"cost model has nothing to weigh", self.path)
            self._means[preset.name] = (lm, encoder)
        return self._means[preset.name]

    def contents(self, preset: Preset) -> list[SampleContent]:
        out = []
        for text, images, tiles, frames, visual, documents in self.rows:
            if visual is None:
                visual = tiles * preset.tokens_per_tile + frames * preset.tokens_per_frame
            kind = "packed" if documents else "video" if frames else "image" if tiles else "text"
            out.append(SampleContent(kind, text, images, tiles, frames, visual, documents))
        return out

    def __str__(self) -> str:
        return self.path


def load_cost_table(path: str | Path) -> CostTable:
    """Read a cost table (CSV; docs/workloads.md). Any problem is one :class:`UserError` naming the row
    (counted as a spreadsheet shows it: the header is row 1) and the column."""
    where = str(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:  # -sig: Excel's "CSV UTF-8" starts with a BOM
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None:
                raise UserError("is empty; the first line must name the columns (text_tokens, ...)", where)
            header = [name.strip() for name in header]
            for name in header:
                if name not in COST_TABLE_COLUMNS:
                    raise UserError(f"row 1: unknown column {name!r}; columns are {', '.join(COST_TABLE_COLUMNS)}",
                                    where)
            if "text_tokens" not in header:
                raise UserError("row 1: the column text_tokens is required", where)
            rows = [_cost_row(header, cells, number, where) for number, cells in enumerate(reader, start=2)
                    if any(cell.strip() for cell in cells)]
    except FileNotFoundError:
        raise UserError("no such file", where) from None
    except IsADirectoryError:
        raise UserError("is a directory, not a cost table", where) from None
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise UserError(f"cannot read: {getattr(err, 'strerror', None) or err}", where) from None
    if not rows:
        raise UserError("has no samples (only a header)", where)
    return CostTable(where, tuple(rows))


def _cost_row(header: list[str], cells: list[str], number: int, where: str):
    if len(cells) != len(header):
        raise UserError(f"row {number}: {len(cells)} cells but the header names {len(header)} columns", where)
    values = dict(zip(header, (cell.strip() for cell in cells)))

    def whole(name: str, default: int | None = 0) -> int | None:
        text = values.get(name, "")
        if text == "":
            if name == "text_tokens":
                raise UserError(f"row {number}, column {name}: empty; give a whole number >= 0", where)
            return default
        if not (text.isascii() and text.isdigit()):  # str.isdigit alone takes '²', which int() refuses
            raise UserError(f"row {number}, column {name}: must be a whole number >= 0, got {text!r}", where)
        return int(text)

    text, images, tiles, frames = whole("text_tokens"), whole("images"), whole("tiles"), whole("frames")
    visual = whole("visual_tokens", None)
    documents: tuple[int, ...] = ()
    if values.get("documents"):
        parts = values["documents"].split()
        if not all(part.isascii() and part.isdigit() and int(part) > 0 for part in parts):
            raise UserError(f"row {number}, column documents: must be document lengths > 0 separated by spaces, "
                            f"got {values['documents']!r}", where)
        documents = tuple(int(part) for part in parts)
        if sum(documents) != text:
            raise UserError(f"row {number}, column documents: the lengths add up to {sum(documents)}, "
                            f"not text_tokens {text}", where)
    if tiles and not images:
        images = 1  # tiles of one image unless the table says how many
    if text + (visual or 0) + tiles + frames == 0:
        raise UserError(f"row {number}: an empty sample (no tokens, tiles or frames)", where)
    return text, images, tiles, frames, visual, documents


__all__ = ["CANONICAL_WORKLOADS", "CostTable", "Lengths", "MEASURED_SPLIT_OVERHEAD", "PRESETS", "PRESET_NAMES", "Preset",
           "SPLIT_OVERHEAD", "SampleContent", "WORKLOAD_NAMES", "canonical", "default_split_overhead",
           "load_cost_table", "mean_costs"]
