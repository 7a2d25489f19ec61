"""Recording a rank into a Perfetto trace (``rrfp-trace/1``, see :mod:`profiler.trace.schema`).

:class:`TraceRecorder` implements ``runtime.exec.recording.Recorder``. On the
dispatch path it only appends tuples to an in-memory list (no I/O, no
protobuf). At the end of each traced iteration the list goes to a background
writer thread, which builds native Perfetto ``TracePacket``s with the
``perfetto`` package's proto builder (``TraceProtoBuilder``) and appends them to
``<run>/trace/rank<r>.pftrace``, flushed per iteration: a crash leaves a
readable trace of the finished iterations. The per-rank files concatenate into
one trace (``rrfp trace merge``; ``rrfp run`` does it at the end).

[Note: a trace the disk refuses]
    Tracing never takes training down for a bug of its own: the writer says
    so once and stops tracing. A disk that refuses the trace (full, over
    quota, read-only: :func:`hints.outputs.is_disk_error`) is another matter:
    every later output of the run would be refused too, so the rank stops at
    its next iteration with :class:`hints.outputs.DiskError` naming the file
    and the file system (raised in :meth:`TraceRecorder.begin_iteration`, so
    the iterations before it are whole in ``metrics.jsonl``). Each iteration
    goes to the file whole or not at all (a refused write is cut back to the
    iteration before), and nothing is written after the first refusal.

Besides the ``runtime.exec.recording.Recorder`` protocol, :meth:`TraceRecorder.optimizer_step`
records what follows the executor's iteration on the rank (the optimizer step,
then the barrier that closes the iteration) as a slice on the ``step`` track;
the worker calls it after the barrier, with host-clock times.

[Note: CUDA timestamps]
    On CUDA the compute slices come from a pair of
    ``torch.cuda.Event(enable_timing=True)`` recorded around each task on the
    current stream and resolved once, after the iteration (one
    ``synchronize``). They are placed on the host clock through a reference
    event: at the start of the iteration the device is synchronized, the
    reference event is recorded and the host clock read at once, so the
    reference's device time is that host time (to within the launch latency
    of one event, microseconds). A task's device start is then
    ``host_ref + reference.elapsed_time(start)``. Decisions, messages and
    counters stay on the host clock.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from hints.errors import UserError
from hints.outputs import is_disk_error, write_error, write_whole
from hints.tasks import Task
from profiler.trace.schema import (
    COUNTERS,
    SCHEMA,
    complete_packets,
    flow_id,
    rank_trace_files,
    track_name,
    track_uuid,
)

_SENTINEL = object()


class TraceRecorder:
    """Buffers one iteration at a time; a writer thread serializes finished iterations."""

    def __init__(self, setup) -> None:
        self.setup = setup
        self.rank = setup.rank
        self.offset = setup.clock_offset_ns
        self.config = setup.config
        self.path = Path(setup.out_dir) / "trace" / f"rank{setup.rank}.pftrace"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.cuda = getattr(setup.device, "type", "cpu") == "cuda"
        self.events: list[tuple] | None = None
        self.iteration = -1
        self._cuda_pending: list[tuple] = []
        self._cuda_start = None
        self._auto: dict[int, tuple[str, str]] = {}  # iteration -> (rule, why) under --policy auto
        self._queue: queue.Queue = queue.Queue()
        self._writer = _RunWriter(self.path, setup, self.cuda)
        self.refused: Exception | None = None  # [Note: a trace the disk refuses], set by the writer thread
        self._stopped = False  # the writer met an error: it writes nothing more
        self._thread = threading.Thread(target=self._write_loop, name=f"rrfp-trace-{self.rank}", daemon=True)
        self._thread.start()

    # -- Recorder protocol (dispatcher thread) ----------------------------
    def begin_iteration(self, iteration: int, now_ns: int, order: tuple[Task, ...]) -> None:
        if self.refused is not None:  # [Note: a trace the disk refuses]
            refused, self.refused = self.refused, None
            raise refused
        self.iteration = iteration
        if not self.config.traces(iteration):
            self.events = None
            return
        self.events = [("begin", iteration, now_ns, " ".join(map(str, order)), self._auto.pop(iteration, None))]
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            self._reference = torch.cuda.Event(enable_timing=True)
            self._reference.record()
            self._reference_host = time.monotonic_ns()

    def decision(self, iteration: int, decision, wait_ns: int) -> None:
        if self.events is not None:
            now = int(decision.time * 1e9)
            self.events.append(("decision", now - wait_ns, now, decision, iteration))

    def task_started(self, iteration: int, task: Task, now_ns: int) -> None:
        if self.events is not None and self.cuda:
            import torch

            self._cuda_start = torch.cuda.Event(enable_timing=True)
            self._cuda_start.record()

    def task_finished(self, span) -> None:
        if self.events is None:
            return
        self.events.append(("task", span))
        if self.cuda:
            import torch

            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._cuda_pending.append((len(self.events) - 1, self._cuda_start, end))

    def arrival(self, iteration: int, arrival) -> None:
        if self.events is not None:
            self.events.append(("arrival", arrival))

    def rendezvous(self, iteration: int, start_ns: int, end_ns: int, messages) -> None:
        if self.events is not None:
            self.events.append(("rendezvous", iteration, start_ns, end_ns, messages))

    def counters(self, iteration: int, now_ns: int, values: dict[str, float]) -> None:
        if self.events is not None:
            self.events.append(("counters", now_ns, values))

    def end_iteration(self, iteration: int, now_ns: int, sends: list) -> None:
        if self.events is None:
            return
        if self.cuda and self._cuda_pending:
            self._resolve_cuda()
        self.events.append(("sends", sends))
        self.events.append(("end", iteration, now_ns))
        self._queue.put(self.events)
        self.events = None

    def rule_decided(self, iteration: int, rule: str, why: str) -> None:
        """``--policy auto``: the rule ``iteration`` runs (its label) and why ([Note: the auto policy] in
        runtime.sched.auto), called before ``begin_iteration``; written on the iteration's slice."""
        self._auto[iteration] = (rule, why)

    def optimizer_step(self, iteration: int, start_ns: int, barrier_ns: int, end_ns: int) -> None:
        """The end of an iteration on this rank, after ``end_iteration``: the optimizer step from ``start_ns``
        to ``barrier_ns``, then the barrier (all-gather of the timings) to ``end_ns``; host clock."""
        if self.config.traces(iteration):
            self._queue.put([("step", iteration, start_ns, barrier_ns, end_ns)])

    def close(self) -> None:
        """Write what is queued and close the file. A refusal of the disk not raised yet is raised here, unless
        the rank is already on its way out with another exception ([Note: a trace the disk refuses])."""
        self._queue.put(_SENTINEL)
        self._thread.join(timeout=60)
        if self.refused is not None and sys.exc_info()[1] is None:
            refused, self.refused = self.refused, None
            raise refused

    # -- internals --------------------------------------------------------
    def _resolve_cuda(self) -> None:
        """[Note: CUDA timestamps] one synchronize per iteration, then device times on the host clock."""
        import torch

        torch.cuda.synchronize()
        for index, start, end in self._cuda_pending:
            span = self.events[index][1]
            device_start = self._reference_host + int(self._reference.elapsed_time(start) * 1e6)
            device_end = self._reference_host + int(self._reference.elapsed_time(end) * 1e6)
            self.events[index] = ("task", span, device_start, device_end)
        self._cuda_pending.clear()

    def _write_loop(self) -> None:
        while True:
            chunk = self._queue.get()
            if chunk is _SENTINEL:
                try:
                    self._writer.close()
                except OSError as err:  # its buffer's last flush: refused only if an earlier write was
                    if not self._stopped:
                        self._stop(err)
                return
            if self._stopped:
                continue  # nothing after the first error: the file ends with whole packets
            try:
                self._writer.write_iteration(chunk, self.offset)
            except Exception as err:  # [Note: a trace the disk refuses]
                self._stop(err)

    def _stop(self, err: Exception) -> None:
        """The writer's first error: a refusal of the disk stops the rank at its next iteration; any other
        error stops tracing, said once ([Note: a trace the disk refuses])."""
        self._stopped = True
        if is_disk_error(err):
            self.refused = write_error(err, self.path)
        else:
            print(f"rrfp: rank {self.rank}: trace write failed, tracing stops here: {type(err).__name__}: {err}",
                  file=sys.stderr)


