"""``rrfp trace import``: torch profiler traces of a torch.distributed.pipelining job as an rrfp run directory.

The per-rank Kineto files (:mod:`profiler.trace.kineto`) become, per pipeline rank, an ``rrfp-trace/1``
file written with the recorder's own packet writer (:class:`profiler.trace.recorder.PacketWriter`), merged
into ``trace.pftrace``, so every ``rrfp trace`` command and ``rrfp tune-hint RUN_DIR`` read it as they read
a run of rrfp's:

* iterations are the profiler's steps (``ProfilerStep#N`` is iteration ``N``); each rank's iteration slice
  carries the order it ran as its hint (torch runs its schedule in fixed order, so the order run *is* the
  hint, and the run's rule is ``fixed``);
* tasks and messages come from :mod:`profiler.trace.torch_actions` (the input wait split off the compute);
* the shape (ranks, stages per rank, placement, microbatches, split backward) is inferred from the tasks
  of the first complete step and checked against ``-p/-v/-m`` when given; the schedule is named by
  comparing each rank's order with torch's built-in schedules (``--schedule`` states it, and is checked);
* the memory budget the analyses compare at is what the job's own order held: ``1f1b`` when its peak in
  flight equals 1F1B's on every rank, else its largest per-rank peak as a slot count.

[Note: what a torch trace cannot say]
    torch does not decide at run time: there are no arbiter decisions, ready sets, budget hold-backs or
    counters, and message sizes are not recorded. The metadata says ``source: torch-profiler``;
    ``rrfp trace decisions`` and ``follow`` refuse such a run with that reason instead of printing empty
    tables, and ``import.json`` in the run directory lists what was inferred, from which files, and every
    warning. A job with data or tensor parallelism puts several ranks on each pipeline position: the
    lowest global rank of each is imported (its replicas ran the same order), and the warning says so.

Bad input (no trace, a file that is not a Kineto JSON trace, a trace of a job that is not pipeline-parallel,
missing ranks, ranks of different runs, actions that do not match the given shape or schedule) is a
:class:`profiler.trace.kineto.KinetoError` naming the file, and nothing is written: the run directory is
built beside its destination and renamed into place only when complete.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hints.errors import HintError
from hints.files.torch_csv import hint_from_task_orders
from hints.orders import HintOrder, peak_in_flight
from hints.outputs import new_directory_beside, write_error
from hints.tasks import PipelineShape, Task
from profiler.trace.kineto import ANNOTATION, Event, KinetoError, RankFile, read_rank_file, trace_files
from profiler.trace.recorder import PacketWriter, merge_traces
from profiler.trace.schema import SCHEMA, flow_id
from profiler.trace.torch_actions import RankEvents, RawTask, StepActions, stages_named, step_actions

SOURCE = "torch-profiler"


@dataclass
class Imported:
    """What :func:`import_torch_traces` found and wrote."""

    out: Path
    shape: PipelineShape
    schedule: str  # torch's schedule name, or "custom"
    iterations: list[int]
    complete: list[int]
    ranks: dict[int, int]  # pipeline rank -> global rank imported
    files: list[str]
    memory_budget: str
    peaks: list[int]
    timing: str
    annotated: bool
    tasks: int
    transfers: int
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"source": SOURCE, "out": str(self.out), "shape": self.shape.describe(), "ranks": self.shape.ranks,
                "chunks": self.shape.chunks, "microbatches": self.shape.microbatches,
                "placement": self.shape.placement, "split_backward": self.shape.split_backward, "schedule": self.schedule,
                "iterations": self.iterations, "complete_iterations": self.complete,
                "pipeline_ranks": {str(k): v for k, v in self.ranks.items()}, "files": self.files,
                "memory_budget": self.memory_budget, "peak_in_flight": self.peaks, "timing": self.timing,
                "annotated": self.annotated, "tasks": self.tasks, "transfers": self.transfers,
                "not_in_a_torch_trace": ["arbiter decisions", "ready sets", "budget hold-backs", "counters",
                                         "message sizes"],
                "warnings": self.warnings}


def import_torch_traces(inputs: list[Path], out: Path, schedule: str | None = None,
                        ranks: int | None = None, chunks: int | None = None, microbatches: int | None = None,
                        progress: Callable[[str], None] | None = None) -> Imported:
    """Read the torch profiler traces ``inputs`` and write the run directory ``out`` (see the module docstring)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise KinetoError("is a file; give a new directory", str(out))
    if out.exists() and any(out.iterdir()):
        raise KinetoError("exists and is not empty; give a new directory", str(out))
    if not out.parent.is_dir():
        raise KinetoError(f"no such directory {str(out.parent)!r}", str(out))
    if schedule is not None:
        schedule = _stated_schedule(schedule)
    files = trace_files([Path(p) for p in inputs])
    profiles = _by_rank(files, progress)
    pipeline, warnings = _pipeline_ranks(profiles)
    steps = _common_steps(profiles, pipeline)
    per_step: dict[int, dict[int, StepActions]] = {}
    for number in steps:
        per_step[number] = {}
        for pipe_rank, global_rank in pipeline.items():
            _, events, step_of = profiles[global_rank]
            per_step[number][pipe_rank] = step_actions(events, step_of[number], pipe_rank)
    annotated = any(a.annotated for by_rank in per_step.values() for a in by_rank.values())
    tasks = {n: {r: list(a.tasks) for r, a in by_rank.items()} for n, by_rank in per_step.items()}
    where = _where(files)
    if not any(tasks[n][r] for n in tasks for r in tasks[n]):
        raise KinetoError("holds no pipeline work: no PP: actions, no Forward/Backward ranges, no model compute "
                          "between sends and receives (is this a torch.distributed.pipelining job?)", where)
    split = any(t.kind in "IW" for by_rank in tasks.values() for ts in by_rank.values() for t in ts)
    if split:
        _split_full_backwards(tasks)
    hint, complete = _shape(tasks, where, ranks, chunks, microbatches)
    shape = hint.shape
    if len(complete) < len(steps):
        warnings.append(f"steps {', '.join(map(str, sorted(set(steps) - set(complete))))} are incomplete "
                        f"(some rank's tasks missing); the analyses read the complete ones")
    name = _schedule_name(hint, schedule, where, warnings)
    peaks = [peak_in_flight(order, shape) for order in hint.orders]
    budget = _budget(shape, peaks)
    cuda = any(profiles[g][0].cuda for g in pipeline.values())
    timing = "torch profiler: device spans (gpu_user_annotation)" if cuda else "torch profiler: host clock"
    if cuda and not annotated:
        warnings.append("a CUDA trace without PP: annotations: tasks are timed on the host (launch) clock")
    meta = {"schema": SCHEMA, "world": shape.ranks, "job": name, "workload": "torch job", "stages": shape.ranks,
            "chunks": shape.chunks, "placement": shape.placement, "microbatches": shape.microbatches,
            "policy": "fixed", "rule": "fixed", "p2p": "async", "hint": _hint_name(name),
            "memory_budget": budget, "budget_slots": 0, "clock_offset_ns": 0, "clock_error_ns": 0,
            "timing": timing, "device": "cuda" if cuda else "cpu", "source": SOURCE}
    transfers = _transfers(per_step, tasks, shape)
    count = sum(len(ts) for by_rank in tasks.values() for ts in by_rank.values())
    imported = Imported(out, shape, name, steps, complete, pipeline, [str(f) for f in files], budget, peaks,
                        timing, annotated, count, len(transfers), warnings)
    _write(out, shape, meta, tasks, transfers, profiles, pipeline, steps, imported.to_json())
    return imported


