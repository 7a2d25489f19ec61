"""What the executor's profiler ranges cost per task ([Note: profiler ranges] in runtime/exec/ranges.py).

    .venv/bin/python benchmarks/record_function_cost.py [--tasks 20000] [--profiled-tasks 2000] [--repeats 9]

In this process, one thread, CPU. A "task" is one call of a small handler shaped like the executor's
(``handler(iteration, task, tid)``, an 8x8 matmul), cycling through rank 0's tasks of interleaved 1F1B on 4 ranks
x 2 chunks x 8 microbatches (so the ranges' names are the real ``PP:<task>`` ones). Each repeat runs every
variant once, in turn, ``--tasks`` calls each (``--profiled-tasks`` under the profiler, which keeps every
event in memory):

* ``bare``: the handler call alone;
* ``ranges, no profiler``: ``with TaskRanges.around(task): handler(...)``, the executor's loop, nothing recording;
* ``ranges switched off``: the same with ``RRFP_PROFILER_RANGES=0`` (``TaskRanges(enabled=False)``);
* ``record_function, no profiler``: ``torch.profiler.record_function`` around every call unchecked (what the
  check saves);
* ``bare, profiler on`` and ``ranges, profiler on``: the first two under ``torch.profiler.profile()``
  (CPU activity), each repeat a profiler of its own.

Reported: the median over repeats of the time per task, and the overhead per task over the bare call in the
same profiler state, in microseconds. Output: Markdown on stdout (command, machine, table). Bad arguments print
one ``error:`` line and exit 2.
"""

from __future__ import annotations

import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from _cli import Parser, run

from hints.orders import builtin_hint
from runtime.exec.ranges import TaskRanges


def _tasks():
    return list(builtin_hint("interleaved-1f1b", 4, 2, 8).orders[0])


def _handler() -> Callable:
    a, b = torch.randn(8, 8), torch.randn(8, 8)

    def handler(iteration, task, tid):
        return (torch.mm(a, b),)

    return handler


def _bare(tasks, handler, calls: int) -> int:
    n = len(tasks)
    began = time.perf_counter_ns()
    for i in range(calls):
        task = tasks[i % n]
        handler(0, task, i)
    return time.perf_counter_ns() - began


def _ranged(ranges: TaskRanges) -> Callable:
    def run(tasks, handler, calls: int) -> int:
        n = len(tasks)
        began = time.perf_counter_ns()
        for i in range(calls):
            task = tasks[i % n]
            with ranges.around(task):  # exactly the executor's loop (StageExecutor._run_task)
                handler(0, task, i)
        return time.perf_counter_ns() - began

    return run


def _unchecked(tasks, handler, calls: int) -> int:
    names = [f"PP:{t}" for t in tasks]
    n = len(tasks)
    began = time.perf_counter_ns()
    for i in range(calls):
        task = tasks[i % n]
        with torch.profiler.record_function(names[i % n]):
            handler(0, task, i)
    return time.perf_counter_ns() - began


def _profiled(run: Callable) -> Callable:
    def profiled(tasks, handler, calls: int) -> int:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            elapsed = run(tasks, handler, calls)
        names = {e.name for e in prof.events()}
        if run is not _bare and f"PP:{tasks[0]}" not in names:
            raise SystemExit(f"error: no PP:{tasks[0]} range recorded under the profiler")
        return elapsed

    return profiled


def measure(calls: int, profiled_calls: int, repeats: int) -> dict[str, float]:
    """Median microseconds per task of each variant, every repeat running every variant once, in turn."""
    tasks, handler = _tasks(), _handler()
    on = TaskRanges(torch.device("cpu"), enabled=True)
    variants = {
        "bare": (_bare, calls),
        "ranges, no profiler": (_ranged(on), calls),
        "ranges switched off": (_ranged(TaskRanges(torch.device("cpu"), enabled=False)), calls),
        "record_function, no profiler": (_unchecked, calls),
        "bare, profiler on": (_profiled(_bare), profiled_calls),
        "ranges, profiler on": (_profiled(_ranged(on)), profiled_calls),
    }
    for run, count in variants.values():  # warm-up: first calls, the profiler's first start
        run(tasks, handler, min(count, 500))
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, (run, count) in variants.items():
            times[name].append(run(tasks, handler, count) / count / 1e3)
    return {name: statistics.median(values) for name, values in times.items()}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def render(medians: dict[str, float], args) -> str:
    bare, bare_on = medians["bare"], medians["bare, profiler on"]
    lines = ["| variant | per task (us) | over the bare call (us) |", "|---|---:|---:|"]
    for name, value in medians.items():
        base = bare_on if name.endswith("profiler on") else bare
        over = "" if name.startswith("bare") else f"{value - base:+.3f}"
        lines.append(f"| {name} | {value:.3f} | {over} |")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    header = [
        f"`{shlex.join(['.venv/bin/python', 'benchmarks/record_function_cost.py', *sys.argv[1:]])}`",
        "",
        f"Machine: {os.cpu_count()} CPUs ({_cpu_model()}), Python {platform.python_version()}, torch "
        f"{torch.__version__}, {torch.get_num_threads()} thread(s); load average {load:.2f} at the end. "
        f"Medians of {args.repeats} repeats; {args.tasks} tasks per repeat ({args.profiled_tasks} under the "
        "profiler).",
        "",
    ]
    return "\n".join(header + lines)


def main(argv: list[str] | None = None) -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20000, help="handler calls per variant and repeat")
    parser.add_argument("--profiled-tasks", type=int, default=2000, help="the same under the profiler")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    parser.at_least(args, 1, "tasks", "profiled_tasks", "repeats")
    torch.set_num_threads(1)
    print(render(measure(args.tasks, args.profiled_tasks, args.repeats), args))


if __name__ == "__main__":
    run(main)
