"""Two readings of one trace compared: every frame (columns, dtypes, rows in order), the metadata, the warnings
and the one-line errors. For tests that hold one reader to another (the reader before issue 26's rework, the
Python walk against the compiled one)."""

from __future__ import annotations

from hints.errors import UserError

FRAMES = ("tasks", "decisions", "transfers", "counters", "iterations", "steps", "rendezvous", "members",
          "member_decisions", "member_transfers")


def reading(read, path):
    """What ``read`` makes of ``path``: its frames and everything else it says, or its error."""
    try:
        frames = read(path)
    except UserError as err:  # a reader's TraceError
        return ("error", str(err))
    return ({name: getattr(frames, name) for name in FRAMES}, frames.meta, frames.member_meta, frames.warnings,
            frames.packets, frames.path)


def assert_same(first, second, unordered: tuple[str, ...] = ()) -> None:
    """Two :func:`reading` results are the same; the frames in ``unordered`` compared as sets of rows (their sort
    keys may tie, and ties come in each reader's own order)."""
    if first[0] == "error" or second[0] == "error":
        assert first == second
        return
    for name in FRAMES:
        old, new = first[0][name], second[0][name]
        assert old.schema == new.schema, name
        if name in unordered:
            old, new = old.sort(old.columns, nulls_last=True), new.sort(new.columns, nulls_last=True)
        assert old.equals(new, null_equal=True), (name, old, new)
    assert first[1:] == second[1:]


def compiled_built() -> bool:
    """Whether the compiled reader was built here (a C compiler at install)."""
    import importlib.util

    return importlib.util.find_spec("profiler.trace._fastread") is not None


def assert_same_both_ways(path, monkeypatch) -> None:
    """``path`` reads the same with its packets walked in Python and by the compiled reader ([Note: the compiled
    reader] in profiler.trace.reader); skips where the compiled reader was not built."""
    import pytest

    from profiler.trace import reader

    pytest.importorskip("profiler.trace._fastread", reason="the compiled reader was not built here")

    def walked(compiled: bool):
        monkeypatch.setenv("RRFP_TRACE_COMPILED", "1" if compiled else "0")
        return reading(lambda p: reader.read_trace(p, cache=False), path)

    # the transfers are sorted by (src, dst, sequence), which may tie: ties come in each walk's own order
    assert_same(walked(False), walked(True), unordered=("transfers", "member_transfers"))


def packets(data: bytes) -> list:
    """A trace file's packets, as protobuf objects."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    return list(Trace.FromString(data).packet)


def trace_bytes(packets) -> bytes:
    """A trace file of ``packets``."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    trace = Trace()
    trace.packet.extend(packets)
    return trace.SerializeToString()
