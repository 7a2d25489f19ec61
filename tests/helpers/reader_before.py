"""The trace reader as it was at 27d0fea, before issue 26's rework ([Note: reading fast] in profiler.trace.reader),
kept verbatim (bar this docstring and one fix since) so tests/unit/test_trace_reader_before.py can show the rework
changed no frame, warning or error. Delete both when the reader's output is meant to change.

The fix: a receive slice whose send is missing and whose annotations are unusable (say the packet that interned
their names was lost) is dropped; it is now counted in the warning that counts dropped events, where the transfers
used to be built after that warning was written and the drop went unsaid. ``finish`` builds the transfers first."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import polars as pl

from hints.errors import UserError
from hints.tasks import LOOPING, PLACEMENTS
from profiler.trace.schema import PACKET_FIELD, SCHEMA, FramingError, decode_track_uuid, next_field, rank_trace_files

_META_TYPES = {"schema": str, "rank": int, "world": int, "stages": int, "chunks": int, "microbatches": int,
               "policy": str, "hint": str, "memory_budget": str, "clock_offset_ns": int, "clock_error_ns": int}


_REQUIRED = {  # annotation types a slice must carry to be kept (exact types: a bool is no int here)
    "compute": (("iteration", int), ("stage", int), ("kind", str), ("microbatch", int), ("chunk", int)),
    "decisions": (("iteration", int), ("hint_rank", int), ("in_flight", int)),
    "iterations": (("iteration", int), ("hint", str)),
    "step": (("iteration", int), ("barrier_ns", int)),
    "rendezvous": (("iteration", int), ("messages", str)),
    "send": (("iteration", int), ("sequence", int), ("bytes", int)),
    "recv": (("iteration", int), ("sequence", int), ("bytes", int)),
}


FRAME_NAMES = ("tasks", "decisions", "transfers", "counters", "iterations", "steps", "rendezvous")


class TraceError(UserError):
    """The input is not a readable rrfp trace."""


I64, STR = pl.Int64, pl.Utf8
TASK_SCHEMA = {"rank": I64, "iteration": I64, "task": STR, "stage": I64, "kind": STR, "microbatch": I64,
               "chunk": I64, "start_ns": I64, "end_ns": I64, "units": I64, "tokens": I64, "images": I64,
               "wait_ns": I64}
DECISION_SCHEMA = {"rank": I64, "iteration": I64, "waited_from_ns": I64, "time_ns": I64, "chosen": STR,
                   "hint_rank": I64, "skipped": STR, "ready": STR, "held_back": STR, "deferred": STR,
                   "in_flight": I64, "index": I64, "leader_ns": I64, "decision_arrived_ns": I64, "announce_ns": I64}
GRID_SCHEMA = {"rank": I64, "pipe_rank": I64, "tp_rank": I64, "dp_rank": I64}
ITERATION_SCHEMA = {"rank": I64, "iteration": I64, "start_ns": I64, "end_ns": I64, "hint": STR, "rule": STR,
                    "auto": STR}
STEP_SCHEMA = {"rank": I64, "iteration": I64, "start_ns": I64, "barrier_ns": I64, "end_ns": I64}
RENDEZVOUS_SCHEMA = {"rank": I64, "iteration": I64, "start_ns": I64, "end_ns": I64, "messages": STR}
COUNTER_SCHEMA = {"rank": I64, "counter": STR, "time_ns": I64, "value": pl.Float64}
TRANSFER_SCHEMA = {"src": I64, "dst": I64, "sequence": I64, "iteration": I64, "producer": STR, "bytes": I64,
                   "queued_ns": I64, "send_start_ns": I64, "send_end_ns": I64, "recv_start_ns": I64,
                   "recv_end_ns": I64}


def _empty(schema: dict) -> pl.DataFrame:
    return pl.DataFrame(schema=schema)


def _frame(rows: list[tuple], schema: dict) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=schema, orient="row") if rows else _empty(schema)


@dataclass
class TraceFrames:
    path: str
    tasks: pl.DataFrame
    decisions: pl.DataFrame
    transfers: pl.DataFrame
    counters: pl.DataFrame
    iterations: pl.DataFrame
    meta: dict[int, dict[str, Any]]
    steps: pl.DataFrame = field(default_factory=lambda: _empty(STEP_SCHEMA))
    rendezvous: pl.DataFrame = field(default_factory=lambda: _empty(RENDEZVOUS_SCHEMA))
    warnings: list[str] = field(default_factory=list)
    packets: int = 0
    # [Note: traces of TP and DP runs]: every rank's tasks and decisions, with its grid coordinates
    members: pl.DataFrame = field(default_factory=lambda: _empty({**GRID_SCHEMA, **TASK_SCHEMA}))
    member_decisions: pl.DataFrame = field(default_factory=lambda: _empty({**GRID_SCHEMA, **DECISION_SCHEMA}))
    member_transfers: pl.DataFrame = field(default_factory=lambda: _empty(TRANSFER_SCHEMA))
    member_meta: dict[int, dict[str, Any]] = field(default_factory=dict)  # every rank's metadata

    @property
    def ranks(self) -> int:
        return len(self.meta)

    def frames(self) -> dict[str, pl.DataFrame]:
        return {name: getattr(self, name) for name in FRAME_NAMES}


def locate_trace(path: str | Path) -> tuple[list[Path], str | None]:
    """The trace file(s) of a run directory or a file, and a note when per-rank files are read unmerged."""
    path = Path(path)
    if not path.exists():
        raise TraceError("no such file or directory", str(path))
    if path.is_file():
        return [path], None
    merged = path / "trace.pftrace"
    if merged.is_file():
        return [merged], None
    ranks = rank_trace_files(path)
    if ranks:
        return ranks, f"{path} was not merged (crashed run?): reading {len(ranks)} per-rank files"
    jobs = job_runs(path)
    if jobs:
        names = ", ".join(job.name for job in jobs)
        raise TraceError(f"holds several jobs ({names}); give one of them, e.g. {jobs[0]}", str(path))
    raise TraceError("holds no trace (trace.pftrace or trace/rank*.pftrace); was it run with `no_trace`?",
                     str(path))


def job_runs(path: str | Path) -> list[Path]:
    """The job directories of an ``rrfp run --compare`` directory (one trace each); empty for a trace file or
    a directory that holds a trace of its own."""
    path = Path(path)
    if not path.is_dir() or (path / "trace.pftrace").is_file() or rank_trace_files(path):
        return []
    jobs = [p.parent for p in path.glob("*/trace.pftrace")] + \
        [p.parent.parent for p in path.glob("*/trace/rank*.pftrace")]
    return sorted(set(jobs))  # by name: fixed-1f1b, fixed-<hint>, ready-<hint>, the order --compare runs them


def read_trace(path: str | Path) -> TraceFrames:
    with _cyclic_gc_paused():
        return _read(path)


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """[Note: reading fast]: no cyclic collection while the rows are built."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _read(path: str | Path) -> TraceFrames:
    paths, note = locate_trace(path)
    reader = _Reader(str(path))
    if note:
        reader.warnings.append(note)
    for file in paths:
        try:
            data = file.read_bytes()
        except OSError as err:
            raise TraceError(f"cannot read: {err}", str(file)) from None
        if not data and len(paths) > 1:
            reader.warnings.append(f"{file} is empty (that rank finished no traced iteration)")
            continue
        reader.feed(data, str(file))
    return reader.finish()


