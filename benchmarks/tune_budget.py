"""tune-hint's time budget measured: wall time against ``--time-budget``, CPU time, and simulations per second per
worker, with ``--jobs 1`` and ``--jobs 2`` interleaved (docs/benchmarks/tune-budget.md quotes its output).

    .venv/bin/python benchmarks/tune_budget.py [--time-budget 20] [--repeats 3] [--jobs 1 2]

Each run is ``rrfp tune-hint --workload multimodal -p 8 -m 32 --jitter 0.1 --time-budget Ts --jobs J --json`` in a
fresh interpreter, its wall time taken from outside (interpreter start-up and the written outputs included); the
CPU time and simulation rates are report.json's (``search``). The load average is read before each run: the
figures of a machine shared with other work depend on it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPE = ("--workload", "multimodal", "-p", "8", "-m", "32", "--jitter", "0.1")


def one_run(seconds: float, jobs: int, out: Path) -> dict:
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "rrfp_cli", "tune-hint", *SHAPE, "--time-budget", f"{seconds:g}s",
                           "--jobs", str(jobs), "--out", str(out), "--json"], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if done.returncode != 0 or "Traceback" in done.stderr:
        raise SystemExit(f"tune-hint --jobs {jobs} failed ({done.returncode}):\n{done.stderr}")
    search = json.loads(done.stdout)["search"]
    return {"jobs": jobs, "load": load, "wall": wall, "report_wall": search["wall_s"], "cpu": search["cpu_s"],
            "simulations": search["simulations"], "per_worker": search["simulations_per_second_per_worker"],
            "stopped": search["stopped"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-budget", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as work:
        for repeat in range(args.repeats):
            for jobs in args.jobs:  # interleaved: a change of load meets every --jobs alike
                run = one_run(args.time_budget, jobs, Path(work) / f"{repeat}-{jobs}")
                runs.append(run)
                print(f"run {repeat + 1}, --jobs {jobs}: load {run['load']}, wall {run['wall']:.2f} s, CPU "
                      f"{run['cpu']:.1f} s, {run['simulations']:,} simulations, {run['per_worker']:.0f}/s per worker, "
                      f"stopped: {run['stopped']}", flush=True)
    budget = args.time_budget
    print(f"\n`rrfp tune-hint {' '.join(SHAPE)} --time-budget {budget:g}s --jobs J`, median of {args.repeats} "
          "interleaved runs\n")
    print("| --jobs | wall (whole command) | over the budget | report's wall_s | CPU time | simulations | "
          "simulations/s per worker | load average (1 min) |")
    print("|---|---|---|---|---|---|---|---|")
    for jobs in args.jobs:
        mine = [r for r in runs if r["jobs"] == jobs]

        def median(key):
            return statistics.median(r[key] for r in mine)

        loads = ", ".join(r["load"] for r in mine)
        print(f"| {jobs} | {median('wall'):.2f} s | {median('wall') - budget:+.2f} s "
              f"({(median('wall') - budget) / budget:+.1%}) | {median('report_wall'):.2f} s | {median('cpu'):.1f} s | "
              f"{median('simulations'):,.0f} | {median('per_worker'):.0f} | {loads} |")
    worst = max(r["wall"] - budget for r in runs)
    print(f"\nWorst overrun of the {len(runs)} runs: {worst:+.2f} s ({worst / budget:+.1%}).")


if __name__ == "__main__":
    main()