class PacketWriter:
    """One rank's sequence of ``rrfp-trace/1`` packets, appended to its file a batch at a time.

    The primitives every writer of the schema shares: the process track and metadata (:meth:`start`), child
    tracks, interned names and annotations, slices, counters. :class:`_RunWriter` turns a run's buffered
    events into them; ``profiler.trace.torch_profile`` writes an imported torch profiler trace with them.
    """

    def __init__(self, path: Path, rank: int) -> None:
        self.path = path
        self.rank = rank
        self.sequence_id = rank + 1
        self.file = open(path, "wb")
        self.names: dict[str, int] = {}  # interned event names
        self.keys: dict[str, int] = {}  # interned debug annotation names
        self.tracks: set[int] = set()
        self.started = False
        self.builder = None

    def close(self) -> None:
        self.file.close()

    def batch(self) -> None:
        """Start a batch of packets (written by :meth:`flush`)."""
        from perfetto.trace_builder.proto_builder import TraceProtoBuilder

        self.builder = TraceProtoBuilder()

    def flush(self) -> None:
        self.file.write(self.builder.serialize())
        self.file.flush()

    def start(self, now: int, meta: dict[str, Any], kinds: Sequence[str], clocks_offset: int | None = None) -> None:
        """The process track, the child tracks ``kinds``, and the metadata instant (clears incremental state).

        ``clocks_offset``: write a clock snapshot relating this trace's clock to the host's
        ([Note: trace clocks]); None writes none (a trace of another host, imported).
        """
        rank = self.rank
        process = self._packet(now, first=True)
        process.trace_packet_defaults.timestamp_clock_id = 3  # BUILTIN_CLOCK_MONOTONIC
        if clocks_offset is not None:
            self._clock_snapshot(clocks_offset)
        descriptor = process.track_descriptor
        descriptor.uuid = track_uuid(rank, "process")
        descriptor.name = f"rank {rank}"
        descriptor.process.pid = rank + 1
        descriptor.process.process_name = f"rank {rank}"
        for kind in kinds:
            self._track(kind, 0, now, counter=kind in COUNTERS.values())
        packet = self._packet(now)
        event = packet.track_event
        event.type = event.TYPE_INSTANT
        event.track_uuid = track_uuid(rank, "process")
        self._name(packet, SCHEMA)
        self._annotate(packet, meta)
        self.started = True

    def slice(self, kind: str, peer: int, start: int, end: int, name: str, values: dict[str, Any], flows=(),
              ends=()) -> None:
        """One slice on this rank's ``kind`` track (to or from ``peer`` for messages)."""
        track = self._track(kind, peer, start)
        self._begin(track, start, name, values, flows, ends)
        self._end(track, end)

    def _clock_snapshot(self, offset: int) -> None:
        """[Note: trace clocks] Timestamps are ``CLOCK_MONOTONIC`` of this rank plus
        ``clock_offset_ns`` (0 on one host: runtime.run.worker's [Note: one clock
        domain]), declared as the sequence's default clock, and a ClockSnapshot
        relates that domain to this host's BOOTTIME and REALTIME, so trace
        processors align it with Kineto or Nsight Systems traces of the same run.
        """
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import BuiltinClock

        packet = self.builder.add_packet()
        packet.trusted_packet_sequence_id = self.sequence_id
        snapshot = packet.clock_snapshot
        snapshot.primary_trace_clock = BuiltinClock.BUILTIN_CLOCK_BOOTTIME
        readings = [(BuiltinClock.BUILTIN_CLOCK_MONOTONIC, time.monotonic_ns() + offset),
                    (BuiltinClock.BUILTIN_CLOCK_BOOTTIME, time.clock_gettime_ns(time.CLOCK_BOOTTIME)),
                    (BuiltinClock.BUILTIN_CLOCK_REALTIME, time.time_ns())]
        for clock_id, value in readings:
            clock = snapshot.clocks.add()
            clock.clock_id, clock.timestamp = clock_id, value

    def _packet(self, now: int, first: bool = False):
        packet = self.builder.add_packet()
        packet.timestamp = max(0, now)
        packet.trusted_packet_sequence_id = self.sequence_id
        packet.sequence_flags = (packet.SEQ_INCREMENTAL_STATE_CLEARED if first
                                 else packet.SEQ_NEEDS_INCREMENTAL_STATE)
        return packet

    def _track(self, kind: str, peer: int, now: int, counter: bool = False) -> int:
        uuid = track_uuid(self.rank, kind, peer)
        if uuid not in self.tracks:
            self.tracks.add(uuid)
            descriptor = self._packet(now).track_descriptor
            descriptor.uuid = uuid
            descriptor.parent_uuid = track_uuid(self.rank, "process")
            descriptor.name = track_name(kind, peer)
            if counter:
                descriptor.counter.SetInParent()
        return uuid

    def _name(self, packet, name: str) -> None:
        iid = self.names.get(name)
        if iid is None:
            iid = self.names[name] = len(self.names) + 1
            entry = packet.interned_data.event_names.add()
            entry.iid, entry.name = iid, name
        packet.track_event.name_iid = iid

    def _annotate(self, packet, values: dict[str, Any]) -> None:
        for key, value in values.items():
            if value is None:
                continue
            iid = self.keys.get(key)
            if iid is None:
                iid = self.keys[key] = len(self.keys) + 1
                entry = packet.interned_data.debug_annotation_names.add()
                entry.iid, entry.name = iid, key
            annotation = packet.track_event.debug_annotations.add()
            annotation.name_iid = iid
            if isinstance(value, bool):
                annotation.bool_value = value
            elif isinstance(value, int):
                annotation.int_value = value
            elif isinstance(value, float):
                annotation.double_value = value
            else:
                annotation.string_value = str(value)

    def _begin(self, track: int, now: int, name: str, values: dict[str, Any], flows=(), ends=()):
        packet = self._packet(now)
        event = packet.track_event
        event.type = event.TYPE_SLICE_BEGIN
        event.track_uuid = track
        self._name(packet, name)
        self._annotate(packet, values)
        if flows:
            event.flow_ids.extend(flows)
        if ends:
            event.terminating_flow_ids.extend(ends)

    def _end(self, track: int, now: int) -> None:
        event = self._packet(now).track_event
        event.type = event.TYPE_SLICE_END
        event.track_uuid = track

    def _counter(self, kind: str, now: int, value: float) -> None:
        event = self._packet(now).track_event
        event.type = event.TYPE_COUNTER
        event.track_uuid = track_uuid(self.rank, kind)
        event.counter_value = int(value)


