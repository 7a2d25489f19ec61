"""Tracing benchmarks: overhead on a real run, reader speed on a large trace, and the bubble breakdown.

    .venv/bin/python benchmarks/trace_bench.py [--stages 8] [--microbatches 32] [--iters 5] [--events 1000000]
    .venv/bin/python benchmarks/trace_bench.py --reader-only   # part 2 alone

1. Overhead: one launch of `--stages` ranks running, on the emulated
   multimodal model, fixed 1F1B and ready zb@2x each with tracing off and on
   (jobs alternate off/on). Median step time over iterations after the first;
   ratio on/off per policy.
2. Reader: a synthetic trace of about `--events` TrackEvent packets written
   by the real TraceRecorder (no processes), then read into frames; seconds
   to read, median of 3, and the ratio to a plain protobuf parse of the
   whole file (the floor for any reader built on the perfetto protos).
3. The bubble breakdown (`rrfp trace bubbles` on the traced jobs of 1).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from hints.tasks import Task
from profiler.trace.reader import read_trace
from profiler.trace.recorder import TraceRecorder, merge_run_traces
from runtime.comm.inbox import Arrival
from runtime.comm.links import Sent
from runtime.config import RunConfig
from runtime.exec.recording import RecorderSetup, TaskSpan
from runtime.run.launch import launch
from runtime.run.worker import Job, WorkerOptions
from runtime.sched.arbiter import Decision

ROOT = Path(__file__).resolve().parent.parent
TRACER = "profiler.trace.recorder:TraceRecorder"


def overhead(args, out: Path) -> dict[str, str]:
    base = dict(workload="emulated", emulate="multimodal", ranks=args.stages, microbatches=args.microbatches,
                iters=args.iters, forward_time=args.forward_time, seed=1)
    configs = {"fixed-1f1b": RunConfig(**base, hint="1f1b", policy="fixed"),
               "ready-zb@2x": RunConfig(**base, hint="zb", policy="ready", memory_budget="2x")}
    jobs = []
    for name, config in configs.items():
        for traced in (False, True):
            label = f"{name}-{'trace' if traced else 'off'}"
            jobs.append(Job(label, config, str(out / label), recorder=TRACER if traced else None))
    results = launch(jobs, WorkerOptions(str(out), timeout=120), args.stages)[0]
    for job in jobs:
        if job.recorder:
            merge_run_traces(Path(job.out_dir))
    print(f"\n### Tracing overhead ({args.stages} ranks, {args.microbatches} microbatches, emulated multimodal, "
          f"{args.iters} iterations, median step after the first)\n")
    print("| job | tracing off | tracing on | on / off |")
    print("|---|---|---|---|")
    for name in configs:
        off = statistics.median(r["wall_seconds"] for r in results[f"{name}-off"]["metrics"][1:])
        on = statistics.median(r["wall_seconds"] for r in results[f"{name}-trace"]["metrics"][1:])
        print(f"| {name} | {off * 1e3:.1f} ms | {on * 1e3:.1f} ms | {on / off:.3f} |")
    return {name: str(out / f"{name}-trace") for name in configs}


def synthetic_trace(out: Path, events: int) -> int:
    """Write a trace of about ``events`` packets through TraceRecorder; returns the task count."""
    ranks, microbatches = 8, 64
    per_task = 11  # task 2 + decision 2 + counters 3 + about 2 send + 2 receive packets
    iterations = max(1, events // (ranks * microbatches * 2 * per_task))
    config = RunConfig(workload="emulated", ranks=ranks, microbatches=microbatches, iters=iterations)
    tasks = 0
    for rank in range(ranks):
        setup = RecorderSetup(rank, ranks, str(out), "synthetic", config, torch.device("cpu"), 0, 0, None)
        recorder = TraceRecorder(setup)
        order = tuple(Task(rank, kind, mb) for kind in (Task.parse("0F0").kind, Task.parse("0B0").kind)
                      for mb in range(microbatches))
        now = 0
        for iteration in range(iterations):
            recorder.begin_iteration(iteration, now, order)
            sends = []
            for h, task in enumerate(order):
                start, end = now + 1000, now + 11000
                recorder.decision(iteration, Decision(start / 1e9, rank, task, h, None, ((task, h),), (), 1), 1000)
                recorder.task_finished(TaskSpan(iteration, task, start, end, 1000, {"units": 4}))
                recorder.counters(iteration, end, {"ready": 1, "in_flight": 1, "activation_bytes": 4096})
                sequence = iteration * len(order) + h + 1
                recorder.arrival(iteration, Arrival((rank - 1) % ranks, sequence, iteration, task,
                                                    (torch.zeros(1),), end, end + 500))
                sends.append(Sent((rank + 1) % ranks, sequence, iteration, task, 4096, end, end, end + 400))
                now = end
                tasks += 1
            recorder.end_iteration(iteration, now, sends)
        recorder.close()
    merge_run_traces(out)
    return tasks


def _median_seconds(run, repeats: int = 3) -> tuple[float, float, object]:
    """Median wall and CPU (this process) seconds of ``repeats`` calls of ``run``, and the last result. CPU time
    is the figure to compare on a shared machine, where other work stretches the wall clock."""
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        result = run()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), result


def reader_speed(args, out: Path) -> None:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    began = time.perf_counter()
    tasks = synthetic_trace(out, args.events)
    written = time.perf_counter() - began
    path = out / "trace.pftrace"
    read, read_cpu, frames = _median_seconds(lambda: read_trace(path))
    plain, plain_cpu, _ = _median_seconds(lambda: Trace.FromString(path.read_bytes()))
    rows = sum(f.height for f in frames.frames().values())
    print("\n### Reader speed\n")
    print(f"synthetic trace: {frames.packets:,} packets (TrackEvents and descriptors) for {tasks:,} tasks, "
          f"{path.stat().st_size / 2**20:.1f} MiB, written in {written:.1f} s; {rows:,} frame rows; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    print("| step | wall, median of 3 | CPU, median of 3 | CPU per packet | CPU vs plain parse |")
    print("|---|---|---|---|---|")
    for name, wall, cpu in (("plain protobuf parse of the whole file (`Trace.FromString`)", plain, plain_cpu),
                            ("read_trace (parse + frames)", read, read_cpu)):
        print(f"| {name} | {wall:.2f} s | {cpu:.2f} s | {cpu / frames.packets * 1e6:.2f} us | "
              f"{cpu / plain_cpu:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=32)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--forward-time", type=float, default=0.02)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--out", default="runs/bench-trace")
    parser.add_argument("--reader-only", action="store_true", help="Only part 2 (reader speed).")
    args = parser.parse_args()
    out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, CPython {platform.python_version()}, "
          f"torch {torch.__version__}")
    if args.reader_only:
        reader_speed(args, out / "synthetic")
        return
    traced = overhead(args, out / "runs")
    reader_speed(args, out / "synthetic")
    for name, run in traced.items():
        print(f"\n### `rrfp trace bubbles` of {name}\n\n```")
        done = subprocess.run([sys.executable, "-m", "rrfp_cli", "trace", "bubbles", run], cwd=ROOT,
                              capture_output=True, text=True, env={**os.environ, "COLUMNS": "140"})
        print(done.stdout.rstrip())
        print("```")


if __name__ == "__main__":
    main()
