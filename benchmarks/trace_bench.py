"""Tracing benchmarks: overhead on a real run, reader speed on a large trace, and the bubble breakdown.

    .venv/bin/python benchmarks/trace_bench.py [--stages 8] [--microbatches 32] [--iters 5] [--events 1000000]
    .venv/bin/python benchmarks/trace_bench.py --reader-only   # part 2 alone

1. Overhead: one launch of `--stages` ranks running, on the emulated
   multimodal model, fixed 1F1B and ready zb@2x each with tracing off and on
   (jobs alternate off/on). Median step time over iterations after the first;
   ratio on/off per policy.
2. Reader: a synthetic trace of about `--events` TrackEvent packets written
   by the real TraceRecorder (no processes), then read into frames. The
   reader's CPU time as a multiple of a plain protobuf parse of the same file
   (`Trace.FromString`), its packets walked by the compiled reader (where it
   was built: [Note: the compiled reader] in profiler/trace/reader.py) and in
   Python (`RRFP_TRACE_COMPILED=0`), the steps taking turns for `--repeats`
   rounds on the same machine, medians, with the absolute figure beside it;
   and, for the Python walk's floors, a pass that only reads each packet's type, track and time (what
   any reader over the perfetto classes' Python objects pays before its first
   annotation), a pass that also reads every annotation's name and value (what
   decoding them into those objects costs before any row), and the first step
   of a reader on the raw bytes instead (each packet's bytes from protobuf's C
   framing, split into its fields by one regex pass; nothing decoded). Target
   (issue 26): the reader at most 3x the plain parse, judged on the walk
   `rrfp trace` runs on this machine.
   The reader runs with the frames cache off; a last step times what a
   second ``rrfp trace`` command on the same run pays: the cache's load
   (hashing the file included, [Note: the frames cache] in
   profiler/trace/cache.py).
3. The bubble breakdown (`rrfp trace bubbles` on the traced jobs of 1).
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _cli import Parser, run

from hints.tasks import Task
from profiler.trace.cache import keep
from profiler.trace.reader import compiled_reader, read_trace
from profiler.trace.recorder import TraceRecorder, merge_run_traces
from runtime.config import RunConfig
from runtime.exec.recording import RecorderSetup, TaskSpan
from runtime.run.launch import launch, preflight
from runtime.run.worker import Job, WorkerOptions
from runtime.sched.arbiter import Decision

ROOT = Path(__file__).resolve().parent.parent
TRACER = "profiler.trace.recorder:TraceRecorder"
READER_TARGET = 3.0  # read_trace's CPU time as a multiple of a plain parse of the same file (issue 26)


def overhead_configs(args) -> dict[str, RunConfig]:
    """The two jobs of part 1, each run with tracing off and on."""
    base = dict(workload="emulated", emulate="multimodal", ranks=args.stages, microbatches=args.microbatches,
                iters=args.iters, forward_time=args.forward_time, seed=1)
    return {"fixed-1f1b": RunConfig(**base, hint="1f1b", policy="fixed"),
            "ready-zb@2x": RunConfig(**base, hint="zb", policy="ready", memory_budget="2x")}


def overhead(args, out: Path) -> dict[str, str]:
    configs = overhead_configs(args)
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
    import torch

    from runtime.comm.inbox import Arrival
    from runtime.comm.links import Sent

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


def _walk(path: Path) -> int:
    """Parse, then read each packet's event type, track and timestamp and nothing else: the least any reader
    that builds frames from the perfetto classes' Python objects does (no annotation, no row)."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    kinds = 0
    for packet in Trace.FromString(path.read_bytes()).packet:
        event = packet.track_event
        kinds += event.type + (event.track_uuid & 1) + (packet.timestamp & 1)
    return kinds