# -- ranks and steps -----------------------------------------------------------------------------------------


def _by_rank(files: list[Path], progress) -> dict[int, tuple[RankFile, RankEvents, dict[int, Event]]]:
    """Per global rank: its profile (several files of one rank are joined: torchtitan writes one per profiled
    window), its indexed events, and its steps by number."""
    profiles: dict[int, RankFile] = {}
    world = None
    for path in files:
        if progress:
            progress(str(path))
        profile = read_rank_file(path)
        if world is None:
            world = (profile.world, path)
        elif profile.world != world[0]:
            raise KinetoError(f"is rank {profile.rank} of a world of {profile.world}, but {world[1]} is of a world "
                              f"of {world[0]}: ranks of different runs", str(path))
        if profile.rank in profiles:
            joined = profiles[profile.rank]
            clash = joined.steps().keys() & profile.steps().keys()
            if clash:
                raise KinetoError(f"holds step {min(clash)} of rank {profile.rank}, as {joined.path} does: two "
                                  f"profiles of one rank (different runs?)", str(path))
            joined.events = sorted(joined.events + profile.events, key=lambda e: (e.start_ns, -e.end_ns))
            joined.flow_starts = sorted(joined.flow_starts + profile.flow_starts)
        else:
            profiles[profile.rank] = profile
    missing = [r for r in range(world[0]) if r not in profiles]
    if missing:
        raise KinetoError(f"the traces are of a world of {world[0]} ranks, but rank {missing[0]}'s is missing "
                          f"({len(missing)} missing); give every rank's trace", _where(files))
    out = {}
    for rank, profile in profiles.items():
        steps = profile.steps()
        if not steps:
            raise KinetoError("has no ProfilerStep#N range: call prof.step() after every training step",
                              str(profile.path))
        out[rank] = (profile, RankEvents(profile), steps)
    return out


