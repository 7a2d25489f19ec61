"""The rrfp trace schema (``rrfp-trace/1``): how a run is laid out as Perfetto TrackEvents.

This is a public, versioned format: the writer (:mod:`profiler.recorder`)
and the reader (:mod:`profiler.reader`) both follow it, and other tools may.

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
                       task; ``hint_rank``, ``skipped`` (the hint head it
                       skipped), ``ready`` (``task@hint_rank`` list),
                       ``held_back`` (admissions the budget held back),
                       ``deferred`` (a better-ranked ready backward the
                       lookahead rule passed over, if any),
                       ``in_flight``, ``iteration``
``iterations``         one slice per iteration; ``iteration``, ``hint``
                       (this rank's hint order)
``send -> <d>``        one slice per message sent to rank ``d`` (on the
                       sender thread); ``sequence``, ``bytes``,
                       ``queued_ns``, ``iteration``; starts a flow
``recv <- <s>``        one slice per message from rank ``s`` (frame received
                       to message handed over); ends that flow
``ready set``, ``in flight``, ``activation bytes``
                       counters, sampled after every task
=====================  =====================================================

The first event of every rank is an instant named ``rrfp-trace/1`` on the
process track whose annotations hold the run's metadata (shape, policy,
``rule`` -- ``fixed``, ``greedy`` or ``lookahead``, absent in traces older
than the lookahead rule --, hint, budget, clock offset, timing source). A trace without it was not
written by rrfp.

Track uuids are ``(rank + 1) << 32 | code << 16 | peer`` (:func:`track_uuid`)
and flow ids are derived from the link and the message's sequence number
(:func:`flow_id`), so both ends compute them without talking.

Timestamps are nanoseconds of rank 0's monotonic clock: each rank adds its
measured offset to rank 0 (NTP-style ping-pong at start; the offset and its
error bound are in the metadata). On CUDA, compute slices come from CUDA
events (see :mod:`profiler.recorder`); everything else from the host clock.
"""

from __future__ import annotations

from pathlib import Path

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
