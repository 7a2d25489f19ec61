"""Which lever earns what: the gain over fixed 1F1B split into ordering by known cost, memory, readiness, the
split backward and search (issue 22, part 1; README's "What it gains").

    .venv/bin/python benchmarks/credit.py [--ranks 32 128] [--workloads vlm-mixed sft-chat pretrain-packed]
        [--seeds 3] [--seeds-at-128 1] [--jitter 0.1] [--tune-seconds 10] [--tune-max-ranks 32]

Per workload, rank count (``m = 4p``, one chunk) and seed, one sampled table (jitter 0.1 on top of the
workload's own variability), the comparison ``rrfp simulate --compare`` makes (every built-in under fixed and
ready with lookahead, plus the sorted 1F1Bs whose warm-ups fill the budget and the order planned within it:
[Note: planned orders] in runtime/sched/baselines.py), at the 1f1b and 2x budgets. Each lever is a ratio of
makespans on the same table (medians over seeds), taken in turn, so that they multiply to the total:

* ordering: the best sorted 1F1B (``1f1b-light`` or ``1f1b-heavy``) in fixed order at 1F1B's memory, over
  fixed 1F1B;
* memory: the best fixed order without a split backward within 2x, over the same within 1f1b;
* the split backward, planned: the best fixed order within the budget (the planned order among them) over the
  best fixed order without a split (at 1f1b and at 2x): a split-backward order planned before the iteration on
  the known costs, run fixed: no readiness in it;
* readiness: the best ready run within the budget over the best fixed order within it (at 1f1b and at 2x);
* search: ``rrfp tune-hint``'s pick (its library entry point, ready policy, on model scenarios with other
  seeds) scored on the same table, over the best ready built-in (up to ``--tune-max-ranks``).

Every run keeps to the budget it is credited at; fixed orders over the budget are left out.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time

from _cli import Parser, progress, run

from hints.tasks import PipelineShape
from runtime.durations.presets import WORKLOAD_NAMES
from runtime.durations.variability import VariabilityModel, sample_durations
from runtime.sched.budget import MemoryBudget
from runtime.sched.evaluate import builtin_candidates, compare
from runtime.sched.simulator import simulate

SORTED = ("1f1b-light", "1f1b-heavy")


def best(rows, fixed: bool, split: bool = True):
    """The fastest row within the budget, fixed or ready; ``split`` False: of a hint without a split backward."""
    chosen = [r for r in rows if r.within_budget and (r.rule == "fixed") == fixed
              and (split or not r.shape.split_backward)]
    return min(chosen, key=lambda r: r.makespan)


def levers(workload: str, ranks: int, seed: int, jitter: float, tune_seconds: float) -> dict:
    shape = PipelineShape(ranks, 1, 4 * ranks)
    model = VariabilityModel(workload=workload, jitter=jitter)
    table = sample_durations(model, shape, seed)
    out = {}
    rows = {}
    for spec in ("1f1b", "2x"):
        budget = MemoryBudget.parse(spec)
        rows[spec] = compare(builtin_candidates(shape, table, budget), table, budget,
                             rules=("fixed", "lookahead")).rows
    base = next(r.makespan for r in rows["1f1b"] if r.hint == "1f1b" and r.rule == "fixed")
    sorted_fixed = min(r.makespan for r in rows["1f1b"] if r.hint in SORTED and r.rule == "fixed")
    out["ordering"] = base / sorted_fixed
    out["memory"] = best(rows["1f1b"], True, split=False).makespan / best(rows["2x"], True, split=False).makespan
    for spec in ("1f1b", "2x"):
        fixed, ready = best(rows[spec], True), best(rows[spec], False)
        out[f"readiness {spec}"] = fixed.makespan / ready.makespan
        out[f"split {spec}"] = best(rows[spec], True, split=False).makespan / fixed.makespan
        out[f"total {spec}"] = base / ready.makespan
        out[f"best fixed {spec}"] = fixed.hint
        out[f"best ready {spec}"] = ready.hint
    if tune_seconds > 0:
        from profiler.bench.cells import tune_cell
        from profiler.bench.matrix import Settings

        settings = Settings(jitter=jitter, tune_seconds=tune_seconds, seed=100 + seed)
        for spec in ("1f1b", "2x"):
            tuned = tune_cell(workload, ranks, spec, settings)
            from profiler.bench.cells import hint_for
            from profiler.bench.matrix import TUNED, MatrixRow

            hint = hint_for(MatrixRow("tuned", TUNED, tuned.candidate.rule), shape, table, tuned, spec)
            made = simulate(hint, table, tuned.candidate.rule, MemoryBudget.parse(spec)).makespan
            out[f"search {spec}"] = best(rows[spec], False).makespan / made
    return out


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--workloads", nargs="+", default=["vlm-mixed", "sft-chat", "pretrain-packed"],
                        choices=WORKLOAD_NAMES)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seeds-at-128", type=int, default=1, help="seeds at 64 ranks and more (slow)")
    parser.add_argument("--jitter", type=float, default=0.1)
    parser.add_argument("--tune-seconds", type=float, default=10.0)
    parser.add_argument("--tune-max-ranks", type=int, default=32)
    args = parser.parse_args()
    parser.at_least(args, 1, "ranks", "seeds", "seeds_at_128")
    parser.at_least(args, 0, "tune_seconds")
    VariabilityModel(jitter=args.jitter)  # checked before anything runs
    began = time.perf_counter()
    lines = []
    for workload in args.workloads:
        for ranks in args.ranks:
            seeds = args.seeds if ranks < 64 else args.seeds_at_128
            found = []
            for seed in range(seeds):
                progress(f"{workload} p={ranks} seed {seed}")
                tune = args.tune_seconds if ranks <= args.tune_max_ranks else 0.0
                found.append(levers(workload, ranks, seed, args.jitter, tune))

            def med(key):
                values = [f[key] for f in found if key in f]
                return f"{statistics.median(values):.3f}x" if values else "-"

            def names(key):
                return ", ".join(sorted({f[key] for f in found}))

            lines.append(f"| {workload} | {ranks} | {seeds} | {med('ordering')} | {med('memory')} | "
                         f"{med('split 1f1b')} / {med('split 2x')} | "
                         f"{med('readiness 1f1b')} ({names('best ready 1f1b')} / {names('best fixed 1f1b')}) | "
                         f"{med('readiness 2x')} ({names('best ready 2x')} / {names('best fixed 2x')}) | "
                         f"{med('search 1f1b')} / {med('search 2x')} | "
                         f"{med('total 1f1b')} / {med('total 2x')} |")
    elapsed = time.perf_counter() - began
    print(f"Command: `{' '.join([os.path.basename(sys.executable), *sys.argv])}`; {platform.machine()}, "
          f"Python {platform.python_version()}, {os.cpu_count()} CPUs; {elapsed:.0f} s.\n")
    print("| workload | ranks | seeds | ordering (sorted 1F1B / 1F1B, fixed, 1F1B memory) | memory (best fixed 2x / "
          "best fixed 1f1b, no split) | split backward, planned (best fixed / best fixed without a split) @1f1b / "
          "@2x | readiness @1f1b (best ready / best fixed) | readiness @2x | search @1f1b / @2x | total: best ready "
          "vs fixed 1F1B @1f1b / @2x |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    run(main)