def _pipeline_ranks(profiles) -> tuple[dict[int, int], list[str]]:
    """Pipeline rank -> the global rank imported for it. The stages a rank runs come from its PP: actions
    (without them, each rank is one stage, in rank order); ranks that run the same stages are replicas
    (data or tensor parallelism), of which the lowest is imported."""
    stages_of: dict[int, frozenset[int]] = {}
    for rank, (profile, events, steps) in profiles.items():
        stages_of[rank] = frozenset(stage for event in profile.events if event.cat == ANNOTATION
                                    for stage in stages_named(event.name))
    warnings = []
    if not any(stages_of.values()):
        return {rank: rank for rank in sorted(profiles)}, warnings
    groups: dict[frozenset[int], list[int]] = {}
    for rank, stages in sorted(stages_of.items()):
        if stages:
            groups.setdefault(stages, []).append(rank)
    positions = sorted(groups.items(), key=lambda item: min(item[0]))
    pipeline = {pipe: ranks[0] for pipe, (_, ranks) in enumerate(positions)}
    replicas = max(len(ranks) for _, ranks in positions)
    if replicas > 1:
        warnings.append(f"{replicas} ranks run each pipeline position (data or tensor parallelism): imported the "
                        f"lowest of each, global ranks {', '.join(map(str, pipeline.values()))}")
    return pipeline, warnings


def _common_steps(profiles, pipeline: dict[int, int]) -> list[int]:
    """The step numbers every pipeline rank profiled; ranks of different runs (no overlap in time) are refused."""
    numbers = set.intersection(*(set(profiles[g][2]) for g in pipeline.values()))
    if not numbers:
        raise KinetoError("no ProfilerStep number is on every rank: ranks of different runs, or profiled in "
                          "different windows", _where([profiles[g][0].path for g in pipeline.values()]))
    for number in sorted(numbers):
        spans = [profiles[g][2][number] for g in pipeline.values()]
        if max(s.start_ns for s in spans) > min(s.end_ns for s in spans):
            late = max(pipeline.values(), key=lambda g: profiles[g][2][number].start_ns)
            raise KinetoError(f"step {number} does not overlap in time with the other ranks' step {number}: "
                              f"ranks of different runs", str(profiles[late][0].path))
    return sorted(numbers)


