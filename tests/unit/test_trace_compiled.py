"""The compiled packet walk ([Note: the compiled reader] in profiler/trace/reader.py) reads every trace as the
Python walk does: the same frames (columns, dtypes, rows), metadata, warnings and errors, on built traces, on
traces edited at the protobuf level so that they stay valid but hold every value type, name form and flow
encoding the walk decodes, on what it leaves to Python, and on damaged files.

Skipped where the extension was not built (no C compiler at install): the reader then always walks in Python,
which the rest of the suite tests."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiler.trace import reader
from profiler.trace.schema import SCHEMA, decode_track_uuid
from tests.helpers.trace_builder import packet_bounds, sample_runs
from tests.helpers.trace_compare import assert_same_both_ways, trace_bytes
from tests.helpers.trace_compare import packets as packets_of

fastread = pytest.importorskip("profiler.trace._fastread", reason="the compiled reader was not built here")

def walked(data: bytes):
    """The compiled walk over one file, or None where it leaves the file to Python."""
    return fastread.read([data], decode_track_uuid, reader._data_members(), SCHEMA)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return sample_runs(tmp_path_factory.mktemp("compiled"))


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


@pytest.mark.parametrize("name", ["1f1b", "misaligned", "killed", "taskless"])
def test_built_traces_read_the_same_both_ways(runs, name, monkeypatch):
    data = (runs[name] / "trace.pftrace").read_bytes()
    columns = walked(data)
    assert columns is not None and columns["packets"] == len(packet_bounds(data))  # walked in C, not left
    assert_same_both_ways(runs[name] / "trace.pftrace", monkeypatch)
    assert_same_both_ways(runs[name], monkeypatch)


def test_unmerged_rank_files_read_the_same_both_ways(runs, tmp_path, monkeypatch):
    unmerged = tmp_path / "unmerged" / "trace"
    unmerged.mkdir(parents=True)
    for file in (runs["misaligned"] / "trace").glob("rank*.pftrace"):
        (unmerged / file.name).write_bytes(file.read_bytes())
    assert_same_both_ways(unmerged.parent, monkeypatch)
    (unmerged / "rank1.pftrace").write_bytes(b"")  # a rank that finished no traced iteration
    assert_same_both_ways(unmerged.parent, monkeypatch)
    (unmerged / "rank1.pftrace").write_bytes(b"\x0a\x05ab")  # cut short: every file walked in Python
    assert_same_both_ways(unmerged.parent, monkeypatch)


def test_what_the_walk_leaves_to_python_reads_the_same(runs, tmp_path, monkeypatch):
    """Each case is one the compiled walk declines (it returns None) and the reader then reads in Python."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TracePacket

    packets = packets_of((runs["1f1b"] / "trace.pftrace").read_bytes())
    begin = next(i for i, p in enumerate(packets) if p.track_event.type == 1 and p.track_event.debug_annotations
                 and (p.track_event.track_uuid >> 16) & 0xFFFF == 1)  # rank 0's first compute slice

    def edited(edit) -> bytes:
        copy = [TracePacket.FromString(p.SerializeToString()) for p in packets]
        body = edit(copy[begin])  # the packet's new bytes, or None: the edited object's
        blob = trace_bytes(copy)
        if body is not None:
            start, end = packet_bounds(blob)[begin]
            blob = blob[:start] + b"\x0a" + _varint(len(body)) + body + blob[end:]
        return blob.replace(b"ZqZq", b"\xff\xfeZq")  # a placeholder made bytes that are not UTF-8

    def two_members(packet) -> bytes:  # the event, then a descriptor in the same packet: it clears the event
        with_descriptor = TracePacket()
        with_descriptor.track_descriptor.uuid = 5
        return packet.SerializeToString() + with_descriptor.SerializeToString()

    cases = {
        "two data members": two_members,
        "invalid UTF-8 value": lambda packet: setattr(packet.track_event.debug_annotations[0], "string_value", "ZqZq"),
        "invalid UTF-8 name": lambda packet: setattr(packet.track_event, "name", "ZqZq"),
        "invalid UTF-8 interned": lambda packet: packet.interned_data.event_names.add(iid=99, name="ZqZq") and None,
        "nested value": lambda packet: setattr(packet.track_event.debug_annotations[0].nested_value, "int_value", 1),
    }
    for name, edit in cases.items():
        data = edited(edit)
        assert walked(data) is None, name
        path = tmp_path / f"{name}.pftrace"
        path.write_bytes(data)
        assert_same_both_ways(path, monkeypatch)


# -- valid traces edited at the protobuf level ---------------------------------------------------------------

def _edit_annotation(annotation, data) -> None:
    kind = data.draw(st.sampled_from(["int", "uint", "negative", "bool", "double", "string", "empty string",
                                      "none", "pointer", "json", "string iid", "inline name", "unknown name"]))
    if kind == "int":
        annotation.int_value = data.draw(st.integers(0, 2**40))
    elif kind == "uint":
        annotation.uint_value = data.draw(st.integers(0, 2**64 - 1))
    elif kind == "negative":
        annotation.int_value = data.draw(st.integers(-(2**63), -1))
    elif kind == "bool":
        annotation.bool_value = data.draw(st.booleans())
    elif kind == "double":
        annotation.double_value = data.draw(st.floats(allow_nan=False))
    elif kind == "string":
        annotation.string_value = data.draw(st.text(max_size=6))
    elif kind == "empty string":
        annotation.string_value = ""
    elif kind == "none":
        for field in ("int_value", "bool_value", "double_value", "string_value", "uint_value"):
            annotation.ClearField(field)
    elif kind == "pointer":
        annotation.pointer_value = data.draw(st.integers(0, 2**64 - 1))
    elif kind == "json":
        annotation.legacy_json_value = data.draw(st.text(max_size=4))
    elif kind == "string iid":
        annotation.string_value_iid = data.draw(st.integers(0, 9))
    elif kind == "inline name":
        annotation.name = data.draw(st.sampled_from(["stage", "kind", "iteration", "units", "x", ""]))
    else:
        annotation.name_iid = data.draw(st.integers(0, 40))


