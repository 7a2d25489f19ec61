"""Reading rrfp traces (``rrfp-trace/1``) into polars frames, with the perfetto package's protobuf classes.

The trace processor of the ``perfetto`` package needs a binary that cannot be
downloaded here, so we walk the packets ourselves: a ``.pftrace`` file is a
``Trace`` message, i.e. a sequence of length-delimited ``packet`` fields
(field 1), which we frame by hand and parse one ``TracePacket`` at a time.
That also makes damaged files readable: every complete packet of a truncated
file is kept and a warning says where the file was cut, and a packet that does
not parse although its framing is intact is skipped and counted.

[Note: reading fast]
    An intact file is parsed in one ``Trace.FromString`` call (protobuf's C
    parser); only when that fails (truncated or corrupt) is it walked packet
    by packet. The loop over the packets reads each one's type, track and
    time and no more: a slice's begin event is kept on its track's stack, and
    at its end the slice is queued for its track kind. The queued slices are
    decoded in one batch per kind (annotations, rows appended as tuples, one
    per slice) at the end, and before any packet that interns names or
    clears a sequence's state: a slice is decoded with the names in force
    when it ended, as if decoded then. The cyclic garbage collector is paused
    meanwhile: the reader makes millions of tuples and no reference cycles,
    and the collector's passes over the growing heap cost 10-20% of the read.
    The reader holds no reference cycle (its slice handlers are unbound
    functions in a module table), so its rows and events are freed as soon
    as the frames are built, not by a collector pass over them once
    collection resumes (another 10-15%). END and COUNTER packets take a short
    path: the recorder never interns names or clears incremental state on
    them.

    The frames are handed to polars a column at a time (``_frame``), not as
    rows: polars' row orientation took twice as long.

    Where the time goes (``benchmarks/trace_bench.py --reader-only``,
    docs/benchmarks/traces.md), as multiples of the plain parse: every field
    read from protobuf's Python objects costs a wrapper object, so reading
    each packet's type, track and time alone is about 3x, and reading each
    annotation's name and value besides about 6x, before any row is built;
    this walk is about 10x. Skipping the objects does not get under 3x in
    pure Python either: framing the file into packet bytes and splitting each
    packet into its fields with one regular expression pass is already about
    2.2x, with nothing decoded. Hence the compiled walk below.

[Note: the compiled reader]
    ``profiler/trace/_fastread.c`` walks the packets' bytes in C and builds
    the frames' columns directly, a Python object per value and none per
    field read: about 2x a plain parse where the Python walk is about 10x
    (issue 26's target is 3x). It is optional: ``setup.py`` builds it at
    install where a C compiler is at hand (``optional=True``: the install
    goes on without one) and ``RRFP_TRACE_COMPILED=0`` turns it off; without
    it every trace is walked in Python, with the same result.

    The same result is the rule it is held to, frames, metadata, warnings
    and errors alike (tests/unit/test_trace_compiled.py, including a fuzz of
    valid traces edited at the protobuf level). Three things make that hold:

    * It only walks files protobuf's own parser takes whole (``parses_whole``:
      that parse is part of the read, about 1x), so a damaged file, whose
      packets the Python walk frames, parses and counts one by one, never
      reaches it. Its walk then mirrors ``_consume`` and the slice handlers
      line by line, with protobuf's rules for what it reads: the last of a
      repeated scalar wins, a oneof holds its last member, a closed enum's
      unknown value is no value, uint32 fields are truncated.
    * Where protobuf would give the Python walk something it cannot mirror
      cheaply (a string that is not UTF-8, which protobuf hands over as
      bytes; a nested annotation value; an unknown event type; a field with
      an unexpected wire type; an event in a packet that also holds another
      of ``data``'s members; ...), it declines the whole read (returns
      None) and the Python walk reads every file instead, in file order, as
      if it had never been tried.
    * It decodes a slice's annotations when the slice ends, with the names
      in force then, which is what the Python walk's batches amount to
      ([Note: reading fast]); a receive without its send is decoded at the
      end, with the names in force at the end, as ``_lone_recv`` does.

    Both walks drop a row holding an integer that no Int64 column holds
    (protobuf's uint64 reaches 2**64 - 1) and count it with the malformed
    events (``_table``), where such a value used to end the read in polars'
    TypeError.

Frames (:class:`TraceFrames`), times in ns of rank 0's clock:

* ``tasks``: rank, iteration, task, stage, kind, microbatch, chunk, start_ns,
  end_ns, duration_ns, units (tokens or samples: the workload's throughput unit), tokens (text tokens
  of the microbatch: samples x sequence length; null in traces older than it), images (multimodal),
  wait_ns
* ``decisions``: rank, iteration, waited_from_ns, time_ns, chosen, hint_rank,
  skipped, ready, held_back, in_flight, deferred, and in a TP group (else null)
  index (the decision's place in the group's sequence), leader_ns (followers:
  when the leader decided), decision_arrived_ns (followers: when the DECISION
  arrived), announce_ns (leaders: time spent posting it)
* ``transfers``: src, dst, sequence, iteration, producer, bytes, queued_ns,
  send_start_ns, send_end_ns, recv_start_ns, recv_end_ns (one row per message;
  a side missing from the trace is null)
* ``counters``: rank, counter, time_ns, value
* ``iterations``: rank, iteration, start_ns, end_ns, hint, rule and auto (``--policy auto``: the rule the
  iteration ran and why, [Note: the auto policy] in runtime.sched.auto; null otherwise)
* ``steps``: rank, iteration, start_ns, barrier_ns, end_ns (the optimizer step, then the barrier that ends
  the iteration; empty in traces older than it)
* ``rendezvous``: rank, iteration, start_ns, end_ns, messages (``--p2p blocking``: the waits for receivers
  to post, [Note: blocking p2p in the runtime] in runtime.exec.executor; empty otherwise)

[Note: traces of TP and DP runs]
    Every rank writes its trace, but the frames above hold one *slice* of
    the grid (:mod:`runtime.comm.grid`): the TP leaders of DP replica 0, global
    ranks ``0..stages-1``, whose rank is also the pipeline rank. That slice
    is a pipeline-only job as far as every analysis can tell (bubbles,
    critical path, sensitivity). ``members`` and ``member_decisions`` hold
    the tasks and decisions of *every* rank, with ``pipe_rank``, ``tp_rank``
    and ``dp_rank`` columns, ``member_transfers`` every rank's messages and
    ``member_meta`` every rank's metadata (all empty for a pipeline-only
    trace).

Any input that is not a readable rrfp trace raises :class:`TraceError` (a
one-line ``UserError``): never a raw protobuf or index error.
"""

