"""torch.distributed.pipelining's schedules against ``rrfp run``, on the same models, stages, microbatches and data.

    .venv/bin/python benchmarks/cross_framework.py [--stages 4] [--microbatches 16] [--iters 4]
        [--forward-time 0.01] [--cases gpt uniform multimodal] [--hints 1f1b zb bfw] [--budgets 1f1b 2x]

For each case it runs, on ``--stages`` CPU processes over gloo:

* torch's ``Schedule1F1B`` and ``ScheduleGPipe`` (``PipelineStage`` + ``step()``), one launch;
* ``rrfp run`` jobs through :func:`runtime.launch.launch`, one launch: fixed-order ``1f1b`` (rrfp's
  baseline) and readiness-first with each of ``--hints`` at each of ``--budgets``.

Each job trains ``--warmup`` + ``--iters`` iterations (forward, backward, AdamW step); the warm-up
iterations are dropped and the median step time of the rest is reported, with throughput (tokens or
samples per second) and the speedups over torch's ``Schedule1F1B`` and over rrfp's fixed 1F1B, all
measured in the same run. A step is timed on rank 0 and includes the optimizer step: for torch from a
barrier through ``step()`` and the optimizer to a closing barrier; rrfp times itself, from the end of
the previous iteration's ``all_gather`` through the optimizer to this iteration's ``all_gather``.
"peak in flight" is the most microbatches a rank holds activations for: measured for rrfp, by
construction for torch (1F1B: ``stages``; GPipe: ``microbatches``).

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
over torch 1F1B, without and with variability); progress goes to stderr.

[Note: the torch adapter]
    torch splits the ``step()`` input along dim 0 into microbatches and calls the stage module with the
    tensors it received. Stage 0 is given the microbatch indices (``arange(m)``, shape ``[m, 1]``) and
    looks up ``workload.batch(iteration, index)``; the loss function is given the same indices as
    ``target``. Later stages receive only activations, yet the emulated stages need the microbatch
    index to sleep its sampled durations, so :class:`IndexedStage` records the chunk id that torch
    passes to ``forward_one_chunk`` before the module runs. Each stage's module is built by
    ``Workload.build_stage`` from the same seed as in rrfp, and each microbatch's loss is divided by
    the microbatch count with ``scale_grads=False``, exactly as rrfp does, so both runtimes compute the
    same losses and gradients; the tables print the last iteration's loss to show it.

[Note: static shapes]
    ``PipelineStage`` infers shapes on the first ``step()`` unless it is given example tensors; that
    dynamic inference exchanges metadata with ``send_object_list``/``recv_object_list``, which need
    numpy (absent from this venv: "Numpy is not available"). Each rank therefore builds its stage's
    example input and output by running stages ``0..k`` once on microbatch 0 (:func:`example_tensors`),
    and torch runs in static mode: no inference pass, no metadata messages. This relies on fixed
    shapes, which all three cases have (gpt with ``--seq-len``; emulated activations are
    ``[samples, 32]``).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # before torch: no numpy here

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage

from hints.tasks import PipelineShape
from runtime.config import RunConfig
from runtime.launch import free_port, launch
from runtime.worker import Job, WorkerOptions
from runtime.workloads import make_optimizer, make_workload

TORCH_SCHEDULES = ("Schedule1F1B", "ScheduleGPipe")
BASELINE = "torch Schedule1F1B"
RRFP_BASELINE = "rrfp fixed 1f1b"


@dataclass(frozen=True)
class Case:
    name: str
    variability: bool
    config: RunConfig


@dataclass
class Measured:
    """One job of one case: step times and losses of the measured iterations (warm-up dropped)."""

    runner: str  # "torch" or "rrfp"
    schedule: str
    policy: str
    budget: str
    walls: list[float]
    losses: list[float | None]
    units: list[int]  # tokens or samples per measured iteration
    peak_in_flight: str

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
        return f"rrfp {self.policy} {self.schedule}" + (f" @{self.budget}" if self.policy == "ready" else "")


# -- torch side (runs in the spawned ranks) ----------------------------------------------------------


class TorchStageAdapter(nn.Module):
    """An rrfp stage module behind torch's ``module(*received_tensors)`` interface (see [Note: the torch adapter])."""

    def __init__(self, workload, stage_index: int) -> None:
        super().__init__()
        self.workload = workload
        self.stage_module = workload.build_stage(stage_index)
        self.first = stage_index == 0
        self.iteration = 0
        self.microbatch = 0  # set by IndexedStage before every forward

    def forward(self, received: torch.Tensor) -> torch.Tensor:
        if self.first:
            batch = self.workload.batch(self.iteration, int(received.reshape(-1)[0]))
            inputs = tuple(t.detach().requires_grad_(t.is_floating_point())
                           for t in self.workload.first_inputs(batch))
        else:
            batch = self.workload.batch(self.iteration, self.microbatch)
            inputs = (received,)
        (output,) = self.stage_module(inputs, batch)
        return output