class _RunWriter(PacketWriter):
    """Turns a run's buffered events into TracePackets for one rank's sequence and appends them to its file."""

    def __init__(self, path: Path, setup, cuda: bool) -> None:
        super().__init__(path, setup.rank)
        self.setup = setup
        self.cuda = cuda
        self.whole = 0  # bytes of the file that hold whole iterations

    def flush(self) -> None:
        """One iteration's packets, whole or not at all: a write the disk refuses is cut back to the iteration
        before ([Note: a trace the disk refuses]). Written to the descriptor, past the (always empty) buffer."""
        data = self.builder.serialize()
        fd = self.file.fileno()
        try:
            rest = memoryview(data)
            while rest:
                rest = rest[os.write(fd, rest):]
        except OSError:
            os.ftruncate(fd, self.whole)
            os.lseek(fd, self.whole, os.SEEK_SET)
            raise
        self.whole += len(data)

    def write_iteration(self, events: list[tuple], offset: int) -> None:
        self.batch()
        if not self.started:
            self._start(events[0][2] + offset, offset)
        rank = self.rank
        for event in events:
            tag = event[0]
            if tag == "begin":
                _, iteration, now, hint, auto = event
                values = {"iteration": iteration, "hint": hint}
                if auto is not None:
                    values.update(rule=auto[0], auto=auto[1])
                self._begin(track_uuid(rank, "iterations"), now + offset, f"iteration {iteration}", values)
            elif tag == "end":
                self._end(track_uuid(rank, "iterations"), event[2] + offset)
            elif tag == "task":
                self._task(event, offset)
            elif tag == "decision":
                self._decision(event, offset)
            elif tag == "arrival":
                self._arrival(event[1], offset)
            elif tag == "counters":
                _, now, values = event
                for key, value in values.items():
                    self._counter(COUNTERS[key], now + offset, value)
            elif tag == "step":
                self._step(event, offset)
            elif tag == "rendezvous":
                self._rendezvous(event, offset)
            elif tag == "sends":
                for sent in event[1]:
                    if self.setup.config.traces(sent.iteration):
                        self._send(sent, offset)
        self.flush()

    def _start(self, now: int, offset: int) -> None:
        """The process track, its child tracks and this run's metadata ([Note: trace clocks])."""
        from runtime.config import hint_spec, run_shape

        setup, c = self.setup, self.setup.config
        shape = run_shape(c)
        meta = {
            "schema": SCHEMA, "rank": self.rank, "world": setup.world, "job": setup.job, "workload": c.workload,
            "stages": shape.ranks, "chunks": shape.chunks, "placement": shape.placement,
            "microbatches": shape.microbatches, "policy": c.policy,
            "rule": c.rule().name, "p2p": c.p2p,
            "hint": hint_spec(c), "memory_budget": c.memory_budget, "budget_slots": setup.budget or 0,
            "clock_offset_ns": setup.clock_offset_ns, "clock_error_ns": setup.clock_error_ns,
            "timing": "cuda-events" if self.cuda else "host", "device": str(setup.device),
        }
        grid = getattr(setup, "grid", None)
        if grid is not None and grid.world > grid.pp:  # TP / DP: where this rank sits (runtime.comm.grid)
            meta.update({"tp": grid.tp, "dp": grid.dp, "pipe_rank": grid.pipe_rank, "tp_rank": grid.tp_rank,
                         "dp_rank": grid.dp_rank})
        self.start(now, meta, ("iterations", "compute", "decisions", "ready set", "in flight", "activation bytes"),
                   clocks_offset=offset)

    # -- event kinds ---------------------------------------------------------
    def _task(self, event: tuple, offset: int) -> None:
        span = event[1]
        start, end = (event[2], event[3]) if len(event) == 4 else (span.start_ns, span.end_ns)
        task, setup = span.task, self.setup
        track = track_uuid(self.rank, "compute")
        values = {"iteration": span.iteration, "stage": task.stage, "kind": task.kind.value,
                  "microbatch": task.microbatch, "chunk": task.stage // setup.config.ranks,
                  "units": span.info.get("units"), "tokens": span.info.get("tokens"),
                  "images": span.info.get("images"), "wait_ns": span.wait_ns}
        if len(event) == 4:
            values["host_start_ns"] = span.start_ns + offset
        self._begin(track, start + offset, str(task), values)
        self._end(track, end + offset)

    def _decision(self, event: tuple, offset: int) -> None:
        _, waited_from, now, d, iteration = event
        track = track_uuid(self.rank, "decisions")
        values = {"iteration": iteration, "hint_rank": d.hint_position,
                  "skipped": str(d.head) if d.head is not None else None,
                  "ready": " ".join(f"{t}@{h}" for t, h in d.ready),
                  "held_back": " ".join(map(str, d.held_back)) or None, "in_flight": d.in_flight,
                  "deferred": str(d.deferred) if d.deferred is not None else None}
        if d.index is not None:  # a TP group's decision ([Note: TP coordination] in runtime.exec.tp_follow)
            values.update({"index": d.index, "announce_ns": d.announce_ns, "leader_ns": d.leader_ns,
                           "decision_arrived_ns": None if d.decision_arrived_ns is None
                           else d.decision_arrived_ns + offset})
        self._begin(track, waited_from + offset, str(d.chosen), values)
        self._end(track, now + offset)

    def _step(self, event: tuple, offset: int) -> None:
        _, iteration, start, barrier, end = event
        track = self._track("step", 0, start + offset)
        self._begin(track, start + offset, "optimizer step", {"iteration": iteration, "barrier_ns": barrier + offset})
        self._end(track, end + offset)

    def _rendezvous(self, event: tuple, offset: int) -> None:
        _, iteration, start, end, messages = event
        track = self._track("rendezvous", 0, start + offset)
        self._begin(track, start + offset, "rendezvous",
                    {"iteration": iteration, "messages": " ".join(f"{task}->{dst}" for task, dst in messages)})
        self._end(track, end + offset)

    def _arrival(self, arrival, offset: int) -> None:
        track = self._track("recv", arrival.src, arrival.frame_ns + offset)
        nbytes = sum(t.numel() * t.element_size() for t in arrival.tensors)
        self._begin(track, arrival.frame_ns + offset, str(arrival.producer),
                    {"iteration": arrival.iteration, "sequence": arrival.sequence, "bytes": nbytes},
                    ends=(flow_id(arrival.src, self.rank, arrival.sequence),))
        self._end(track, arrival.arrived_ns + offset)

    def _send(self, sent, offset: int) -> None:
        track = self._track("send", sent.dst, sent.started_ns + offset)
        self._begin(track, sent.started_ns + offset, str(sent.producer),
                    {"iteration": sent.iteration, "sequence": sent.sequence, "bytes": sent.nbytes,
                     "queued_ns": sent.queued_ns + offset},
                    flows=(flow_id(self.rank, sent.dst, sent.sequence),))
        self._end(track, sent.finished_ns + offset)