def _edit_packet(packet, data, uuids) -> None:
    event = packet.track_event
    what = data.draw(st.sampled_from(["annotation", "drop annotation", "duplicate annotation", "type", "track",
                                      "time", "name", "inline name", "counter", "double counter", "flows",
                                      "clear", "intern", "sequence"]))
    if what == "annotation" and event.debug_annotations:
        _edit_annotation(event.debug_annotations[data.draw(st.integers(0, len(event.debug_annotations) - 1))], data)
    elif what == "drop annotation" and event.debug_annotations:
        del event.debug_annotations[data.draw(st.integers(0, len(event.debug_annotations) - 1))]
    elif what == "duplicate annotation" and event.debug_annotations:
        copy = event.debug_annotations.add()
        copy.CopyFrom(event.debug_annotations[0])
        _edit_annotation(copy, data)
    elif what == "type":
        event.type = data.draw(st.integers(0, 5))
    elif what == "track":
        event.track_uuid = data.draw(st.sampled_from(uuids) | st.integers(0, 2**64 - 1))
    elif what == "time":
        packet.timestamp = data.draw(st.integers(0, 2**64 - 1))
    elif what == "name":
        event.name_iid = data.draw(st.integers(0, 60))
    elif what == "inline name":
        event.name = data.draw(st.sampled_from([SCHEMA, "0F0", "0B1", "1F1", "", "x"]))
    elif what == "counter":
        event.counter_value = data.draw(st.integers(-(2**63), 2**63 - 1))
    elif what == "double counter":
        event.double_counter_value = data.draw(st.floats(allow_nan=False))
    elif what == "flows":
        ids = data.draw(st.lists(st.integers(0, 2**64 - 1), max_size=3))
        field = data.draw(st.sampled_from(["flow_ids", "terminating_flow_ids"]))
        getattr(event, field)[:] = ids
    elif what == "clear":
        packet.sequence_flags = 1
    elif what == "intern":
        interned = packet.interned_data
        entries = interned.event_names if data.draw(st.booleans()) else interned.debug_annotation_names
        entries.add(iid=data.draw(st.integers(0, 40)),
                    name=data.draw(st.sampled_from(["0F0", "1B1", "stage", "kind", "iteration", "hint", "", "z"])))
    else:
        packet.trusted_packet_sequence_id = data.draw(st.integers(0, 4))


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(data=st.data())
def test_edited_valid_traces_read_the_same_both_ways(runs, tmp_path_factory, monkeypatch, data):
    name = data.draw(st.sampled_from(["1f1b", "misaligned"]))
    packets = packets_of((runs[name] / "trace.pftrace").read_bytes())
    uuids = sorted({p.track_event.track_uuid for p in packets if p.HasField("track_event")})
    for _ in range(data.draw(st.integers(1, 6))):
        _edit_packet(packets[data.draw(st.integers(0, len(packets) - 1))], data, uuids)
    path = tmp_path_factory.mktemp("edited") / "trace.pftrace"
    path.write_bytes(trace_bytes(packets))
    assert_same_both_ways(path, monkeypatch)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(data=st.data())
def test_damaged_traces_read_the_same_both_ways(runs, tmp_path_factory, monkeypatch, data):
    valid = (runs["misaligned"] / "trace.pftrace").read_bytes()
    bounds = packet_bounds(valid)
    choice = data.draw(st.sampled_from(["truncate", "flip", "drop", "shuffle", "random"]))
    if choice == "truncate":
        damaged = valid[:data.draw(st.integers(1, len(valid)))]
    elif choice == "flip":
        at = data.draw(st.integers(0, len(valid) - 1))
        damaged = valid[:at] + bytes([valid[at] ^ data.draw(st.integers(1, 255))]) + valid[at + 1:]
    elif choice == "drop":
        keep = data.draw(st.lists(st.booleans(), min_size=len(bounds), max_size=len(bounds)))
        damaged = b"".join(valid[start:end] for (start, end), kept in zip(bounds, keep) if kept) or valid[:1]
    elif choice == "shuffle":
        order = data.draw(st.permutations(range(len(bounds))))
        damaged = b"".join(valid[bounds[i][0]:bounds[i][1]] for i in order)
    else:
        damaged = data.draw(st.binary(min_size=1, max_size=300))
    fastread.read([damaged], decode_track_uuid, reader._data_members(), SCHEMA)  # never crashes, whatever it is
    path = tmp_path_factory.mktemp("damaged") / "trace.pftrace"
    path.write_bytes(damaged)
    assert_same_both_ways(path, monkeypatch)


def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("RRFP_TRACE_COMPILED", "0")
    assert reader.compiled_reader() is None
    monkeypatch.setenv("RRFP_TRACE_COMPILED", "1")
    assert reader.compiled_reader() is fastread.read
