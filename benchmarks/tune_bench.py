"""rrfp tune-hint benchmarks: search speed, tuned makespan vs the lower bound, and predicted vs realized runs.

    .venv/bin/python benchmarks/tune_bench.py [--parts speed bound runs] [--time-budget 60]

speed
    The default 60 s search on 8 ranks x 32 microbatches (multimodal model,
    jitter 0.1) with --jobs 2: scenario simulations, wall time, simulations
    per second per core.
bound
    In simulation, 32 and 128 ranks (m = 4p), language and multimodal, jitter
    0.1, 1f1b budget: the written-out hint's held-out makespan over the lower
    bound (mean over scenarios), beside the best built-in's and fixed 1F1B's.
runs
    Emulated 8 ranks x 32 microbatches, multimodal and language, budgets 1f1b
    and 2x: (1) a traced base run (ready, 1f1b hint); (2) ``rrfp tune-hint`` on
    it; (3) one launch running the tuned job, the best built-in and fixed 1F1B
    side by side on new data (another seed); the predicted step times and
    gain against the realized ones.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _cli import Parser, run

ROOT = Path(__file__).resolve().parent.parent


def rrfp(*args: str, cwd: Path = ROOT) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "rrfp_cli", *args, "--json"], cwd=cwd, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"rrfp {' '.join(args)} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def part_speed(args, work: Path) -> None:
    began = time.perf_counter()
    data = rrfp("tune-hint", "--workload", "multimodal", "-p", "8", "-m", "32", "--jitter", "0.1", "--jobs", "2",
                "--time-budget", f"{args.time_budget:g}s", "--out", str(work / "speed"))
    wall = time.perf_counter() - began
    sims = data["search"]["simulations"]
    print(f"\n### Search speed: `rrfp tune-hint --workload multimodal -p 8 -m 32 --jitter 0.1 --jobs 2 "
          f"--time-budget {args.time_budget:g}s`\n")
    print("| scenario simulations | wall time (whole command) | simulations/s | per core (2 jobs) |")
    print("|---|---|---|---|")
    print(f"| {sims:,} | {wall:.1f} s | {sims / wall:,.0f} | {sims / wall / 2:,.0f} |")


def part_bound(args, work: Path) -> None:
    from hints.tasks import PipelineShape
    from runtime.sched.bounds import split_bound

    print("\n### Tuned hints against the lower bound (simulation, 1f1b budget, jitter 0.1, held-out scenarios)\n")
    print("| workload | ranks | time budget | written out | its rule | written out / bound | best built-in / bound "
          "| fixed 1F1B / bound |")
    print("|---|---|---|---|---|---|---|---|")
    for workload in ("language", "multimodal"):
        for ranks, budget, scenarios in ((32, args.time_budget, 16), (128, 5 * args.time_budget, 4)):
            out = work / f"bound-{workload}-{ranks}"
            data = rrfp("tune-hint", "--workload", workload, "-p", str(ranks), "-m", str(4 * ranks), "--jitter",
                        "0.1", "--time-budget", f"{budget:g}s", "--scenarios", str(scenarios), "--jobs", "2",
                        "--out", str(out))
            # The bound of each held-out scenario, from the same model and seeds tune-hint drew.
            from runtime.durations.variability import VariabilityModel
            from runtime.tune.scenarios import from_model

            shape = PipelineShape(ranks, 1, 4 * ranks)
            held = from_model(VariabilityModel(workload=workload, jitter=0.1), shape, scenarios, scenarios, 0).holdout
            bound = statistics.fmean(split_bound(shape, s.table).value for s in held)
            rows = {r["row"]: r for r in data["rows"]}
            chosen = rows["written out"]
            builtin = rows.get("best built-in")
            baseline = rows.get("best baseline")
            cells = [f"{row['holdout']['mean'] / bound:.3f}" if row else "-" for row in (chosen, builtin, baseline)]
            print(f"| {workload} | {ranks} | {budget:g} s | {chosen['hint']} | {chosen['rule']} | " + " | ".join(cells)
                  + " |")


def part_runs(args, work: Path) -> None:
    from runtime.tune.decide import gain_range

    print("\n### Predicted and realized: emulated, 8 ranks x 32 microbatches, 20 ms forward per rank\n")
    print("Base run: ready (lookahead) with the 1f1b hint, 10 iterations, seed 0, traced. tune-hint on it "
          f"({args.time_budget:g} s). Then one launch, seed 1 (data the tuning never saw), 10 iterations: the tuned "
          "job, the best built-in and fixed 1F1B. Predicted: held-out mean makespan (p10..p90); realized: median "
          "over iterations 1..9. Gains are over fixed 1F1B. The predicted gain shows its per-iteration p10..p90, "
          "then the range --check uses: that, widened by the simulator's error measured on the base run "
          "(docs/tuning.md); inside means inside that range.\n")
    print("| workload | budget | written out | predicted tuned | realized tuned | realized best built-in | "
          "realized fixed 1F1B | predicted gain (p10..p90; range) | realized gain | inside |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for emulate in ("multimodal", "language"):
        for budget in ("1f1b", "2x"):
            tag = f"{emulate}-{budget}"
            base = work / f"base-{tag}"
            rrfp("run", "--workload", "emulated", "--emulate", emulate, "--stages", "8", "--microbatches", "32",
                 "--iters", "10", "--jitter", "0.1", "--memory-budget", budget, "--out", str(base))
            tuned = work / f"tuned-{tag}"
            report = rrfp("tune-hint", str(base), "--memory-budget", budget, "--time-budget",
                          f"{args.time_budget:g}s", "--jobs", "2", "--out", str(tuned))
            rows = {r["row"]: r for r in report["rows"]}
            builtin = rows["best built-in"]
            jobs = _side_by_side(work / f"check-{tag}", tuned / "job.toml", builtin, emulate, budget)
            realized = {name: statistics.median(m["makespan_seconds"] for m in metrics[1:])
                        for name, metrics in jobs.items()}
            fixed_by_it = [m["makespan_seconds"] for m in jobs["fixed"][1:]]
            tuned_by_it = [m["makespan_seconds"] for m in jobs["tuned"][1:]]
            gain = statistics.median((f - t) / f for f, t in zip(fixed_by_it, tuned_by_it))
            p = report["prediction"]
            g = p.get("gain_over_fixed_1f1b", {})
            low, high = gain_range(g) if g else (float("nan"), float("nan"))
            inside = g and low <= gain <= high
            print(f"| {emulate} | {budget} | {report['verdict']['hint']} ({report['verdict']['rule']}) | "
                  f"{p['makespan']['mean'] * 1e3:.0f} ms ({p['makespan_range'][0] * 1e3:.0f}..{p['makespan_range'][1] * 1e3:.0f}) | "
                  f"{realized['tuned'] * 1e3:.0f} ms | {realized['builtin'] * 1e3:.0f} ms | {realized['fixed'] * 1e3:.0f} ms | "
                  f"{g.get('estimate', float('nan')):+.1%} ({g.get('p10', float('nan')):+.1%}..{g.get('p90', float('nan')):+.1%}; "
                  f"{low:+.1%}..{high:+.1%}) | "
                  f"{gain:+.1%} | {'yes' if inside else 'NO'} |")


def _side_by_side(out: Path, job_toml: Path, builtin: dict, emulate: str, budget: str) -> dict:
    """The tuned job, the best built-in and fixed 1F1B in one launch (same processes, same load), seed 1."""
    from runtime.config import build_config, load_toml
    from runtime.run.launch import launch
    from runtime.run.worker import Job, WorkerOptions

    tuned = build_config(load_toml(job_toml), {"seed": 1, "iters": 10, "trace": False})
    common = dict(workload="emulated", emulate=emulate, ranks=8, microbatches=32, iters=10, jitter=0.1, seed=1,
                  forward_time=tuned.forward_time, trace=False)
    rule = builtin["rule"]
    hint = builtin["hint"].removesuffix(" (traced)")
    best = build_config({}, {**common, "hint": hint, "policy": "fixed" if rule == "fixed" else "ready",
                             "memory_budget": budget, **({"lookahead": rule == "lookahead"} if rule != "fixed" else {})})
    fixed = build_config({}, {**common, "hint": "1f1b", "policy": "fixed"})
    jobs = [Job("tuned", tuned, str(out / "tuned")), Job("builtin", best, str(out / "builtin")),
            Job("fixed", fixed, str(out / "fixed"))]
    results = launch(jobs, WorkerOptions(str(out), timeout=180), 8)[0]
    return {job.name: results[job.name]["metrics"] for job in jobs}


PARTS = {"speed": part_speed, "bound": part_bound, "runs": part_runs}


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--time-budget", type=float, default=60.0)
    parser.add_argument("--work", default="runs/bench-tune")
    args = parser.parse_args()
    parser.positive(args, "time_budget")  # tune-hint's search needs some time
    parser.folder(args.work, "--work")
    work = Path(args.work) / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, CPython {platform.python_version()}; "
          f"{time.strftime('%Y-%m-%d')}")
    for part in dict.fromkeys(args.parts):  # once each: a part's tune-hint runs write new directories
        PARTS[part](args, work.resolve())


if __name__ == "__main__":
    run(main)
