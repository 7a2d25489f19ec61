"""Foundation benchmarks: simulator throughput, end to end cost per task, arbiter decision latency, CLI start-up.

    .venv/bin/python benchmarks/foundation.py [--repeats 5]
    .venv/bin/python benchmarks/foundation.py --against REV [--repeats 5]
    .venv/bin/python benchmarks/foundation.py --calls

Prints one Markdown table per measurement (medians over repeats) for
BENCHMARKS.md. Timings are wall-clock on whatever machine runs it; compare
ratios measured in one run, not numbers across machines.

``--against REV`` checks ``REV`` out into a temporary git worktree (outside
the repository) and measures the end-to-end cost there and here, side by
side: each in its own worker process (this interpreter, ``PYTHONPATH`` at one
tree), taking turns repeat by repeat so that both see the same machine load.
It prints that table only.

End to end is what ``rrfp simulate`` pays for one hint: sample the durations
(``sample_durations``), build the hint (``builtin_hint``), compile the graph
(``TaskGraph.build``) and simulate (``simulate``, which maps the durations onto
the graph with ``Durations.for_graph``), from nothing, with the cyclic garbage
collector on (collected before each repeat, outside the timing).

``--calls`` counts the work instead of timing it: one end-to-end run per rule at the smallest and the largest
size under ``cProfile``, the Python function calls per task and the profiled time per task (the profiler's
cost per call dominates it, so it follows the calls, not the memory hierarchy). Equal counts per task at both
sizes say the simulation is linear as an algorithm; what the timed table shows beyond that is the machine.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Only APIs every revision has: the --against worker imports this file against an older tree, whose
# modules may sit where they sat before runtime/ was split into rooms (1a37c5e and earlier). The layout is
# read off the tree that `runtime` came from: an editable install elsewhere would otherwise fill the gaps.
import runtime
from hints.orders import builtin_hint

if (Path(runtime.__file__).parent / "sched").is_dir():
    import runtime.sched.simulator as simulator_module
    from hints.deps import TaskGraph
    from runtime.durations.variability import VariabilityModel, sample_durations
    from runtime.sched.rules import make_arbiter
else:  # a tree from before the rooms
    import runtime.simulator as simulator_module
    from runtime.arbiter import make_arbiter
    from runtime.deps import TaskGraph
    from runtime.variability import VariabilityModel, sample_durations
simulate = simulator_module.simulate

ROOT = Path(__file__).resolve().parent.parent

# 1F1B hints of 8,192, 131,072 and 524,288 tasks (ranks x microbatches x 2).
E2E_SHAPES = ((32, 128), (128, 512), (256, 1024))
E2E_RULES = ("fixed", "greedy", "lookahead")
E2E_MODEL = dict(workload="multimodal", jitter=0.2, comm_latency=0.0005)


def _repeats_for(tasks: int, repeats: int) -> int:
    """More repeats for small shapes: a run of a few milliseconds is at the mercy of one noisy moment."""
    return repeats * max(1, 65_536 // tasks)


def simulator_throughput(repeats: int) -> None:
    ranks, microbatches = 128, 512
    model = VariabilityModel(workload="multimodal", jitter=0.2, comm_latency=0.0005)
    hint = builtin_hint("1f1b", ranks, 1, microbatches)
    table = sample_durations(model, hint.shape, 0)
    builds = []
    for _ in range(repeats):
        began = time.perf_counter()
        graph = TaskGraph.build(hint.shape)
        builds.append(time.perf_counter() - began)
    print(f"\n### Simulator: {ranks} stages x {microbatches} microbatches x 2 = {len(graph):,} tasks "
          f"(multimodal, jitter 0.2, latency 0.5 ms), median of {repeats}\n")
    print("| policy | simulate (graph reused) | tasks/s | graph build + simulate | tasks/s |")
    print("|---|---|---|---|---|")
    build = statistics.median(builds)
    for policy in ("fixed", "ready"):
        runs = []
        for _ in range(repeats):
            began = time.perf_counter()
            simulate(hint, table, policy, graph=graph)
            runs.append(time.perf_counter() - began)
        sim = statistics.median(runs)
        print(f"| {policy} | {sim:.3f} s | {len(graph) / sim:,.0f} | {sim + build:.3f} s | "
              f"{len(graph) / (sim + build):,.0f} |")


def end_to_end(ranks: int, microbatches: int, rule: str) -> float:
    """Seconds for one 1F1B hint from nothing to its simulated result (see the module docstring)."""
    model = VariabilityModel(**E2E_MODEL)
    gc.collect()
    began = time.perf_counter()
    hint = builtin_hint("1f1b", ranks, 1, microbatches)
    table = sample_durations(model, hint.shape, 0)
    graph = TaskGraph.build(hint.shape)
    simulate(hint, table, rule, graph=graph)
    return time.perf_counter() - began


def end_to_end_table(repeats: int) -> None:
    print(f"\n### End to end (sample + hint + graph + simulate), 1f1b, multimodal, median of {repeats} "
          f"({_repeats_for(2 * E2E_SHAPES[0][0] * E2E_SHAPES[0][1], repeats)} at the smallest shape), "
          f"the sizes taking turns in {repeats} rounds, each turn a fresh process after one uncounted run\n")
    print("| tasks | rule | seconds | us/task |")
    print("|---|---|---|---|")
    # Rounds, each running every case its share of times, so that a change of the machine's speed during the run
    # falls on every size alike instead of on whichever size was being measured (the linearity is a ratio of sizes).
    # Each turn runs in a fresh process, after one run that is not counted: in one process a small case measured
    # right after a large one paid for the memory and caches the large one left behind (2-3x per task at 8,192
    # tasks on the 2-core VM, even after a warm-up run), which is no cost of its size.
    cases = list(_e2e_cases(repeats))
    times: dict[tuple[int, str], list[float]] = {(tasks, rule): [] for _, _, tasks, rule, _ in cases}
    for _ in range(repeats):
        for ranks, microbatches, tasks, rule, count in cases:
            worker = _Worker(ROOT)
            try:
                worker.measure(ranks, microbatches, rule)
                times[tasks, rule].extend(worker.measure(ranks, microbatches, rule) for _ in range(count // repeats))
            finally:
                worker.close()
    per_task: dict[tuple[int, str], float] = {}
    for ranks, microbatches, tasks, rule, _ in cases:
        seconds = statistics.median(times[tasks, rule])
        per_task[tasks, rule] = seconds / tasks
        print(f"| {tasks:,} ({ranks} x {microbatches}) | {rule} | {seconds:.3f} | {seconds / tasks * 1e6:.2f} |")
    _print_linearity(per_task)


def _e2e_cases(repeats: int):
    """``(ranks, microbatches, tasks, rule, repeats at that size)`` for every end-to-end shape and rule."""
    for ranks, microbatches in E2E_SHAPES:
        tasks = 2 * ranks * microbatches
        for rule in E2E_RULES:
            yield ranks, microbatches, tasks, rule, _repeats_for(tasks, repeats)


def _print_linearity(per_task: dict[tuple[int, str], float]) -> None:
    smallest, largest = (2 * r * m for r, m in (E2E_SHAPES[0], E2E_SHAPES[-1]))
    ratios = ", ".join(f"{rule} {per_task[largest, rule] / per_task[smallest, rule]:.2f}x" for rule in E2E_RULES)
    print(f"\nPer-task cost at {largest:,} tasks over that at {smallest:,} tasks: {ratios}")


class _Worker:
    """A process measuring :func:`end_to_end` with ``PYTHONPATH`` at ``tree``, one repeat per request."""

    def __init__(self, tree: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(tree))
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--e2e-worker"], cwd=tree, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        hello = self._reply()
        if not Path(hello["simulator"]).resolve().is_relative_to(tree.resolve()):
            raise RuntimeError(f"the worker for {tree} imported {hello['simulator']}")
        self.rules: dict[str, str] = hello["rules"]

    def measure(self, ranks: int, microbatches: int, rule: str) -> float:
        self.process.stdin.write(f"{ranks} {microbatches} {rule}\n")
        self.process.stdin.flush()
        return self._reply()["seconds"]

    def _reply(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the benchmark worker exited with {self.process.wait()}")
        return json.loads(line)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def _worker_main() -> None:
    """--e2e-worker: announce the tree, then answer "ranks microbatches rule" lines with the seconds taken."""
    tiny = builtin_hint("1f1b", 2, 1, 2)
    names = {}  # rule asked for -> rule this revision runs: older ones know only "fixed" and "ready" (greedy)
    for rule in E2E_RULES:
        try:
            simulate(tiny, sample_durations(VariabilityModel(), tiny.shape, 0), rule)
            names[rule] = rule
        except Exception:
            names[rule] = "ready"
    print(json.dumps({"simulator": simulator_module.__file__, "rules": names}), flush=True)
    for line in sys.stdin:
        ranks, microbatches, rule = line.split()
        print(json.dumps({"seconds": end_to_end(int(ranks), int(microbatches), names[rule])}), flush=True)


def against(rev: str, repeats: int) -> None:
    """The end-to-end table for ``rev`` and this working tree, measured side by side."""
    commit = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    scratch = Path(tempfile.mkdtemp(prefix="rrfp-against-"))
    tree = scratch / commit
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=ROOT, capture_output=True,
                   check=True)
    try:
        old, new = _Worker(tree), _Worker(ROOT)
        try:
            _against_table(commit, old, new, repeats)
        finally:
            old.close()
            new.close()
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)


def _against_table(commit: str, old: _Worker, new: _Worker, repeats: int) -> None:
    smallest = 2 * E2E_SHAPES[0][0] * E2E_SHAPES[0][1]
    print(f"\n### End to end, {commit} (old) vs this tree (new): sample + hint + graph + simulate, 1f1b, "
          f"multimodal, median of {repeats} ({_repeats_for(smallest, repeats)} at {smallest:,} tasks), "
          f"old and new taking turns\n")
    substituted = [f"`{rule}` against its `{name}`" for rule, name in old.rules.items() if name != rule]
    if substituted:
        print(f"{commit} has no {' or '.join(r for r, n in old.rules.items() if n != r)} rule, so this compares "
              f"{', '.join(substituted)} (the policy `ready` without lookahead is `greedy`).\n")
    print("| tasks | rule | old s | new s | speedup | old us/task | new us/task |")
    print("|---|---|---|---|---|---|---|")
    per_task: dict[tuple[int, str], float] = {}
    for ranks, microbatches, tasks, rule, count in _e2e_cases(repeats):
        old_runs, new_runs = [], []
        for _ in range(count):
            old_runs.append(old.measure(ranks, microbatches, rule))
            new_runs.append(new.measure(ranks, microbatches, rule))
        old_s, new_s = statistics.median(old_runs), statistics.median(new_runs)
        per_task[tasks, rule] = new_s / tasks
        print(f"| {tasks:,} ({ranks} x {microbatches}) | {rule} | {old_s:.3f} | {new_s:.3f} | "
              f"{old_s / new_s:.2f}x | {old_s / tasks * 1e6:.2f} | {new_s / tasks * 1e6:.2f} |", flush=True)
    _print_linearity(per_task)


def arbiter_latency(repeats: int, ready_size: int = 64, decisions: int = 20000) -> None:
    """Median time of one decision (choose) and one arrival (available) with `ready_size` ready tasks."""
    microbatches = ready_size + decisions
    hint = builtin_hint("gpipe", 2, 1, microbatches)
    graph = TaskGraph.build(hint.shape)
    producers = [graph.tid(task) for task in hint.orders[0] if task.kind.value == "F"]
    choose_ns, arrive_ns = [], []
    clock = time.perf_counter_ns
    for _ in range(repeats):
        arbiter = make_arbiter("ready", graph, 1, hint.orders[1], budget=microbatches)
        for producer in producers[:ready_size]:
            arbiter.available(producer)
        for producer in producers[ready_size:]:
            t0 = clock()
            arbiter.choose()
            t1 = clock()
            arbiter.available(producer)
            t2 = clock()
            choose_ns.append(t1 - t0)
            arrive_ns.append(t2 - t1)
    print(f"\n### Arbiter (ready policy): {ready_size} tasks in the ready set, "
          f"{decisions:,} decisions x {repeats}\n")
    print("| operation | median | p90 |")
    print("|---|---|---|")
    for name, samples in (("choose() (decision)", choose_ns), ("available() (arrival)", arrive_ns)):
        samples.sort()
        print(f"| {name} | {statistics.median(samples) / 1e3:.2f} us | "
              f"{samples[int(len(samples) * 0.9)] / 1e3:.2f} us |")


def cli_startup(repeats: int) -> None:
    rrfp = [sys.executable, "-m", "rrfp_cli"]
    print(f"\n### CLI start-up, median of {repeats} runs\n")
    print("| command | median | torch imported |")
    print("|---|---|---|")
    for args in (["--help"], ["hints", "list"], ["simulate", "-p", "4", "-m", "8", "--json"]):
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            subprocess.run(rrfp + args, cwd=ROOT, capture_output=True, check=True)
            times.append(time.perf_counter() - began)
        probe = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "rrfp_cli", *args], cwd=ROOT, capture_output=True, text=True
        )
        torch_loaded = any(line.rstrip().endswith("| torch") for line in probe.stderr.splitlines())
        print(f"| rrfp {' '.join(args)} | {statistics.median(times):.3f} s | {'yes' if torch_loaded else 'no'} |")


def calls_per_task() -> None:
    """--calls: Python function calls and profiled time per task, smallest and largest end-to-end size."""
    import cProfile
    import pstats

    print("\n### End to end under cProfile: function calls per task (the algorithm's work), smallest and largest "
          "size\n")
    print("| rule | tasks | calls per task | profiled us per task | the ten most called, per task |")
    print("|---|---|---|---|---|")
    for rule in E2E_RULES:
        for ranks, microbatches in (E2E_SHAPES[0], E2E_SHAPES[-1]):
            profile = cProfile.Profile()
            profile.enable()
            end_to_end(ranks, microbatches, rule)
            profile.disable()
            stats = pstats.Stats(profile).stats
            tasks = 2 * ranks * microbatches
            calls = sum(row[1] for row in stats.values())
            spent = sum(row[2] for row in stats.values())
            top = sorted(((row[1], name) for (_, _, name), row in stats.items()), reverse=True)[:10]
            listed = ", ".join(f"{name} {count / tasks:.2f}" for count, name in top)
            print(f"| {rule} | {tasks:,} | {calls / tasks:.2f} | {spent / tasks * 1e6:.2f} | {listed} |", flush=True)


def main() -> None:
    from _cli import Parser  # here, not at the top: see the end of this file

    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--against", metavar="REV", help="compare end to end with git revision REV, side by side")
    parser.add_argument("--calls", action="store_true", help="count function calls per task instead of timing")
    args = parser.parse_args()
    parser.at_least(args, 1, "repeats")
    if args.against is not None:
        parser.commit(args.against, "--against")
    print(f"machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} CPUs")
    if args.against is not None:
        against(args.against, args.repeats)
        return
    if args.calls:
        calls_per_task()
        return
    simulator_throughput(args.repeats)
    end_to_end_table(args.repeats)
    arbiter_latency(args.repeats)
    cli_startup(max(args.repeats, 10))


if __name__ == "__main__":
    if sys.argv[1:] == ["--e2e-worker"]:  # a _Worker: maybe under an older tree (--against), without what _cli needs
        _worker_main()
    else:
        from _cli import run

        run(main)
