"""Runtime benchmarks: overhead, readiness-first at equal memory under variability, replay accuracy.

    .venv/bin/python benchmarks/runtime_bench.py [--stages 4 8] [--microbatches-per-rank 4] [--iters 5]

All runs are `rrfp run --workload emulated` (real processes, real transport,
task durations sampled by the simulator's models). For each stage count one
launch runs every job, so all jobs of a stage count share the same processes
and the same machine load; every job is traced.

1. Overhead: uniform durations, no variability, `1f1b` hint: fixed, ready
   (greedy) and ready with lookahead.
2. Variability (multimodal model, jitter): fixed 1F1B, and for every built-in
   hint its fixed order and both ready rules at the 1f1b and 2x budgets; each
   as speedup over fixed 1F1B and over the same hint's fixed order, with the
   peak in flight.
3. Replay accuracy: every steady-state iteration's measured makespan against
   (a) the simulator on the durations the iteration *sampled* (no overhead),
   and (b) `rrfp trace sensitivity`'s replay of the *realized* durations and
   latencies from the trace with the dispatch overhead calibrated from it.

Step times are medians over iterations after the first.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path

from _cli import Parser, run

from hints.orders import BUILTIN_HINTS, applicable_builtins
from profiler.analysis.replay import sensitivity, trace_hint
from profiler.trace.reader import read_trace
from profiler.trace.recorder import merge_run_traces
from runtime.config import RunConfig
from runtime.durations.tables import load_durations
from runtime.run.launch import launch, preflight
from runtime.run.worker import Job, WorkerOptions
from runtime.sched.budget import MemoryBudget
from runtime.sched.simulator import simulate

RECORDER = "profiler.trace.recorder:TraceRecorder"
BUDGETS = ("1f1b", "2x")


def jobs_for(args, stages: int, out: Path) -> list[Job]:
    m = args.microbatches_per_rank * stages
    base = dict(workload="emulated", ranks=stages, microbatches=m, iters=args.iters, forward_time=args.forward_time,
                seed=args.seed)
    jobs = []

    def add(name: str, **config) -> None:
        jobs.append(Job(name, RunConfig(**config), str(out / name), recorder=RECORDER))

    uniform = dict(base, emulate="uniform")
    add("overhead-fixed", **uniform, hint="1f1b", policy="fixed")
    add("overhead-ready", **uniform, hint="1f1b", policy="ready", lookahead=False)
    add("overhead-ready+la", **uniform, hint="1f1b", policy="ready", lookahead=True)
    varied = dict(base, emulate="multimodal", jitter=args.jitter)
    for hint in [*applicable_builtins(stages, 1, m), "cp"]:
        add(f"fixed-{hint}", **varied, hint=hint, policy="fixed")
        for budget in BUDGETS:
            add(f"ready-{hint}@{budget}", **varied, hint=hint, policy="ready", lookahead=False, memory_budget=budget)
            add(f"ready+la-{hint}@{budget}", **varied, hint=hint, policy="ready", lookahead=True,
                memory_budget=budget)
    return jobs


def median_step(rows) -> float:
    return statistics.median(r["wall_seconds"] for r in rows[1:])


def sampled_agreement(job: Job, rows, frames) -> list[float]:
    """(simulated - measured) / measured per steady-state iteration, on the durations it sampled.

    The hint is the one the iteration ran (from its trace: bfw and cp are rebuilt every iteration).
    """
    c = job.config
    errors = []
    for row in rows[1:]:
        table = load_durations(Path(job.out_dir) / "durations.parquet", c.ranks * (c.chunks or 1), c.microbatches,
                               iteration=row["iteration"])
        hint = trace_hint(frames, row["iteration"])
        result = simulate(hint, table, c.rule(), MemoryBudget.parse(c.memory_budget))
        errors.append((result.makespan - row["makespan_seconds"]) / row["makespan_seconds"])
    return errors


def bench(args, stages: int, root: Path) -> None:
    out = root / f"p{stages}"
    jobs = jobs_for(args, stages, out)
    began = time.perf_counter()
    results = launch(jobs, WorkerOptions(str(out), timeout=180), stages)[0]
    elapsed = time.perf_counter() - began
    for job in jobs:
        merge_run_traces(Path(job.out_dir))
    m = args.microbatches_per_rank * stages
    print(f"\n## {stages} ranks, {m} microbatches, {args.iters} iterations, forward {args.forward_time * 1e3:g} ms "
          f"per rank, jitter {args.jitter}; {len(jobs)} jobs in one launch, {elapsed:.0f} s\n")
    steps = {job.name: median_step(results[job.name]["metrics"]) for job in jobs}
    peaks = {job.name: max(max(r["peak_in_flight"]) for r in results[job.name]["metrics"]) for job in jobs}

    print("### Overhead (uniform durations, 1f1b hint)\n")
    print("| rule | median step | vs fixed |")
    print("|---|---|---|")
    for name in ("overhead-fixed", "overhead-ready", "overhead-ready+la"):
        print(f"| {name.split('-', 1)[1]} | {steps[name] * 1e3:.1f} ms | {steps['overhead-fixed'] / steps[name]:.3f}x |")

    base = steps["fixed-1f1b"]
    print(f"\n### Variability (multimodal model): fixed 1F1B {base * 1e3:.1f} ms\n")
    print("Each cell: speedup over fixed 1F1B / over the same hint in fixed order (what readiness adds) / peak "
          "in flight. Fixed orders: speedup / peak.\n")
    print("| hint | fixed | ready @1f1b | ready+la @1f1b | ready @2x | ready+la @2x |")
    print("|---|---|---|---|---|---|")
    for hint in BUILTIN_HINTS:
        fixed = steps.get(f"fixed-{hint}")
        if fixed is None:
            continue
        cells = [f"{base / fixed:.3f}x / {peaks[f'fixed-{hint}']}"]
        for budget in BUDGETS:
            for rule in ("ready", "ready+la"):
                name = f"{rule}-{hint}@{budget}"
                cells.append(f"{base / steps[name]:.3f}x / {fixed / steps[name]:.3f}x / {peaks[name]}")
        print(f"| {hint} | " + " | ".join(cells) + " |")

    print("\n### Replay accuracy: each steady-state iteration, measured vs simulated\n")
    print("(a) the simulator on the durations the iteration sampled, no overhead; (b) `rrfp trace sensitivity`: "
          "the realized durations and latencies from the trace, with the dispatch overhead calibrated from "
          "it. Errors are (simulated - measured) / measured.\n")
    print("| job | overhead (calibrated) | (a) median | (a) worst | (b) median | (b) worst |")
    print("|---|---|---|---|---|---|")
    worst_a, worst_b = [], []
    for job in jobs:
        rows = results[job.name]["metrics"]
        frames = read_trace(job.out_dir)
        a = sampled_agreement(job, rows, frames)
        replay = sensitivity(frames, [r["iteration"] for r in rows[1:]])
        b = list(replay.errors.values())
        worst_a += a
        worst_b += b
        print(f"| {job.name} | {replay.overhead_s * 1e6:.0f} us | {statistics.median(a):+.1%} | "
              f"{max(a, key=abs):+.1%} | {statistics.median(b):+.2%} | {max(b, key=abs):+.2%} |")
    print(f"\nall {len(worst_b)} steady-state iterations: (a) median {statistics.median(worst_a):+.1%}, worst "
          f"{max(worst_a, key=abs):+.1%}; (b) median {statistics.median(worst_b):+.2%}, worst "
          f"{max(worst_b, key=abs):+.2%}")


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--microbatches-per-rank", type=int, default=4)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--forward-time", type=float, default=0.02)
    parser.add_argument("--jitter", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bench-runtime")
    args = parser.parse_args()
    parser.at_least(args, 1, "stages", "microbatches_per_rank")
    parser.at_least(args, 2, "iters")  # step times are medians over the iterations after the first
    out = Path(args.out)
    parser.folder(out, "--out")
    for stages in args.stages:  # every job's flags (--forward-time, --jitter, --seed), before any rank starts
        preflight([job.config for job in jobs_for(args, stages, out)])
    root = out / time.strftime("%Y%m%d-%H%M%S")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, CPython {platform.python_version()}; "
          f"{time.strftime('%Y-%m-%d')}")
    for stages in args.stages:
        bench(args, stages, root)


if __name__ == "__main__":
    run(main)
