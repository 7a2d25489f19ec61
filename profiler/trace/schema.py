"""The rrfp trace schema (``rrfp-trace/1``): how a run is laid out as Perfetto TrackEvents.

This is a public, versioned format: the writer (:mod:`profiler.trace.recorder`)
and the reader (:mod:`profiler.trace.reader`) both follow it, and other tools may.

Per rank (``trusted_packet_sequence_id = rank + 1``), one process track
``rank <r>`` (pid ``r + 1``) with child tracks:

=====================  =====================================================
track                  events
=====================  =====================================================
``compute``            one slice per task, named by its canonical text
                       (``2F0``); annotations ``stage``, ``kind``,
                       ``microbatch``, ``chunk``, ``iteration``, ``units``
                       (tokens or samples), ``tokens`` (the microbatch's text
                       tokens), ``images`` (multimodal)
``decisions``          one slice per arbiter decision, from the moment the
                       rank became idle to the decision, named by the chosen
                       task; ``hint_rank`` (its hint position), ``skipped`` (the hint head it
                       skipped), ``ready`` (``task@hint_rank`` list),
                       ``held_back`` (admissions the budget held back),
                       ``deferred`` (a better-ranked ready backward the
                       lookahead rule passed over, if any),
                       ``in_flight``, ``iteration``
``iterations``         one slice per iteration; ``iteration``, ``hint``
                       (this rank's hint order); under ``--policy auto``
                       also ``rule`` (``fixed``, ``ready+la`` or ``ready``:
                       the rule the iteration ran) and ``auto`` (why)
``send -> <d>``        one slice per message sent to rank ``d`` (framing
                       to handed to the wire, by whichever thread sent
                       it); ``sequence``, ``bytes``,
                       ``queued_ns``, ``iteration``; starts a flow
``recv <- <s>``        one slice per message from rank ``s`` (frame received
                       to message handed over); ends that flow
``step``               one slice per iteration, named ``optimizer step``:
                       from the end of the rank's last task's bookkeeping to
                       the end of the barrier that closes the iteration;
                       ``iteration``, ``barrier_ns`` (when the optimizer step
                       ended and the barrier began). Absent in traces older
                       than it
``rendezvous``         ``--p2p blocking`` only: one slice per wait, after a
                       task (or the last), until the receivers of the
                       messages it sent posted their receives; named
                       ``rendezvous``; ``iteration``, ``messages``
                       (``<producer>-><rank>`` list). Absent otherwise
``ready set``, ``in flight``, ``activation bytes``
                       counters, sampled after every task
=====================  =====================================================

The first event of every rank is an instant named ``rrfp-trace/1`` on the
process track whose annotations hold the run's metadata (shape, policy,
``rule`` -- ``fixed``, ``greedy`` or ``lookahead``, absent in traces older
than the lookahead rule --, ``p2p`` -- ``async`` or ``blocking``, absent
(async) in traces older than it --, hint, budget, clock offset, timing source). A trace without it was not
written by rrfp.

Track uuids are ``(rank + 1) << 32 | code << 16 | peer`` (:func:`track_uuid`)
and flow ids are derived from the link and the message's sequence number
(:func:`flow_id`), so both ends compute them without talking.

Timestamps are nanoseconds of rank 0's monotonic clock: each rank adds its
measured offset to rank 0 (NTP-style ping-pong at start; the offset and its
error bound are in the metadata). On CUDA, compute slices come from CUDA
events (see :mod:`profiler.trace.recorder`); everything else from the host clock.

Framing: a ``.pftrace`` file is a ``Trace`` message, a sequence of
length-delimited fields 1 (``packet``), each one ``TracePacket``
(:func:`next_field` walks them).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

SCHEMA = "rrfp-trace/1"

TRACK_CODES = {
    "process": 0,
    "compute": 1,
    "decisions": 2,
    "iterations": 3,
    "send": 4,
    "recv": 5,
    "ready set": 6,
    "in flight": 7,
    "activation bytes": 8,
    "step": 9,
    "rendezvous": 10,
}
KIND_OF_CODE = {code: kind for kind, code in TRACK_CODES.items()}
COUNTERS = {"ready": "ready set", "in_flight": "in flight", "activation_bytes": "activation bytes"}


def track_uuid(rank: int, kind: str, peer: int = 0) -> int:
    return ((rank + 1) << 32) | (TRACK_CODES[kind] << 16) | peer


def decode_track_uuid(uuid: int) -> tuple[int, str, int] | None:
    """``(rank, kind, peer)`` of an rrfp track uuid, or None."""
    code = (uuid >> 16) & 0xFFFF
    rank = (uuid >> 32) - 1
    if rank < 0 or code not in KIND_OF_CODE:
        return None
    return rank, KIND_OF_CODE[code], uuid & 0xFFFF


def track_name(kind: str, peer: int = 0) -> str:
    if kind == "send":
        return f"send -> {peer}"
    if kind == "recv":
        return f"recv <- {peer}"
    return kind


def rank_trace_files(run: str | Path) -> list[Path]:
    """A run's per-rank traces, ``<run>/trace/rank<r>.pftrace``, in rank order."""
    return sorted((Path(run) / "trace").glob("rank*.pftrace"), key=lambda p: int(p.stem[4:] or 0))


def flow_id(src: int, dst: int, sequence: int) -> int:
    """The flow from a message's send slice to its receive slice."""
    return ((src + 1) << 48) ^ ((dst + 1) << 32) ^ (sequence & 0xFFFFFFFF)


# -- framing ---------------------------------------------------------------------

PACKET_FIELD = 1  # Trace.packet


class Field(NamedTuple):
    """One top-level field of a trace file: ``number``, and its body ``data[start:end]`` (length-delimited only)."""

    number: int
    wire: int
    start: int
    end: int


class FramingError(Exception):
    """The file's framing ends at byte ``at``: cut short (``truncated``) or not protobuf framing there."""

    def __init__(self, at: int, truncated: bool, reason: str) -> None:
        super().__init__(reason)
        self.at, self.truncated, self.reason = at, truncated, reason


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A protobuf varint at ``pos``: (value, next position); IndexError past the end, ValueError if too long."""
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


_FIXED = {1: 8, 5: 4}  # wire type -> width


def next_field(data: bytes, pos: int) -> tuple[Field, int]:
    """The field at ``pos`` and the position after it; :class:`FramingError` where the framing ends."""
    try:
        tag, body = _varint(data, pos)
        wire = tag & 7
        if wire == 2:
            length, body = _varint(data, body)
            end = body + length
        elif wire == 0:
            _, end = _varint(data, body)
        elif wire in _FIXED:
            end = body + _FIXED[wire]
        else:
            raise FramingError(pos, False, f"unexpected field tag {tag}")
    except IndexError:
        raise FramingError(pos, True, "cut inside a field header") from None
    except ValueError:
        raise FramingError(pos, False, "malformed varint") from None
    if end > len(data):
        raise FramingError(pos, True, "cut inside a field")
    return Field(tag >> 3, wire, body, end), end


def complete_packets(data: bytes) -> tuple[int, int, FramingError | None]:
    """``(bytes, packets, error)``: the length of ``data``'s longest prefix of whole fields, the packets in it, and
    why the framing stopped there (None when it ran to the end)."""
    pos = packets = 0
    while pos < len(data):
        try:
            field, following = next_field(data, pos)
        except FramingError as err:
            return pos, packets, err
        packets += field.number == PACKET_FIELD and field.wire == 2
        pos = following
    return pos, packets, None
