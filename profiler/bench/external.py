"""torch.distributed.pipelining's schedules against ``rrfp run``, on the same models, stages, microbatches and data.

    .venv/bin/python benchmarks/cross_framework.py [--stages 4] [--microbatches 16] [--iters 4]
        [--forward-time 0.01] [--cases gpt uniform multimodal] [--schedules ...] [--hints 1f1b zb bfw]
        [--budgets 1f1b 2x] [--json FILE] [--quick]

For each case it runs, on ``--stages`` CPU processes over gloo:

* each of torch's ``--schedules`` (``PipelineStage``\\ s + ``step()``), all in one launch: by default
  ``Schedule1F1B``, ``ScheduleGPipe``, ``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble``,
  ``ScheduleZBVZeroBubble`` and ``ScheduleDualPipeV``;
* ``rrfp run`` jobs through :func:`runtime.run.launch.launch`, one launch: for every torch schedule, the
  rrfp hint of the same structure (:data:`PAIRS`) under ``fixed`` and under ``ready`` at that
  schedule's own peak in flight ([Note: equal memory pairs]); and, on one chunk, each of ``--hints``
  under ``fixed`` and under ``ready`` at each of ``--budgets``.

Each job trains ``--warmup`` + ``--iters`` iterations (forward, backward, AdamW step); the warm-up
iterations are dropped and the median step time of the rest is reported with its spread (min - max),
throughput (tokens or samples per second) and speedups, all measured in the same run: over torch's
``Schedule1F1B``, over the torch schedule of the same structure, and (ready rows) over the same hint
in fixed order. A step is timed on rank 0 and includes the optimizer step: for torch from a barrier
through ``step()`` and the optimizer to a closing barrier; rrfp times itself, from the end of the
previous iteration's ``all_gather`` through the optimizer to this iteration's ``all_gather``. "peak in
flight" is the most microbatch-chunks a rank holds activations for: measured for rrfp, by construction
for torch (from torch's own ``pipeline_order``, :func:`hints.files.torch_import.import_torch_schedule`).

[Note: equal memory pairs]
    A speedup of readiness over a torch schedule is only readiness's if both run the same structure
    at the same memory. So each torch schedule is paired with the rrfp hint that issues the same order
    (``1f1b``, ``gpipe``, ``interleaved-1f1b``, ``zb``, ``zbv``; DualPipeV has no built-in and is
    imported, ``torch:ScheduleDualPipeV``) on the same chunks and placement, run in ``fixed`` order
    (what rrfp's runtime costs against torch's on the same order) and under ``ready`` with the memory
    budget equal to the torch schedule's per-rank peak (what readiness adds). The per-rank peaks are
    read off torch's order: when they are 1F1B's (``Schedule1F1B``, ``ScheduleInterleaved1F1B``,
    ``ScheduleZBVZeroBubble``) the budget is ``1f1b``; when they are the same on every rank
    (``ScheduleGPipe``: ``m``; ``ScheduleInterleavedZeroBubble``: ``(v-1) * round + p``;
    ``ScheduleDualPipeV``: ``2p + 1``) it is that slot count. A peak that is neither cannot be written
    as an rrfp budget; the row then runs at the largest rank's peak and is marked ``equal_memory:
    false`` (``*`` in the tables). The ``--hints`` rows run ready at each of ``--budgets`` against the
    same hint in fixed order, which keeps its own memory: when that fixed order holds more than the
    budget on some rank (``gpipe``, ``bf``, ``bfw`` keep every microbatch; ``zb`` defers ``W``), the
    ready row is marked ``equal_memory: false`` and ``*`` too, since its ready / fixed ratio sets less
    memory against more (:func:`fixed_within`). Multi-chunk schedules run ``--layers-per-rank / chunks`` gpt blocks
    per model stage and the emulated workload splits each rank's ``--forward-time`` over its chunks
    (:mod:`runtime.durations.variability`), so every structure trains a model of the same per-rank size (the
    gpt losses differ between chunk counts: different stage cuts, different initialisation).

Cases (``--cases``):

``gpt``
    No variability: the gpt workload with ``--seq-len`` fixed (torch's stages need fixed shapes).
``uniform``
    No variability: emulated stages, every task lasts ``--forward-time`` (backward twice that).
``multimodal``
    Variability: emulated stages whose durations follow the image counts of the multimodal model, with
    lognormal jitter (``--jitter``) and stragglers (``--straggler-prob``). Durations are sampled per
    (seed, iteration), so every job, torch's included, faces the same durations in each iteration.
    Transfer latency is not emulated: rrfp would inject it in its transport, torch would not see it.

Output: Markdown on stdout (command line, machine, one table per case, then a summary of the speedups
over torch 1F1B, without and with variability); progress goes to stderr. ``--json FILE`` also writes
every row as a JSON list (fields in :func:`json_row`). Bad arguments print one ``error:`` line and
exit 2.

torch's side (its schedules on rrfp's stage modules, in the spawned ranks) is :mod:`profiler.bench.torch_side`, with [Note: the torch adapter] and [Note: static shapes].
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # before torch: no numpy here

import torch

from hints.errors import HintError, UserError, as_flag, render_inputs
from hints.files.torch_import import import_torch_schedule
from hints.orders import peak_in_flight
from hints.outputs import write_text
from hints.tasks import LOOPING, PipelineShape, V
from profiler.bench.script_args import Parser, progress, run
from profiler.bench.torch_side import run_torch
from runtime.config import RunConfig
from runtime.run.launch import launch, preflight
from runtime.run.worker import Job, WorkerOptions
from runtime.sched.budget import MemoryBudget, one_f_one_b_bounds
from runtime.workloads.make import make_workload


@dataclass(frozen=True)
class Pair:
    """The rrfp hint that issues a torch schedule's order, on its chunks and placement ([Note: equal memory pairs])."""

    hint: str
    chunks: int
    placement: str


