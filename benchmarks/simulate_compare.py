"""Readiness-first vs fixed order in the simulator, at equal memory, as Markdown for BENCHMARKS.md.

    .venv/bin/python benchmarks/simulate_compare.py [--stages 8 32 128] [--workloads language multimodal]
        [--jitter 0.1] [--seed 0] [--chunks 1] [--acceptance]

Part 1 (always): for each workload and stage count, ``m = 4p`` microbatches,
one sampled table (seed, jitter), the same comparison ``rrfp simulate
--compare`` makes (``runtime.sched.evaluate.compare``) at the 1f1b and 2x budgets:
every built-in hint (``cp`` included) under fixed, ready (greedy) and ready
with lookahead; each as speedup over fixed 1F1B, as ready-X over fixed-X
(what readiness itself adds, marked when fixed-X holds more memory than the
budget), as makespan over the lower bound, and the memory held.

Part 2 (``--acceptance``): the 1f1b hint at both budgets on 3 seeds x both
workloads x 8/16/32 ranks with jitter 0.1, and for every built-in the ratio
of lookahead to greedy over the same grid (which decides the per-hint
defaults of ``runtime.sched.rules.LOOKAHEAD_OFF_BY_DEFAULT``).
"""

from __future__ import annotations

import os
import platform
import statistics
import time

from _cli import Parser, run

from hints.tasks import PipelineShape
from runtime.durations.presets import WORKLOAD_NAMES
from runtime.durations.variability import VariabilityModel, sample_durations
from runtime.sched.budget import MemoryBudget
from runtime.sched.evaluate import builtin_candidates, compare

BUDGETS = ("1f1b", "2x")
RULE_LABEL = {"fixed": "fixed", "greedy": "ready", "lookahead": "ready+la"}


def comparisons(workload: str, stages: int, chunks: int, seed: int, jitter: float, hints: list[str] | None = None):
    shape = PipelineShape(stages, chunks, 4 * stages)
    table = sample_durations(VariabilityModel(workload=workload, jitter=jitter), shape, seed)
    candidates = builtin_candidates(shape, table)
    if hints is not None:
        candidates = {name: candidates[name] for name in hints if name in candidates}
    return {budget: compare(candidates, table, MemoryBudget.parse(budget)) for budget in BUDGETS}


def part_one(args) -> None:
    for workload in args.workloads:
        for stages in args.stages:
            began = time.perf_counter()
            result = comparisons(workload, stages, args.chunks, args.seed, args.jitter)
            elapsed = time.perf_counter() - began
            chunks = f" --chunks {args.chunks}" if args.chunks > 1 else ""
            tight = result["1f1b"]
            print(f"\n#### {workload}, {stages} ranks, {4 * stages} microbatches{', %d chunks' % args.chunks if args.chunks > 1 else ''}"
                  f" (`rrfp simulate -p {stages} -m {4 * stages}{chunks} --workload {workload} --jitter {args.jitter} "
                  f"--seed {args.seed} --compare --memory-budget 1f1b|2x`; {elapsed:.1f} s)\n")
            print(f"Lower bound {tight.bound.value:.4f} s ({tight.bound.binding}); budgets per rank: "
                  f"1f1b = {min(tight.slots)}..{max(tight.slots)}, "
                  f"2x = {min(result['2x'].slots)}..{max(result['2x'].slots)} microbatch-chunks.\n")
            print("| hint | rule | vs 1F1B @1f1b | vs fixed-X @1f1b | / bound @1f1b | memory @1f1b "
                  "| vs 1F1B @2x | vs fixed-X @2x | / bound @2x | memory @2x |")
            print("|---|---|---|---|---|---|---|---|---|---|")
            for row in tight.rows:
                cells = []
                for budget in BUDGETS:
                    comparison = result[budget]
                    r = comparison.row(row.hint, row.rule)
                    fixed_row = comparison.row(row.hint, "fixed")
                    mark = "" if fixed_row is None or fixed_row.within_budget else "*"
                    versus = "-" if r.vs_fixed is None else f"{r.vs_fixed:.3f}x{mark}"
                    memory = sum(r.peak_in_flight) / sum(comparison.slots)
                    over = "" if r.within_budget else " (over)"
                    cells += [f"{r.speedup:.3f}x", versus, f"{r.over_bound:.3f}", f"{memory:.2f}x{over}"]
                print(f"| {row.hint} | {RULE_LABEL[row.rule]} | " + " | ".join(cells) + " |")
    print("\n`vs fixed-X`: the same hint's fixed-order makespan over this row's (what readiness adds); `*`: that "
          "fixed order holds more memory than the budget, so the ratio is not at equal memory. `memory`: peak "
          "microbatch-chunks in flight summed over ranks, over the budget's sum; `(over)`: some rank exceeded "
          "its budget (fixed orders only: ready rules never do).")


