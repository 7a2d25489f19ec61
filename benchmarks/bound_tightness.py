"""How far the paper's rows are from the bound of their own hint family, and from the universal bound (issue 26).

    .venv/bin/python benchmarks/bound_tightness.py [--ranks 128] [--workloads vlm-mixed sft-chat pretrain-packed]
        [--seeds 3] [--jitter 0.1]

Per workload and seed, one sampled table (m = 4p, one chunk, jitter 0.1 on the workload's own variability) and
the comparison ``rrfp simulate --compare`` makes at 1F1B's memory (fixed and ready with lookahead). For the rows
README's "What it gains" quotes (fixed 1F1B, the best sorted 1F1B in fixed order, ready bfw, ready zb, ready cp),
the makespan over the universal (free-split) bound, as reported before, and over the bound of the row's hint
family ([Note: bound per hint family] in runtime/sched/bounds.py), with the two bounds' ratio. Medians over
seeds. Pure simulation: the ratios do not depend on the machine.
"""

from __future__ import annotations

import statistics

from _cli import Parser, progress, run

from hints.tasks import PipelineShape
from runtime.durations.presets import WORKLOAD_NAMES
from runtime.durations.variability import VariabilityModel, sample_durations
from runtime.sched.budget import MemoryBudget
from runtime.sched.evaluate import builtin_candidates, compare

ROWS = (("1f1b", "fixed"), ("best sorted 1f1b", "fixed"), ("bfw", "lookahead"), ("zb", "lookahead"),
        ("cp", "lookahead"))
SORTED = ("1f1b-light", "1f1b-heavy")


def measure(workload: str, ranks: int, seed: int, jitter: float) -> dict:
    shape = PipelineShape(ranks, 1, 4 * ranks)
    table = sample_durations(VariabilityModel(workload=workload, jitter=jitter), shape, seed)
    budget = MemoryBudget.parse("1f1b")
    hints = builtin_candidates(shape, table, budget)
    comparison = compare(hints, table, budget, rules=("fixed", "lookahead"))
    found = {}
    for name, rule in ROWS:
        if name == "best sorted 1f1b":
            row = min((comparison.row(h, "fixed") for h in SORTED if comparison.row(h, "fixed")),
                      key=lambda r: r.makespan)
        else:
            row = comparison.row(name, rule)
        if row is not None:
            found[name] = (row.over_universal, row.over_bound, row.bound / comparison.bound.value, row.bound_family)
    return found


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[128])
    parser.add_argument("--workloads", nargs="+", default=["vlm-mixed", "sft-chat", "pretrain-packed"],
                        choices=WORKLOAD_NAMES)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jitter", type=float, default=0.1)
    args = parser.parse_args()
    parser.at_least(args, 1, "ranks", "seeds")
    VariabilityModel(jitter=args.jitter)  # checked before anything runs
    print("| workload | ranks | row | family | family bound / universal | makespan / universal (before) | "
          "makespan / family bound (after) |")
    print("|---|---|---|---|---|---|---|")
    for workload in args.workloads:
        for ranks in args.ranks:
            runs = []
            for seed in range(args.seeds):
                progress(f"{workload} p={ranks} seed {seed}")
                runs.append(measure(workload, ranks, seed, args.jitter))
            for name, rule in ROWS:
                values = [r[name] for r in runs if name in r]
                if not values:
                    continue
                label = f"{name} {'ready' if rule != 'fixed' else 'fixed'}"

                def med(k):
                    return statistics.median(v[k] for v in values)

                print(f"| {workload} | {ranks} | {label} | {values[0][3]} | {med(2):.3f}x | {med(0):.2f}x | "
                      f"{med(1):.2f}x |")
    print(f"\n{args.seeds} seeds, m = 4p, jitter {args.jitter}, 1F1B's memory; medians.")


if __name__ == "__main__":
    run(main)
