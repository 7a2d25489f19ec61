"""docs/benchmarks/tp-dp.md: ready vs fixed order with --tp and --dp, TP coordination, DP overlap.

    python benchmarks/tp_dp.py [--iters 10] [--repeats 3] [--budgets 1f1b,2x] [--only NAME,...]
                               [--out runs/bench-tp-dp] [--json]

Runs, each with ``rrfp run`` (traces on), and reads back what they wrote:

1. emulated multimodal (jitter 0.2), pp=4 x tp=2 (8 processes), ``--compare``: fixed 1F1B vs ready 1F1B
   at each memory budget (at ``1f1b`` the same memory as the fixed order; ``2x`` lets ready hold more,
   marked), and zb the same way (fixed zb vs ready zb);
2. emulated multimodal, pp=2 x dp=2 (4 processes), ``--compare``, the same hints and budgets;
3. gpt, pp=2 x tp=2 and pp=2 x dp=2 (4 processes each), readiness-first 1F1B: the TP coordination cost on
   millisecond tasks, and the DP overlap with real gradients; and pp=2 x dp=2 with 2 chunks per rank
   (interleaved-1f1b), where a rank's other stage gives its first reduction later backwards to hide behind.

``--only`` runs only the named runs (``emulated-pp4-tp2``, ``emulated-pp2-dp2``, ``gpt-pp2-tp2``,
``gpt-pp2-dp2``, ``gpt-pp2v2-dp2``).

Figures: median step time of each job (rank 0's wall clock per iteration, iteration 0 left out) and
ready-X over fixed-X for the same hint, with the peak microbatches in flight of both (equal memory when
ready's is no higher); per TP decision, the leader's time posting it (``announce``) and its share of the
median iteration makespan, the followers' follow latency, and how long after the leader's copy of an input
the follower's own copy arrived (``rrfp trace follow``); for DP, the
all-reduce time and the part of it exposed after each rank's last task, over every rank and iteration
but 0 (``metrics.parquet``: ``dp_reduce_seconds``, ``dp_exposed_seconds``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _cli import Parser, run

from hints.errors import UserError
from hints.tasks import PipelineShape
from runtime.sched.budget import MemoryBudget

ROOT = Path(__file__).resolve().parents[1]
EMULATED = ["--workload", "emulated", "--emulate", "multimodal", "--jitter", "0.2"]


def rrfp(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "rrfp_cli", *args, "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"rrfp {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def compare(out: Path, name: str, args: list[str], hint: str, budget: str, iters: int) -> dict:
    data = rrfp("run", *args, "--hint", hint, "--memory-budget", budget, "--iters", str(iters), "--compare",
                "--out", str(out / f"{name}@{budget}"))
    jobs = {job["job"]: job for job in data["jobs"]}
    fixed, ready = jobs[f"fixed-{hint}"], data["jobs"][-1]
    return {"run": name, "hint": hint, "budget": budget, "fixed_s": fixed["median_wall_seconds"],
            "ready_s": ready["median_wall_seconds"],
            "ready_over_fixed": fixed["median_wall_seconds"] / ready["median_wall_seconds"],
            "peak_fixed": fixed["peak_in_flight"], "peak_ready": ready["peak_in_flight"],
            "equal_memory": ready["peak_in_flight"] <= fixed["peak_in_flight"], "ready_dir": ready["out"]}


def follow(run_dir: str) -> dict:
    data = rrfp("trace", "follow", run_dir, "--limit", "1")
    leaders = [r for r in data["ranks"] if r["tp_rank"] == 0]
    followers = [r for r in data["ranks"] if r["tp_rank"] > 0]
    return {"announce_us": statistics.median(r["announce_us"] for r in leaders),
            "announce_share": max(r["announce_share"] for r in leaders),
            "follow_us": statistics.median(r["follow_us"] for r in followers),
            "delivery_us": statistics.median(r["delivery_us"] for r in followers),
            "input_lag_us": statistics.median(r["input_lag_us"] for r in followers
                                              if r["input_lag_us"] is not None)}


def overlap(run_dir: str) -> dict:
    import polars as pl

    metrics = pl.read_parquet(Path(run_dir) / "metrics.parquet").filter(pl.col("iteration") > 0)
    reduce = [x for row in metrics["dp_reduce_seconds"].to_list() for x in row]
    exposed = [x for row in metrics["dp_exposed_seconds"].to_list() for x in row]
    return {"reduce_ms": 1e3 * sum(reduce) / len(reduce), "exposed_ms": 1e3 * sum(exposed) / len(exposed),
            "hidden": 1 - sum(exposed) / sum(reduce) if sum(reduce) else None,
            "step_ms": 1e3 * statistics.median(metrics["wall_seconds"].to_list())}


# The emulated --compare runs: name, shape flags, which table, what to read from the ready job.
GRIDS = (("emulated-pp4-tp2", ["--stages", "4", "--tp", "2", "--microbatches", "16"], "tp", follow),
         ("emulated-pp2-dp2", ["--stages", "2", "--dp", "2", "--microbatches", "8"], "dp", overlap))
RUNS = (*(name for name, *_ in GRIDS), "gpt-pp2-tp2", "gpt-pp2-dp2", "gpt-pp2v2-dp2")  # what --only names


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budgets", default="1f1b,2x")
    parser.add_argument("--only", default=None, help="comma-separated run names (default: every run)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-tp-dp")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    parser.at_least(args, 2, "iters")  # the figures leave iteration 0 out
    parser.at_least(args, 1, "repeats")
    for budget in args.budgets.split(","):
        try:  # the emulated runs hold one chunk per rank
            MemoryBudget.parse(budget).per_rank(PipelineShape(2, 1, 8))
        except UserError as err:
            parser.error(f"--budgets: {err.what}")
    for name in [] if args.only is None else args.only.split(","):
        if name not in RUNS:
            parser.error(f"--only: {name!r} is not a run; use {', '.join(RUNS)}")
    parser.folder(args.out, "--out")
    args.out = args.out.resolve()  # rrfp runs in ROOT: a relative --out means this directory's, as everywhere
    results: dict = {"compare": [], "tp": [], "dp": []}
    wanted = None if args.only is None else set(args.only.split(","))
    runs = lambda name: wanted is None or name in wanted  # noqa: E731
    for repeat in range(args.repeats):
        out = args.out / f"r{repeat}"
        for budget in args.budgets.split(","):
            for name, shape, kind, measure in GRIDS:
                for hint in ("1f1b", "zb") if runs(name) else ():
                    row = compare(out, f"{name}-{hint}", [*EMULATED, *shape], hint, budget, args.iters)
                    results["compare"].append(row)
                    results[kind].append({"run": f"{row['run']}@{budget}", **measure(row["ready_dir"])})
        gpt = ["--workload", "gpt", "--stages", "2", "--microbatches", "8", "--iters", str(args.iters)]
        if runs("gpt-pp2-tp2"):
            tp = rrfp("run", *gpt, "--tp", "2", "--out", str(out / "gpt-pp2-tp2"))["jobs"][0]
            results["tp"].append({"run": "gpt-pp2-tp2@1f1b", **follow(tp["out"])})
        if runs("gpt-pp2-dp2"):
            dp = rrfp("run", *gpt, "--dp", "2", "--out", str(out / "gpt-pp2-dp2"))["jobs"][0]
            results["dp"].append({"run": "gpt-pp2-dp2@1f1b", **overlap(dp["out"])})
        if runs("gpt-pp2v2-dp2"):
            dp = rrfp("run", *gpt, "--chunks", "2", "--dp", "2", "--out", str(out / "gpt-pp2v2-dp2"))["jobs"][0]
            results["dp"].append({"run": "gpt-pp2v2-dp2@1f1b", **overlap(dp["out"])})
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"medians over {args.repeats} repeats (each repeat's value in brackets)\n")
    print("| run | hint | budget | fixed step (ms) | ready step (ms) | ready over fixed | "
          "peak in flight fixed / ready |")
    print("|---|---|---|---|---|---|---|")
    for key, rows in _groups(results["compare"], ("run", "hint", "budget")):
        equal = all(r["equal_memory"] for r in rows)
        print(f"| {key[0]} | {key[1]} | {key[2]} | {_median(rows, 'fixed_s', 1e3, '.1f')} | "
              f"{_median(rows, 'ready_s', 1e3, '.1f')} | {_median(rows, 'ready_over_fixed', 1, '.3f')}x | "
              f"{max(r['peak_fixed'] for r in rows)} / {max(r['peak_ready'] for r in rows)}"
              f"{'' if equal else ' (ready held more)'} |")
    print("\n| run (ready job) | announce per decision (us) | announce share of step | follow latency (us) | "
          "decision delivery (us) | input lag behind the leader's (us) |")
    print("|---|---|---|---|---|---|")
    for (run,), rows in _groups(results["tp"], ("run",)):
        print(f"| {run} | {_median(rows, 'announce_us', 1, '.0f')} | {_median(rows, 'announce_share', 100, '.2f')}% | "
              f"{_median(rows, 'follow_us', 1, '.0f')} | {_median(rows, 'delivery_us', 1, '.0f')} | "
              f"{_median(rows, 'input_lag_us', 1, '.0f')} |")
    print("\n| run (ready job) | all-reduce per rank-step (ms) | exposed (ms) | hidden | step (ms) |")
    print("|---|---|---|---|---|")
    for (run,), rows in _groups(results["dp"], ("run",)):
        print(f"| {run} | {_median(rows, 'reduce_ms', 1, '.2f')} | {_median(rows, 'exposed_ms', 1, '.2f')} | "
              f"{_median(rows, 'hidden', 100, '.0f')}% | {_median(rows, 'step_ms', 1, '.1f')} |")


def _groups(rows: list[dict], keys: tuple[str, ...]) -> list[tuple[tuple, list[dict]]]:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    return list(groups.items())


def _median(rows: list[dict], key: str, scale: float, fmt: str) -> str:
    values = [r[key] * scale for r in rows if r[key] is not None]
    if not values:
        return "-"
    each = " ".join(format(v, fmt) for v in values)
    return f"{format(statistics.median(values), fmt)} [{each}]" if len(values) > 1 else format(values[0], fmt)


if __name__ == "__main__":
    run(main)
