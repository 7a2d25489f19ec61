"""Hand-built rrfp traces with known answers, written through the real TraceRecorder (no processes).

``build_run(tmp_path, ranks, tasks, transfers, ...)`` takes per-rank task spans
in microseconds and transfers (producer, src, dst, send start/end, arrival) and
writes a run directory with ``trace.pftrace``, exactly as ``rrfp run`` would.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hints.orders import builtin_hint
from hints.tasks import Task
from profiler.trace.recorder import TraceRecorder, merge_run_traces
from runtime.comm.inbox import Arrival
from runtime.comm.links import Sent
from runtime.config import RunConfig
from runtime.exec.recording import RecorderSetup, TaskSpan
from runtime.sched.arbiter import Decision

US = 1000  # ns per microsecond


def build_run(
    root: Path,
    ranks: int,
    microbatches: int,
    tasks: dict[int, list[tuple[str, float, float]]],
    transfers: list[tuple[str, int, int, float, float, float]],
    hint: str = "1f1b",
    policy: str = "fixed",
    orders: dict[int, list[str]] | None = None,
    iterations: int = 1,
    period_us: float = 0.0,
    held_back: dict[str, tuple[str, ...]] | None = None,
    steps: dict[int, tuple[float, float, float]] | None = None,
    memory_budget: str = "1f1b",
    killed_rank: int | None = None,
) -> Path:
    """Write ``root/trace.pftrace``. Iteration k repeats the spans shifted by ``k * period_us``.

    ``held_back``: per task, the admissions the budget held back at the decision that chose it; ``steps``: per
    rank, its optimizer step's (start, barrier, end) after each iteration; ``killed_rank``: that rank was killed
    during the last iteration, so its trace ends with the iteration before (a rank writes an iteration when it
    ends), and the last iteration holds only the other ranks' tasks.
    """
    config = RunConfig(workload="gpt", ranks=ranks, microbatches=microbatches, hint=hint, policy=policy,
                       memory_budget=memory_budget)
    base = builtin_hint(hint, ranks, 1, microbatches)
    for rank in range(ranks):
        setup = RecorderSetup(rank, ranks, str(root), "hand-made", config, torch.device("cpu"), 0, 0, None)
        recorder = TraceRecorder(setup)
        order = tuple(Task.parse(t) for t in (orders or {}).get(rank, [str(x) for x in base.orders[rank]]))
        for iteration in range(iterations - (rank == killed_rank)):
            shift = int(iteration * period_us * US)
            spans = sorted(tasks[rank], key=lambda s: s[1])
            recorder.begin_iteration(iteration, shift + int(spans[0][1] * US), order)
            idle_since = shift + int(spans[0][1] * US)
            for text, start, end in spans:
                task = Task.parse(text)
                start_ns, end_ns = shift + int(start * US), shift + int(end * US)
                h = order.index(task)
                held = tuple(Task.parse(t) for t in (held_back or {}).get(text, ()))
                recorder.decision(iteration, Decision(start_ns / 1e9, rank, task, h, None, ((task, h),), held, 1),
                                  start_ns - idle_since)
                recorder.task_finished(TaskSpan(iteration, task, start_ns, end_ns, start_ns - idle_since,
                                                {"units": 8}))
                recorder.counters(iteration, end_ns, {"ready": 0, "in_flight": 1, "activation_bytes": 64})
                idle_since = end_ns
            sends = []
            for sequence, (producer, src, dst, send_start, send_end, arrival) in enumerate(transfers, start=1):
                if dst == rank:
                    recorder.arrival(iteration, Arrival(src, sequence, iteration, Task.parse(producer), (torch.zeros(2),),
                                                        shift + int(send_end * US), shift + int(arrival * US)))
                if src == rank:
                    sends.append(Sent(dst, sequence, iteration, Task.parse(producer), 8, shift + int(send_start * US),
                                      shift + int(send_start * US), shift + int(send_end * US)))
            recorder.end_iteration(iteration, shift + int(max(e for _, _, e in spans) * US), sends)
            if steps and rank in steps:
                recorder.optimizer_step(iteration, *(shift + int(t * US) for t in steps[rank]))
        recorder.close()
    merge_run_traces(root)
    return root


# Two ranks, two microbatches, fixed 1F1B (ranks' orders 0F0 0F1 0B0 0B1 / 1F0 1B0 1F1 1B1).
ONE_F_ONE_B = dict(
    ranks=2, microbatches=2,
    tasks={0: [("0F0", 0, 10), ("0F1", 10, 20), ("0B0", 40, 60), ("0B1", 70, 90)],
           1: [("1F0", 12, 22), ("1B0", 22, 37), ("1F1", 37, 47), ("1B1", 47, 67)]},
    transfers=[("0F0", 0, 1, 10, 11, 12), ("0F1", 0, 1, 20, 21, 22), ("1B0", 1, 0, 37, 38, 40),
               ("1B1", 1, 0, 67, 68, 70)],
)

# Rank 0 runs 0F0 0B0 0F1 0B1 and idles 10..40 waiting for 0B0 although 0F1 was ready from the start.
MISALIGNED = dict(
    ranks=2, microbatches=2,
    tasks={0: [("0F0", 0, 10), ("0B0", 40, 60), ("0F1", 60, 70), ("0B1", 95, 115)],
           1: [("1F0", 12, 22), ("1B0", 22, 37), ("1F1", 72, 82), ("1B1", 82, 92)]},
    transfers=[("0F0", 0, 1, 10, 11, 12), ("1B0", 1, 0, 37, 38, 40), ("0F1", 0, 1, 70, 71, 72),
               ("1B1", 1, 0, 92, 93, 95)],
    orders={0: ["0F0", "0B0", "0F1", "0B1"], 1: ["1F0", "1B0", "1F1", "1B1"]},
)


def packet_bounds(data: bytes) -> list[tuple[int, int]]:
    """``(start, end)`` of each top-level packet of a trace file (its header included)."""
    from profiler.trace.schema import next_field

    bounds, pos = [], 0
    while pos < len(data):
        _, following = next_field(data, pos)
        bounds.append((pos, following))
        pos = following
    return bounds


def corrupt_packet(data: bytes, index: int) -> bytes:
    """``data`` with packet ``index``'s body replaced by bytes that are no TracePacket; the framing stays intact."""
    from profiler.trace.schema import next_field

    start, end = packet_bounds(data)[index]
    field, _ = next_field(data, start)
    return data[:field.start] + b"\xff" * (field.end - field.start) + data[end:]


