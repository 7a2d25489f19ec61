"""Trace writing, reading and analyses on hand-built traces whose answers are known."""

from __future__ import annotations

import shutil

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hints.errors import UserError
from profiler.analysis.bubbles import bubble_totals, bubbles, misalignment_gaps
from profiler.analysis.conformance import conformance, kendall_tau
from profiler.analysis.critical_path import critical_path
from profiler.analysis.realized import (
    OverheadEstimate,
    dispatch_overhead,
    realized_durations,
    realized_iterations,
    realized_tables,
)
from profiler.analysis.replay import sensitivity, trace_hint
from profiler.analysis.summary import compare, summary
from profiler.trace.reader import TraceError, read_trace
from tests.helpers.trace_builder import MISALIGNED, ONE_F_ONE_B, US, build_run


@pytest.fixture
def one_f_one_b(tmp_path):
    return build_run(tmp_path / "run", **ONE_F_ONE_B)


@pytest.fixture
def misaligned(tmp_path):
    return build_run(tmp_path / "mis", **MISALIGNED)


def test_round_trip(one_f_one_b):
    frames = read_trace(one_f_one_b)
    assert frames.warnings == []
    assert frames.meta[0]["schema"] == "rrfp-trace/1" and frames.meta[1]["rank"] == 1
    got = {(r, t): (s // US, e // US) for r, t, s, e in frames.tasks.select("rank", "task", "start_ns",
                                                                             "end_ns").iter_rows()}
    want = {(r, t): (s, e) for r, spans in ONE_F_ONE_B["tasks"].items() for t, s, e in spans}
    assert got == want
    assert frames.tasks.get_column("units").to_list() == [8] * 8
    transfers = frames.transfers.select("producer", "src", "dst", "send_start_ns", "recv_end_ns").rows()
    assert sorted(transfers) == sorted((p, s, d, a * US, r * US) for p, s, d, a, _, r in ONE_F_ONE_B["transfers"])
    assert frames.decisions.height == 8 and frames.iterations.height == 2
    assert set(frames.counters.get_column("counter")) == {"ready set", "in flight", "activation bytes"}


def test_bubbles_of_a_fixed_1f1b(one_f_one_b):
    frame = bubbles(read_trace(one_f_one_b)).sort("rank")
    rank0, rank1 = frame.to_dicts()
    assert rank0["makespan_ns"] == 90 * US and rank0["busy_ns"] == 60 * US
    assert (rank0["fill_ns"], rank0["drain_ns"]) == (0, 0)
    assert rank0["dependency_ns"] == 30 * US and rank0["misalignment_ns"] == 0 and rank0["dispatch_ns"] == 0
    assert (rank1["fill_ns"], rank1["drain_ns"], rank1["busy_ns"]) == (12 * US, 23 * US, 55 * US)
    assert rank1["dependency_ns"] == rank1["misalignment_ns"] == rank1["dispatch_ns"] == 0


def test_misalignment_is_idle_time_while_another_task_was_ready(misaligned):
    frames = read_trace(misaligned)
    rank0 = bubbles(frames).filter(pl.col("rank") == 0).row(0, named=True)
    # 10..40: 0F1 (ready since 0) waits behind the fixed head 0B0; 70..95: nothing ready (0B1 arrives at 95).
    assert rank0["misalignment_ns"] == 30 * US
    assert rank0["dependency_ns"] == 25 * US
    gaps = misalignment_gaps(frames)
    top = gaps.row(0, named=True)
    assert (top["rank"], top["ran_next"], top["ready"], top["misaligned_ns"]) == (0, "0B0", "0F1", 30 * US)
    totals = bubble_totals(bubbles(frames))
    assert totals.filter(pl.col("rank") == "all").row(0, named=True)["misalignment_ns"] == 30 * US


def test_overhead_is_idle_time_with_only_the_next_task_ready(tmp_path):
    spec = dict(ONE_F_ONE_B)
    spec["tasks"] = dict(spec["tasks"])
    spec["tasks"][1] = [("1F0", 15, 25), ("1B0", 25, 37), ("1F1", 37, 47), ("1B1", 47, 67)]  # 0F0 arrived at 12
    frames = read_trace(build_run(tmp_path / "o", **spec))
    rank1 = bubbles(frames).filter(pl.col("rank") == 1).row(0, named=True)
    assert rank1["fill_ns"] == 15 * US  # before the first task counts as fill, whatever was ready


