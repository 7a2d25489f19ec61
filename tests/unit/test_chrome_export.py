"""Chrome trace JSON of an rrfp run (profiler/trace/chrome.py) on hand-built traces: the layout torch's profiler
writes and HTA reads (per-rank files with their own distributedInfo, ProfilerStep per iteration, PP:<task> slices
whose times are the trace's to the nanosecond), the combined file with a flow per message, and bad destinations as
one-line errors. With holistictraceanalysis installed, HTA itself loads the per-rank folder."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter

import pytest

from hints.errors import UserError
from profiler.trace.chrome import ChromeEvents, is_combined, rank_file, write_chrome
from profiler.trace.reader import read_trace
from tests.helpers.trace_builder import MISALIGNED, ONE_F_ONE_B, build_run

ITERATIONS = 3
STEPS = {0: (95, 96, 99), 1: (93, 97, 99)}  # per rank: optimizer step start, barrier, end (us, iteration 0)


@pytest.fixture(scope="module")
def frames(tmp_path_factory):
    run = build_run(tmp_path_factory.mktemp("chrome") / "run", **ONE_F_ONE_B, iterations=ITERATIONS, period_us=200,
                    steps=STEPS)
    return read_trace(run)


@pytest.fixture(scope="module")
def per_rank(frames, tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks") / "chrome"
    written = write_chrome(frames, out)
    assert written == [str(out / rank_file(rank)) for rank in (0, 1)]
    return {rank: json.loads((out / rank_file(rank)).read_text()) for rank in (0, 1)}


def _slices(trace: dict, prefix: str = "") -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"].startswith(prefix)]


def test_each_rank_file_is_one_rank_of_a_torch_profiler_trace(per_rank):
    for rank, trace in per_rank.items():
        assert list(trace)[:6] == ["schemaVersion", "deviceProperties", "distributedInfo", "displayTimeUnit",
                                   "baseTimeNanoseconds", "traceEvents"]
        info = trace["distributedInfo"]
        assert info["rank"] == rank and info["world_size"] == 2 and info["backend"] == "gloo"
        assert info["pg_config"][0]["ranks"] == [0, 1] and info["pg_count"] == 1
        # HTA reads a file's rank as the first '"rank": N' in it
        assert int(re.search(r'"rank":\s+(\d+)', json.dumps(trace)).group(1)) == rank
        assert trace["rrfp"][str(rank)]["schema"] == "rrfp-trace/1"
        assert {e["pid"] for e in trace["traceEvents"]} == {rank}
    assert per_rank[0]["baseTimeNanoseconds"] == per_rank[1]["baseTimeNanoseconds"]  # ranks line up


def test_every_slice_has_what_viewers_need(per_rank):
    for trace in per_rank.values():
        for event in trace["traceEvents"]:
            assert {"ph", "name", "pid", "tid", "ts"} <= event.keys(), event
            if event["ph"] == "X":
                assert {"cat", "dur", "args"} <= event.keys() and event["dur"] >= 0, event
                assert isinstance(event["ts"], float) and isinstance(event["dur"], float)
        threads = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
        assert {e["tid"] for e in _slices(trace)} <= threads.keys()
        assert threads[0] == "tasks" and threads[1] == "decisions"


def test_one_profiler_step_per_iteration_holding_its_tasks(frames, per_rank):
    for rank, trace in per_rank.items():
        steps = {e["name"]: e for e in _slices(trace, "ProfilerStep#")}
        assert sorted(steps) == [f"ProfilerStep#{i}" for i in range(ITERATIONS)]
        for task in _slices(trace, "PP:"):
            step = steps[f"ProfilerStep#{task['args']['iteration']}"]
            assert step["ts"] <= task["ts"] and task["ts"] + task["dur"] <= step["ts"] + step["dur"] + 1e-9
        optimizer = _slices(trace, "Optimizer.step")
        assert len(optimizer) == ITERATIONS and len(_slices(trace, "barrier")) == ITERATIONS
        start, barrier, end = STEPS[rank]
        assert optimizer[0]["dur"] == pytest.approx(barrier - start)
        assert steps["ProfilerStep#0"]["ts"] + steps["ProfilerStep#0"]["dur"] == pytest.approx(end)  # base 0: the first task starts at 0


def test_tasks_are_the_traces_tasks_to_the_nanosecond(frames, per_rank):
    tasks = _slices(per_rank[0], "PP:") + _slices(per_rank[1], "PP:")
    assert len(tasks) == frames.tasks.height
    base = per_rank[0]["baseTimeNanoseconds"]
    exported = Counter((e["pid"], e["args"]["iteration"], e["name"], round(e["ts"] * 1e3) + base, round(e["dur"] * 1e3))
                       for e in tasks)
    expected = Counter((r["rank"], r["iteration"], f"PP:{r['task']}", r["start_ns"], r["duration_ns"])
                       for r in frames.tasks.iter_rows(named=True))
    assert exported == expected
    for event in tasks:
        args = event["args"]
        assert event["name"] == f"PP:{args['stage']}{args['kind']}{args['microbatch']}"
        assert event["cat"] == "user_annotation" and args["wait_ns"] >= 0 and args["units"] == 8


def test_decisions_and_messages_have_their_own_tracks(frames, per_rank):
    decisions = [e for trace in per_rank.values() for e in _slices(trace, "decide ")]
    assert len(decisions) == frames.decisions.height and {e["tid"] for e in decisions} == {1}
    sends = [e for e in _slices(per_rank[0]) if e["cat"] == "rrfp_message" and e["tid"] == 101]
    assert sorted(e["name"] for e in sends) == sorted(frames.transfers.filter(frames.transfers["src"] == 0)["producer"])
    threads = {e["tid"]: e["args"]["name"] for e in per_rank[1]["traceEvents"] if e["name"] == "thread_name"}
    assert threads[200] == "recv <- 0" and threads[100] == "send -> 0"
    counters = [e for e in per_rank[0]["traceEvents"] if e["ph"] == "C"]
    assert {e["name"] for e in counters} == {"ready set", "in flight", "activation bytes"}


def test_the_combined_file_holds_every_rank_and_a_flow_per_message(frames, tmp_path):
    path = tmp_path / "run.json.gz"
    assert is_combined(path) and not is_combined(tmp_path) and not is_combined(tmp_path / "folder")
    write_chrome(frames, path)
    with gzip.open(path, "rt") as handle:
        trace = json.load(handle)
    assert "rank" not in trace["distributedInfo"] and trace["distributedInfo"]["world_size"] == 2
    assert {e["pid"] for e in _slices(trace)} == {0, 1}
    assert len(_slices(trace, "PP:")) == frames.tasks.height
    starts = {e["id"]: e for e in trace["traceEvents"] if e["ph"] == "s"}
    ends = {e["id"]: e for e in trace["traceEvents"] if e["ph"] == "f"}
    assert starts.keys() == ends.keys() and len(starts) == frames.transfers.height
    for flow, start in starts.items():
        end = ends[flow]
        assert end["bp"] == "e" and start["ts"] <= end["ts"] and (start["pid"], end["pid"]) in {(0, 1), (1, 0)}


def test_a_misaligned_run_exports_as_well(tmp_path):
    frames = read_trace(build_run(tmp_path / "run", **MISALIGNED))
    events = ChromeEvents(frames)
    waits = {e["name"]: e["args"]["wait_ns"] for e in events.events(0) if e["name"].startswith("PP:")}
    assert waits["PP:0B0"] == 30_000  # rank 0 idles 10..40 us before 0B0
    assert events.base_ns == 0


def test_bad_destinations_are_one_line_errors(frames, tmp_path):
    with pytest.raises(UserError, match="no such directory"):
        write_chrome(frames, tmp_path / "missing" / "run.json", flag="--chrome")
    (tmp_path / "taken.json").write_text("{}")
    with pytest.raises(UserError, match="--chrome .*taken.json: exists; pass --force"):
        write_chrome(frames, tmp_path / "taken.json", flag="--chrome")
    write_chrome(frames, tmp_path / "taken.json", force=True)
    (tmp_path / "afile").write_text("")
    with pytest.raises(UserError, match="is a file"):
        write_chrome(frames, tmp_path / "afile")
    folder = tmp_path / "folder"
    write_chrome(frames, folder)
    with pytest.raises(UserError, match="already holds rank0_trace.json; pass --force"):
        write_chrome(frames, folder)
    assert len(write_chrome(frames, folder, force=True)) == 2
    (folder / "metrics.json").write_text("{}")
    with pytest.raises(UserError, match="holds metrics.json, which HTA would read"):
        write_chrome(frames, folder, force=True)


def test_hta_loads_the_per_rank_folder(frames, tmp_path):
    """Optional: holistictraceanalysis (``pip install HolisticTraceAnalysis``) reads the export as torch's own."""
    pytest.importorskip("hta")
    from hta.trace_analysis import TraceAnalysis

    write_chrome(frames, tmp_path / "chrome")
    analysis = TraceAnalysis(trace_dir=str(tmp_path / "chrome"), include_last_profiler_step=True)
    assert sorted(analysis.t.get_ranks()) == [0, 1]
    names = analysis.t.symbol_table.get_sym_table()
    for rank in (0, 1):
        df = analysis.t.get_trace(rank)
        tasks = df[[names[n].startswith("PP:") for n in df["name"]]]
        assert len(tasks) == frames.tasks.filter(frames.tasks["rank"] == rank).height
        assert sorted(set(tasks["iteration"])) == list(range(ITERATIONS))  # HTA's iteration, from ProfilerStep