_NO_KEYS: dict[int, str] = {}


def _text(value: Any) -> str | None:
    """A string annotation, or None when a corrupt trace put something else there."""
    return value if type(value) is str else None


def _whole(value: Any) -> int | None:
    return value if type(value) is int else None


class _Reader:
    """Packets -> rows. ``feed`` one file at a time, then ``finish`` (see [Note: reading fast])."""

    def __init__(self, name: str) -> None:
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TracePacket

        self.Trace, self.TracePacket = Trace, TracePacket
        self.name = name
        self.warnings: list[str] = []
        self.names: dict[int, dict[int, str]] = {}
        self.keys: dict[int, dict[int, str]] = {}
        self.open: dict[int, list] = {}
        self.tracks: dict[int, tuple[int, str, int] | None] = {}
        self.meta: dict[int, dict[str, Any]] = {}
        self.packets = 0
        self.corrupt = 0
        self.malformed = 0
        self.cut: tuple[str, str] | None = None  # the first truncated file and where it was cut, for errors
        self.rows: dict[str, list[tuple]] = {kind: [] for kind in ("compute", "decisions", "iterations", "step",
                                                                   "counters", "rendezvous")}
        self.sends: dict[int, tuple] = {}
        self.recvs: dict[int, tuple] = {}

    # -- framing -----------------------------------------------------------
    def feed(self, data: bytes, where: str) -> None:
        if not data:
            raise TraceError("empty file", where)
        try:
            packets = self.Trace.FromString(data).packet
        except Exception:  # protobuf's DecodeError: truncated or corrupt; walk it packet by packet
            packets = None
        if packets:
            self._consume(packets)
            self.packets += len(packets)
            return
        self._feed_framed(data, where)

    def _feed_framed(self, data: bytes, where: str) -> None:
        pos, kept, parse = 0, 0, self.TracePacket.FromString
        while pos < len(data):
            try:
                field, following = next_field(data, pos)
            except FramingError as err:
                self._stopped(where, err, kept)
                return
            if field.number == PACKET_FIELD and field.wire == 2:
                try:
                    packet = parse(data[field.start:field.end])
                except Exception:  # DecodeError: bytes that are not a packet, framed correctly
                    self.corrupt += 1
                else:
                    kept += 1
                    self.packets += 1
                    self._consume((packet,))
            pos = following

    def _stopped(self, where: str, err: FramingError, kept: int) -> None:
        if err.truncated:
            message = f"truncated at byte {err.at}; {kept} complete packets kept"
            if not self.packets:
                raise TraceError(message, where)
            self.cut = self.cut or (where, message)
            self.warnings.append(f"{where}: {message}")
        elif not self.packets:
            raise TraceError(f"not a Perfetto trace (byte {err.at}: {err.reason})", where)
        else:
            self.warnings.append(f"{where}: stopped at byte {err.at} ({err.reason}); {kept} packets kept")

    # -- packets -------------------------------------------------------------
    def _consume(self, packets) -> None:
        """The hot loop ([Note: reading fast]): every packet once, locals bound, slices decoded at their end."""
        names, keys, tracks, stacks = self.names, self.keys, self.tracks, self.open
        counters, decode, close = self.rows["counters"], decode_track_uuid, self._slice
        for packet in packets:
            event = packet.track_event
            kind = event.type
            if kind == 2 or kind == 4:  # a slice's end or a counter: never first, never interning (the recorder)
                uuid = event.track_uuid
                track = tracks.get(uuid, 0)
                if track == 0:
                    track = tracks[uuid] = decode(uuid)
                if track is None:
                    continue
                if kind == 2:  # TYPE_SLICE_END
                    stack = stacks.get(uuid)
                    if stack:
                        close(track, stack.pop(), packet.timestamp)
                else:  # TYPE_COUNTER
                    counters.append((track[0], track[1], packet.timestamp,
                                     event.counter_value or event.double_counter_value))
                continue
            sequence = packet.trusted_packet_sequence_id
            if packet.sequence_flags & 1:  # SEQ_INCREMENTAL_STATE_CLEARED
                names[sequence] = {}
                keys[sequence] = {}
            if packet.HasField("interned_data"):
                self._intern(packet.interned_data, sequence)
            if not kind:
                continue
            uuid = event.track_uuid
            track = tracks.get(uuid, 0)
            if track == 0:
                track = tracks[uuid] = decode(uuid)
            if track is None:
                continue
            if kind == 1:  # TYPE_SLICE_BEGIN: decoded at its end
                stack = stacks.get(uuid)
                if stack is None:
                    stack = stacks[uuid] = []
                stack.append((packet.timestamp, event, sequence))
            elif kind == 3 and self._name(event, sequence) == SCHEMA:  # TYPE_INSTANT: the metadata
                self.meta[track[0]] = self._annotations(event, sequence)

    def _intern(self, interned, sequence: int) -> None:
        names = self.names.setdefault(sequence, {})
        for entry in interned.event_names:
            names[entry.iid] = entry.name
        keys = self.keys.setdefault(sequence, {})
        for entry in interned.debug_annotation_names:
            keys[entry.iid] = entry.name

    def _name(self, event, sequence: int) -> str:
        iid = event.name_iid
        return (self.names.get(sequence) or {}).get(iid, "") if iid else event.name

    def _annotations(self, event, sequence: int) -> dict[str, Any]:
        key_of = (self.keys.get(sequence) or _NO_KEYS).get
        values = {}
        for annotation in event.debug_annotations:
            which = annotation.WhichOneof("value")
            value = getattr(annotation, which) if which else None
            if type(value) is not bytes:  # damaged text reads as bytes: as if absent
                values[key_of(annotation.name_iid) or annotation.name or "#"] = value
        return values

    def _slice(self, track: tuple[int, str, int], begun: tuple, end: int) -> None:
        handler = _SLICE_HANDLERS.get(track[1])
        if handler is None:
            return
        if end < begun[0]:
            self.malformed += 1
            return
        handler(self, track, begun, end)

    def _values(self, kind: str, event, sequence: int) -> dict[str, Any] | None:
        """The slice's annotations, or None (counted as malformed) when a required one is missing or mistyped."""
        values = self._annotations(event, sequence)
        for key, typ in _REQUIRED[kind]:
            if type(values.get(key)) is not typ:
                self.malformed += 1
                return None
        return values

    # -- one handler per slice track: (rank, kind, peer), (start, begin event, sequence), end ----------------
    def _compute(self, track, begun, end) -> None:
        start, event, sequence = begun
        v = self._values("compute", event, sequence)
        if v is not None:
            name = self._name(event, sequence)
            if name != f"{v['stage']}{v['kind']}{v['microbatch']}":  # a slice is named by its task's text
                self.malformed += 1  # (a corrupt name would reach the analyses as "'' is not a task")
                return
            self.rows["compute"].append((
                track[0], v["iteration"], name, v["stage"], v["kind"], v["microbatch"],
                v["chunk"], start, end, _whole(v.get("units")), _whole(v.get("tokens")), _whole(v.get("images")),
                _whole(v.get("wait_ns"))))

    def _decision(self, track, begun, end) -> None:
        start, event, sequence = begun
        v = self._values("decisions", event, sequence)
        if v is not None:
            self.rows["decisions"].append((
                track[0], v["iteration"], start, end, self._name(event, sequence), v["hint_rank"],
                _text(v.get("skipped")), _text(v.get("ready", "")) or "", _text(v.get("held_back")),
                _text(v.get("deferred")), v["in_flight"], _whole(v.get("index")), _whole(v.get("leader_ns")),
                _whole(v.get("decision_arrived_ns")), _whole(v.get("announce_ns"))))

    def _iteration(self, track, begun, end) -> None:
        start, event, sequence = begun
        v = self._values("iterations", event, sequence)
        if v is not None:
            rule, auto = v.get("rule"), v.get("auto")  # --policy auto only ([Note: the auto policy])
            self.rows["iterations"].append((track[0], v["iteration"], start, end, v["hint"],
                                            rule if isinstance(rule, str) else None,
                                            auto if isinstance(auto, str) else None))

    def _step(self, track, begun, end) -> None:
        start, event, sequence = begun
        v = self._values("step", event, sequence)
        if v is not None:
            self.rows["step"].append((track[0], v["iteration"], start, min(max(v["barrier_ns"], start), end), end))

    def _rendezvous(self, track, begun, end) -> None:
        start, event, sequence = begun
        v = self._values("rendezvous", event, sequence)
        if v is not None:
            self.rows["rendezvous"].append((track[0], v["iteration"], start, end, v["messages"]))

    def _send(self, track, begun, end) -> None:
        start, event, sequence = begun
        v = self._values("send", event, sequence)
        if v is not None:
            name = self._name(event, sequence)
            for flow in event.flow_ids:
                self.sends[flow] = (track[0], track[2], v, name, start, end)

    def _recv(self, track, begun, end) -> None:
        """Kept raw: decoded only for a message whose send slice is missing (most have one)."""
        for flow in begun[1].terminating_flow_ids:
            self.recvs[flow] = (track, begun, end)

    def _lone_recv(self, recv: tuple) -> tuple | None:
        """A receive slice without its send, as the send's ``(src, dst, values, name, start, end)``; None if malformed."""
        (dst, _, src), (start, event, sequence), end = recv
        v = self._values("recv", event, sequence)
        return None if v is None else (src, dst, v, self._name(event, sequence), start, end)

    # -- frames --------------------------------------------------------------
    def finish(self) -> TraceFrames:
        self._check_found()
        self._check_meta()
        transfers = self._transfers()  # the fix (module docstring): its drops counted in the warnings
        unfinished = sum(len(stack) for stack in self.open.values())
        if unfinished:
            self.warnings.append(f"{unfinished} slices were begun but never ended (dropped)")
        if self.corrupt:
            self.warnings.append(f"{self.corrupt} corrupt packets (framed correctly, not a TracePacket) skipped")
        if self.malformed:
            self.warnings.append(f"{self.malformed} events with missing or mistyped fields (dropped)")
        tasks = _frame(self.rows["compute"], TASK_SCHEMA)
        tasks = tasks.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"))
        frames = TraceFrames(
            path=self.name,
            tasks=tasks.sort("rank", "start_ns"),
            decisions=_frame(self.rows["decisions"], DECISION_SCHEMA).sort("rank", "time_ns"),
            transfers=transfers,
            counters=_frame(self.rows["counters"], COUNTER_SCHEMA),
            iterations=_frame(self.rows["iterations"], ITERATION_SCHEMA).sort("iteration", "rank"),
            steps=_frame(self.rows["step"], STEP_SCHEMA).sort("iteration", "rank"),
            rendezvous=_frame(self.rows["rendezvous"], RENDEZVOUS_SCHEMA).sort("rank", "start_ns"),
            meta=dict(sorted(self.meta.items())),
            warnings=self.warnings,
            packets=self.packets,
        )
        return _pipeline_slice(frames)

    def _check_found(self) -> None:
        if not self.packets and self.corrupt:
            raise TraceError(f"not a Perfetto trace (no packet parses; {self.corrupt} corrupt)", self.name)
        if not self.packets:
            raise TraceError("holds no complete trace packet (no traced iteration finished?)", self.name)
        if not self.meta:
            if self.cut:  # named once: the file that was cut (one of a run's rank files, or the trace given)
                where, message = self.cut
                raise TraceError(f"{message}, none with the {SCHEMA} metadata", where)
            raise TraceError(f"not written by rrfp (no {SCHEMA} metadata in {self.packets} packets)", self.name)

    def _check_meta(self) -> None:
        for rank, meta in self.meta.items():
            for key, kind in _META_TYPES.items():
                if type(meta.get(key)) is not kind:
                    raise TraceError(f"rank {rank}'s metadata has no valid {key!r} (corrupt trace?)", self.name)
            if min(meta["stages"], meta["chunks"], meta["microbatches"]) < 1:
                raise TraceError(f"rank {rank}'s metadata has an impossible shape (corrupt trace?)", self.name)
            if meta.get("placement", LOOPING) not in PLACEMENTS:  # absent before placement was recorded: looping
                raise TraceError(f"rank {rank}'s metadata has no valid 'placement' (corrupt trace?)", self.name)

    def _transfers(self) -> pl.DataFrame:
        rows = []
        for flow in self.sends.keys() | self.recvs.keys():
            send = self.sends.get(flow)
            recv = self.recvs.get(flow)
            known = send or self._lone_recv(recv)
            if known is None:
                continue
            src, dst, values, name, _, _ = known
            received = (recv[1][0], recv[2]) if recv else (None, None)
            rows.append((src, dst, values["sequence"], values["iteration"], name, values["bytes"],
                         _whole(send[2].get("queued_ns")) if send else None,
                         send[4] if send else None, send[5] if send else None, *received))
        return _frame(rows, TRANSFER_SCHEMA).sort("src", "dst", "sequence")