def _where(files) -> str:
    files = [str(f) for f in files]
    return files[0] if len(files) == 1 else f"{files[0]} (and {len(files) - 1} more)"


# -- shape, schedule and budget ------------------------------------------------------------------------------


def _split_full_backwards(tasks) -> None:
    """A split shape's whole backward (DualPipeV mixes them) as ``I`` over its span and a zero-length ``W`` at its
    end: the gradient leaves when the whole backward ends ([Note: DualPipeV as rrfp tasks] in
    hints.files.torch_import)."""
    for by_rank in tasks.values():
        for rank, raw in by_rank.items():
            out = []
            for task in raw:
                if task.kind == "B":
                    out.append(RawTask(task.stage, "I", task.microbatch, task.start_ns, task.end_ns, task.wait_ns,
                                       task.recv_end_ns, task.send))
                    out.append(RawTask(task.stage, "W", task.microbatch, task.end_ns, task.end_ns, 0))
                else:
                    out.append(task)
            by_rank[rank] = out


def _orders(by_rank: dict[int, list[RawTask]]) -> list[list[Task]]:
    return [[Task.parse(f"{t.stage}{t.kind}{t.microbatch}") for t in sorted(by_rank[r], key=lambda t: t.start_ns)]
            for r in sorted(by_rank)]


def _shape(tasks, where: str, ranks, chunks, microbatches) -> tuple[HintOrder, list[int]]:
    """The first step whose orders form a complete schedule, as a hint; the steps with the same task count."""
    first_error = None
    for number in sorted(tasks):
        try:
            hint = hint_from_task_orders(_orders(tasks[number]), where, "traced", {"source": SOURCE})
        except HintError as err:
            first_error = first_error or f"step {number}: {err.what}"
            continue
        shape = hint.shape
        given = {"-p": (ranks, shape.ranks), "-v": (chunks, shape.chunks), "-m": (microbatches, shape.microbatches)}
        for flag, (want, found) in given.items():
            if want is not None and want != found:
                raise KinetoError(f"the trace's actions are of {shape.describe()}, not the {flag} {want} given",
                                  where)
        total = shape.total_tasks
        complete = [n for n in sorted(tasks) if sum(len(ts) for ts in tasks[n].values()) == total]
        return hint, complete
    raise KinetoError(f"no step holds a complete pipeline schedule ({first_error})", where)


def _schedule_name(hint: HintOrder, stated: str | None, where: str, warnings: list[str]) -> str:
    """torch's schedule whose order every rank ran ([Note: what a torch trace cannot say]); ``custom`` if none."""
    from hints.files.torch_import import import_torch_schedule
    from hints.files.torch_names import TORCH_SCHEDULES

    shape = hint.shape
    names = [stated] if stated else list(TORCH_SCHEDULES)
    for name in names:
        try:
            theirs = import_torch_schedule(name, shape.ranks, shape.microbatches, shape.chunks, shape.placement)
        except HintError as err:
            if stated:  # a torch schedule that cannot build this shape (e.g. 1F1B with two chunks per rank)
                raise KinetoError(f"the trace's actions do not follow {stated}: {err.what}", where) from None
            continue
        mismatch = _first_difference(hint, theirs)
        if mismatch is None:
            return name  # TORCH_SCHEDULES' or _stated_schedule's spelling
        if stated:
            raise KinetoError(f"the trace's actions do not follow {stated}: {mismatch}", where)
    warnings.append("the order run matches none of torch's built-in schedules: imported as a custom schedule")
    return "custom"


def _stated_schedule(name: str) -> str:
    """``--schedule``'s torch schedule, spelled as torch's names are (``ScheduleGPipe``, ``gpipe`` -> ``GPipe``)."""
    from hints.files.torch_names import TORCH_SCHEDULES

    key = name.lower().removeprefix("schedule")
    known = {schedule.lower(): schedule for schedule in TORCH_SCHEDULES}
    if key not in known:
        raise KinetoError(f"{name!r} is not a torch schedule; one of {', '.join(TORCH_SCHEDULES)}", "`schedule`")
    return known[key]