PAIRS = {
    "Schedule1F1B": Pair("1f1b", 1, LOOPING),
    "ScheduleGPipe": Pair("gpipe", 1, LOOPING),
    "ScheduleInterleaved1F1B": Pair("interleaved-1f1b", 2, LOOPING),
    "ScheduleInterleavedZeroBubble": Pair("zb", 2, LOOPING),
    "ScheduleZBVZeroBubble": Pair("zbv", 2, V),
    "ScheduleDualPipeV": Pair("torch:ScheduleDualPipeV", 2, V),
}
BASELINE = "Schedule1F1B"  # every speedup "vs torch 1F1B" is over this one; always run
QUICK = dict(cases=["uniform", "multimodal"], microbatches=8, iters=3, forward_time=0.005, hints=["zb"],
             budgets=["1f1b"])


@dataclass(frozen=True)
class Case:
    name: str
    variability: bool
    config: RunConfig  # one chunk; multi-chunk schedules derive theirs (structure_config)


@dataclass(frozen=True)
class Structure:
    """One job's structure and memory: what torch schedule it is paired with, and at which budget."""

    hint: str
    chunks: int
    placement: str
    paired_with: str | None  # a torch schedule name, or None (an extra --hints row)
    equal_memory: bool = True


@dataclass
class Measured:
    """One job of one case: step times and losses of the measured iterations (warm-up dropped)."""

    runner: str  # "torch" or "rrfp"
    schedule: str  # torch schedule name, or rrfp hint
    policy: str
    budget: str
    structure: Structure
    walls: list[float]
    losses: list[float | None]
    units: list[int]  # tokens or samples per measured iteration
    peak_in_flight: int
    peak_by_construction: bool = False
    speedups: dict[str, float | None] = field(default_factory=dict)

    @property
    def median_wall(self) -> float:
        return statistics.median(self.walls)

    @property
    def throughput(self) -> float:
        return statistics.median(u / w for u, w in zip(self.units, self.walls))

    @property
    def label(self) -> str:
        if self.runner == "torch":
            return f"torch {self.schedule}"
        chunked = "" if self.structure.chunks == 1 else f" (v={self.structure.chunks}, {self.structure.placement})"
        budget = f" @{self.budget}" if self.policy == "ready" else ""
        return f"rrfp {self.policy} {self.schedule}{chunked}{budget}"


