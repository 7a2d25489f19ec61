"""Foundation benchmarks: simulator throughput, arbiter decision latency, CLI start-up.

    .venv/bin/python benchmarks/foundation.py [--repeats 5]

Prints one Markdown table per measurement (medians over repeats) for
BENCHMARKS.md. Timings are wall-clock on whatever machine runs it; compare
ratios measured in one run, not numbers across machines.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hints.orders import builtin_hint
from runtime.arbiter import make_arbiter
from runtime.deps import TaskGraph
from runtime.simulator import simulate
from runtime.variability import VariabilityModel, sample_durations

ROOT = Path(__file__).resolve().parent.parent


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}, "
          f"{__import__('os').cpu_count()} CPUs")
    simulator_throughput(args.repeats)
    arbiter_latency(args.repeats)
    cli_startup(max(args.repeats, 10))


if __name__ == "__main__":
    main()