def _first_difference(ours: HintOrder, theirs: HintOrder) -> str | None:
    if theirs.shape.with_split(False) != ours.shape.with_split(False):
        return f"it is of {theirs.shape.describe()}, the trace of {ours.shape.describe()}"
    for rank, (a, b) in enumerate(zip(ours.orders, theirs.orders)):
        for position, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return f"rank {rank} ran {x} at position {position}, where the schedule runs {y}"
        if len(a) != len(b):
            return f"rank {rank} ran {len(a)} tasks, the schedule {len(b)}"
    return None


def _hint_name(schedule: str) -> str:
    return "torch-trace" if schedule == "custom" else f"torch:{schedule}"


def _budget(shape: PipelineShape, peaks: list[int]) -> str:
    """What the job's order held as a budget: its spelling, else its largest per-rank peak (a trace's metadata
    holds one spelling)."""
    from runtime.sched.budget import budget_spelling

    return budget_spelling(shape, peaks) or str(max(peaks))


# -- messages ------------------------------------------------------------------------------------------------


def _transfers(per_step, tasks, shape: PipelineShape) -> list[tuple]:
    """``(iteration, src, dst, producer, send_start, send_end, recv_start, recv_end)`` per message crossing ranks,
    either side None when the trace does not show it."""
    rows = []
    for number, by_rank in per_step.items():
        ran = {(t.stage, t.kind, t.microbatch): t for ts in tasks[number].values() for t in ts}
        sides: dict[tuple[str, int], dict] = {}

        def producer_of(stage: int, kind: str, mb: int) -> str | None:
            if kind == "F":
                return f"{stage}F{mb}"
            for letter in ("I", "B"):
                if (stage, letter, mb) in ran:
                    return f"{stage}{letter}{mb}"
            return None

        for rank, actions in by_rank.items():
            for m in actions.messages:
                if m.direction == "SEND":
                    producer, consumer = producer_of(m.stage, m.kind, m.microbatch), m.stage + (1 if m.kind == "F"
                                                                                                 else -1)
                    key = "send"
                else:
                    source = m.stage - 1 if m.kind == "F" else m.stage + 1
                    producer, consumer, key = producer_of(source, m.kind, m.microbatch), m.stage, "recv"
                if producer is None or not 0 <= consumer < shape.stages:
                    continue
                sides.setdefault((producer, consumer), {})[key] = (m.start_ns, m.end_ns)
            for t in tasks[number][rank]:  # GPipe's ranges and unannotated tasks carry their messages
                if t.kind == "W":
                    continue
                consumer = t.stage + 1 if t.kind == "F" else t.stage - 1
                if t.send is not None and 0 <= consumer < shape.stages:
                    sides.setdefault((f"{t.stage}{t.kind}{t.microbatch}", consumer), {}).setdefault("send", t.send)
                if t.recv_end_ns is not None:
                    source = t.stage - 1 if t.kind == "F" else t.stage + 1
                    producer = producer_of(source, t.kind, t.microbatch)
                    if producer is not None and 0 <= source < shape.stages:
                        sides.setdefault((producer, t.stage), {}).setdefault("recv", (None, t.recv_end_ns))
        for (producer, consumer), side in sides.items():
            src, dst = shape.rank_of(Task.parse(producer).stage), shape.rank_of(consumer)
            if src == dst:
                continue
            consumer_task = _consumer(producer, consumer, ran)
            send, recv = side.get("send"), side.get("recv")
            if recv is not None and consumer_task is not None:  # arrived before the consumer computed
                recv = (recv[0], min(recv[1], consumer_task.start_ns))
            rows.append((number, src, dst, producer, *(send or (None, None)), *(recv or (None, None))))
    return rows