def test_critical_path(one_f_one_b):
    path = critical_path(read_trace(one_f_one_b))
    segments = [(kind, task, duration // US) for kind, task, duration in
                path.segments.select("kind", "task", "duration_ns").iter_rows()]
    assert segments == [("compute", "0F0", 10), ("transfer", "0F0", 2), ("compute", "1F0", 10),
                        ("compute", "1B0", 15), ("compute", "1F1", 10), ("compute", "1B1", 20),
                        ("transfer", "1B1", 3), ("compute", "0B1", 20)]
    assert path.makespan_ns == 90 * US
    assert path.shares() == pytest.approx({"compute": 85 / 90, "transfer": 5 / 90, "wait": 0.0})


def test_conformance_and_kendall_tau(misaligned):
    assert kendall_tau([0, 1, 2, 3]) == 1.0
    assert kendall_tau([3, 2, 1, 0]) == -1.0
    assert kendall_tau([1, 0, 2, 3]) == pytest.approx(1 - 4 / 12)
    frame = conformance(read_trace(misaligned))
    assert frame.get_column("kendall_tau").to_list() == [1.0, 1.0]  # ran exactly the hint
    assert frame.get_column("skips").to_list() == [0, 0]


def test_sensitivity_replays_the_realized_durations(tmp_path):
    # Uniform F = 10 us, B = 20 us, arrivals exactly at the producer's end: fixed 1F1B and GPipe take
    # (m + p - 1) * 30 us in the simulator, whatever the run did.
    ranks, m = 2, 2
    spec = dict(ranks=ranks, microbatches=m,
                tasks={0: [("0F0", 0, 10), ("0F1", 10, 20), ("0B0", 50, 70), ("0B1", 70, 90)],
                       1: [("1F0", 10, 20), ("1B0", 20, 40), ("1F1", 40, 50), ("1B1", 50, 70)]},
                transfers=[("0F0", 0, 1, 10, 10, 10), ("0F1", 0, 1, 20, 20, 20), ("1B0", 1, 0, 40, 40, 40),
                           ("1B1", 1, 0, 70, 70, 70)])
    frames = read_trace(build_run(tmp_path / "s", **spec))
    result = sensitivity(frames, overhead=0.0)
    rows = {(r.hint, r.rule): r.makespan for r in result.rows}
    assert rows[("1f1b", "fixed")] == pytest.approx((m + ranks - 1) * 30e-6)
    assert rows[("gpipe", "fixed")] == pytest.approx((m + ranks - 1) * 30e-6)
    assert {rule for _, rule in rows} == {"fixed", "greedy", "lookahead"}
    assert ("cp", "lookahead") in rows
    assert result.rows[0].hint == "(traced) 1f1b" and result.rows[0].rule == "fixed"
    assert result.measured_s == {0: pytest.approx(90e-6)}
    assert result.errors[0] == pytest.approx(0.0, abs=1e-9)  # the traced order replays to what ran
    data = result.to_json()
    assert data["rows"][0]["speedup_vs_traced"] == 1.0 and data["task_overhead_s"] == 0.0


def test_sensitivity_calibrates_the_dispatch_overhead(tmp_path):
    # Every task starts 5 us after it could have (previous end and inputs in): a 5 us dispatch cost.
    # Replaying the traced order with it reproduces the measured makespan exactly.
    ranks, m = 2, 2
    spec = dict(ranks=ranks, microbatches=m,
                tasks={0: [("0F0", 5, 15), ("0F1", 20, 30), ("0B0", 65, 85), ("0B1", 105, 125)],
                       1: [("1F0", 20, 30), ("1B0", 35, 55), ("1F1", 60, 70), ("1B1", 75, 95)]},
                transfers=[("0F0", 0, 1, 15, 15, 15), ("0F1", 0, 1, 30, 30, 30), ("1B0", 1, 0, 55, 56, 60),
                           ("1B1", 1, 0, 95, 96, 100)])
    frames = read_trace(build_run(tmp_path / "o", **spec))
    result = sensitivity(frames)
    assert result.overhead_s == pytest.approx(5e-6)
    assert result.overhead.samples > 0
    assert result.replayed_s[0] == pytest.approx(result.measured_s[0], rel=1e-6)


def _seconds(us: float) -> float:
    return int(us * US) * 1e-9  # what the trace's integer nanoseconds give


def test_realized_durations_are_the_traced_spans_and_latencies(one_f_one_b):
    frames = read_trace(one_f_one_b)
    table = realized_durations(frames, 0)
    assert table.forward == [[_seconds(10), _seconds(10)], [_seconds(10), _seconds(10)]]
    assert table.backward == [[_seconds(20), _seconds(20)], [_seconds(15), _seconds(20)]]
    # latency = receiver's recv_end minus the producer's end: 0F0 ends 10, arrives 12; 1B0 ends 37, arrives 40
    assert table.send_forward == [[_seconds(2), _seconds(2)], [0.0, 0.0]]
    assert table.send_backward == [[0.0, 0.0], [_seconds(3), _seconds(3)]]
    (realized,) = realized_iterations(frames)
    assert sorted(realized.measured) == ["0F0", "0F1", "1B0", "1B1"] and realized.filled == ()


def test_a_latency_missing_from_the_trace_is_filled_with_the_median_and_said_so(one_f_one_b):
    frames = read_trace(one_f_one_b)
    frames.transfers = frames.transfers.with_columns(
        pl.when(pl.col("producer") == "1B1").then(None).otherwise(pl.col("recv_end_ns")).alias("recv_end_ns"))
    (realized,) = realized_iterations(frames, [0])
    assert realized.filled == ("1B1",) and sorted(realized.measured) == ["0F0", "0F1", "1B0"]
    assert realized.fill_s == _seconds(2)  # median of 2, 2, 3 us
    assert realized.durations.send_backward[1] == [_seconds(3), _seconds(2)]


def test_realized_tables_cover_the_complete_iterations(tmp_path):
    frames = read_trace(build_run(tmp_path / "r", **ONE_F_ONE_B, iterations=3, period_us=200))
    assert [it for it, _ in realized_tables(frames)] == [0, 1, 2]
    assert [it for it, _ in realized_tables(frames, [2, 1])] == [2, 1]
    frames.tasks = frames.tasks.filter((pl.col("iteration") != 1) | (pl.col("task") != "0B1"))
    assert [it for it, _ in realized_tables(frames)] == [0, 2]  # iteration 1 lost a task


def test_realized_table_written_and_read_back_replays_the_run(one_f_one_b, tmp_path):
    from runtime.durations.tables import load_durations, write_durations
    from runtime.sched.simulator import simulate

    frames = read_trace(one_f_one_b)
    ((iteration, table),) = realized_tables(frames)
    path = tmp_path / "realized.parquet"
    write_durations(path, [(iteration, table)])
    loaded = load_durations(path, 2, 2, iteration=0)
    assert (loaded.forward, loaded.backward, loaded.send_forward, loaded.send_backward) == (
        table.forward, table.backward, table.send_forward, table.send_backward)
    # The hand-built run has no dispatch overhead, so replaying its own hint gives its makespan exactly.
    result = simulate(trace_hint(frames, 0), loaded, "fixed")
    assert result.makespan == pytest.approx(90e-6)


def test_realized_durations_of_an_incomplete_iteration_is_one_error(one_f_one_b):
    frames = read_trace(one_f_one_b)
    frames.tasks = frames.tasks.filter(pl.col("task") != "1B1")
    with pytest.raises(UserError, match=r"iteration 0 holds 7 of 8 tasks \(truncated trace\?\); the trace holds no "
                       r"complete one"):
        realized_durations(frames, 0)


def test_realized_durations_point_at_the_complete_iterations(tmp_path):
    frames = read_trace(build_run(tmp_path / "r", **ONE_F_ONE_B, iterations=3, period_us=200))
    frames.tasks = frames.tasks.filter((pl.col("iteration") != 1) | (pl.col("task") != "0B1"))
    with pytest.raises(UserError, match=r"iteration 1 holds 7 of 8 tasks .*; pick a complete one: 0, 2"):
        realized_durations(frames, 1)
    with pytest.raises(UserError, match=r"iteration 9 holds 0 of 8 tasks"):
        realized_iterations(frames, [0, 9])


# Known dispatch gaps (us), measured from max(previous end, ready) to the start:
# rank 0: 0F1 1 (ready at 0, previous end 10), 0B0 3 (1B0 arrives 40), 0B1 2 (1B1 arrives 70);
# rank 1: 1B0 4 (1F0 ends 22), 1F1 1 (0F1 arrived 23, 1B0 ends 36), 1B1 1. First tasks do not count.
DISPATCH = dict(
    ranks=2, microbatches=2,
    tasks={0: [("0F0", 0, 10), ("0F1", 11, 21), ("0B0", 43, 63), ("0B1", 72, 92)],
           1: [("1F0", 12, 22), ("1B0", 26, 36), ("1F1", 37, 47), ("1B1", 48, 68)]},
    transfers=[("0F0", 0, 1, 10, 11, 12), ("0F1", 0, 1, 21, 22, 23), ("1B0", 1, 0, 36, 38, 40),
               ("1B1", 1, 0, 68, 69, 70)],
)


def test_dispatch_overhead_is_the_median_gap_before_a_ready_task(tmp_path):
    frames = read_trace(build_run(tmp_path / "d", **DISPATCH))
    estimate = dispatch_overhead(frames)
    assert estimate.samples == 6
    assert estimate.per_task_s == pytest.approx(1.5e-6)  # gaps 1 1 1 2 3 4
    assert estimate.mean_s == pytest.approx(2e-6)
    assert dispatch_overhead(frames, [0]) == estimate
    # A task whose ready time is unknown (its input's arrival is not in the trace) is left out.
    frames.transfers = frames.transfers.filter(pl.col("producer") != "1B1")
    estimate = dispatch_overhead(frames)
    assert estimate.samples == 5 and estimate.per_task_s == pytest.approx(1e-6)  # gaps 1 1 1 3 4
    with pytest.raises(UserError, match="iteration 7 is not in the trace"):
        dispatch_overhead(frames, [7])


def test_dispatch_overhead_of_a_run_without_overhead_is_zero(one_f_one_b):
    assert dispatch_overhead(read_trace(one_f_one_b)) == OverheadEstimate(0.0, 0.0, 6)

def test_summary_and_compare(one_f_one_b, misaligned):
    a, b = read_trace(one_f_one_b), read_trace(misaligned)
    data = summary(a)
    assert data["iterations"] == 1 and data["median_makespan_s"] == pytest.approx(90e-6)
    assert sum(data["idle_share"].values()) == pytest.approx(1.0)
    frame = compare(a, b)
    assert frame.get_column("speedup_vs_A").to_list() == pytest.approx([1.0, 90 / 115])


# -- bad input -------------------------------------------------------------------


def test_truncated_trace_keeps_complete_packets(one_f_one_b, tmp_path):
    data = (one_f_one_b / "trace.pftrace").read_bytes()
    cut = tmp_path / "cut.pftrace"
    cut.write_bytes(data[: len(data) - 7])
    frames = read_trace(cut)
    assert any("truncated at byte" in w for w in frames.warnings)
    assert 0 < frames.tasks.height <= 8


def test_garbage_empty_and_foreign(tmp_path):
    (tmp_path / "random.pftrace").write_bytes(bytes(range(7, 250)))
    with pytest.raises(TraceError, match="not a Perfetto trace"):
        read_trace(tmp_path / "random.pftrace")
    (tmp_path / "empty.pftrace").write_bytes(b"")
    with pytest.raises(TraceError, match="empty file"):
        read_trace(tmp_path / "empty.pftrace")
    from perfetto.trace_builder.proto_builder import TraceProtoBuilder

    builder = TraceProtoBuilder()
    packet = builder.add_packet()
    packet.timestamp = 5
    packet.track_event.type = packet.track_event.TYPE_INSTANT
    packet.track_event.name = "someone else's event"
    packet.track_event.track_uuid = 42
    (tmp_path / "foreign.pftrace").write_bytes(builder.serialize())
    with pytest.raises(TraceError, match="not written by rrfp"):
        read_trace(tmp_path / "foreign.pftrace")
    (tmp_path / "empty-run").mkdir()
    with pytest.raises(TraceError, match="holds no trace"):
        read_trace(tmp_path / "empty-run")
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "absent")


