"""The reader on damaged traces: corrupt packets skipped and counted, truncation said plainly, merge by packet."""

from __future__ import annotations

import pytest

from profiler.trace.reader import TraceError, read_trace
from tests.helpers.trace_builder import ONE_F_ONE_B, build_run, corrupt_packet, packet_bounds


@pytest.fixture
def trace(tmp_path):
    return build_run(tmp_path / "run", **ONE_F_ONE_B) / "trace.pftrace"


def _compute_begin(data: bytes) -> int:
    """The index of a packet in the middle of rank 0's tasks (a compute slice's begin or end)."""
    return len(packet_bounds(data)) // 4


def test_a_corrupt_packet_is_skipped_and_reading_goes_on(trace, tmp_path):
    data = trace.read_bytes()
    damaged = tmp_path / "damaged.pftrace"
    damaged.write_bytes(corrupt_packet(data, _compute_begin(data)))
    frames = read_trace(damaged)
    assert any("1 corrupt packets" in w and "skipped" in w for w in frames.warnings), frames.warnings
    assert frames.packets == len(packet_bounds(data)) - 1
    assert frames.ranks == 2 and frames.tasks.filter(frames.tasks["rank"] == 1).height == 4  # later rank kept


def test_a_truncated_trace_says_where_and_what_it_kept(trace, tmp_path):
    data = trace.read_bytes()
    bounds = packet_bounds(data)
    cut_at = bounds[len(bounds) // 2][0] + 3
    cut = tmp_path / "cut.pftrace"
    cut.write_bytes(data[:cut_at])
    frames = read_trace(cut)
    assert f"truncated at byte {bounds[len(bounds) // 2][0]}; {len(bounds) // 2} complete packets kept" in \
        " ".join(frames.warnings)


@pytest.mark.parametrize("packets", [0, 2])
def test_a_trace_truncated_before_its_metadata_is_called_truncated(trace, tmp_path, packets):
    data = trace.read_bytes()
    start, _ = packet_bounds(data)[packets]
    cut = tmp_path / "cut.pftrace"
    cut.write_bytes(data[:start + 2])
    with pytest.raises(TraceError, match=rf"truncated at byte {start}; {packets} complete packets kept") as err:
        read_trace(cut)
    assert "not a Perfetto trace" not in str(err.value) and "not written by rrfp" not in str(err.value)


def test_merge_keeps_the_complete_packets_of_a_cut_rank_file_and_every_later_rank(tmp_path):
    from profiler.trace.recorder import merge_run_traces
    from profiler.trace.schema import rank_trace_files

    spec = dict(ONE_F_ONE_B, ranks=4, microbatches=2,
                tasks={r: [(f"{r}F0", 10 * r, 10 * r + 5), (f"{r}F1", 10 * r + 5, 10 * r + 10),
                           (f"{r}B0", 100 - 10 * r, 105 - 10 * r), (f"{r}B1", 105 - 10 * r, 110 - 10 * r)]
                       for r in range(4)},
                transfers=[])
    run = build_run(tmp_path / "four", **spec, iterations=2, period_us=200)
    rank1 = rank_trace_files(run)[1]
    data = rank1.read_bytes()
    bounds = packet_bounds(data)
    kept = len(bounds) - 3
    rank1.write_bytes(data[:bounds[kept][0] + 5])  # cut inside a packet of its second iteration
    merged = merge_run_traces(run)
    assert merged.warnings == [f"{rank1}: truncated at byte {bounds[kept][0]}; {kept} complete packets kept"]
    frames = read_trace(run)
    assert frames.ranks == 4 and sorted(frames.tasks["rank"].unique()) == [0, 1, 2, 3]
    assert frames.tasks.filter(frames.tasks["rank"] == 3).height == 8  # both iterations of the last rank
    assert not [w for w in frames.warnings if "truncated" in w]  # the merged file itself is whole


@pytest.mark.parametrize("compiled", ["0", "1"])
def test_an_integer_no_64_bit_column_holds_drops_its_row_and_counts_it(trace, tmp_path, monkeypatch, compiled):
    """protobuf's uint64 fields reach 2**64 - 1, the frames' Int64 columns 2**63 - 1: a corrupt task end (or any
    such value) drops that row and is counted, where it used to end the read in polars' TypeError. Both walks
    ([Note: the compiled reader]); the compiled one where it was built."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    if compiled == "1":
        pytest.importorskip("profiler.trace._fastread", reason="the compiled reader was not built here")
    monkeypatch.setenv("RRFP_TRACE_COMPILED", compiled)
    whole = read_trace(trace, cache=False)
    packets = Trace.FromString(trace.read_bytes())
    end = next(p for p in packets.packet if p.track_event.type == 2  # a compute slice's end
               and (p.track_event.track_uuid >> 16) & 0xFFFF == 1)
    end.timestamp = 2**63
    path = tmp_path / "huge.pftrace"
    path.write_bytes(packets.SerializeToString())
    frames = read_trace(path, cache=False)
    assert frames.tasks.height == whole.tasks.height - 1
    assert any(w == "1 events with missing or mistyped fields (dropped)" for w in frames.warnings), frames.warnings
