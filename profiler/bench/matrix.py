"""``rrfp bench``'s matrix as data: the workloads, rank counts, budgets and rows it runs, and the paper's rows.

A baseline or a workload preset is one line here. What to run (:class:`Settings`) and its checks are here too;
the simulated cells are run by :mod:`profiler.bench.cells`, the real runs by :mod:`profiler.bench.runs`, and
:mod:`profiler.bench.suite` runs them all into one results folder (:mod:`profiler.bench.results`).

[Note: rows that need an option]
    A row may not run in every cell (the tuned row: a search budget, and
    at most TUNE_MAX_RANKS ranks). :func:`row_unavailable` says why a row cannot run;
    the suite prints that and lists it under ``skipped`` in the results,
    never dropping a row silently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hints.errors import UserError
from hints.tasks import PipelineShape
from runtime.durations.ranges import check_number
from runtime.sched.baselines import PLANNED

# The workload presets the suite runs (names VariabilityModel(workload=...) accepts; docs/workloads.md).
WORKLOADS: tuple[str, ...] = ("uniform", "pretrain-packed", "sft-chat", "vlm-mixed", "vlm-video", "legacy-language",
                              "legacy-multimodal")
QUICK_WORKLOADS: tuple[str, ...] = ("sft-chat", "vlm-mixed")
# Which of the paper's settings a workload preset stands for (for the gap sentences); None: no counterpart.
PAPER_KIND: dict[str, str | None] = {
    "uniform": None, "language": "language", "multimodal": "multimodal",
    "legacy-language": "language", "legacy-multimodal": "multimodal", "pretrain-packed": "language",
    "sft-chat": "language", "vlm-mixed": "multimodal", "vlm-video": "multimodal",
}
RANKS: tuple[int, ...] = (8, 16, 32, 64, 128)
QUICK_RANKS: tuple[int, ...] = (8, 16, 32)
BUDGETS: tuple[str, ...] = ("1f1b", "2x")
MICROBATCHES_PER_RANK = 4
JITTER = 0.1  # lognormal task noise on top of each workload's own variability
VARIABILITY_JITTERS: tuple[float, ...] = (0.0, 0.1, 0.2, 0.4)
# [Note: unknown variability] (runtime.durations.unknown): the levels the unknown-variability sweep draws, per kind
# (level 0, or 1 for moe, is the matrix's own table). The sweep's rank count is the variability sweep's.
UNKNOWN_SWEEP: tuple[tuple[str, tuple[float, ...]], ...] = (
    ("moe", (1.3, 1.7, 2.5)), ("cost-error", (0.1, 0.2, 0.4)), ("slow-rank", (0.1, 0.3, 0.6)),
    ("inter-node", (0.5, 1.0, 2.0)),
)
TUNE_MAX_RANKS = 32  # above this the search's cost per scenario makes a tuned row too slow for a suite

BASELINE_ROW = "fixed-1f1b"
TUNED = "tuned"  # a MatrixRow.hint: the hint rrfp tune-hint's library entry point picks for the cell


@dataclass(frozen=True)
class MatrixRow:
    """One way to run a cell: a hint under a rule (``runtime.sched.rules.RULES``), maybe with an option."""

    name: str
    hint: str  # a built-in hint, or TUNED
    rule: str  # "fixed" or "lookahead" (ready, the default rule); a tuned row uses the tuner's rule
    chunks: int = 1
    p2p: str | None = None  # "blocking": Megatron-style fixed baseline ([Note: rows that need an option])
    about: str = ""
    fills_budget: bool = False  # a hint made for each cell's budget: a sorted 1F1B whose warm-ups fill it, or the
    # planned order (runtime.sched.baselines)

    @property
    def ready(self) -> bool:
        return self.rule != "fixed"


MATRIX_ROWS: tuple[MatrixRow, ...] = (
    MatrixRow("fixed-1f1b", "1f1b", "fixed", about="fixed-order 1F1B, asynchronous p2p: the baseline"),
    MatrixRow("fixed-1f1b-blocking", "1f1b", "fixed", p2p="blocking",
              about="fixed-order 1F1B with blocking p2p (Megatron-style)"),
    MatrixRow("fixed-interleaved", "interleaved-1f1b", "fixed", chunks=2,
              about="fixed-order interleaved 1F1B, 2 chunks per rank"),
    MatrixRow("fixed-zb", "zb", "fixed", about="fixed-order zero bubble (split backward)"),
    MatrixRow("fixed-1f1b-light", "1f1b-light", "fixed", fills_budget=True,
              about="fixed-order 1F1B, lightest microbatches first by known cost, warm-ups filling the budget"),
    MatrixRow("fixed-1f1b-heavy", "1f1b-heavy", "fixed", fills_budget=True,
              about="fixed-order 1F1B, heaviest microbatches first by known cost, warm-ups filling the budget"),
    MatrixRow("fixed-planned", PLANNED, "fixed", fills_budget=True,
              about="fixed order planned within the budget on the known costs (the split-backward order whose "
                    "lookahead run on the expected durations is shortest, fixed as it ran)"),
    MatrixRow("ready-1f1b", "1f1b", "lookahead", about="readiness-first, 1f1b hint"),
    MatrixRow("ready-bf", "bf", "lookahead", about="readiness-first, bf hint (breadth first)"),
    MatrixRow("ready-bfw", "bfw", "lookahead", about="readiness-first, bfw hint (heaviest microbatch first)"),
    MatrixRow("ready-1f1b-light", "1f1b-light", "lookahead",
              about="readiness-first, 1f1b-light hint (the sorted baseline's order, 1F1B's warm-ups)"),
    MatrixRow("ready-zb", "zb", "lookahead", about="readiness-first, zb hint"),
    MatrixRow("ready-cp", "cp", "lookahead", about="readiness-first, cp hint (critical path first)"),
    MatrixRow("ready-planned", PLANNED, "lookahead", fills_budget=True,
              about="readiness-first, the planned order as the hint (ready over fixed-planned: what readiness "
                    "earns from what the plan could not know)"),
    MatrixRow("ready-tuned", TUNED, "lookahead", about="readiness-first, the hint and rule tune-hint picks"),
)


@dataclass(frozen=True)
class PaperRow:
    """A headline setting of the RRFP paper (arXiv 2605.18750), cited, against our row at its rank count."""

    setting: str
    kind: str  # "language" or "multimodal": which of our workloads the gap sentence speaks of
    row: str  # our MatrixRow name, or "external" for the torch comparison of the real runs
    ranks: int
    paper: float
    cited: str


PAPER_ROWS: tuple[PaperRow, ...] = (
    PaperRow("language-only, 128 stages, BF hint vs fixed 1F1B", "language", "ready-bf", 128, 1.77,
             "up to 1.77x (language, 128 GPUs)"),
    PaperRow("language-only, 128 stages, BFW hint vs fixed 1F1B", "language", "ready-bfw", 128, 1.77,
             "up to 1.77x (language, 128 GPUs)"),
    PaperRow("multimodal, 128 stages, BF hint vs fixed 1F1B", "multimodal", "ready-bf", 128, 2.77,
             "up to 2.77x (multimodal, 128 GPUs)"),
    PaperRow("multimodal, 128 stages, BFW hint vs fixed 1F1B", "multimodal", "ready-bfw", 128, 2.77,
             "up to 2.77x (multimodal, 128 GPUs)"),
    PaperRow("readiness (BF hint) vs a faster external system", "multimodal", "external", 0, 1.84,
             "1.84x over the external system with its default BF hint"),
)


@dataclass(frozen=True)
class Settings:
    """One suite run: what to simulate and what to run for real."""

    workloads: tuple[str, ...] = WORKLOADS
    ranks: tuple[int, ...] = RANKS
    budgets: tuple[str, ...] = BUDGETS
    seeds: int = 3
    iterations: int = 2
    seed: int = 0
    jitter: float = JITTER
    variability_jitters: tuple[float, ...] = VARIABILITY_JITTERS
    variability_ranks: int = 32
    unknown_sweep: tuple[tuple[str, tuple[float, ...]], ...] = UNKNOWN_SWEEP
    bubble_ranks: int = 32
    tune_seconds: float = 10.0
    split_overhead: float | None = None  # None: each workload's own (runtime.durations.presets.SPLIT_OVERHEAD)
    real: bool = True
    external: bool = True
    quick: bool = False

    @classmethod
    def quick_defaults(cls) -> "Settings":
        return cls(workloads=QUICK_WORKLOADS, ranks=QUICK_RANKS, seeds=2, iterations=1, variability_ranks=16,
                   unknown_sweep=tuple((kind, levels[1:2]) for kind, levels in UNKNOWN_SWEEP),
                   bubble_ranks=16, tune_seconds=2.0, quick=True)

    @property
    def tables(self) -> list[tuple[int, int]]:
        """The ``(seed, iteration)`` of every table a cell is simulated on."""
        return [(self.seed + s, i) for s in range(self.seeds) for i in range(self.iterations)]


def check_settings(settings: Settings) -> None:
    """Bad input as one :class:`UserError` before anything runs."""
    from runtime.durations.variability import WORKLOADS as KNOWN
    from runtime.sched.budget import MemoryBudget

    for name in settings.workloads:
        if name not in KNOWN:
            raise UserError(f"unknown workload {name!r}; choose from {', '.join(KNOWN)}", "`workloads`")
    if not settings.workloads:
        raise UserError("give at least one workload", "`workloads`")
    if not settings.ranks or any(r < 2 for r in settings.ranks):
        raise UserError(f"every rank count must be at least 2, got {list(settings.ranks)}", "`ranks`")
    if not settings.budgets:
        raise UserError("give at least one budget, e.g. 1f1b,2x", "`budgets`")
    chunks = max(row.chunks for row in MATRIX_ROWS)
    for ranks in settings.ranks:  # a budget too small for some cell is refused now, not at that cell
        shape = PipelineShape(ranks, chunks, MICROBATCHES_PER_RANK * ranks)
        for budget in settings.budgets:
            try:  # the library names `memory_budget`, a flag rrfp bench does not have
                MemoryBudget.parse(budget).per_rank(shape)
            except UserError as err:
                raise UserError(f"{err.what} (at {ranks} ranks)", "`budgets`") from None
    if settings.seeds < 1:
        raise UserError(f"need at least one seed per cell, got {settings.seeds}", "`seeds`")
    if settings.iterations < 1:
        raise UserError(f"need at least one iteration per seed, got {settings.iterations}", "`iterations`")
    for jitter in (settings.jitter, *settings.variability_jitters):  # [Note: number ranges]
        check_number("jitter", jitter)
    if isinstance(settings.tune_seconds, bool) or not math.isfinite(settings.tune_seconds) \
            or settings.tune_seconds < 0:
        raise UserError(f"must be a finite number >= 0 (0 skips the tuned row), got {settings.tune_seconds!r}",
                        "`tune_seconds`")
    if settings.split_overhead is not None:
        from runtime.durations.variability import check_split_overhead

        check_split_overhead(settings.split_overhead, "`split_overhead`")


def parse_unknown_sweep(text: str, where: str = "--unknown-sweep") -> tuple[tuple[str, tuple[float, ...]], ...]:
    """``moe=1.3:1.7,cost-error=0.2`` -> the sweep's levels per kind; ``none`` skips the sweep. Each level is
    checked as ``--unknown`` checks it ([Note: unknown variability] in runtime.durations.unknown); an error names
    ``where`` (the flag that gave ``text``)."""
    from runtime.durations.unknown import Unknown

    if text.strip() == "none":
        return ()
    sweep = []
    for part in text.split(","):
        kind, sep, levels = part.strip().partition("=")
        if not sep or not levels.strip():
            raise UserError(f"{part.strip()!r} is not KIND=LEVEL[:LEVEL...], e.g. moe=1.3:1.7", where)
        values = []
        for level in levels.split(":"):
            Unknown.parse(f"{kind.strip()}={level.strip()}", where)
            values.append(float(level))
        sweep.append((kind.strip(), tuple(values)))
    return tuple(sweep)


def parse_ranks(text: str) -> tuple[int, ...]:
    """``8,16,32`` -> ``(8, 16, 32)``; one ``error:`` line otherwise."""
    try:
        ranks = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UserError(f"{text!r} is not a comma-separated list of integers, e.g. 8,16,32", "`ranks`") from None
    if not ranks or any(r < 2 for r in ranks):
        raise UserError(f"{text!r}: give rank counts of at least 2, e.g. 8,16,32", "`ranks`")
    return tuple(sorted(set(ranks)))


# -- rows that need an option -----------------------------------------------------------------------


def row_unavailable(row: MatrixRow, settings: Settings, ranks: int | None = None) -> str | None:
    """Why ``row`` cannot run here (printed and recorded), or None."""
    if row.hint == TUNED:
        if settings.tune_seconds <= 0:
            return "--tune-seconds 0"
        if ranks is not None and ranks > TUNE_MAX_RANKS:
            return f"tuning runs up to {TUNE_MAX_RANKS} ranks (profiler.bench.matrix.TUNE_MAX_RANKS)"
    return None
