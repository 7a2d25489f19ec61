"""Does readiness win where no order can know? Issue 22, part 3: the unknown-variability sweep at 32 and 128 ranks.

    .venv/bin/python benchmarks/unknown_variability.py [--ranks 32 128] [--workloads sft-chat vlm-mixed]
        [--tables 2] [--jitter 0.1] [--levels moe=1.3:1.7:2.5 ...] [--large-levels moe=1.7 ...]

For each workload, rank count (``m = 4p``) and point of the sweep (none, then each kind of
[Note: unknown variability] in runtime/durations/unknown.py at each level), the tables ``seed = 1000 s`` for
``s < --tables`` are simulated with ``rrfp bench``'s own code (``profiler.bench.cells.simulate_table`` and
``summarize_cell``) for the rows below, at budgets 1f1b and 2x. Printed per point, medians over the tables:

* the best fixed order within the budget (fixed 1F1B, zero bubble, 1F1B sorted lightest- or heaviest-first
  by known cost with warm-ups filling the budget, and the order planned within the budget on the known costs:
  [Note: planned orders] in runtime/sched/baselines.py) and readiness over it: with the sorted order as the hint
  (``ready-1f1b-light``, 1F1B's warm-ups), with ``cp`` (critical path by known cost, split backward) and with
  the planned order itself as the hint (``ready-planned``; beside it, ready over the same planned order fixed);
* ``--policy auto`` ([Note: the auto policy] in runtime/sched/auto.py) with the sorted hint fitted to the budget
  (``1f1b-light``; ``1f1b-light @2x`` at 2x) over ``--auto-iterations`` tables taken as consecutive iterations
  (half as many above 32 ranks): the iterations it ran fixed, its switches, and always-ready's total over auto's.

``--oracle`` adds a yardstick: the order planned on each table's *realized* durations (perfect knowledge, which no
scheduler has), run fixed, over the planned order (made on the expected durations) run fixed; beside it, ready
``planned``'s gain over fixed ``planned`` as a share of it (in log terms). Not a bound: the planner is a heuristic
(the lookahead arbiter run offline), and readiness can beat a plan made with perfect knowledge.

[Note: what a revealed cost is worth]
    Beside it, ``--oracle`` asks what a scheduler that learns as it goes could win. Where a microbatch's cost is
    mispredicted on every stage alike (``cost-error``), its first forward reveals it to every later stage. The
    *revealed* run is a ready run whose rank 0 keeps the planned order (it runs a microbatch's first forward
    before anything is known of it) and whose other ranks take the order planned on the realized durations; the
    *control* is the same with those ranks' order planned on another draw of the table. Revealed over control
    is what the knowledge itself is worth, control over ready ``planned`` what a plan of the other shape is.
    Also a yardstick, not a bound: the other ranks know more than a first forward reveals (every later stage's
    routing and slow episodes too), and their plan assumed a rank 0 that knew as much.

Rank counts above 32 run ``--large-levels`` (one level per kind by default): a 128-rank table takes about
20 s per row set on a 2-core machine.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import statistics
import sys
import time

from _cli import Parser, progress, run

from hints.tasks import PipelineShape
from profiler.bench.cells import hint_for, simulate_table, summarize_cell
from profiler.bench.matrix import MATRIX_ROWS, MICROBATCHES_PER_RANK, parse_unknown_sweep
from runtime.durations.presets import WORKLOAD_NAMES
from runtime.durations.variability import VariabilityModel, sample_durations
from runtime.sched.auto import simulate_auto
from runtime.sched.budget import MemoryBudget
from runtime.sched.rules import RULES

ROWS = ("fixed-1f1b", "fixed-zb", "fixed-1f1b-light", "fixed-1f1b-heavy", "fixed-planned", "ready-1f1b-light",
        "ready-cp", "ready-planned")
BUDGETS = ("1f1b", "2x")


def points(spec: str, flag: str) -> list[str]:
    return [""] + [f"{kind}={level:g}" for kind, levels in parse_unknown_sweep(spec, flag) for level in levels]


def auto_over(workload: str, ranks: int, jitter: float, unknown: str, seeds: list[int], budget: str):
    """--policy auto with the sorted hint (fitted to ``budget``) over the tables in order: (fixed iterations,
    switches, always-ready total / auto total)."""
    shape = PipelineShape(ranks, 1, MICROBATCHES_PER_RANK * ranks)
    model = VariabilityModel(workload=workload, jitter=jitter, unknown=unknown)
    light = next(r for r in MATRIX_ROWS if r.name == "fixed-1f1b-light")  # the bench's own fitting of the order

    def iterations():
        for seed in seeds:
            table = sample_durations(model, shape, seed)
            yield hint_for(light, shape, table, None, budget), table

    rows, policy = simulate_auto(iterations(), RULES["lookahead"], MemoryBudget.parse(budget))
    fixed = sum(1 for r in rows if r.decision.rule == "fixed")
    return fixed, policy.switches, sum(r.ready for r in rows) / sum(r.makespan for r in rows), len(rows)


def realized(table):
    """``table`` as a planner that knew every duration would see it: its expectation is what happens, and each
    microbatch's known cost its realized forward and backward over every stage (in the table's own units, so that
    where nothing varies the planner sees ``table`` itself)."""
    spent = [sum(table.forward[s][k] + table.backward[s][k] for s in range(table.stages))
             for k in range(table.microbatches)]
    unit = sum(table.microbatch_costs) / sum(spent)
    known = dataclasses.replace(table, microbatch_costs=[cost * unit for cost in spent])
    known.expectation = known
    return known


def oracle_over_planned(workload: str, ranks: int, jitter: float, unknown: str, seeds: list[int], budget: str,
                        per_table: list[dict]) -> tuple[float, float | None, float | None]:
    """Medians over the tables of three yardsticks, each over the planned order (planned on the expected
    durations) run fixed: the ``fixed-planned`` run of ``per_table``, simulate_table's result on table ``seeds[i]``
    with ``keep_plans`` (its table and its plan are read from it).

    * perfect knowledge: the order planned on the realized durations, fixed;
    * revealed: a ready run (the lookahead rule, at ``budget``) whose rank 0 keeps the planned order and whose
      other ranks take the order planned on the realized durations: what knowing each microbatch's cost once its
      first forward has run could be worth ([Note: what a revealed cost is worth] in the module's docstring);
    * its control: the same with the other ranks' order planned on another draw of the table (seed + 7), knowledge
      that is wrong. Revealed over control is what the knowledge itself is worth; control over ready ``planned``,
      what the other plan's shape is.

    The last two are None where no plan on the realized durations keeps the planned order's shape."""
    from runtime.sched.evaluate import planned_baseline
    from runtime.sched.simulator import simulate

    shape = PipelineShape(ranks, 1, MICROBATCHES_PER_RANK * ranks)
    model = VariabilityModel(workload=workload, jitter=jitter, unknown=unknown)
    memory = MemoryBudget.parse(budget)
    oracles, revealed, control = [], [], []
    for seed, ran in zip(seeds, per_table):
        table, plan = ran["tables"][1], ran["plans"][(1, budget)]
        planned_fixed = ran["runs"][("fixed-planned", budget)]["makespan"]
        known = realized(table)
        oracle = planned_baseline(shape, known, memory)
        oracles.append(planned_fixed / simulate(oracle, table, "fixed").makespan)
        for knowing, into in ((known, revealed), (realized(sample_durations(model, shape, seed + 7)), control)):
            downstream = planned_baseline(shape, knowing, memory, keep=plan.shape)
            if downstream is not None:
                hybrid = dataclasses.replace(plan, orders=plan.orders[:1] + downstream.orders[1:])
                into.append(planned_fixed / simulate(hybrid, table, "lookahead", memory).makespan)
    return (statistics.median(oracles), statistics.median(revealed) if revealed else None,
            statistics.median(control) if control else None)


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--workloads", nargs="+", default=["sft-chat", "vlm-mixed"], choices=WORKLOAD_NAMES)
    parser.add_argument("--tables", type=int, default=2)
    parser.add_argument("--jitter", type=float, default=0.1)
    parser.add_argument("--levels", default="moe=1.3:1.7:2.5,cost-error=0.1:0.2:0.4,slow-rank=0.1:0.3:0.6,"
                                            "inter-node=0.5:1:2")
    parser.add_argument("--auto-iterations", type=int, default=8, help="iterations of the auto runs (half above 32 "
                        "ranks); their tables are seed 1000 s + 1, apart from the others")
    parser.add_argument("--large-levels", default="moe=1.7,cost-error=0.2,slow-rank=0.3,inter-node=1")
    parser.add_argument("--oracle", action="store_true", help="add yardsticks (not bounds): the order planned on the "
                        "realized durations, fixed, over the planned order, fixed; and what knowing each microbatch's "
                        "cost once its first forward has run could be worth to a ready run, with a control")
    args = parser.parse_args()
    parser.at_least(args, 1, "ranks", "tables", "auto_iterations")
    VariabilityModel(jitter=args.jitter)  # checked before anything runs, as the sweep's levels are
    sweeps = {small: points(args.levels if small else args.large_levels, "--levels" if small else "--large-levels")
              for small in {ranks <= 32 for ranks in args.ranks}}
    rows = [r for r in MATRIX_ROWS if r.name in ROWS]
    seeds = [1000 * s for s in range(args.tables)]
    began = time.perf_counter()
    out = []
    for ranks in args.ranks:
        for workload in args.workloads:
            for unknown in sweeps[ranks <= 32]:
                progress(f"{workload} p={ranks} {unknown or 'none'}")
                per_table = [simulate_table(workload, ranks, args.jitter, seed, rows, BUDGETS, unknown=unknown,
                                            keep_plans=args.oracle)
                             for seed in seeds]
                cells = {b: summarize_cell(workload, ranks, b, per_table, rows, None, args.jitter) for b in BUDGETS}
                runs = args.auto_iterations if ranks <= 32 else max(3, args.auto_iterations // 2)
                autos = {b: auto_over(workload, ranks, args.jitter, unknown, [1000 * s + 1 for s in range(runs)], b)
                         for b in BUDGETS}
                oracles = ({b: oracle_over_planned(workload, ranks, args.jitter, unknown, seeds, b, per_table)
                            for b in BUDGETS} if args.oracle else {})
                out.append((ranks, workload, unknown, cells, autos, oracles))
    elapsed = time.perf_counter() - began
    print(f"Command: `{' '.join([os.path.basename(sys.executable), *sys.argv])}`; "
          f"{platform.machine()}, Python {platform.python_version()}; {elapsed:.0f} s.\n")
    print("| ranks | workload | unknown | budget | best fixed | its speedup vs fixed 1F1B | ready 1f1b-light / best "
          "fixed | ready cp / best fixed | ready planned / best fixed | ready planned / fixed planned | ready peak "
          "(cp, planned) | auto, hint 1f1b-light fitted to the budget: fixed iterations, switches, always-ready/auto |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    gains = {}
    oracle_lines = []
    worths = {}
    for ranks, workload, unknown, cells, autos, oracles in out:
        for budget in BUDGETS:
            entries = {e["row"]: e for e in cells[budget]["rows"]}
            light, cp, planned = entries["ready-1f1b-light"], entries["ready-cp"], entries["ready-planned"]
            best = light.get("best_fixed", "-")
            speed = entries[best]["speedup_vs_fixed_1f1b"]["median"] if best in entries else float("nan")
            fixed, switches, ratio, count = autos[budget]
            a, b, c = (e["ready_over_best_fixed"]["median"] for e in (light, cp, planned))
            own = planned["ready_over_fixed_same_hint"]["median"]
            gains.setdefault((ranks, budget), []).append((a, b, c, own))
            print(f"| {ranks} | {workload} | {unknown or 'none'} | {budget} | {best} | {speed:.3f}x | {a:.3f}x | "
                  f"{b:.3f}x | {c:.3f}x | {own:.3f}x | {cp['peak_in_flight']:g}, {planned['peak_in_flight']:g} | "
                  f"{fixed} of {count}, {switches}, {ratio:.3f}x |")
            if oracles:
                ceiling, revealed, control = oracles[budget]
                share = f"{math.log(own) / math.log(ceiling):.0%}" if ceiling > 1.005 else "-"
                knowing = "-" if revealed is None else f"{revealed:.3f}x"
                wrong = "-" if control is None else f"{control:.3f}x"
                worth = "-" if revealed is None or control is None else f"{revealed / control:.3f}x"
                oracle_lines.append(f"| {ranks} | {workload} | {unknown or 'none'} | {budget} | {ceiling:.3f}x | "
                                    f"{own:.3f}x | {share} | {knowing} | {wrong} | {worth} |")
                if revealed is not None and control is not None:
                    worths.setdefault((ranks, budget), []).append((revealed, revealed / control, own, revealed / own))
    print("\n| ranks | budget | ready 1f1b-light / best fixed | ready cp / best fixed | ready planned / best fixed | "
          "ready planned / fixed planned | points with the best ready >= 1.05x the best fixed |")
    print("|---|---|---|---|---|---|---|")
    for (ranks, budget), values in gains.items():
        def spread(k: int) -> str:
            column = [v[k] for v in values]
            return f"{min(column):.3f}x, {statistics.median(column):.3f}x, {max(column):.3f}x"
        wins = sum(1 for v in values if max(v[:3]) >= 1.05)
        print(f"| {ranks} | {budget} | {spread(0)} | {spread(1)} | {spread(2)} | {spread(3)} | {wins} of {len(values)} |")
    print("\nEach cell: min, median, max over the points.")
    if oracle_lines:
        print("\n| ranks | workload | unknown | budget | perfect knowledge: planned on the realized durations, fixed, "
              "over planned fixed | ready planned / fixed planned | readiness's gain as a share of it (-: under 0.5%) "
              "| revealed: ready, ranks 1+ planned on the realized durations, over planned fixed | control: the same "
              "planned on another draw | what the knowledge is worth: revealed / control |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        print("\n".join(oracle_lines))
        print("\n| ranks | budget | revealed / fixed planned | revealed / control | ready planned / fixed planned | "
              "revealed / ready planned | points where revealed >= 1.05x fixed planned (ready planned) |")
        print("|---|---|---|---|---|---|---|")
        for (ranks, budget), values in worths.items():
            cells = (", ".join(f"{f(v[k] for v in values):.3f}x" for f in (min, statistics.median, max))
                     for k in range(4))
            wins = sum(1 for v in values if v[0] >= 1.05)
            ready = sum(1 for v in values if v[2] >= 1.05)
            print(f"| {ranks} | {budget} | {' | '.join(cells)} | {wins} ({ready}) of {len(values)} |")


if __name__ == "__main__":
    run(main)
