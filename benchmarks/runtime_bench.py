"""Runtime benchmarks: overhead, readiness-first speedup under variability, agreement with the simulator.

    .venv/bin/python benchmarks/runtime_bench.py [--stages 8] [--microbatches 32] [--iters 4]

All runs are `rrfp run --workload emulated` (real processes, real transport,
task durations sampled by the simulator's models), launched once with every
job inside, so all jobs share the same processes and the same machine load.

1. Overhead: uniform durations, no variability, `1f1b` hint: ready vs fixed.
2. Variability: the multimodal duration model, fixed-order 1F1B against
   readiness-first with every built-in hint at the 1f1b and 2x budgets.
3. Agreement: each emulated iteration's makespan against `rrfp simulate` on
   the very durations that iteration sampled (same hint, policy, budget).

Step times are medians over iterations after the first.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

from hints.orders import BUILTIN_HINTS, applicable_builtins, builtin_hint
from runtime.config import RunConfig
from runtime.duration_tables import load_durations
from runtime.launch import launch
from runtime.simulator import simulate
from runtime.worker import Job, WorkerOptions


def jobs_for(args, out: Path) -> list[Job]:
    base = dict(workload="emulated", stages=args.stages, microbatches=args.microbatches, iters=args.iters,
                forward_time=args.forward_time, seed=args.seed)
    jobs = []
    uniform = dict(base, emulate="uniform")
    for policy in ("fixed", "ready"):
        jobs.append(Job(f"overhead-{policy}", RunConfig(**uniform, hint="1f1b", policy=policy),
                        str(out / f"overhead-{policy}")))
    varied = dict(base, emulate="multimodal", jitter=args.jitter)
    jobs.append(Job("fixed-1f1b", RunConfig(**varied, hint="1f1b", policy="fixed"), str(out / "fixed-1f1b")))
    for hint in applicable_builtins(args.stages, 1, args.microbatches):
        for budget in ("1f1b", "2x"):
            name = f"ready-{hint}@{budget}"
            jobs.append(Job(name, RunConfig(**varied, hint=hint, policy="ready", memory_budget=budget),
                            str(out / name)))
    return jobs


def median_step(rows) -> float:
    return statistics.median(r["wall_seconds"] for r in rows[1:])


def agreement(job: Job, rows) -> list[float]:
    """Relative difference (emulated - simulated) / simulated of each iteration's makespan."""
    c = job.config
    diffs = []
    for row in rows[1:]:
        table = load_durations(Path(job.out_dir) / "durations.parquet", c.stages, c.microbatches,
                               iteration=row["iteration"])
        hint = builtin_hint(c.hint, c.stages, c.chunks, c.microbatches, table.microbatch_costs)
        simulated = simulate(hint, table, c.policy, None if c.policy == "fixed" else
                             __import__("runtime.arbiter", fromlist=["MemoryBudget"]).MemoryBudget.parse(
                                 c.memory_budget)).makespan
        diffs.append((row["makespan_seconds"] - simulated) / simulated)
    return diffs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=32)
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--forward-time", type=float, default=0.02)
    parser.add_argument("--jitter", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bench-runtime")
    args = parser.parse_args()
    out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    jobs = jobs_for(args, out)
    began = time.perf_counter()
    results = launch(jobs, WorkerOptions(str(out), timeout=120), args.stages)[0]
    elapsed = time.perf_counter() - began
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, CPython {platform.python_version()}; "
          f"{args.stages} ranks, {args.microbatches} microbatches, {args.iters} iterations, forward "
          f"{args.forward_time * 1e3:g} ms/rank, jitter {args.jitter}; {elapsed:.0f} s in all\n")
    steps = {job.name: median_step(results[job.name]["metrics"]) for job in jobs}
    print("### Overhead (uniform durations, 1f1b hint)\n")
    print("| policy | median step | vs fixed |")
    print("|---|---|---|")
    for policy in ("fixed", "ready"):
        step = steps[f"overhead-{policy}"]
        print(f"| {policy} | {step * 1e3:.1f} ms | {steps['overhead-fixed'] / step:.3f}x |")
    print("\n### Variability (multimodal duration model): speedup over fixed-order 1F1B\n")
    print("| hint | ready @ 1f1b budget | ready @ 2x budget |")
    print("|---|---|---|")
    base = steps["fixed-1f1b"]
    print(f"| (fixed 1f1b: {base * 1e3:.1f} ms) | | |")
    for hint in BUILTIN_HINTS:
        cells = [steps.get(f"ready-{hint}@{b}") for b in ("1f1b", "2x")]
        if all(c is None for c in cells):
            continue
        print(f"| {hint} | " + " | ".join("-" if c is None else f"{base / c:.3f}x" for c in cells) + " |")
    print("\n### Emulated vs simulated makespan on the same sampled durations\n")
    print("| job | median (emulated - simulated) / simulated | worst |")
    print("|---|---|---|")
    worst_all = []
    for job in jobs:
        diffs = agreement(job, results[job.name]["metrics"])
        worst_all += diffs
        print(f"| {job.name} | {statistics.median(diffs):+.1%} | {max(diffs, key=abs):+.1%} |")
    print(f"\nall {len(worst_all)} iterations: median {statistics.median(worst_all):+.1%}, "
          f"worst {max(worst_all, key=abs):+.1%}")


if __name__ == "__main__":
    main()