def drop_last_packet(data: bytes, matches) -> bytes:
    """``data`` without the last packet for which ``matches(TracePacket)`` holds."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TracePacket

    from profiler.trace.schema import next_field

    bounds = packet_bounds(data)
    for start, end in reversed(bounds):
        field, _ = next_field(data, start)
        if matches(TracePacket.FromString(data[field.start:field.end])):
            return data[:start] + data[end:]
    raise ValueError("no packet matches")


def build_taskless_run(root: Path, ranks: int = 2) -> Path:
    """A run whose ranks traced an iteration without running a task (metadata, iteration slices, no compute)."""
    config = RunConfig(workload="gpt", ranks=ranks, microbatches=2)
    for rank in range(ranks):
        setup = RecorderSetup(rank, ranks, str(root), "hand-made", config, torch.device("cpu"), 0, 0, None)
        recorder = TraceRecorder(setup)
        recorder.begin_iteration(0, 1000, ())
        recorder.end_iteration(0, 2000, [])
        recorder.close()
    merge_run_traces(root)
    return root


def sample_runs(root: Path) -> dict[str, Path]:
    """The runs tests hold one reader to another on: 1F1B over three iterations, a misaligned run with optimizer
    steps and a held-back admission, a run whose rank 1 was killed, and a run that traced no task."""
    return {
        "1f1b": build_run(root / "1f1b", **ONE_F_ONE_B, iterations=3, period_us=200),
        "misaligned": build_run(root / "misaligned", **MISALIGNED, iterations=2, period_us=200,
                                steps={0: (116, 120, 130), 1: (93, 97, 130)}, held_back={"0F1": ("0F1",)}),
        "killed": build_run(root / "killed", **ONE_F_ONE_B, iterations=2, period_us=200, killed_rank=1),
        "taskless": build_taskless_run(root / "taskless"),
    }
