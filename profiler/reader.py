"""Reading rrfp traces (``rrfp-trace/1``) into polars frames, with the perfetto package's protobuf classes.

The trace processor of the ``perfetto`` package needs a binary that cannot be
downloaded here, so we walk the packets ourselves: a ``.pftrace`` file is a
``Trace`` message, i.e. a sequence of length-delimited ``packet`` fields
(field 1), which we frame by hand and parse one ``TracePacket`` at a time.
That also makes truncated files readable: every complete packet is kept and a
warning says where the file was cut.

Frames (:class:`TraceFrames`), times in ns of rank 0's clock:

* ``tasks``: rank, iteration, task, stage, kind, microbatch, chunk, start_ns,
  end_ns, duration_ns, units (tokens or samples: the workload's throughput unit), tokens (text tokens
  of the microbatch: samples x sequence length; null in traces older than it), images (multimodal),
  wait_ns
* ``decisions``: rank, iteration, waited_from_ns, time_ns, chosen, hint_rank,
  skipped, ready, held_back, in_flight, deferred
* ``transfers``: src, dst, sequence, iteration, producer, bytes, queued_ns,
  send_start_ns, send_end_ns, recv_start_ns, recv_end_ns (one row per message;
  a side missing from the trace is null)
* ``counters``: rank, counter, time_ns, value
* ``iterations``: rank, iteration, start_ns, end_ns, hint

Any input that is not a readable rrfp trace raises :class:`TraceError` (a
one-line ``UserError``): never a raw protobuf or index error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from hints.errors import UserError
from profiler.schema import SCHEMA, decode_track_uuid, rank_trace_files


_META_TYPES = {"schema": str, "rank": int, "world": int, "stages": int, "chunks": int, "microbatches": int,
               "policy": str, "hint": str, "memory_budget": str, "clock_offset_ns": int, "clock_error_ns": int}


_REQUIRED = {  # annotation types a slice must carry to be kept
    "compute": {"iteration": int, "stage": int, "kind": str, "microbatch": int, "chunk": int},
    "decisions": {"iteration": int, "hint_rank": int, "in_flight": int},
    "iterations": {"iteration": int, "hint": str},
    "send": {"iteration": int, "sequence": int, "bytes": int},
    "recv": {"iteration": int, "sequence": int, "bytes": int},
}


class TraceError(UserError):
    """The input is not a readable rrfp trace."""


@dataclass
class TraceFrames:
    path: str
    tasks: pl.DataFrame
    decisions: pl.DataFrame
    transfers: pl.DataFrame
    counters: pl.DataFrame
    iterations: pl.DataFrame
    meta: dict[int, dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    packets: int = 0

    @property
    def ranks(self) -> int:
        return len(self.meta)

    def frames(self) -> dict[str, pl.DataFrame]:
        return {"tasks": self.tasks, "decisions": self.decisions, "transfers": self.transfers,
                "counters": self.counters, "iterations": self.iterations}


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
    jobs = sorted(p.parent.name for p in path.glob("*/trace.pftrace")) + \
        sorted(p.parent.parent.name for p in path.glob("*/trace/rank*.pftrace"))
    if jobs:
        names = ", ".join(dict.fromkeys(jobs))
        raise TraceError(f"holds several jobs ({names}); give one of them, e.g. {path / jobs[0]}", str(path))
    raise TraceError("holds no trace (trace.pftrace or trace/rank*.pftrace); was it run with --no-trace?",
                     str(path))


def read_trace(path: str | Path) -> TraceFrames:
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


def _text(value: Any) -> str | None:
    """A string annotation, or None when a corrupt trace put something else there."""
    return value if isinstance(value, str) else None


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """Decode a protobuf varint at ``pos``; returns (value, next position); raises IndexError at the end."""
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


class _Reader:
    def __init__(self, name: str) -> None:
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TracePacket

        self.TracePacket = TracePacket
        self.name = name
        self.warnings: list[str] = []
        self.names: dict[int, dict[int, str]] = {}
        self.keys: dict[int, dict[int, str]] = {}
        self.open: dict[int, list] = {}
        self.meta: dict[int, dict[str, Any]] = {}
        self.packets = 0
        self.tasks: dict[str, list] = {k: [] for k in (
            "rank", "iteration", "task", "stage", "kind", "microbatch", "chunk", "start_ns", "end_ns", "units",
            "tokens", "images", "wait_ns")}
        self.decisions: dict[str, list] = {k: [] for k in (
            "rank", "iteration", "waited_from_ns", "time_ns", "chosen", "hint_rank", "skipped", "ready", "held_back",
            "deferred",
            "in_flight")}
        self.iterations: dict[str, list] = {k: [] for k in ("rank", "iteration", "start_ns", "end_ns", "hint")}
        self.counters: dict[str, list] = {k: [] for k in ("rank", "counter", "time_ns", "value")}
        self.sends: dict[int, tuple] = {}
        self.recvs: dict[int, tuple] = {}
        self.malformed = 0

    # -- framing -----------------------------------------------------------
    def feed(self, data: bytes, where: str) -> None:
        if not data:
            raise TraceError("empty file", where)
        pos, end = 0, len(data)
        parse = self.TracePacket.FromString
        while pos < end:
            start = pos
            try:
                tag, pos = _varint(data, pos)
                field_number, wire_type = tag >> 3, tag & 7
                if wire_type != 2:
                    if self.packets == 0:
                        raise TraceError(f"not a Perfetto trace (byte {start}: unexpected field tag {tag})", where)
                    self.warnings.append(f"{where}: stopped at byte {start} (unexpected field tag {tag}); "
                                         f"kept {self.packets} packets")
                    return
                length, pos = _varint(data, pos)
            except (IndexError, ValueError):
                self._truncated(where, start)
                return
            if pos + length > end:
                self._truncated(where, start)
                return
            if field_number == 1:
                try:
                    packet = parse(data[pos:pos + length])
                except Exception:  # protobuf's DecodeError (and friends) for bytes that are not a packet
                    if self.packets == 0:
                        raise TraceError(f"not a Perfetto trace (byte {start}: not a TracePacket)", where) from None
                    self.warnings.append(f"{where}: packet at byte {start} is corrupt; kept {self.packets} packets")
                    return
                self.packets += 1
                self._packet(packet)
            pos += length

    def _truncated(self, where: str, at: int) -> None:
        if self.packets == 0:
            raise TraceError(f"not a Perfetto trace (nothing complete before byte {at})", where)
        self.warnings.append(f"{where}: truncated at byte {at}; kept the {self.packets} complete packets")

    # -- packets -------------------------------------------------------------
    def _packet(self, packet) -> None:
        sequence = packet.trusted_packet_sequence_id
        if packet.sequence_flags & 1:  # SEQ_INCREMENTAL_STATE_CLEARED
            self.names[sequence] = {}
            self.keys[sequence] = {}
        if packet.HasField("interned_data"):
            interned = packet.interned_data
            names = self.names.setdefault(sequence, {})
            for entry in interned.event_names:
                names[entry.iid] = entry.name
            keys = self.keys.setdefault(sequence, {})
            for entry in interned.debug_annotation_names:
                keys[entry.iid] = entry.name
        if not packet.HasField("track_event"):
            return
        event = packet.track_event
        track = decode_track_uuid(event.track_uuid)
        if track is None:
            return
        kind = event.type
        if kind == 1:  # TYPE_SLICE_BEGIN
            name = event.name or self.names.get(sequence, {}).get(event.name_iid, "")
            self.open.setdefault(event.track_uuid, []).append(
                (packet.timestamp, name, self._annotations(event, sequence), tuple(event.flow_ids),
                 tuple(event.terminating_flow_ids)))
        elif kind == 2:  # TYPE_SLICE_END
            stack = self.open.get(event.track_uuid)
            if stack:
                self._slice(track, stack.pop(), packet.timestamp)
        elif kind == 4:  # TYPE_COUNTER
            rank, name, _ = track
            self.counters["rank"].append(rank)
            self.counters["counter"].append(name)
            self.counters["time_ns"].append(packet.timestamp)
            self.counters["value"].append(event.counter_value or event.double_counter_value)
        elif kind == 3:  # TYPE_INSTANT
            name = event.name or self.names.get(sequence, {}).get(event.name_iid, "")
            if name == SCHEMA:
                self.meta[track[0]] = self._annotations(event, sequence)

    def _annotations(self, event, sequence: int) -> dict[str, Any]:
        keys = self.keys.get(sequence, {})
        values = {}
        for annotation in event.debug_annotations:
            key = annotation.name or keys.get(annotation.name_iid, f"#{annotation.name_iid}")
            which = annotation.WhichOneof("value")
            values[key] = getattr(annotation, which) if which else None
        return values

    def _slice(self, track: tuple[int, str, int], begun: tuple, end: int) -> None:
        rank, kind, peer = track
        start, name, values, flows, ends = begun
        name = _text(name)
        required = _REQUIRED.get(kind, {})
        if any(not isinstance(values.get(key), typ) or isinstance(values.get(key), bool)
               for key, typ in required.items()) or end < start:
            self.malformed += 1
            return
        if kind == "compute":
            t = self.tasks
            t["rank"].append(rank)
            t["iteration"].append(values.get("iteration"))
            t["task"].append(name)
            t["stage"].append(values.get("stage"))
            t["kind"].append(values.get("kind"))
            t["microbatch"].append(values.get("microbatch"))
            t["chunk"].append(values.get("chunk"))
            t["start_ns"].append(start)
            t["end_ns"].append(end)
            t["units"].append(_whole(values.get("units")))
            t["tokens"].append(_whole(values.get("tokens")))
            t["images"].append(_whole(values.get("images")))
            t["wait_ns"].append(_whole(values.get("wait_ns")))
        elif kind == "decisions":
            d = self.decisions
            d["rank"].append(rank)
            d["iteration"].append(values.get("iteration"))
            d["waited_from_ns"].append(start)
            d["time_ns"].append(end)
            d["chosen"].append(name)
            d["hint_rank"].append(values.get("hint_rank"))
            d["skipped"].append(_text(values.get("skipped")))
            d["ready"].append(_text(values.get("ready", "")) or "")
            d["held_back"].append(_text(values.get("held_back")))
            d["deferred"].append(_text(values.get("deferred")))
            d["in_flight"].append(values.get("in_flight"))
        elif kind == "iterations":
            i = self.iterations
            i["rank"].append(rank)
            i["iteration"].append(values.get("iteration"))
            i["start_ns"].append(start)
            i["end_ns"].append(end)
            i["hint"].append(values.get("hint", ""))
        elif kind == "send":
            for flow in flows:
                self.sends[flow] = (rank, peer, values, name, start, end)
        elif kind == "recv":
            for flow in ends:
                self.recvs[flow] = (peer, rank, values, name, start, end)

    # -- frames --------------------------------------------------------------
    def finish(self) -> TraceFrames:
        if not self.packets:
            raise TraceError("holds no complete trace packet (no traced iteration finished?)", self.name)
        if self.packets and not self.meta:
            raise TraceError(f"not written by rrfp (no {SCHEMA} metadata in {self.packets} packets)", self.name)
        for rank, meta in self.meta.items():
            for key, kind in _META_TYPES.items():
                if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
                    raise TraceError(f"rank {rank}'s metadata has no valid {key!r} (corrupt trace?)", self.name)
            if min(meta["stages"], meta["chunks"], meta["microbatches"]) < 1:
                raise TraceError(f"rank {rank}'s metadata has an impossible shape (corrupt trace?)", self.name)
        unfinished = sum(len(stack) for stack in self.open.values())
        if unfinished:
            self.warnings.append(f"{unfinished} slices were begun but never ended (dropped)")
        if self.malformed:
            self.warnings.append(f"{self.malformed} events with missing or mistyped fields (dropped)")
        tasks = pl.DataFrame(self.tasks, schema={
            "rank": pl.Int64, "iteration": pl.Int64, "task": pl.Utf8, "stage": pl.Int64, "kind": pl.Utf8,
            "microbatch": pl.Int64, "chunk": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
            "units": pl.Int64, "tokens": pl.Int64, "images": pl.Int64, "wait_ns": pl.Int64})
        tasks = tasks.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"))
        decisions = pl.DataFrame(self.decisions, schema={
            "rank": pl.Int64, "iteration": pl.Int64, "waited_from_ns": pl.Int64, "time_ns": pl.Int64,
            "chosen": pl.Utf8, "hint_rank": pl.Int64, "skipped": pl.Utf8, "ready": pl.Utf8, "held_back": pl.Utf8,
            "deferred": pl.Utf8,
            "in_flight": pl.Int64})
        return TraceFrames(
            path=self.name,
            tasks=tasks.sort("rank", "start_ns"),
            decisions=decisions.sort("rank", "time_ns"),
            transfers=self._transfers(),
            counters=pl.DataFrame(self.counters, schema={"rank": pl.Int64, "counter": pl.Utf8, "time_ns": pl.Int64,
                                                         "value": pl.Float64}),
            iterations=pl.DataFrame(self.iterations, schema={"rank": pl.Int64, "iteration": pl.Int64,
                                                             "start_ns": pl.Int64, "end_ns": pl.Int64,
                                                             "hint": pl.Utf8}).sort("iteration", "rank"),
            meta=dict(sorted(self.meta.items())),
            warnings=self.warnings,
            packets=self.packets,
        )

    def _transfers(self) -> pl.DataFrame:
        columns: dict[str, list] = {k: [] for k in (
            "src", "dst", "sequence", "iteration", "producer", "bytes", "queued_ns", "send_start_ns", "send_end_ns",
            "recv_start_ns", "recv_end_ns")}
        for flow in set(self.sends) | set(self.recvs):
            send = self.sends.get(flow)
            recv = self.recvs.get(flow)
            src, dst, values, name, _, _ = send or recv
            columns["src"].append(src)
            columns["dst"].append(dst)
            columns["sequence"].append(values.get("sequence"))
            columns["iteration"].append(values.get("iteration"))
            columns["producer"].append(name)
            columns["bytes"].append(values.get("bytes"))
            columns["queued_ns"].append(_whole(send[2].get("queued_ns")) if send else None)
            columns["send_start_ns"].append(send[4] if send else None)
            columns["send_end_ns"].append(send[5] if send else None)
            columns["recv_start_ns"].append(recv[4] if recv else None)
            columns["recv_end_ns"].append(recv[5] if recv else None)
        frame = pl.DataFrame(columns, schema={k: (pl.Utf8 if k == "producer" else pl.Int64) for k in columns})
        return frame.sort("src", "dst", "sequence")
