"""Readiness-first vs fixed order in the simulator, as Markdown tables for BENCHMARKS.md.

    .venv/bin/python benchmarks/simulate_compare.py [--stages 8 32 128] [--workloads language multimodal]

For each stage count and workload it runs
``rrfp simulate --stages P --microbatches 4P --workload W --compare --json``
at ``--memory-budget 1f1b`` and ``2x`` (the same sampled durations, seed 0)
and prints makespan speedups over fixed-order 1F1B, one column per
(policy, budget).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def compare(stages: int, workload: str, budget: str, extra: list[str]) -> dict:
    args = [sys.executable, "-m", "rrfp_cli", "simulate", "--stages", str(stages), "--microbatches",
            str(4 * stages), "--workload", workload, "--memory-budget", budget, "--compare", "--json", *extra]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--workloads", nargs="+", default=["language", "multimodal"])
    parser.add_argument("extra", nargs="*", help="more rrfp simulate options, after --")
    args = parser.parse_args()
    for workload in args.workloads:
        for stages in args.stages:
            tight = compare(stages, workload, "1f1b", args.extra)
            loose = compare(stages, workload, "2x", args.extra)
            print(f"\n#### {workload}, {stages} stages, {4 * stages} microbatches "
                  f"(`rrfp simulate --stages {stages} --microbatches {4 * stages} --workload {workload} "
                  f"--compare --memory-budget 1f1b|2x {' '.join(args.extra)}`)\n")
            print("| hint | fixed | ready @ 1f1b budget | ready @ 2x budget | fixed peak in flight |")
            print("|---|---|---|---|---|")
            speedup = {(r["hint"], r["policy"], b): r["speedup"]
                       for b, data in (("1f1b", tight), ("2x", loose)) for r in data["rows"]}
            peak = {r["hint"]: r["peak_in_flight"] for r in tight["rows"] if r["policy"] == "fixed"}
            for hint in dict.fromkeys(r["hint"] for r in tight["rows"]):
                cells = [speedup[(hint, "fixed", "1f1b")], speedup[(hint, "ready", "1f1b")],
                         speedup[(hint, "ready", "2x")]]
                best = max(cells)
                print(f"| {hint} | " + " | ".join(
                    f"**{c:.3f}x**" if c == best and c > 1.0 else f"{c:.3f}x" for c in cells)
                      + f" | {peak[hint]} |")
            slots = tight["memory_budget_slots"], loose["memory_budget_slots"]
            print(f"\nReady budgets (max slots per rank): 1f1b = {max(slots[0])}, 2x = {max(slots[1])}.")


if __name__ == "__main__":
    main()
