"""What a split backward costs on real compute: ``(I + W) / B`` per stage, from traces of ``rrfp run``.

    .venv/bin/python benchmarks/split_cost.py [--workloads gpt multimodal] [--stages 2] [--microbatches 8]
        [--iters 6] [--warmup 1] [--rounds 2] [--seq-len 32] [--hidden 64] [--layers-per-stage 1] [--json FILE]

For each workload (the real ``gpt`` and ``multimodal`` models of :mod:`runtime.workloads.builtin`, CPU, gloo) it
runs, in one launch and taking turns (``--rounds`` times: full, split, full, split, ...), two fixed-order
jobs on the same model and data: ``1f1b`` (every backward a fused ``B``) and ``zb`` (every backward split
into ``I``, the input gradient sent upstream at once, and ``W``, the weight gradient, later; [Note: split
backward in the runtime] in :mod:`runtime.exec.executor`). It reads each task's duration from the jobs'
traces (:func:`profiler.trace.reader.read_trace`, the ``tasks`` frame: the handler's own time, no waiting) and
pairs the two jobs task by task: for each (round, stage, iteration, microbatch) after the warm-up,
``(I + W) / B``, ``I / B`` and ``W / B``, where ``B`` is that microbatch's fused backward on that stage in
the full job of the same round. Reported per stage, over all stages, and over the stages after the first
(the ones that compute an input gradient: stage 0's inputs are data): the median and the spread
(quartiles, min - max) of those ratios, the median ``B``, ``I``, ``W`` in ms, and the median step time of
the split job over the full one (what the split costs end to end, bubbles saved included).

The ratios are what :attr:`runtime.durations.variability.VariabilityModel.split_overhead` models
([Note: split backward durations] there). Both jobs share the machine the same way (same ranks, same
threads, taking turns), so the ratio is robust to a uniformly slow or fast machine; it is not robust to a
neighbour's load that comes and goes, hence the turns and the spread.

Output: Markdown on stdout (command, machine, one table per workload); ``--json FILE`` writes the same
numbers. Bad arguments print one ``error:`` line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # before torch: no numpy here

import torch
from _cli import Parser, progress  # benchmarks/_cli.py: this script's folder is on sys.path

from profiler.trace.reader import read_trace
from runtime.config import RunConfig
from runtime.run.launch import launch
from runtime.run.worker import Job, WorkerOptions

FULL, SPLIT = "1f1b", "zb"
TRACE_RECORDER = "profiler.trace.recorder:TraceRecorder"  # what `rrfp run` records with (rrfp_cli.cmd_run)


def jobs_for(workload: str, args: argparse.Namespace, out_root: Path) -> list[Job]:
    base = RunConfig(workload=workload, ranks=args.stages, microbatches=args.microbatches,
                     iters=args.warmup + args.iters, seed=args.seed, policy="fixed", hidden=args.hidden,
                     layers_per_stage=args.layers_per_stage, samples=args.samples, trace=True,
                     seq_len=args.seq_len if workload == "gpt" else None)
    jobs = []
    for round_index in range(args.rounds):
        for hint in (FULL, SPLIT):
            name = f"{hint}-r{round_index}"
            jobs.append(Job(name, base.with_overrides(hint=hint), str(out_root / workload / name),
                            recorder=TRACE_RECORDER))
    return jobs


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    q1, median, q3 = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else ordered * 3
    return {"median": median, "q1": q1, "q3": q3, "min": ordered[0], "max": ordered[-1], "n": len(ordered)}


def task_seconds(run_dir: str, warmup: int) -> dict[tuple[int, str, int, int], float]:
    """(stage, kind letter, iteration, microbatch) -> seconds, for the iterations after the warm-up."""
    tasks = read_trace(run_dir).tasks
    return {(row["stage"], row["kind"], row["iteration"], row["microbatch"]): row["duration_ns"] * 1e-9
            for row in tasks.iter_rows(named=True) if row["iteration"] >= warmup}


def measure(workload: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="rrfp-split-") as tmp:
        root = Path(tmp)
        jobs = jobs_for(workload, args, root)
        progress(f"{workload}: {', '.join(job.name for job in jobs)}")
        options = WorkerOptions(out_root=str(root), show_progress=False, timeout=args.timeout, threads=1)
        results = launch(jobs, options, args.stages)[0]
        samples: dict[int, dict[str, list[float]]] = {}
        step_ratios, durations = [], {}
        for round_index in range(args.rounds):
            full_job, split_job = jobs[2 * round_index], jobs[2 * round_index + 1]
            full, split = task_seconds(full_job.out_dir, args.warmup), task_seconds(split_job.out_dir, args.warmup)
            for (stage, kind, iteration, mb), backward in full.items():
                if kind != "B":
                    continue
                inp, weight = split[(stage, "I", iteration, mb)], split[(stage, "W", iteration, mb)]
                per_stage = samples.setdefault(stage, {"split": [], "input": [], "weight": [], "B": [], "I": [],
                                                        "W": []})
                per_stage["split"].append((inp + weight) / backward)
                per_stage["input"].append(inp / backward)
                per_stage["weight"].append(weight / backward)
                per_stage["B"].append(backward)
                per_stage["I"].append(inp)
                per_stage["W"].append(weight)
            full_walls = [row["wall_seconds"] for row in results[full_job.name]["metrics"][args.warmup:]]
            split_walls = [row["wall_seconds"] for row in results[split_job.name]["metrics"][args.warmup:]]
            step_ratios.append(statistics.median(split_walls) / statistics.median(full_walls))
            durations[round_index] = (full_walls, split_walls)
    stages = {}
    pooled: dict[str, list[float]] = {"split": [], "input": [], "weight": []}
    later: dict[str, list[float]] = {"split": [], "input": [], "weight": []}  # stages that send an input gradient
    for stage in sorted(samples):
        values = samples[stage]
        stages[stage] = {name: quantiles(values[name]) for name in ("split", "input", "weight")}
        stages[stage].update({f"{kind}_ms": statistics.median(values[kind]) * 1e3 for kind in ("B", "I", "W")})
        for name in pooled:
            pooled[name] += values[name]
            if stage > 0:
                later[name] += values[name]
    return {"workload": workload, "stages": stages, "all": {name: quantiles(v) for name, v in pooled.items()},
            "after_stage_0": {name: quantiles(v) for name, v in later.items()},
            "split_step_over_full_step": step_ratios,
            "step_s": {str(r): {"full": f, "split": s} for r, (f, s) in durations.items()}}


def cell(q: dict[str, float]) -> str:
    return f"{q['median']:.3f} | {q['q1']:.3f} - {q['q3']:.3f} | {q['min']:.3f} - {q['max']:.3f}"


def print_workload(result: dict, args: argparse.Namespace) -> None:
    print(f"\n### {result['workload']}: {args.stages} stages, {args.microbatches} microbatches, {args.iters} "
          f"measured iterations after {args.warmup} warm-up, {args.rounds} round(s) of (1f1b, zb)\n")
    print("| stage | (I+W)/B median | quartiles | min - max | I/B median | W/B median | B ms | I ms | W ms | n |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = [(str(stage), values, values) for stage, values in result["stages"].items()]
    rows += [("all", result["all"], None), ("1 and later", result["after_stage_0"], None)]
    for label, values, timing in rows:
        times = (f"{timing['B_ms']:.2f} | {timing['I_ms']:.2f} | {timing['W_ms']:.2f}" if timing
                 else "- | - | -")
        print(f"| {label} | {cell(values['split'])} | {values['input']['median']:.3f} "
              f"| {values['weight']['median']:.3f} | {times} | {values['split']['n']} |")
    ratios = ", ".join(f"{r:.3f}" for r in result["split_step_over_full_step"])
    print(f"\nMedian step time, zb over 1f1b, per round: {ratios} (> 1: the split job is slower end to end).")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", choices=("gpt", "multimodal"), default=["gpt", "multimodal"])
    parser.add_argument("--stages", type=int, default=2, help="pipeline ranks = processes (default 2)")
    parser.add_argument("--microbatches", type=int, default=8, help="per iteration (default 8)")
    parser.add_argument("--iters", type=int, default=6, help="measured iterations per job (default 6)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up iterations, not measured (default 1)")
    parser.add_argument("--rounds", type=int, default=2, help="(1f1b, zb) pairs, taking turns (default 2)")
    parser.add_argument("--seq-len", type=int, default=32, help="gpt sequence length (default 32)")
    parser.add_argument("--hidden", type=int, default=64, help="model width (default 64)")
    parser.add_argument("--layers-per-stage", type=int, default=1, help="blocks per stage (default 1)")
    parser.add_argument("--samples", type=int, default=2, help="samples per microbatch (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0, help="stall timeout, seconds")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the numbers as JSON")
    args = parser.parse_args(argv)
    for name in ("stages", "microbatches", "iters", "rounds", "seq_len", "hidden", "layers_per_stage", "samples"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.stages < 2 or args.warmup < 0:
        parser.error("need --stages >= 2 and --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("PYTHONWARNINGS", "ignore:Failed to initialize NumPy")
    began = time.perf_counter()
    print("## Split backward cost on real compute: (I + W) / B\n")
    print(f"Command: `{shlex.join(sys.orig_argv)}`\n")
    print(f"Machine: {platform.platform()} ({platform.machine()}), {os.cpu_count()} CPUs, CPython "
          f"{platform.python_version()}, torch {torch.__version__}, gloo; gpt/multimodal hidden {args.hidden}, "
          f"{args.layers_per_stage} block(s) per stage, {args.samples} samples per microbatch"
          + (f", gpt seq-len {args.seq_len}" if "gpt" in args.workloads else ""))
    results = []
    for workload in args.workloads:
        results.append(measure(workload, args))
        print_workload(results[-1], args)
        sys.stdout.flush()
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nTotal run time: {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