@dataclass
class Merged:
    """What :func:`merge_traces` wrote: the file, the packets kept, and a warning per damaged rank file."""

    out: Path
    packets: int
    warnings: list[str] = field(default_factory=list)


def merge_traces(paths: list[Path], out: Path) -> Merged:
    """Concatenate per-rank traces packet by packet (sequence ids and track uuids are unique per rank).

    A rank file that ends in a partial packet (its rank crashed while writing)
    keeps its complete packets; the files after it are merged whole. A file
    that holds no packet and is not cut short is not a trace, and nothing is
    written: a :class:`UserError` naming it; so is a set of files with no
    packet at all. The merged file is written atomically.
    """
    parts, warnings, packets = [], [], 0
    for path in paths:
        try:
            data = Path(path).read_bytes()
        except OSError as err:
            raise UserError(f"cannot read: {err.strerror or err}", str(path)) from None
        length, count, stopped = complete_packets(data)
        if not count and stopped is not None and not stopped.truncated:
            raise UserError(f"not a Perfetto trace (byte {stopped.at}: {stopped.reason}); nothing merged", str(path))
        parts.append(data[:length])
        packets += count
        if stopped is not None:
            what = "truncated" if stopped.truncated else f"stopped ({stopped.reason})"
            warnings.append(f"{path}: {what} at byte {stopped.at}; {count} complete packets kept")
    if not packets:
        raise UserError("no rank file holds a complete trace packet; nothing merged",
                        ", ".join(map(str, paths)) if len(paths) < 3 else f"{paths[0]} and {len(paths) - 1} more")

    def write(temporary: Path) -> None:
        with open(temporary, "wb") as merged:
            for part in parts:
                merged.write(part)

    return Merged(write_whole(out, write), packets, warnings)


def merge_run_traces(run: Path) -> Merged | None:
    """``<run>/trace/rank*.pftrace`` -> ``<run>/trace.pftrace`` (what ``rrfp run`` does at the end)."""
    files = rank_trace_files(run)
    return merge_traces(files, Path(run) / "trace.pftrace") if files else None