def test_compare_run_directory_asks_for_a_job(one_f_one_b, tmp_path):
    both = tmp_path / "both"
    shutil.copytree(one_f_one_b, both / "fixed-1f1b")
    shutil.copytree(one_f_one_b, both / "ready-zb@2x")
    with pytest.raises(TraceError, match=r"holds several jobs \(fixed-1f1b, ready-zb@2x\)"):
        read_trace(both)


def test_unmerged_run_reads_rank_files(one_f_one_b):
    (one_f_one_b / "trace.pftrace").unlink()
    frames = read_trace(one_f_one_b)
    assert frames.tasks.height == 8 and any("not merged" in w for w in frames.warnings)


@settings(max_examples=int(__import__("os").environ.get("RRFP_FUZZ_EXAMPLES", "200")), suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(data=st.data())
def test_fuzzed_input_never_crashes_the_reader(tmp_path_factory, data):
    run = tmp_path_factory.getbasetemp() / "fuzz-source"
    if not (run / "trace.pftrace").exists():
        build_run(run, **ONE_F_ONE_B)
    valid = (run / "trace.pftrace").read_bytes()
    choice = data.draw(st.sampled_from(["random", "truncate", "flip", "splice"]))
    if choice == "random":
        blob = data.draw(st.binary(min_size=0, max_size=512))
    elif choice == "truncate":
        blob = valid[: data.draw(st.integers(0, len(valid)))]
    elif choice == "flip":
        position = data.draw(st.integers(0, len(valid) - 1))
        blob = valid[:position] + bytes([valid[position] ^ data.draw(st.integers(1, 255))]) + valid[position + 1:]
    else:
        blob = data.draw(st.binary(max_size=64)) + valid[data.draw(st.integers(0, len(valid))):]
    target = tmp_path_factory.getbasetemp() / "fuzz.pftrace"
    target.write_bytes(blob)
    try:
        frames = read_trace(target)
    except TraceError as err:
        assert "\n" not in str(err)
        return
    # Whatever parses must still analyse or fail with a one-line UserError.
    from hints.errors import UserError

    try:
        summary(frames)
    except UserError:
        pass