def structure_config(config: RunConfig, structure: Structure, layers_per_rank: int) -> RunConfig:
    """``config`` for ``structure``: its chunks and placement, the hint, and a per-rank model of the same size."""
    return config.with_overrides(hint=structure.hint, chunks=structure.chunks, placement=structure.placement,
                                 layers_per_stage=layers_per_rank // structure.chunks)


def torch_peaks(schedule: str, stages: int, microbatches: int) -> list[int]:
    """Per-rank peak microbatch-chunks in flight of torch's own order for ``schedule``."""
    hint = import_torch_schedule(schedule, stages, microbatches, PAIRS[schedule].chunks)
    return [peak_in_flight(order, hint.shape) for order in hint.orders]


def fixed_within(hint: str, stages: int, microbatches: int, budget: str) -> bool:
    """Does ``hint``'s fixed order (one chunk) stay within ``budget`` on every rank? If not, ready at that budget
    against the same hint fixed is not at equal memory ([Note: equal memory pairs]: ``*`` in the tables)."""
    from runtime.sched.evaluate import resolve

    order = resolve(hint, stages, 1, microbatches)
    slots = MemoryBudget.parse(budget).per_rank(order.shape)
    return all(peak_in_flight(tasks, order.shape) <= limit for tasks, limit in zip(order.orders, slots))


def equal_memory_budget(schedule: str, stages: int, microbatches: int) -> tuple[str, bool]:
    """The rrfp ``--memory-budget`` equal to ``schedule``'s per-rank peaks, and whether it is exactly equal."""
    pair = PAIRS[schedule]
    peaks = torch_peaks(schedule, stages, microbatches)
    if peaks == one_f_one_b_bounds(PipelineShape(stages, pair.chunks, microbatches, placement=pair.placement)):
        return "1f1b", True
    return str(max(peaks)), len(set(peaks)) == 1


# -- rrfp side ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What one case runs: torch schedules with their configs, rrfp jobs with their structures."""

    torch_configs: dict[str, RunConfig]
    jobs: list[Job]
    structures: dict[str, Structure]  # job name -> structure
    torch_peaks: dict[str, int]


def plan_case(case: Case, schedules: list[str], hints: list[str], budgets: list[str], layers_per_rank: int,
              out_root: Path) -> Plan:
    config = case.config
    p, m = config.ranks, config.microbatches
    torch_configs, jobs, structures, peaks = {}, [], {}, {}

    def add(name: str, structure: Structure, job_config: RunConfig) -> None:
        if name not in structures:
            structures[name] = structure
            jobs.append(Job(name, job_config, str(out_root / name.replace(":", "-"))))

    for schedule in schedules:
        pair = PAIRS[schedule]
        budget, exact = equal_memory_budget(schedule, p, m)
        peaks[schedule] = max(torch_peaks(schedule, p, m))
        structure = Structure(pair.hint, pair.chunks, pair.placement, schedule, exact)
        paired = structure_config(config, structure, layers_per_rank)
        torch_configs[schedule] = paired
        add(f"fixed-{pair.hint}-v{pair.chunks}", structure, paired.with_overrides(policy="fixed"))
        add(f"ready-{pair.hint}-v{pair.chunks}@{budget}", structure,
            paired.with_overrides(policy="ready", memory_budget=budget))
    for hint in hints:
        extra = structure_config(config, Structure(hint, 1, LOOPING, None), layers_per_rank)
        add(f"fixed-{hint}-v1", Structure(hint, 1, LOOPING, None), extra.with_overrides(policy="fixed"))
        for budget in budgets:
            structure = Structure(hint, 1, LOOPING, None, fixed_within(hint, p, m, budget))
            add(f"ready-{hint}-v1@{budget}", structure, extra.with_overrides(policy="ready", memory_budget=budget))
    return Plan(torch_configs, jobs, structures, peaks)


def run_rrfp(jobs: list[Job], config: RunConfig, out_root: Path) -> dict:
    options = WorkerOptions(out_root=str(out_root), show_progress=False, timeout=config.timeout, threads=1)
    return launch(jobs, options, config.ranks)[0]


# -- one case ---------------------------------------------------------------------------------------


def units_per_iteration(config: RunConfig) -> list[int]:
    workload = make_workload(config, PipelineShape(config.ranks, 1, config.microbatches))
    return [sum(workload.batch(iteration, mb).units for mb in range(config.microbatches))
            for iteration in range(config.iters)]


def measure(case: Case, plan: Plan, warmup: int, root: Path) -> list[Measured]:
    """Run one case's plan (its rrfp jobs write under ``root / "rrfp"``, as :func:`plan_case` was told)."""
    config = case.config
    units = units_per_iteration(config)[warmup:]
    progress(f"{case.name}: torch {', '.join(plan.torch_configs)}")
    torch_results = run_torch(plan.torch_configs, config.ranks, root)
    progress(f"{case.name}: rrfp {', '.join(job.name for job in plan.jobs)}")
    rrfp_results = run_rrfp(plan.jobs, config, root / "rrfp")
    measured = []
    for name, result in torch_results.items():
        pair = PAIRS[name]
        measured.append(Measured("torch", name, "fixed", "-", Structure(pair.hint, pair.chunks, pair.placement, name),
                                 result["walls"][warmup:], result["losses"][warmup:], units,
                                 plan.torch_peaks[name], peak_by_construction=True))
    for job in plan.jobs:
        rows = rrfp_results[job.name]["metrics"][warmup:]
        budget = job.config.memory_budget if job.config.policy == "ready" else "-"
        measured.append(Measured("rrfp", job.config.hint, job.config.policy, budget, plan.structures[job.name],
                                 [row["wall_seconds"] for row in rows], [row["loss"] for row in rows], units,
                                 max(max(row["peak_in_flight"]) for row in rows)))
    add_speedups(measured)
    return measured


def add_speedups(measured: list[Measured]) -> None:
    """Median step-time ratios (> 1: this row is faster), each over a row measured in the same run."""
    torch_rows = {m.schedule: m for m in measured if m.runner == "torch"}
    fixed_rows = {(m.schedule, m.structure.chunks): m for m in measured if m.runner == "rrfp" and m.policy == "fixed"}

    def over(reference: Measured | None, row: Measured) -> float | None:
        return None if reference is None else reference.median_wall / row.median_wall

    for row in measured:
        paired = row.structure.paired_with
        row.speedups = {
            "vs_torch_1f1b": over(torch_rows.get(BASELINE), row),
            "vs_rrfp_fixed_1f1b": over(fixed_rows.get(("1f1b", 1)), row),
            "vs_torch_paired": over(torch_rows.get(paired), row) if paired else None,
            "vs_rrfp_fixed_same_hint": (over(fixed_rows.get((row.schedule, row.structure.chunks)), row)
                                        if row.runner == "rrfp" and row.policy == "ready" else None),
        }


# -- report ---------------------------------------------------------------------------------------


def json_row(case: Case, m: Measured) -> dict:
    """One row of ``--json``: seconds, units per second, peaks in microbatch-chunks per rank."""
    s = m.structure
    return {
        "case": case.name, "variability": case.variability, "system": m.runner, "schedule": m.schedule,
        "label": m.label, "policy": m.policy, "budget": m.budget, "chunks": s.chunks, "placement": s.placement,
        "paired_with": s.paired_with, "equal_memory": s.equal_memory,
        "median_step_s": m.median_wall, "min_step_s": min(m.walls), "max_step_s": max(m.walls),
        "spread": (max(m.walls) - min(m.walls)) / m.median_wall, "step_s": m.walls,
        "throughput": m.throughput, "unit": "tokens/s" if case.config.workload == "gpt" else "samples/s",
        "peak_in_flight": m.peak_in_flight, "peak_by_construction": m.peak_by_construction,
        "last_loss": m.losses[-1], "speedups": m.speedups,
        "stages": case.config.ranks, "microbatches": case.config.microbatches, "measured_iters": len(m.walls),
    }


def describe(config: RunConfig, layers_per_rank: int) -> str:
    if config.workload == "gpt":
        return (f"gpt, seq-len {config.seq_len}, hidden {config.hidden}, {layers_per_rank} block(s) per rank, "
                f"{config.samples} samples per microbatch")
    noise = (f"jitter {config.jitter:g}, straggler-prob {config.straggler_prob:g} (x{config.straggler_slowdown:g})"
             if config.jitter or config.straggler_prob else "no jitter")
    return (f"emulated {config.emulate}, forward-time {config.forward_time:g} s per rank, backward-ratio "
            f"{config.backward_ratio:g}, {noise}")


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def print_case(case: Case, measured: list[Measured], warmup: int, layers_per_rank: int) -> None:
    config = case.config
    unit = "tokens/s" if config.workload == "gpt" else "samples/s"
    print(f"\n### {case.name}: {describe(config, layers_per_rank)}\n")
    print(f"{config.ranks} stages, {config.microbatches} microbatches, {config.iters - warmup} measured "
          f"iterations after {warmup} warm-up, seed {config.seed}.\n")
    print(f"| runner | schedule (hint) | chunks | policy | memory budget | median step | min - max | {unit} "
          f"| vs torch 1F1B | vs torch same structure | ready / fixed same hint | peak in flight | last loss |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    order = {name: index for index, name in enumerate(PAIRS)}
    for m in sorted(measured, key=lambda m: (m.structure.paired_with is None,
                                             order.get(m.structure.paired_with, 0), m.runner != "torch")):
        s, sp = m.structure, m.speedups
        loss = "-" if m.losses[-1] is None else f"{m.losses[-1]:.5f}"
        unequal = "" if s.equal_memory or m.policy != "ready" else "*"
        budget = m.budget + unequal
        peak = f"{m.peak_in_flight}" + (" (torch's order)" if m.peak_by_construction else "")
        print(f"| {m.runner} | {m.schedule} | {s.chunks}{' V' if s.placement == V else ''} | {m.policy} | {budget} "
              f"| {m.median_wall * 1e3:.1f} ms | {min(m.walls) * 1e3:.1f} - {max(m.walls) * 1e3:.1f} ms "
              f"| {m.throughput:,.0f} | {ratio(sp['vs_torch_1f1b'])} | {ratio(sp['vs_torch_paired'])} "
              f"| {ratio(sp['vs_rrfp_fixed_same_hint'])}{unequal} | {peak} | {loss} |")
    print("\n`vs torch same structure`: the paired torch schedule's median over this row's ([Note: equal memory "
          "pairs]); `ready / fixed same hint`: what readiness adds at the row's budget; `*`: not at equal "
          "memory: a paired row's torch schedule has per-rank peaks that are no rrfp budget (the row runs at "
          "their maximum), or an extra hint's fixed order holds more than the row's budget on some rank.")


def print_summary(cases: list[Case], results: dict[str, list[Measured]]) -> None:
    print("\n### Summary: speedup over torch Schedule1F1B (median step time ratio, > 1 is faster)\n")
    headers = [f"{case.name} ({'variability' if case.variability else 'no variability'})" for case in cases]
    print("| runner, schedule | " + " | ".join(headers) + " |")
    print("|---|" + "---|" * len(cases))
    for label in [m.label for m in results[cases[0].name]]:
        cells = []
        for case in cases:
            by_label = {m.label: m for m in results[case.name]}
            cells.append(ratio(by_label[label].speedups["vs_torch_1f1b"]) if label in by_label else "-")
        print(f"| {label} | " + " | ".join(cells) + " |")


def machine() -> str:
    return (f"{platform.platform()} ({platform.machine()}), {os.cpu_count()} CPUs, "
            f"CPython {platform.python_version()}, torch {torch.__version__}, gloo")


def build_cases(args: argparse.Namespace) -> list[Case]:
    iters = args.warmup + args.iters
    common = dict(ranks=args.stages, microbatches=args.microbatches, iters=iters, seed=args.seed,
                  samples=args.samples, timeout=args.timeout, layers_per_stage=args.layers_per_rank)
    emulated = dict(workload="emulated", forward_time=args.forward_time, **common)
    available = {
        "gpt": lambda: Case("gpt", False, RunConfig(workload="gpt", seq_len=args.seq_len, **common)),
        "uniform": lambda: Case("uniform", False, RunConfig(emulate="uniform", jitter=0.0, **emulated)),
        "multimodal": lambda: Case("multimodal", True, RunConfig(emulate="multimodal", jitter=args.jitter,
                                                                 straggler_prob=args.straggler_prob, **emulated)),
    }
    return [available[name]() for name in args.cases]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="small run (uniform and multimodal, 8 microbatches, 3 measured iterations, 5 ms "
                             "forwards, hints zb at the 1f1b budget); explicit flags win")
    parser.add_argument("--stages", type=int, default=4, help="pipeline ranks = processes (default 4)")
    parser.add_argument("--microbatches", type=int, default=None, help="per iteration (default 16)")
    parser.add_argument("--iters", type=int, default=None, help="measured iterations (default 4)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up iterations, not measured (default 1)")
    parser.add_argument("--cases", nargs="+", choices=("gpt", "uniform", "multimodal"), default=None)
    parser.add_argument("--schedules", nargs="+", choices=tuple(PAIRS), default=list(PAIRS),
                        help=f"torch schedules ({BASELINE} always runs: it is the baseline)")
    parser.add_argument("--hints", nargs="*", default=None,
                        help="extra one-chunk rrfp hints, each fixed and ready at --budgets (default 1f1b zb bfw)")
    parser.add_argument("--budgets", nargs="+", default=None, help="budgets of the --hints rows (default 1f1b 2x)")
    parser.add_argument("--layers-per-rank", type=int, default=2,
                        help="gpt blocks per rank, split over its chunks (default 2)")
    parser.add_argument("--seq-len", type=int, default=32, help="gpt sequence length (default 32)")
    parser.add_argument("--samples", type=int, default=2, help="samples per microbatch (default 2)")
    parser.add_argument("--forward-time", type=float, default=None,
                        help="emulated forward seconds per rank (default 0.01)")
    parser.add_argument("--jitter", type=float, default=0.2, help="multimodal case: log-sd of task noise")
    parser.add_argument("--straggler-prob", type=float, default=0.02, help="multimodal case: straggler chance")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60.0, help="rrfp stall timeout, seconds")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write every row as JSON")
    args = parser.parse_args(argv)
    defaults = dict(cases=["gpt", "uniform", "multimodal"], microbatches=16, iters=4, forward_time=0.01,
                    hints=["1f1b", "zb", "bfw"], budgets=["1f1b", "2x"])
    for name, value in (QUICK if args.quick else defaults).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.stages < 2 or args.microbatches < args.stages:
        parser.error("need --stages >= 2 and --microbatches >= --stages (torch's Schedule1F1B requires it)")
    if args.iters < 1 or args.warmup < 0:
        parser.error("need --iters >= 1 and --warmup >= 0")
    if args.forward_time <= 0:
        parser.error(f"--forward-time must be > 0, got {args.forward_time}")
    args.schedules = [BASELINE] + [name for name in dict.fromkeys(args.schedules) if name != BASELINE]
    chunk_counts = {PAIRS[name].chunks for name in args.schedules}
    if any(args.layers_per_rank < 1 or args.layers_per_rank % chunks for chunks in chunk_counts):
        parser.error(f"--layers-per-rank must be a positive multiple of the chunk counts {sorted(chunk_counts)}, "
                     f"got {args.layers_per_rank}")
    for name in args.schedules:  # torch's own shape checks, before anything is launched
        try:
            torch_peaks(name, args.stages, args.microbatches)
        except HintError as err:
            parser.error(in_script_terms(str(err)))
    return args


