"""The reader reworked for speed (issue 26, [Note: reading fast]) reads every trace as the reader before it did:
every frame (columns, dtypes, rows in order), the metadata, the warnings and the one-line errors, on built
traces, on damaged ones, and on traces whose interned names change between slices."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiler.trace import reader
from tests.helpers import reader_before
from tests.helpers.trace_builder import packet_bounds, sample_runs
from tests.helpers.trace_compare import assert_same, reading, trace_bytes
from tests.helpers.trace_compare import packets as packets_of


def assert_same_reading(path) -> None:
    assert_same(reading(reader_before.read_trace, path), reading(reader.read_trace, path))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return sample_runs(tmp_path_factory.mktemp("before"))


@pytest.mark.parametrize("name", ["1f1b", "misaligned", "killed", "taskless"])
def test_built_traces_read_as_before(runs, name):
    assert_same_reading(runs[name] / "trace.pftrace")
    assert_same_reading(runs[name])  # the run directory: its merged trace


def test_unmerged_rank_files_read_as_before(runs, tmp_path):
    rank_files = runs["misaligned"] / "trace"
    unmerged = tmp_path / "unmerged" / "trace"
    unmerged.mkdir(parents=True)
    for file in rank_files.glob("rank*.pftrace"):
        (unmerged / file.name).write_bytes(file.read_bytes())
    assert_same_reading(unmerged.parent)
    (unmerged / "rank1.pftrace").write_bytes(b"")  # a rank that finished no traced iteration
    assert_same_reading(unmerged.parent)


def test_names_interned_again_after_a_slice_name_it_as_when_it_ended(runs, tmp_path):
    """A slice is named and annotated with the interned names in force when it ended: names interned again, or
    the sequence's state cleared, after its end change only the slices after them."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TracePacket

    packets = packets_of((runs["1f1b"] / "trace.pftrace").read_bytes())
    begin = next(i for i, p in enumerate(packets) if p.track_event.type == 1 and p.track_event.debug_annotations
                 and (p.track_event.track_uuid >> 16) & 0xFFFF == 1)  # rank 0's first compute slice
    slice_begin, slice_end = packets[begin], packets[begin + 1]
    sequence = slice_begin.trusted_packet_sequence_id
    later = max(p.timestamp for p in packets) + 1000

    def copy(packet, at):
        out = TracePacket()
        out.CopyFrom(packet)
        out.ClearField("interned_data")
        out.timestamp = at
        return out

    renamed = TracePacket(trusted_packet_sequence_id=sequence)
    for entry in slice_begin.interned_data.event_names or ():
        renamed.interned_data.event_names.add(iid=entry.iid, name="0B1")
    name_iid = slice_begin.track_event.name_iid
    renamed.interned_data.event_names.add(iid=name_iid, name="9F9")
    for annotation in slice_begin.track_event.debug_annotations[:2]:
        renamed.interned_data.debug_annotation_names.add(iid=annotation.name_iid, name="renamed")
    cleared = TracePacket(trusted_packet_sequence_id=sequence, sequence_flags=1)
    extra = [copy(slice_begin, later), copy(slice_end, later + 10), renamed,
             copy(slice_begin, later + 20), copy(slice_end, later + 30), cleared,
             copy(slice_begin, later + 40), copy(slice_end, later + 50)]
    path = tmp_path / "renamed.pftrace"
    path.write_bytes(trace_bytes(packets + extra))
    assert_same_reading(path)
    cut = tmp_path / "renamed-cut.pftrace"  # the same, walked packet by packet (the file is cut short)
    cut.write_bytes(path.read_bytes()[:-1])
    assert_same_reading(cut)


def test_malformed_slices_are_dropped_and_counted_as_before(runs, tmp_path):
    """Ends before their begins, ends without a begin, begins never ended, a counter on an unknown track."""
    packets = packets_of((runs["1f1b"] / "trace.pftrace").read_bytes())
    for index, packet in enumerate(packets):
        event = packet.track_event
        if event.type == 2 and index % 3 == 0:
            packet.timestamp = 0  # ended before it began
        elif event.type == 2 and index % 3 == 1:
            event.track_uuid ^= 1 << 16  # ends on another track
        elif event.type == 4 and index % 2:
            event.track_uuid = 7  # no rrfp track
    path = tmp_path / "malformed.pftrace"
    path.write_bytes(trace_bytes(packets))
    assert_same_reading(path)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(data=st.data())
def test_damaged_traces_read_as_before(runs, tmp_path_factory, data):
    valid = (runs["misaligned"] / "trace.pftrace").read_bytes()
    bounds = packet_bounds(valid)
    choice = data.draw(st.sampled_from(["truncate", "flip", "drop", "shuffle"]))
    if choice == "truncate":
        damaged = valid[:data.draw(st.integers(1, len(valid)))]
    elif choice == "flip":
        at = data.draw(st.integers(0, len(valid) - 1))
        damaged = valid[:at] + bytes([valid[at] ^ data.draw(st.integers(1, 255))]) + valid[at + 1:]
    elif choice == "drop":  # whole packets left out: slices without their ends, ends without their begins
        keep = data.draw(st.lists(st.booleans(), min_size=len(bounds), max_size=len(bounds)))
        damaged = b"".join(valid[start:end] for (start, end), kept in zip(bounds, keep) if kept) or valid[:1]
    else:  # packets out of order
        order = data.draw(st.permutations(range(len(bounds))))
        damaged = b"".join(valid[bounds[i][0]:bounds[i][1]] for i in order)
    path = tmp_path_factory.mktemp("damaged") / "trace.pftrace"
    path.write_bytes(damaged)
    assert_same_reading(path)
