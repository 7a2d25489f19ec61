"""V-shape placement against looping, readiness against fixed order, at equal memory, as Markdown for BENCHMARKS.md.

    .venv/bin/python benchmarks/placement_bench.py [--stages 8] [--microbatches 32] [--seeds 0 1 2 3 4]
        [--workloads multimodal language] [--jitter 0.1] [--sweep 16 20 24 28 32]

For each workload and seed one duration table is sampled for ``p`` ranks x 2
chunks (durations are per model stage, so the same table serves both
placements: a stage costs the same wherever it runs). On it, every hint runs
under fixed, ready (greedy) and ready with lookahead (``runtime.sched.evaluate.compare``,
one comparison per placement, so each has its own lower bound):

* ``zbv`` (V placement, ZB-V), whose fixed order is the V baseline;
* ``zb`` and ``interleaved-1f1b`` (looping placement, 2 chunks).

Budgets are slot counts, equal for every hint and rank: ``2p`` (ZB-V's own
peak, so ``zbv`` fixed is at equal memory by construction) and ``4p``. The
tables give medians over the seeds of: the speedup over fixed ``zbv``, what
readiness adds to the same hint (ready-X over fixed-X, per seed, then the
median), makespan over the lower bound of that placement, and the most
microbatch-chunks any rank held (max over ranks and seeds) against the
budget. ``--sweep`` adds, for ``zbv`` alone, ready-zbv over fixed-zbv at
each of the given slot counts: how much memory readiness needs before it
pays under the reservation rule ([Note: memory budget and chunk deadlock]).
"""

from __future__ import annotations

import os
import platform
import statistics
import time

from _cli import Parser, run

from hints.tasks import LOOPING, PipelineShape, V
from runtime.durations.presets import WORKLOAD_NAMES
from runtime.durations.variability import VariabilityModel, sample_durations
from runtime.sched.budget import MemoryBudget
from runtime.sched.evaluate import DEFAULT_RULES, compare, resolve

HINTS = (("zbv", V), ("zb", LOOPING), ("interleaved-1f1b", LOOPING))
RULE_LABEL = {"fixed": "fixed", "greedy": "ready", "lookahead": "ready+la"}


def one_table(workload: str, stages: int, microbatches: int, seed: int, jitter: float, slots: int) -> dict:
    """(hint, rule) -> (makespan, over bound, max peak, within budget) on one sampled table."""
    table = sample_durations(VariabilityModel(workload=workload, jitter=jitter),
                             PipelineShape(stages, 2, microbatches), seed)
    budget = MemoryBudget.parse(str(slots))
    rows = {}
    for placement in (V, LOOPING):
        hints = {name: resolve(name, stages, 2, microbatches, table, placement)
                 for name, where in HINTS if where == placement}
        comparison = compare(hints, table, budget)
        for row in comparison.rows:
            if row.hint in hints:
                rows[(row.hint, row.rule)] = (row.makespan, row.over_bound, max(row.peak_in_flight),
                                              row.within_budget)
    return rows


def report(workload: str, stages: int, microbatches: int, seeds: list[int], jitter: float, slots: int) -> None:
    began = time.perf_counter()
    per_seed = [one_table(workload, stages, microbatches, seed, jitter, slots) for seed in seeds]
    elapsed = time.perf_counter() - began
    print(f"\n#### {workload}, {stages} ranks x 2 chunks, {microbatches} microbatches, budget {slots} slots per "
          f"rank ({len(seeds)} seeds, {elapsed:.1f} s)\n")
    print("| hint | placement | rule | makespan (s) | vs fixed zbv | ready-X / fixed-X | / bound | peak in flight |")
    print("|---|---|---|---|---|---|---|---|")
    for hint, placement in HINTS:
        for rule in DEFAULT_RULES:
            runs = [rows[(hint, rule)] for rows in per_seed]
            base = [rows[("zbv", "fixed")][0] for rows in per_seed]
            fixed = [rows[(hint, "fixed")][0] for rows in per_seed]
            makespan = statistics.median(r[0] for r in runs)
            versus_zbv = statistics.median(b / r[0] for b, r in zip(base, runs))
            versus_fixed = "-" if rule == "fixed" else \
                f"{statistics.median(f / r[0] for f, r in zip(fixed, runs)):.3f}x"
            if rule != "fixed" and not all(rows[(hint, "fixed")][3] for rows in per_seed):
                versus_fixed += "*"
            over_bound = statistics.median(r[1] for r in runs)
            peak = max(r[2] for r in runs)
            over = "" if all(r[3] for r in runs) else " (over)"
            print(f"| {hint} | {placement} | {RULE_LABEL[rule]} | {makespan:.4f} | {versus_zbv:.3f}x | "
                  f"{versus_fixed} | {over_bound:.3f} | {peak} / {slots}{over} |")


def sweep(workload: str, stages: int, microbatches: int, seeds: list[int], jitter: float,
          budgets: list[int]) -> None:
    print(f"\n#### {workload}: ready zbv over fixed zbv by budget ({stages} ranks, {microbatches} microbatches, "
          f"{len(seeds)} seeds, medians)\n")
    print("| budget (slots per rank) | ready / fixed | ready+la / fixed | peak in flight (ready+la) |")
    print("|---|---|---|---|")
    for slots in budgets:
        per_seed = [one_table(workload, stages, microbatches, seed, jitter, slots) for seed in seeds]
        ratios = {rule: statistics.median(rows[("zbv", "fixed")][0] / rows[("zbv", rule)][0] for rows in per_seed)
                  for rule in ("greedy", "lookahead")}
        peak = max(rows[("zbv", "lookahead")][2] for rows in per_seed)
        print(f"| {slots} | {ratios['greedy']:.3f}x | {ratios['lookahead']:.3f}x | {peak} |")


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=32)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--workloads", nargs="+", default=["multimodal", "language"], choices=WORKLOAD_NAMES)
    parser.add_argument("--jitter", type=float, default=0.1)
    parser.add_argument("--sweep", type=int, nargs="*", default=[], help="slot counts for the zbv budget sweep")
    args = parser.parse_args()
    parser.at_least(args, 1, "stages", "microbatches")
    VariabilityModel(jitter=args.jitter)  # checked before anything runs
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, CPython {platform.python_version()}; "
          f"{time.strftime('%Y-%m-%d')}")
    for workload in args.workloads:
        for slots in (2 * args.stages, 4 * args.stages):
            report(workload, args.stages, args.microbatches, args.seeds, args.jitter, slots)
    print("\n`vs fixed zbv`: fixed-order ZB-V's makespan over this row's, per seed, median (what the hint and the "
          "rule give together). `ready-X / fixed-X`: the same hint's fixed-order makespan over this row's (what "
          "readiness adds); `*`: that fixed order holds more than the budget on some rank, so the ratio is not at "
          "equal memory. `/ bound`: over the lower bound of the row's placement. `peak in flight`: the most "
          "microbatch-chunks any rank held, over the per-rank budget; `(over)`: a fixed order above the budget "
          "(ready rules never are).")
    for workload in args.workloads if args.sweep else ():
        sweep(workload, args.stages, args.microbatches, args.seeds, args.jitter, args.sweep)


if __name__ == "__main__":
    run(main)