def in_script_terms(message: str) -> str:
    """A library message with its inputs named by this script's flags ([Note: inputs in messages] in
    hints.errors): the pipeline's ranks are ``--stages`` here."""
    return render_inputs(message, lambda name: "--stages" if name == "ranks" else as_flag(name))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    os.environ.setdefault("PYTHONWARNINGS", "ignore:Failed to initialize NumPy")
    for name in ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        cases = build_cases(args)
        with tempfile.TemporaryDirectory(prefix="rrfp-xf-plan-") as tmp:
            for case in cases:  # every job checked before anything is launched
                preflight([job.config for job in plan_case(case, args.schedules, args.hints, args.budgets,
                                                           args.layers_per_rank, Path(tmp)).jobs])
    except (UserError, HintError) as err:
        print(f"error: {in_script_terms(str(err))}", file=sys.stderr)
        sys.exit(2)
    began = time.perf_counter()
    print("## torch.distributed.pipelining vs rrfp run\n")
    print(f"Command: `{shlex.join(sys.orig_argv)}`\n")
    print(f"Machine: {machine()}")
    results, rows = {}, []
    for case in cases:
        with tempfile.TemporaryDirectory(prefix="rrfp-xf-") as tmp:
            root = Path(tmp)
            plan = plan_case(case, args.schedules, args.hints, args.budgets, args.layers_per_rank, root / "rrfp")
            results[case.name] = measure(case, plan, args.warmup, root)
        print_case(case, results[case.name], args.warmup, args.layers_per_rank)
        rows += [json_row(case, m) for m in results[case.name]]
        sys.stdout.flush()
        if args.json is not None:  # rewritten after every case, so a long run leaves what it measured
            write_text(args.json, json.dumps(rows, indent=1) + "\n")  # whole: bench reads it as it is
    print_summary(cases, results)
    print(f"\nTotal run time: {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    run(main)