def _consumer(producer: str, consumer_stage: int, ran: dict) -> RawTask | None:
    task = Task.parse(producer)
    if task.kind.value == "F":
        return ran.get((consumer_stage, "F", task.microbatch))
    return ran.get((consumer_stage, "I", task.microbatch)) or ran.get((consumer_stage, "B", task.microbatch))


# -- writing -------------------------------------------------------------------------------------------------


def _write(out: Path, shape: PipelineShape, meta: dict, tasks, transfers, profiles, pipeline, steps,
           summary: dict) -> None:
    """The run directory (rank traces, ``trace.pftrace``, ``import.json`` holding ``summary``), built beside
    ``out`` and renamed into place once whole."""
    building = new_directory_beside(out)
    try:
        _write_ranks(building, shape, meta, tasks, transfers, profiles, pipeline, steps)
        (building / "import.json").write_text(json.dumps(summary, indent=1))
        merge_traces(sorted((building / "trace").glob("rank*.pftrace"),
                            key=lambda p: int(p.stem[4:])), building / "trace.pftrace")
        if out.exists():
            out.rmdir()
        building.rename(out)
    except BaseException as err:
        shutil.rmtree(building, ignore_errors=True)
        if isinstance(err, OSError):  # a full disk names the disk ([Note: outputs written whole] in hints.outputs)
            raise write_error(err, out) from None
        raise


def _write_ranks(root: Path, shape, meta, tasks, transfers, profiles, pipeline, steps) -> None:
    (root / "trace").mkdir()
    sequences = {}
    outgoing: dict[int, list] = {}
    incoming: dict[int, list] = {}
    for row in sorted(transfers, key=lambda r: (r[0], r[4] if r[4] is not None else r[7] or 0)):
        number, src, dst, producer, send_start, send_end, recv_start, recv_end = row
        sequence = sequences[(src, dst)] = sequences.get((src, dst), -1) + 1
        if send_start is not None:
            outgoing.setdefault(src, []).append((dst, number, producer, sequence, send_start, send_end))
        if recv_end is not None:
            begun = recv_start if recv_start is not None else recv_end
            incoming.setdefault(dst, []).append((src, number, producer, sequence, min(begun, recv_end), recv_end))
    for rank, global_rank in pipeline.items():
        writer = PacketWriter(root / "trace" / f"rank{rank}.pftrace", rank)
        try:
            writer.batch()
            step_spans = profiles[global_rank][2]
            first = min(step_spans[n].start_ns for n in steps)
            writer.start(first, {**meta, "rank": rank, "global_rank": global_rank}, ("iterations", "compute"))
            for number in steps:
                span = step_spans[number]
                ran = sorted(tasks[number][rank], key=lambda t: t.start_ns)
                order = " ".join(f"{t.stage}{t.kind}{t.microbatch}" for t in ran)
                writer.slice("iterations", 0, span.start_ns, span.end_ns, f"iteration {number}",
                             {"iteration": number, "hint": order})
                for t in ran:
                    writer.slice("compute", 0, t.start_ns, t.end_ns, f"{t.stage}{t.kind}{t.microbatch}",
                                 {"iteration": number, "stage": t.stage, "kind": t.kind, "microbatch": t.microbatch,
                                  "chunk": shape.chunk_of(t.stage), "wait_ns": t.wait_ns})
            for dst, number, producer, sequence, start, end in outgoing.get(rank, []):
                writer.slice("send", dst, start, end, producer,
                             {"iteration": number, "sequence": sequence, "bytes": 0, "queued_ns": start},
                             flows=(flow_id(rank, dst, sequence),))
            for src, number, producer, sequence, start, end in incoming.get(rank, []):
                writer.slice("recv", src, start, end, producer, {"iteration": number, "sequence": sequence,
                                                                   "bytes": 0}, ends=(flow_id(src, rank, sequence),))
            writer.flush()
        finally:
            writer.close()