def part_two(args) -> None:
    grid = [(w, p, s) for w in ("language", "multimodal") for p in (8, 16, 32) for s in (0, 1, 2)]
    print("\n### Acceptance: the 1f1b hint, 3 seeds x 2 workloads x 8/16/32 ranks, jitter 0.1, m = 4p\n")
    print("| workload | ranks | seed | ready @1f1b | ready+la @1f1b | ready @2x | ready+la @2x | gain kept @2x |")
    print("|---|---|---|---|---|---|---|---|")
    per_hint: dict[tuple[str, str], list[float]] = {}
    worst_tight, worst_kept = float("inf"), float("inf")
    for workload, stages, seed in grid:
        result = comparisons(workload, stages, 1, seed, 0.1)
        for budget in BUDGETS:
            for row in result[budget].rows:
                if row.rule == "lookahead":
                    greedy = result[budget].row(row.hint, "greedy")
                    per_hint.setdefault((row.hint, budget), []).append(greedy.makespan / row.makespan)
        tight, loose = result["1f1b"], result["2x"]
        g1, l1 = tight.row("1f1b", "greedy").speedup, tight.row("1f1b", "lookahead").speedup
        g2, l2 = loose.row("1f1b", "greedy").speedup, loose.row("1f1b", "lookahead").speedup
        kept = (l2 - 1) / (g2 - 1) if g2 > 1 else float("nan")
        worst_tight, worst_kept = min(worst_tight, l1), min(worst_kept, kept)
        print(f"| {workload} | {stages} | {seed} | {g1:.3f}x | {l1:.3f}x | {g2:.3f}x | {l2:.3f}x | {kept:.1%} |")
    print(f"\nWorst ready+la @1f1b: {worst_tight:.3f}x of fixed 1F1B (target >= 0.995x); worst share of the greedy "
          f"gain kept at 2x: {worst_kept:.1%} (target >= 98%).")
    # The same ratio with 2 chunks per rank (interleaved-1f1b only exists there), 8 and 16 ranks.
    for workload, stages, seed in [(w, p, s) for w in ("language", "multimodal") for p in (8, 16) for s in (0, 1, 2)]:
        result = comparisons(workload, stages, 2, seed, 0.1)
        for budget in BUDGETS:
            for row in result[budget].rows:
                if row.rule == "lookahead":
                    greedy = result[budget].row(row.hint, "greedy")
                    per_hint.setdefault((f"{row.hint} (v=2)", budget), []).append(greedy.makespan / row.makespan)
    print("\n#### Lookahead over greedy, per hint (makespan greedy / makespan lookahead; > 1: lookahead is faster)\n")
    print("One chunk: the grid above (18 cases). v=2: 2 chunks per rank, both workloads x 8/16 ranks x 3 seeds "
          "(12 cases).\n")
    print("| hint | median @1f1b | min @1f1b | max @1f1b | median @2x | min @2x | max @2x |")
    print("|---|---|---|---|---|---|---|")
    hints = dict.fromkeys(h for h, _ in per_hint)
    for hint in hints:
        cells = []
        for budget in BUDGETS:
            values = per_hint[(hint, budget)]
            cells += [f"{statistics.median(values):.3f}", f"{min(values):.3f}", f"{max(values):.3f}"]
        print(f"| {hint} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--workloads", nargs="+", default=["language", "multimodal"], choices=WORKLOAD_NAMES)
    parser.add_argument("--chunks", type=int, default=1)
    parser.add_argument("--jitter", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--acceptance", action="store_true", help="also run the acceptance grid (part 2)")
    parser.add_argument("--skip-tables", action="store_true", help="only the acceptance grid")
    args = parser.parse_args()
    parser.at_least(args, 1, "stages", "chunks")
    VariabilityModel(jitter=args.jitter)  # checked before anything runs
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, CPython {platform.python_version()}; "
          f"{time.strftime('%Y-%m-%d')}")
    if not args.skip_tables:
        part_one(args)
    if args.acceptance:
        part_two(args)


if __name__ == "__main__":
    run(main)
