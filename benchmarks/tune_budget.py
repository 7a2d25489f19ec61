"""tune-hint's time budget measured: wall time against ``--time-budget``, CPU time, and simulations per second per
worker, with ``--jobs 1`` and ``--jobs 2`` interleaved (docs/benchmarks/tune-budget.md quotes its output).

    .venv/bin/python benchmarks/tune_budget.py [--time-budget 20 ...] [--repeats 3] [--jobs 1 2]
        [--workload multimodal --ranks 8 --microbatches 32]

Each run is ``rrfp tune-hint --workload multimodal -p 8 -m 32 --jitter 0.1 --time-budget Ts --jobs J --json`` in a
fresh interpreter, its wall time taken from outside (interpreter start-up and the written outputs included); the
CPU time and simulation rates are report.json's (``search``), and what the budget bought: the hint kept and its
predicted speedup over fixed 1F1B on the held-out scenarios (``1 / (1 - gain)``, report.json's ``prediction``).
The load average is read before each run: the figures of a machine shared with other work depend on it.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _cli import Parser, run

from runtime.durations.presets import WORKLOAD_NAMES

ROOT = Path(__file__).resolve().parent.parent


def one_run(shape: tuple[str, ...], seconds: float, jobs: int, out: Path) -> dict:
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "rrfp_cli", "tune-hint", *shape, "--time-budget", f"{seconds:g}s",
                           "--jobs", str(jobs), "--out", str(out), "--json"], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if done.returncode == 2:  # bad input (a workload, a budget): rrfp's own one line, and the same exit code
        print(done.stderr.strip(), file=sys.stderr)
        raise SystemExit(2)
    if done.returncode != 0 or "Traceback" in done.stderr:
        raise SystemExit(f"tune-hint --jobs {jobs} failed ({done.returncode}):\n{done.stderr}")
    data = json.loads(done.stdout)
    search, verdict = data["search"], data["verdict"]
    gain = data["prediction"]["gain_over_fixed_1f1b"]["estimate"]
    return {"budget": seconds, "jobs": jobs, "load": load, "wall": wall, "report_wall": search["wall_s"],
            "cpu": search["cpu_s"], "simulations": search["simulations"],
            "per_worker": search["simulations_per_second_per_worker"], "stopped": search["stopped"],
            "kept": f"{verdict['hint']} ({verdict['rule']})", "speedup": 1.0 / (1.0 - gain) if gain < 1 else math.inf}


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-budget", type=float, nargs="+", default=[20.0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--workload", default="multimodal", choices=WORKLOAD_NAMES)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=32)
    args = parser.parse_args()
    parser.positive(args, "time_budget")  # tune-hint's search needs some time; the table divides by it
    parser.at_least(args, 1, "repeats", "jobs", "ranks", "microbatches")
    # once each: a run's --out is named after its budget and --jobs, and tune-hint refuses one that exists
    args.time_budget, args.jobs = list(dict.fromkeys(args.time_budget)), list(dict.fromkeys(args.jobs))
    shape = ("--workload", args.workload, "-p", str(args.ranks), "-m", str(args.microbatches), "--jitter", "0.1")
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as work:
        for repeat in range(args.repeats):
            for budget in args.time_budget:
                for jobs in args.jobs:  # interleaved: a change of load meets every --jobs alike
                    run = one_run(shape, budget, jobs, Path(work) / f"{repeat}-{budget:g}-{jobs}")
                    runs.append(run)
                    print(f"run {repeat + 1}, {budget:g} s, --jobs {jobs}: load {run['load']}, wall {run['wall']:.2f} "
                          f"s, CPU {run['cpu']:.1f} s, {run['simulations']:,} simulations, {run['per_worker']:.0f}/s "
                          f"per worker, stopped: {run['stopped']}, kept {run['kept']}, {run['speedup']:.3f}x fixed "
                          "1F1B", flush=True)
    print(f"\n`rrfp tune-hint {' '.join(shape)} --time-budget T --jobs J`, median of {args.repeats} "
          "interleaved runs\n")
    print("| budget | --jobs | wall (whole command) | over the budget | report's wall_s | CPU time | simulations | "
          "simulations/s per worker | kept (each run) | predicted over fixed 1F1B | load average (1 min) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for budget in args.time_budget:
        for jobs in args.jobs:
            mine = [r for r in runs if r["jobs"] == jobs and r["budget"] == budget]

            def median(key):
                return statistics.median(r[key] for r in mine)

            loads = ", ".join(r["load"] for r in mine)
            kept = ", ".join(r["kept"] for r in mine)
            print(f"| {budget:g} s | {jobs} | {median('wall'):.2f} s | {median('wall') - budget:+.2f} s "
                  f"({(median('wall') - budget) / budget:+.1%}) | {median('report_wall'):.2f} s | "
                  f"{median('cpu'):.1f} s | {median('simulations'):,.0f} | {median('per_worker'):.0f} | {kept} | "
                  f"{median('speedup'):.3f}x | {loads} |")
    worst = max((r["wall"] - r["budget"]) / r["budget"] for r in runs)
    print(f"\nWorst overrun of the {len(runs)} runs: {worst:+.1%} of its budget.")


if __name__ == "__main__":
    run(main)