from __future__ import annotations

import gc
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Callable, Iterator

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


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _columns_frame(columns, schema: dict) -> pl.DataFrame:
    """The frame of ``columns`` (sequences in ``schema``'s column order)."""
    if not columns or not len(columns[0]):
        return _empty(schema)
    return pl.DataFrame(dict(zip(schema, columns)), schema=schema)


def _frame(rows: list[tuple], schema: dict) -> pl.DataFrame:
    """The frame of ``rows`` (tuples in ``schema``'s column order), handed to polars a column at a time: about
    half the time of its row orientation on a million-packet trace ([Note: reading fast])."""
    return _columns_frame(list(zip(*rows)), schema)


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
    # where profiler.trace.cache.keep would keep these frames: (trace files, key); None once kept, or when loaded
    cache_entry: tuple | None = field(default=None, repr=False, compare=False)

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


def read_trace(path: str | Path, cache: bool | None = None) -> TraceFrames:
    """The frames of the trace at ``path`` (a ``.pftrace`` file or a run directory).

    ``cache``: load them from the frames cache beside the trace when it holds them ([Note: the frames cache]
    in :mod:`profiler.trace.cache`); None: unless ``RRFP_TRACE_CACHE=0``. Frames decoded with the cache on
    carry what :func:`profiler.trace.cache.keep` needs to write it; nothing is written here."""
    from profiler.trace import cache as frames_cache

    if cache is None:
        cache = frames_cache.enabled()
    key = None
    if cache:
        paths, _ = locate_trace(path)
        key = frames_cache.cache_key(str(path), paths, SCHEMA)
        if key is not None:
            loaded = frames_cache.load(paths, key, TraceFrames)
            if loaded is not None:
                return loaded
    with _cyclic_gc_paused():
        frames = _read(path)
    if key is not None:
        frames.cache_entry = (paths, key)
    return frames


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
    walk = compiled_reader()
    whole: list[tuple[str, bytes]] | None = [] if walk else None  # files for the compiled walk, while all parse
    for file in paths:
        try:
            data = file.read_bytes()
        except OSError as err:
            raise TraceError(f"cannot read: {err}", str(file)) from None
        if not data and len(paths) > 1:
            reader.warnings.append(f"{file} is empty (that rank finished no traced iteration)")
            continue
        parses = True  # as far as is known
        if whole is not None:
            if reader.parses_whole(data):
                whole.append((str(file), data))
                continue
            for name, earlier in whole:  # a damaged file: the whole trace walked in Python, in file order
                reader.feed(earlier, name)
            whole, parses = None, False
        reader.feed(data, str(file), parses)
    if whole and not reader.take_compiled(walk, [data for _, data in whole]):
        for name, data in whole:
            reader.feed(data, name)
    return reader.finish()


