"""Does readiness ever lose to the same hint in fixed order, at equal memory? The grid of issue 22, part 2.

    .venv/bin/python benchmarks/never_lose.py [--ranks 8 16 32] [--workloads vlm-mixed sft-chat pretrain-packed]
        [--seeds 3] [--jitter 0.1] [--hints ...] [--rules lookahead greedy]

For every hint X (the built-ins and torch's imported schedules), each workload, rank count (``m = 4p``
microbatches; ``v = 2`` where X has chunks) and seed: X in fixed order, then X under each ready rule at
X's own fixed peak per rank (the memory its fixed order holds) and at twice that. Prints, per X and
budget, the worst and the median of ready-X / fixed-X over the grid (> 1: ready is faster), and the cases
below 0.995. ``--auto N`` adds the rule ``auto`` ([Note: the auto policy] in runtime/sched/auto.py): per
(X, budget, workload, ranks), N iterations (tables at seeds 0..N-1) under ``--policy auto``, whose figure is the
fixed order's total over auto's (one case per run of N iterations, not per seed). Every figure comes from the
simulator (``runtime.sched.simulator.simulate``), the same arbiters
``rrfp run`` drives.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time

from _cli import Parser, progress, run

from hints.orders import peak_in_flight
from runtime.durations.presets import WORKLOAD_NAMES
from runtime.durations.variability import VariabilityModel, sample_durations
from runtime.sched.evaluate import resolve
from runtime.sched.simulator import simulate

# hint -> (chunks, placement)
HINTS = {
    "1f1b": (1, None), "interleaved-1f1b": (2, None), "zb": (1, None), "zbv": (2, "v"), "bf": (1, None),
    "bfw": (1, None), "cp": (1, None), "torch:Interleaved1F1B": (2, None),
    "torch:InterleavedZeroBubble": (2, None), "torch:ZBVZeroBubble": (2, "v"), "torch:DualPipeV": (2, "v"),
    "planned": (1, None),  # planned at 1F1B's memory ([Note: planned orders] in runtime/sched/baselines.py)
}
WORKLOADS = ("vlm-mixed", "sft-chat", "pretrain-packed")


def grid(args):
    """Yields ``(hint, budget, workload, ranks, seed, rule, ready/fixed)``."""
    for workload in args.workloads:
        for ranks in args.ranks:
            for seed in range(args.seeds):
                model = VariabilityModel(workload=workload, jitter=args.jitter)
                for name in args.hints:
                    chunks, placement = HINTS[name]
                    hint = resolve(name, ranks, chunks, 4 * ranks, placement=placement)
                    table = sample_durations(model, hint.shape.with_split(False), seed)
                    hint = resolve(name, ranks, chunks, 4 * ranks, table, placement)
                    fixed = simulate(hint, table, "fixed")
                    peaks = [max(chunks, peak_in_flight(order, hint.shape)) for order in hint.orders]
                    for budget, slots in (("fixed peak", peaks), ("2x", [2 * p for p in peaks])):
                        for rule in args.rules:
                            ready = simulate(hint, table, rule, slots)
                            yield name, budget, workload, ranks, seed, rule, fixed.makespan / ready.makespan


def auto_grid(args):
    """Yields ``(hint, budget, workload, ranks, "auto", fixed total / auto total, fixed iterations, switches)``."""
    from runtime.sched.auto import simulate_auto
    from runtime.sched.rules import RULES

    for workload in args.workloads:
        model = VariabilityModel(workload=workload, jitter=args.jitter)
        for ranks in args.ranks:
            for name in args.hints:
                chunks, placement = HINTS[name]
                first = resolve(name, ranks, chunks, 4 * ranks, placement=placement)
                tables = [sample_durations(model, first.shape.with_split(False), seed) for seed in range(args.auto)]
                hints = [resolve(name, ranks, chunks, 4 * ranks, table, placement) for table in tables]
                peaks = [max(chunks, peak_in_flight(order, hints[0].shape)) for order in hints[0].orders]
                for budget, slots in (("fixed peak", peaks), ("2x", [2 * p for p in peaks])):
                    rows, policy = simulate_auto(zip(hints, tables), RULES["lookahead"], slots)
                    fixed = sum(r.decision.rule == "fixed" for r in rows)
                    yield (name, budget, workload, ranks, "auto", sum(r.fixed for r in rows) /
                           sum(r.makespan for r in rows), fixed, policy.switches)


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOAD_NAMES)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jitter", type=float, default=0.1)
    parser.add_argument("--hints", nargs="+", default=list(HINTS), choices=list(HINTS))
    parser.add_argument("--rules", nargs="+", default=["lookahead"], choices=["greedy", "lookahead"])
    parser.add_argument("--auto", type=int, default=0, help="iterations per case of --policy auto (0: none)")
    parser.add_argument("--auto-only", action="store_true", help="with --auto: skip the per-seed grid")
    args = parser.parse_args()
    parser.at_least(args, 1, "ranks", "seeds")
    parser.at_least(args, 0, "auto")
    VariabilityModel(jitter=args.jitter)  # checked before anything runs
    began = time.perf_counter()
    results: dict[tuple[str, str, str], list[tuple[float, str]]] = {}
    for name, budget, workload, ranks, seed, rule, ratio in ([] if args.auto_only else grid(args)):
        results.setdefault((name, budget, rule), []).append((ratio, f"{workload} p={ranks} seed {seed}"))
        progress(f"{name} {budget} {workload} p={ranks} seed {seed} {rule}: {ratio:.3f}")
    switched: dict[tuple[str, str], list[tuple[int, int]]] = {}
    if args.auto:
        for name, budget, workload, ranks, rule, ratio, fixed, switches in auto_grid(args):
            results.setdefault((name, budget, rule), []).append((ratio, f"{workload} p={ranks}"))
            switched.setdefault((name, budget), []).append((fixed, switches))
            progress(f"{name} {budget} {workload} p={ranks} auto: {ratio:.3f}, {fixed} fixed, {switches} switches")
    elapsed = time.perf_counter() - began
    print(f"Command: `{' '.join([os.path.basename(sys.executable), *sys.argv])}`; "
          f"{platform.machine()}, Python {platform.python_version()}; {elapsed:.0f} s.\n")
    print("| hint | budget | rule | worst ready/fixed | median | cases < 0.995 | worst case |")
    print("|---|---|---|---|---|---|---|")
    for (name, budget, rule), values in results.items():
        worst = min(values)
        losses = sum(1 for ratio, _ in values if ratio < 0.995)
        print(f"| {name} | {budget} | {rule} | {worst[0]:.3f}x | {statistics.median(r for r, _ in values):.3f}x | "
              f"{losses} of {len(values)} | {worst[1]} |")
    if switched:
        print(f"\nauto, {args.auto} iterations per case: iterations run fixed and switches, summed over the cases")
        print("\n| hint | budget | fixed iterations | switches |\n|---|---|---|---|")
        for (name, budget), values in switched.items():
            print(f"| {name} | {budget} | {sum(f for f, _ in values)} of {args.auto * len(values)} | "
                  f"{sum(s for _, s in values)} |")


if __name__ == "__main__":
    run(main)