def _walk_annotations(path: Path) -> int:
    """``_walk``, and for each event that carries annotations (slice begins, instants) each annotation's name and
    value read as the reader reads them (``WhichOneof``, the value, ``name_iid``): what decoding annotations
    into protobuf's Python objects costs before any row is built."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    kinds = 0
    for packet in Trace.FromString(path.read_bytes()).packet:
        event = packet.track_event
        kind = event.type
        kinds += kind + (event.track_uuid & 1) + (packet.timestamp & 1)
        if kind == 1 or kind == 3:
            for annotation in event.debug_annotations:
                which = annotation.WhichOneof("value")
                kinds += annotation.name_iid + (getattr(annotation, which) is None if which else 0)
    return kinds


def _split_raw(path: Path) -> int:
    """The first step of a reader that would skip protobuf's Python objects: frame the file into each packet's
    bytes (protobuf's C parser, with a one-field ``repeated bytes packet = 1`` message), join them with a marker
    no packet holds, and split every packet into its top-level fields (time, sequence, event bytes) with one
    regular expression pass. Nothing is decoded yet: no varint, no event, no annotation."""
    import re

    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    file = descriptor_pb2.FileDescriptorProto(name="trace_bench_raw.proto", package="trace_bench", syntax="proto2")
    field = descriptor_pb2.FieldDescriptorProto
    file.message_type.add(name="RawTrace").field.add(name="packet", number=1, type=field.TYPE_BYTES,
                                                      label=field.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    raw_trace = message_factory.GetMessageClass(pool.FindMessageTypeByName("trace_bench.RawTrace"))
    packets = raw_trace.FromString(path.read_bytes()).packet
    marker = b"\xff\xfe\xff\xfe\xff\xfe"
    joined = marker + marker.join(packets) + marker
    if joined.count(marker) != len(packets) + 1:
        raise RuntimeError("a packet holds the marker: the split below would not be one match per packet")
    varint, mark = rb"[\x80-\xff]{0,9}[\x00-\x7f]", re.escape(marker)
    # timestamp (field 8), trusted_packet_sequence_id (10), track_event (11: its length, then its bytes up to
    # sequence_flags = 2, field 13), in the recorder's order; any other packet whole
    split = re.compile(rb"(?s)" + mark + rb"(?:\x40(" + varint + rb")\x50(" + varint + rb")\x5a(" + varint +
                       rb")(.*?)\x68\x02|(.*?))(?=" + mark + rb")")
    return len(split.findall(joined))


def _interleaved(steps: dict[str, object], repeats: int) -> dict[str, tuple[list[float], list[float]]]:
    """Wall and CPU (this process) seconds of each step, ``repeats`` rounds, the steps taking turns within a
    round, so load from other work falls on all of them alike. CPU time is the figure to compare on a shared
    machine, where other work stretches the wall clock."""
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in steps}
    for _ in range(repeats):
        for name, run in steps.items():
            wall, cpu = time.perf_counter(), time.process_time()
            run()
            times[name][0].append(time.perf_counter() - wall)
            times[name][1].append(time.process_time() - cpu)
    return times


def reader_speed(args, out: Path) -> None:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    began = time.perf_counter()
    tasks = synthetic_trace(out, args.events)
    written = time.perf_counter() - began
    path = out / "trace.pftrace"
    frames = read_trace(path)
    keep(frames)  # the frames cache the last step loads ([Note: the frames cache])
    rows = sum(f.height for f in frames.frames().values())
    load = os.getloadavg()
    compiled = compiled_reader() is not None
    steps = {"plain protobuf parse of the whole file (`Trace.FromString`)": lambda: Trace.FromString(path.read_bytes()),
             "parse + each packet's type, track and time (`_walk`: no annotations, no rows)": lambda: _walk(path),
             "parse + `_walk` + each annotation's name and value (`_walk_annotations`: no rows)":
                 lambda: _walk_annotations(path),
             "bytes instead of objects: framing, then one regex pass splitting each packet into its fields "
             "(`_split_raw`: nothing decoded)": lambda: _split_raw(path),
             PYTHON_READ: lambda: _read_walking(path, compiled=False)}
    if compiled:
        steps[COMPILED_READ] = lambda: _read_walking(path, compiled=True)
    steps["read_trace, the frames cache beside the trace loaded (a later `rrfp trace` command)"] = \
        lambda: read_trace(path, cache=True)
    times = _interleaved(steps, args.repeats)
    plain = times[next(iter(steps))][1]
    load = f"{load[0]:.1f} before, {os.getloadavg()[0]:.1f} after"
    print("\n### Reader speed\n")
    print(f"synthetic trace: {frames.packets:,} packets (TrackEvents and descriptors) for {tasks:,} tasks, "
          f"{path.stat().st_size / 2**20:.1f} MiB, written in {written:.1f} s; {rows:,} frame rows; "
          f"load average {load} on {os.cpu_count()} CPUs; {args.repeats} rounds, the steps taking turns\n")
    print(f"| step | wall, median | CPU, median | CPU per packet | CPU vs plain parse, median of the {args.repeats} "
          "rounds (range) |")
    print("|---|---|---|---|---|")
    for name, (walls, cpus) in times.items():
        ratios = sorted(cpu / base for cpu, base in zip(cpus, plain))
        cpu = statistics.median(cpus)
        print(f"| {name} | {statistics.median(walls):.2f} s | {cpu:.2f} s | {cpu / frames.packets * 1e6:.2f} us | "
              f"{statistics.median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}x) |")
    print()
    for name, what in ((COMPILED_READ, "the compiled walk"), (PYTHON_READ, "the Python walk")):
        if name not in times:
            print("read_trace, the compiled walk: not in use here (not built, for want of a C compiler at install, "
                  "or turned off by RRFP_TRACE_COMPILED=0: docs/traces.md); the reader walks in Python")
            continue
        read = statistics.median(cpu / base for cpu, base in zip(times[name][1], plain))
        user = name == (COMPILED_READ if compiled else PYTHON_READ)
        print(f"read_trace, {what}{' (what `rrfp trace` runs here)' if user else ''}: {read:.2f}x a plain parse of "
              f"the same file ({statistics.median(times[name][1]):.2f} s CPU for {frames.packets:,} packets)"
              + (f"; target at most {READER_TARGET:g}x: {'met' if read <= READER_TARGET else 'not met'}" if user
                 else ""))
    print("The cached load does not decode the trace at all, so it is not a reader's multiple.")


PYTHON_READ = "read_trace, the packets walked in Python (`RRFP_TRACE_COMPILED=0`)"
COMPILED_READ = "read_trace, the packets walked by the compiled reader (the default where it is built)"


def _read_walking(path: Path, compiled: bool):
    """read_trace with the frames cache off, its packets walked in C or in Python ([Note: the compiled reader])."""
    before = os.environ.get("RRFP_TRACE_COMPILED")
    os.environ["RRFP_TRACE_COMPILED"] = "1" if compiled else "0"
    try:
        return read_trace(path, cache=False)
    finally:
        if before is None:
            del os.environ["RRFP_TRACE_COMPILED"]
        else:
            os.environ["RRFP_TRACE_COMPILED"] = before


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=32)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--forward-time", type=float, default=0.02)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5, help="Rounds of the reader timing (medians).")
    parser.add_argument("--out", default="runs/bench-trace")
    parser.add_argument("--reader-only", action="store_true", help="Only part 2 (reader speed).")
    args = parser.parse_args()
    parser.at_least(args, 1, "stages", "microbatches", "repeats")
    parser.at_least(args, 2, "iters")  # the median step leaves the first iteration out
    parser.folder(args.out, "--out")
    if not args.reader_only:
        preflight(list(overhead_configs(args).values()))  # --forward-time and the rest, before any rank starts
    import torch

    out = Path(args.out).resolve() / time.strftime("%Y%m%d-%H%M%S")  # absolute: `rrfp trace bubbles` runs in ROOT
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
    run(main)