# One handler per slice track kind, unbound: bound methods kept on the reader would make it a reference cycle,
# freed only by the cyclic collector's pass over its million rows ([Note: reading fast]).
_SLICE_HANDLERS = {"compute": _Reader._compute, "decisions": _Reader._decision, "iterations": _Reader._iteration,
                   "step": _Reader._step, "send": _Reader._send, "recv": _Reader._recv,
                   "rendezvous": _Reader._rendezvous}


def _pipeline_slice(frames: TraceFrames) -> TraceFrames:
    """[Note: traces of TP and DP runs]: the leaders of replica 0 in the frames, every rank in ``members``."""
    grid = {rank: (meta.get("pipe_rank", rank), meta.get("tp_rank", 0), meta.get("dp_rank", 0))
            for rank, meta in frames.meta.items()}
    if all(tp == 0 and dp == 0 for _, tp, dp in grid.values()):
        return frames
    coordinates = _frame([(rank, *where) for rank, where in grid.items()], GRID_SCHEMA)
    primary = [rank for rank, (_, tp, dp) in grid.items() if tp == 0 and dp == 0]
    keep = pl.col("rank").is_in(primary)
    frames.members = coordinates.join(frames.tasks, on="rank").sort("rank", "start_ns")
    frames.member_decisions = coordinates.join(frames.decisions, on="rank").sort("rank", "time_ns")
    frames.tasks, frames.decisions = frames.tasks.filter(keep), frames.decisions.filter(keep)
    frames.counters, frames.iterations = frames.counters.filter(keep), frames.iterations.filter(keep)
    frames.steps, frames.rendezvous = frames.steps.filter(keep), frames.rendezvous.filter(keep)
    frames.member_transfers = frames.transfers
    frames.transfers = frames.transfers.filter(pl.col("src").is_in(primary) & pl.col("dst").is_in(primary))
    frames.member_meta = frames.meta
    frames.meta = {rank: meta for rank, meta in frames.meta.items() if rank in primary}
    return frames