def compiled_reader() -> Callable | None:
    """The compiled packet walk (``profiler.trace._fastread.read``, [Note: the compiled reader]), or None: not
    built here (no C compiler at install), or turned off with ``RRFP_TRACE_COMPILED=0``."""
    if os.environ.get("RRFP_TRACE_COMPILED", "1") == "0":
        return None
    try:
        from profiler.trace._fastread import read
    except ImportError:
        return None
    return read


@cache
def _data_members() -> bytes:
    """One byte per TracePacket field number, 1 for the members of its ``data`` oneof (``track_event`` and
    the other payloads a packet holds one of): the compiled walk leaves a packet holding two of them to
    Python, where whichever comes last clears the other."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TracePacket

    numbers = [member.number for member in TracePacket.DESCRIPTOR.oneofs_by_name["data"].fields]
    members = bytearray(max(numbers) + 1)
    for number in numbers:
        members[number] = 1
    return bytes(members)


_NO_KEYS: dict[int, str] = {}


def _text(value: Any) -> str | None:
    """A string annotation, or None when a corrupt trace put something else there."""
    return value if type(value) is str else None


def _whole(value: Any) -> int | None:
    return value if type(value) is int else None


def _annotation_values(event, key_of) -> dict[str, Any]:
    """An event's debug annotations by name (``key_of``: the interned names' ``get``); damaged text (read as
    bytes) as if absent."""
    values = {}
    for annotation in event.debug_annotations:
        which = annotation.WhichOneof("value")
        value = getattr(annotation, which) if which else None
        if type(value) is not bytes:
            values[key_of(annotation.name_iid) or annotation.name or "#"] = value
    return values


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
        # slices ended and not yet decoded, per track kind with a handler; and each open track's list of them
        self.ended: dict[str, list[tuple]] = {kind: [] for kind in _SLICE_HANDLERS}
        self.queues: dict[int, list[tuple] | None] = {}
        self.columns: dict[str, Any] | None = None  # the compiled walk's frames ([Note: the compiled reader])

    # -- framing -----------------------------------------------------------
    def parses_whole(self, data: bytes) -> bool:
        """Whether protobuf's parser takes ``data`` whole, with at least one packet: what the compiled walk
        needs to give the frames :meth:`feed` would ([Note: the compiled reader])."""
        try:
            return len(self.Trace.FromString(data).packet) > 0
        except Exception:  # protobuf's DecodeError
            return False

    def take_compiled(self, walk: Callable, files: list[bytes]) -> bool:
        """The frames of ``files`` (each one :meth:`parses_whole`) from the compiled walk; False (nothing taken)
        where a file holds what the walk leaves to Python."""
        columns = walk(files, decode_track_uuid, _data_members(), SCHEMA)
        if columns is None:
            return False
        self.columns = columns
        self.packets += columns["packets"]
        self.malformed += columns["malformed"]
        self.meta.update(columns["meta"])
        return True

    def feed(self, data: bytes, where: str, parses: bool = True) -> None:
        """``parses`` False: :meth:`parses_whole` already found that ``data`` does not parse whole, so it is
        framed packet by packet at once, not parsed a second time first."""
        if not data:
            raise TraceError("empty file", where)
        try:
            packets = self.Trace.FromString(data).packet if parses else None
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
        """The hot loop ([Note: reading fast]): every packet once, locals bound; a slice is queued at its end."""
        names, keys, tracks, stacks, queues = self.names, self.keys, self.tracks, self.open, self.queues
        counters, decode = self.rows["counters"], decode_track_uuid
        for packet in packets:
            event = packet.track_event
            kind = event.type
            if kind == 2:  # TYPE_SLICE_END: never first, never interning (the recorder); stacks are rrfp tracks'
                uuid = event.track_uuid
                stack = stacks.get(uuid)
                if stack:
                    begun = stack.pop()
                    queue = queues[uuid]
                    if queue is not None:
                        queue.append((tracks[uuid], begun, packet.timestamp))
                continue
            if kind == 4:  # TYPE_COUNTER: likewise
                uuid = event.track_uuid
                track = tracks.get(uuid, 0)
                if track == 0:
                    track = tracks[uuid] = decode(uuid)
                if track is not None:
                    counters.append((track[0], track[1], packet.timestamp,
                                     event.counter_value or event.double_counter_value))
                continue
            sequence = packet.trusted_packet_sequence_id
            if packet.sequence_flags & 1:  # SEQ_INCREMENTAL_STATE_CLEARED
                self._decode_queued()
                names[sequence] = {}
                keys[sequence] = {}
            if packet.HasField("interned_data"):
                self._decode_queued()
                self._intern(packet.interned_data, sequence)
            if not kind:
                continue
            uuid = event.track_uuid
            track = tracks.get(uuid, 0)
            if track == 0:
                track = tracks[uuid] = decode(uuid)
            if track is None:
                continue
            if kind == 1:  # TYPE_SLICE_BEGIN: decoded once ended
                stack = stacks.get(uuid)
                if stack is None:
                    stack = stacks[uuid] = []
                    queues[uuid] = self.ended.get(track[1])
                stack.append((packet.timestamp, event, sequence))
            elif kind == 3 and self._name(event, sequence) == SCHEMA:  # TYPE_INSTANT: the metadata
                self.meta[track[0]] = self._annotations(event, sequence)

    def _decode_queued(self) -> None:
        """Decode the ended slices ([Note: reading fast]): before the names they use can change, and at the end."""
        for kind, ended in self.ended.items():
            if ended:
                _SLICE_HANDLERS[kind](self, ended)
                ended.clear()

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
        return _annotation_values(event, (self.keys.get(sequence) or _NO_KEYS).get)

    def _values(self, kind: str, event, sequence: int) -> dict[str, Any] | None:
        """The slice's annotations, or None (counted as malformed) when a required one is missing or mistyped."""
        values = self._annotations(event, sequence)
        for key, typ in _REQUIRED[kind]:
            if type(values.get(key)) is not typ:
                self.malformed += 1
                return None
        return values

    def _ended(self, kind: str, ended: list[tuple]) -> Iterator[tuple]:
        """``(rank, peer, start, end, event, values, name of)`` of each well-formed slice of ``ended``; the others
        are counted as malformed (ended before begun, or a required annotation missing or mistyped)."""
        required, names, keys, malformed = _REQUIRED[kind], self.names, self.keys, 0
        for track, (start, event, sequence), end in ended:
            if end < start:
                malformed += 1
                continue
            values = _annotation_values(event, (keys.get(sequence) or _NO_KEYS).get)
            for key, typ in required:
                if type(values.get(key)) is not typ:
                    malformed += 1
                    break
            else:
                yield track[0], track[2], start, end, event, values, names.get(sequence) or _NO_KEYS
        self.malformed += malformed

    # -- one handler per slice track, over the slices ended since the last call ----------------------------
    def _compute(self, ended: list[tuple]) -> None:
        rows = self.rows["compute"]
        for rank, _, start, end, event, v, name_of in self._ended("compute", ended):
            iid = event.name_iid
            name = name_of.get(iid, "") if iid else event.name
            if name != f"{v['stage']}{v['kind']}{v['microbatch']}":  # a slice is named by its task's text
                self.malformed += 1  # (a corrupt name would reach the analyses as "'' is not a task")
                continue
            get = v.get
            rows.append((rank, v["iteration"], name, v["stage"], v["kind"], v["microbatch"], v["chunk"], start, end,
                         _whole(get("units")), _whole(get("tokens")), _whole(get("images")), _whole(get("wait_ns"))))

    def _decision(self, ended: list[tuple]) -> None:
        rows = self.rows["decisions"]
        for rank, _, start, end, event, v, name_of in self._ended("decisions", ended):
            iid = event.name_iid
            get = v.get
            rows.append((rank, v["iteration"], start, end, name_of.get(iid, "") if iid else event.name,
                         v["hint_rank"], _text(get("skipped")), _text(get("ready", "")) or "", _text(get("held_back")),
                         _text(get("deferred")), v["in_flight"], _whole(get("index")), _whole(get("leader_ns")),
                         _whole(get("decision_arrived_ns")), _whole(get("announce_ns"))))

    def _iteration(self, ended: list[tuple]) -> None:
        rows = self.rows["iterations"]
        for rank, _, start, end, _, v, _ in self._ended("iterations", ended):
            rule, auto = v.get("rule"), v.get("auto")  # --policy auto only ([Note: the auto policy])
            rows.append((rank, v["iteration"], start, end, v["hint"], rule if isinstance(rule, str) else None,
                         auto if isinstance(auto, str) else None))

    def _step(self, ended: list[tuple]) -> None:
        rows = self.rows["step"]
        for rank, _, start, end, _, v, _ in self._ended("step", ended):
            rows.append((rank, v["iteration"], start, min(max(v["barrier_ns"], start), end), end))

    def _rendezvous(self, ended: list[tuple]) -> None:
        rows = self.rows["rendezvous"]
        for rank, _, start, end, _, v, _ in self._ended("rendezvous", ended):
            rows.append((rank, v["iteration"], start, end, v["messages"]))

    def _send(self, ended: list[tuple]) -> None:
        sends = self.sends
        for rank, peer, start, end, event, v, name_of in self._ended("send", ended):
            iid = event.name_iid
            name = name_of.get(iid, "") if iid else event.name
            for flow in event.flow_ids:
                sends[flow] = (rank, peer, v, name, start, end)

    def _recv(self, ended: list[tuple]) -> None:
        """Kept raw: decoded only for a message whose send slice is missing (most have one)."""
        recvs, malformed = self.recvs, 0
        for recv in ended:
            if recv[2] < recv[1][0]:
                malformed += 1
                continue
            for flow in recv[1][1].terminating_flow_ids:
                recvs[flow] = recv
        self.malformed += malformed

    def _lone_recv(self, recv: tuple) -> tuple | None:
        """A receive slice without its send, as the send's ``(src, dst, values, name, start, end)``; None if malformed."""
        (dst, _, src), (start, event, sequence), end = recv
        v = self._values("recv", event, sequence)
        return None if v is None else (src, dst, v, self._name(event, sequence), start, end)

    # -- frames --------------------------------------------------------------
    def finish(self) -> TraceFrames:
        self._decode_queued()
        self._check_found()
        self._check_meta()
        table = self._table  # before the warnings: a row dropped there is counted in them
        tasks = table("compute", TASK_SCHEMA)
        tasks = tasks.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"))
        tables = {"tasks": tasks.sort("rank", "start_ns"),
                  "decisions": table("decisions", DECISION_SCHEMA).sort("rank", "time_ns"),
                  "transfers": table("transfers", TRANSFER_SCHEMA).sort("src", "dst", "sequence"),
                  "counters": table("counters", COUNTER_SCHEMA),
                  "iterations": table("iterations", ITERATION_SCHEMA).sort("iteration", "rank"),
                  "steps": table("step", STEP_SCHEMA).sort("iteration", "rank"),
                  "rendezvous": table("rendezvous", RENDEZVOUS_SCHEMA).sort("rank", "start_ns")}
        unfinished = sum(len(stack) for stack in self.open.values())
        if self.columns is not None:
            unfinished += self.columns["unfinished"]
        if unfinished:
            self.warnings.append(f"{unfinished} slices were begun but never ended (dropped)")
        if self.corrupt:
            self.warnings.append(f"{self.corrupt} corrupt packets (framed correctly, not a TracePacket) skipped")
        if self.malformed:
            self.warnings.append(f"{self.malformed} events with missing or mistyped fields (dropped)")
        frames = TraceFrames(path=self.name, **tables, meta=dict(sorted(self.meta.items())), warnings=self.warnings,
                             packets=self.packets)
        return _pipeline_slice(frames)

    def _table(self, kind: str, schema: dict) -> pl.DataFrame:
        """One frame: from the rows the packet loop built, or from the compiled walk's columns. A row holding an
        integer that no 64-bit column holds (a corrupt time or annotation: protobuf's uint64 reaches 2**64 - 1)
        is dropped and counted as malformed; only a frame that holds one pays for the check."""
        if self.columns is not None:
            columns = self.columns[kind]
        else:
            columns = list(zip(*(self._transfer_rows() if kind == "transfers" else self.rows[kind])))
        try:
            return _columns_frame(columns, schema)
        except (TypeError, OverflowError):  # polars: an int out of Int64's range
            ints = [i for i, dtype in enumerate(schema.values()) if dtype == I64]
            rows = [row for row in zip(*columns) if all(row[i] is None or _INT64_MIN <= row[i] <= _INT64_MAX
                                                        for i in ints)]
            self.malformed += len(columns[0]) - len(rows)
            return _columns_frame(list(zip(*rows)), schema)

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

    def _transfer_rows(self) -> list[tuple]:
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
        return rows


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