def example_tensors(config: RunConfig, stage_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Example input and output of one torch stage, from running stages ``0..stage_index`` on microbatch 0.

    They give torch's ``PipelineStage`` its shapes up front (static mode; see [Note: static shapes]).
    """
    workload = make_workload(config, PipelineShape(config.stages, 1, config.microbatches))
    received = torch.zeros(1, 1, dtype=torch.long)  # stage 0: one microbatch index
    for stage in range(stage_index + 1):
        adapter = TorchStageAdapter(workload, stage)
        output = adapter(received)
        if stage < stage_index:
            received = output.detach().requires_grad_(True)
    return received, output


class IndexedStage(PipelineStage):
    """Tells the adapter which microbatch it is about to run (torch passes it only activations)."""

    def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
        self.submod.microbatch = fwd_chunk_id
        return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)


def torch_worker(config: RunConfig, schedules: tuple[str, ...]) -> dict:
    """One rank of a torch launch: every schedule in turn, fresh modules each; rank 0 returns the timings."""
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch.distributed as dist
    from torch.distributed.pipelining import schedules as torch_schedules

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=max(120.0, 2 * config.timeout)))
    stages, microbatches = config.stages, config.microbatches
    last = rank == stages - 1
    results = {}
    try:
        for name in schedules:
            workload = make_workload(config, PipelineShape(stages, 1, microbatches))
            adapter = TorchStageAdapter(workload, rank)

            def loss_fn(output, target, workload=workload, adapter=adapter):
                batch = workload.batch(adapter.iteration, int(target.reshape(-1)[0]))
                return workload.loss((output,), batch) / microbatches

            example_input, example_output = example_tensors(config, rank)
            stage = IndexedStage(adapter, rank, stages, torch.device("cpu"),
                                 input_args=example_input, output_args=example_output)
            schedule = getattr(torch_schedules, name)(stage, microbatches, loss_fn=loss_fn, scale_grads=False)
            optimizer = make_optimizer(adapter.stage_module.parameters(), config)
            indices = torch.arange(microbatches).unsqueeze(1)
            walls, losses = [], []
            for iteration in range(config.iters):
                adapter.iteration = iteration
                microbatch_losses: list[torch.Tensor] = []
                dist.barrier()
                began = time.perf_counter()
                if rank == 0:
                    schedule.step(indices, return_outputs=False)
                elif last:
                    schedule.step(target=indices, losses=microbatch_losses, return_outputs=False)
                else:
                    schedule.step(return_outputs=False)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                dist.barrier()
                walls.append(time.perf_counter() - began)
                losses.append(sum(float(loss) for loss in microbatch_losses) if last else float("nan"))
            loss_table = torch.tensor(losses, dtype=torch.float64)
            dist.broadcast(loss_table, src=stages - 1)
            results[name] = {"walls": walls, "losses": loss_table.tolist()}
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return results


def run_torch(config: RunConfig, out_root: Path) -> dict:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    launch_config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=config.stages, run_id=f"xf-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=0, monitor_interval=0.1,
        start_method="spawn", shutdown_timeout=5,
        logs_specs=DefaultLogsSpecs(log_dir=str(out_root / "torch-logs"), redirects=Std.ALL),
    )
    return elastic_launch(launch_config, torch_worker)(config, TORCH_SCHEDULES)[0]


# -- rrfp side ------------------------------------------------------------------------------------


def rrfp_jobs(config: RunConfig, hints: list[str], budgets: list[str], out_root: Path) -> list[Job]:
    configs = [("fixed-1f1b", config.with_overrides(policy="fixed", hint=None))]
    configs += [(f"ready-{hint}@{budget}", config.with_overrides(policy="ready", hint=hint, memory_budget=budget))
                for budget in budgets for hint in hints]
    return [Job(name, job_config, str(out_root / name)) for name, job_config in configs]


def run_rrfp(jobs: list[Job], config: RunConfig, out_root: Path) -> dict:
    options = WorkerOptions(out_root=str(out_root), show_progress=False, timeout=config.timeout, threads=1)
    return launch(jobs, options, config.stages)[0]


# -- one case ---------------------------------------------------------------------------------------


def units_per_iteration(config: RunConfig) -> list[int]:
    workload = make_workload(config, PipelineShape(config.stages, 1, config.microbatches))
    return [sum(workload.batch(iteration, mb).units for mb in range(config.microbatches))
            for iteration in range(config.iters)]


def measure(case: Case, hints: list[str], budgets: list[str], warmup: int) -> list[Measured]:
    config = case.config
    units = units_per_iteration(config)[warmup:]
    with tempfile.TemporaryDirectory(prefix="rrfp-xf-") as tmp:
        root = Path(tmp)
        jobs = rrfp_jobs(config, hints, budgets, root / "rrfp")
        progress(f"{case.name}: torch {', '.join(TORCH_SCHEDULES)}")
        torch_results = run_torch(config, root)
        progress(f"{case.name}: rrfp {', '.join(job.name for job in jobs)}")
        rrfp_results = run_rrfp(jobs, config, root / "rrfp")
    measured = []
    by_construction = {"Schedule1F1B": config.stages, "ScheduleGPipe": config.microbatches}
    for name in TORCH_SCHEDULES:
        result = torch_results[name]
        measured.append(Measured("torch", name, "fixed", "-", result["walls"][warmup:], result["losses"][warmup:],
                                 units, f"{by_construction[name]} (by construction)"))
    for job in jobs:
        rows = rrfp_results[job.name]["metrics"][warmup:]
        peak = max(max(row["peak_in_flight"]) for row in rows)
        hint = job.config.hint or "1f1b"
        budget = job.config.memory_budget if job.config.policy == "ready" else "-"
        measured.append(Measured("rrfp", hint, job.config.policy, budget,
                                 [row["wall_seconds"] for row in rows], [row["loss"] for row in rows], units,
                                 str(peak)))
    return measured


# -- report ---------------------------------------------------------------------------------------


def describe(config: RunConfig) -> str:
    if config.workload == "gpt":
        return (f"gpt, seq-len {config.seq_len}, hidden {config.hidden}, {config.layers_per_stage} block(s) per "
                f"stage, {config.samples} samples per microbatch")
    noise = (f"jitter {config.jitter:g}, straggler-prob {config.straggler_prob:g} (x{config.straggler_slowdown:g})"
             if config.jitter or config.straggler_prob else "no jitter")
    return (f"emulated {config.emulate}, forward-time {config.forward_time:g} s, backward-ratio "
            f"{config.backward_ratio:g}, {noise}")


def print_case(case: Case, measured: list[Measured], warmup: int) -> None:
    config = case.config
    unit = "tokens/s" if config.workload == "gpt" else "samples/s"
    by_label = {m.label: m for m in measured}
    baseline, rrfp_baseline = by_label[BASELINE].median_wall, by_label[RRFP_BASELINE].median_wall
    print(f"\n### {case.name}: {describe(config)}\n")
    print(f"{config.stages} stages, {config.microbatches} microbatches, {config.iters - warmup} measured "
          f"iterations after {warmup} warm-up, seed {config.seed}.\n")
    print(f"| runner | schedule (hint) | policy | memory budget | median step | min - max | {unit} "
          f"| vs torch 1F1B | vs rrfp fixed 1f1b | peak in flight | last loss |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for m in measured:
        loss = "-" if m.losses[-1] is None else f"{m.losses[-1]:.5f}"
        print(f"| {m.runner} | {m.schedule} | {m.policy} | {m.budget} | {m.median_wall * 1e3:.1f} ms "
              f"| {min(m.walls) * 1e3:.1f} - {max(m.walls) * 1e3:.1f} ms | {m.throughput:,.0f} "
              f"| {baseline / m.median_wall:.3f}x | {rrfp_baseline / m.median_wall:.3f}x | {m.peak_in_flight} | {loss} |")


def print_summary(cases: list[Case], results: dict[str, list[Measured]]) -> None:
    print("\n### Summary: speedup over torch Schedule1F1B (median step time ratio, > 1 is faster)\n")
    headers = [f"{case.name} ({'variability' if case.variability else 'no variability'})" for case in cases]
    print("| runner, schedule | " + " | ".join(headers) + " |")
    print("|---|" + "---|" * len(cases))
    labels = [m.label for m in results[cases[0].name]]
    for label in labels:
        cells = []
        for case in cases:
            by_label = {m.label: m for m in results[case.name]}
            ratio = by_label[BASELINE].median_wall / by_label[label].median_wall
            cells.append(f"{ratio:.3f}x")
        print(f"| {label} | " + " | ".join(cells) + " |")


def machine() -> str:
    return (f"{platform.platform()} ({platform.machine()}), {os.cpu_count()} CPUs, "
            f"CPython {platform.python_version()}, torch {torch.__version__}, gloo")


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build_cases(args: argparse.Namespace) -> list[Case]:
    iters = args.warmup + args.iters
    common = dict(stages=args.stages, microbatches=args.microbatches, iters=iters, seed=args.seed,
                  samples=args.samples, timeout=args.timeout)
    emulated = dict(workload="emulated", forward_time=args.forward_time, **common)
    available = {
        "gpt": Case("gpt", False, RunConfig(workload="gpt", seq_len=args.seq_len, **common)),
        "uniform": Case("uniform", False, RunConfig(emulate="uniform", jitter=0.0, **emulated)),
        "multimodal": Case("multimodal", True, RunConfig(emulate="multimodal", jitter=args.jitter,
                                                         straggler_prob=args.straggler_prob, **emulated)),
    }
    return [available[name] for name in args.cases]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=4, help="pipeline stages = processes (default 4)")
    parser.add_argument("--microbatches", type=int, default=16, help="per iteration (default 16)")
    parser.add_argument("--iters", type=int, default=4, help="measured iterations (default 4)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up iterations, not measured (default 1)")
    parser.add_argument("--cases", nargs="+", choices=("gpt", "uniform", "multimodal"),
                        default=["gpt", "uniform", "multimodal"])
    parser.add_argument("--hints", nargs="+", default=["1f1b", "zb", "bfw"], help="rrfp ready-policy hints")
    parser.add_argument("--budgets", nargs="+", default=["1f1b", "2x"], help="rrfp memory budgets")
    parser.add_argument("--seq-len", type=int, default=32, help="gpt sequence length (default 32)")
    parser.add_argument("--samples", type=int, default=2, help="samples per microbatch (default 2)")
    parser.add_argument("--forward-time", type=float, default=0.01, help="emulated forward seconds (default 0.01)")
    parser.add_argument("--jitter", type=float, default=0.2, help="multimodal case: log-sd of task noise")
    parser.add_argument("--straggler-prob", type=float, default=0.02, help="multimodal case: straggler chance")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60.0, help="rrfp stall timeout, seconds")
    args = parser.parse_args()
    if args.stages < 2 or args.microbatches < args.stages:
        parser.error("need --stages >= 2 and --microbatches >= --stages (torch's Schedule1F1B requires it)")
    if args.iters < 1 or args.warmup < 0:
        parser.error("need --iters >= 1 and --warmup >= 0")
    return args


def main() -> None:
    args = parse_args()
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    os.environ.setdefault("PYTHONWARNINGS", "ignore:Failed to initialize NumPy")
    for name in ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    cases = build_cases(args)
    began = time.perf_counter()
    print("## torch.distributed.pipelining vs rrfp run\n")
    print(f"Command: `{shlex.join(sys.orig_argv)}`\n")
    print(f"Machine: {machine()}")
    results = {}
    for case in cases:
        results[case.name] = measure(case, args.hints, args.budgets, args.warmup)
        print_case(case, results[case.name], args.warmup)
        sys.stdout.flush()
    print_summary(cases, results)
    print(f"\nTotal run time: {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
