"""`rrfp run` leaves a trace, and every `rrfp trace` command answers from it: the traced --compare run of
tests/multiproc/conftest.py (real ranks), read by the trace commands in this process. The commands on
hand-built traces: tests/inproc/test_trace_commands.py."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from profiler.trace.reader import read_trace
from tests.helpers.cli import run_cli


@pytest.fixture(scope="module")
def runs(traced_compare):
    """Its folder, and two of its jobs: fixed 1f1b and ready zb@2x."""
    assert traced_compare.result.returncode == 0, traced_compare.result.stderr
    return traced_compare.root, traced_compare.run / "fixed-1f1b", traced_compare.run / "ready-zb@2x"


def test_run_leaves_a_merged_trace_of_the_window(runs):
    _, fixed, ready = runs
    for run in (fixed, ready):
        assert (run / "trace.pftrace").exists() and len(list((run / "trace").glob("rank*.pftrace"))) == 3
        frames = read_trace(run)
        assert sorted(frames.tasks.get_column("iteration").unique().to_list()) == [1, 2]  # --trace-iters 1:
        assert frames.ranks == 3 and frames.warnings == []
        per_iteration = frames.tasks.group_by("iteration").len().get_column("len").to_list()
        assert per_iteration == [3 * 6 * (3 if run == ready else 2)] * 2  # zb splits backwards into I + W
        # every message has both ends, and the flow ids joined them
        assert frames.transfers.filter(frames.transfers["recv_end_ns"].is_null()).height == 0
        assert frames.transfers.filter(frames.transfers["send_start_ns"].is_null()).height == 0


def test_each_rank_declares_its_clock_and_snapshots_it(runs):
    """[Note: trace clocks]: monotonic timestamps, related to BOOTTIME and REALTIME (Kineto, nsys)."""
    import time

    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    _, fixed, _ = runs
    packets = Trace.FromString((fixed / "trace.pftrace").read_bytes()).packet
    defaults = [p.trace_packet_defaults.timestamp_clock_id for p in packets if p.HasField("trace_packet_defaults")]
    snapshots = [{c.clock_id: c.timestamp for c in p.clock_snapshot.clocks} for p in packets
                 if p.HasField("clock_snapshot")]
    assert defaults == [3, 3, 3] and len(snapshots) == 3  # one per rank; 3 = BUILTIN_CLOCK_MONOTONIC
    first_task = min(p.timestamp for p in packets if p.HasField("track_event"))
    for clocks in snapshots:
        assert sorted(clocks) == [1, 3, 6]  # REALTIME, MONOTONIC, BOOTTIME
        assert 0 < clocks[3] - first_task < 60e9  # taken when the first traced iteration was written
        assert abs(clocks[1] - time.time_ns()) < 3600e9


@pytest.mark.parametrize("command", ["summary", "bubbles", "misalign", "critical-path", "sensitivity",
                                     "decisions"])
def test_every_analysis_answers(runs, command):
    root, fixed, _ = runs
    human = run_cli(root, "trace", command, str(fixed))
    assert human.returncode == 0, human.stderr
    machine = run_cli(root, "trace", command, str(fixed), "--json")
    assert machine.returncode == 0, machine.stderr
    data = json.loads(machine.stdout)
    # a whole trace of a run that went well: read without a warning, and the answer is about it
    assert data["warnings"] == [] and human.stderr == ""
    assert ANSWERS[command](data), data
    assert human.stdout.strip()


# What each analysis of the fixed 1f1b job (3 ranks x 6 microbatches, iterations 1..2 traced) must say.
ANSWERS = {
    "summary": lambda d: d["ranks"] == 3 and d["iteration_numbers"] == [1, 2] and d["hint"] == "1f1b",
    "bubbles": lambda d: [row["rank"] for row in d["rows"]] == ["0", "1", "2", "all"],
    "misalign": lambda d: 0 < len(d["gaps"]) <= sum(r["gaps"] for r in d["per_rank"])  # fixed order misaligns
    and all(g["misaligned_ns"] > 0 and g["ready"] and g["ran_next"] for g in d["gaps"]),
    "critical-path": lambda d: d["makespan_ns"] > 0 and d["segments"],
    "sensitivity": lambda d: d["rows"][0]["hint"] == "(traced) 1f1b" and d["iterations"] == [1, 2],
    "decisions": lambda d: d["total"] == 2 * 3 * 6 * 2,  # 2 iterations x 3 ranks x 12 tasks
}


def test_bubbles_show_the_misalignment_ready_recovers(runs):
    root, fixed, ready = runs

    def misalignment(run):
        rows = json.loads(run_cli(root, "trace", "bubbles", str(run), "--json").stdout)["rows"]
        total = next(r for r in rows if r["rank"] == "all")
        return total["misalignment_ns"] / total["makespan_ns"]

    assert misalignment(fixed) > misalignment(ready)


def test_sensitivity_replays_the_traced_hint_close_to_what_ran(runs):
    root, fixed, _ = runs
    data = json.loads(run_cli(root, "trace", "sensitivity", str(fixed), "--json").stdout)
    traced = data["rows"][0]
    assert traced["hint"] == "(traced) 1f1b" and traced["rule"] == "fixed"
    assert data["iterations"] == [1, 2]  # traced 1..2; only iteration 0 (start-up) is left out by default
    assert data["overhead_calibration"]["samples"] > 0 and data["task_overhead_s"] > 0
    # A calibrated replay of what ran lands close to what was measured: over the traced iterations within 15%,
    # and no iteration replayed more than 15% slower than it ran. (A single iteration can run slower than its
    # replay when the shared machine stalls a rank; it never runs faster than its own tasks allow.)
    replays = data["replay"]
    assert sum(r["replayed_s"] for r in replays) == pytest.approx(sum(r["measured_s"] for r in replays), rel=0.15)
    for replay in replays:
        assert replay["replayed_s"] <= 1.15 * replay["measured_s"], replay
    assert {(r["hint"], r["rule"]) for r in data["rows"][1:]} >= {("1f1b", "fixed"), ("zb", "greedy"),
                                                                   ("zb", "lookahead"), ("cp", "lookahead")}
    ready = json.loads(run_cli(root, "trace", "sensitivity", str(ready_run := runs[2]), "--json",
                               "--iterations", "1:", "--task-overhead", "0").stdout)
    assert ready["iterations"] == [1, 2] and ready["task_overhead_s"] == 0
    assert ready["rows"][0]["hint"] == "(traced) zb" and ready["rows"][0]["rule"] == "lookahead", ready_run


def test_compare_export_timeline(runs, tmp_path):
    root, fixed, ready = runs
    data = json.loads(run_cli(root, "trace", "compare", str(fixed), str(ready), "--json").stdout)
    assert [row["run"] for row in data["rows"]] == ["A", "B"]
    exported = run_cli(root, "trace", "export", str(ready), "--parquet", str(tmp_path / "pq"))
    assert exported.returncode == 0, exported.stderr
    assert sorted(p.name for p in (tmp_path / "pq").iterdir()) == [
        "counters.parquet", "decisions.parquet", "iterations.parquet", "meta.json", "rendezvous.parquet",
        "steps.parquet", "tasks.parquet", "transfers.parquet"]
    png = tmp_path / "t.png"
    drawn = run_cli(root, "trace", "timeline", str(ready), "--png", str(png), "--json")
    assert drawn.returncode == 0, drawn.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(drawn.stdout)["written"] == [str(png)]
    import polars as pl

    tasks = pl.read_parquet(tmp_path / "pq" / "tasks.parquet")  # the frames, as the reader gives them
    assert tasks.height == read_trace(ready).tasks.height == 2 * 3 * 6 * 3


@pytest.mark.parametrize("which,suffix", [("fixed", ".csv"), ("ready", ".parquet")])
def test_export_durations_replays_each_iteration_close_to_what_ran(runs, tmp_path, which, suffix):
    from profiler.analysis.replay import trace_hint
    from profiler.analysis.windows import iteration_windows
    from runtime.durations.tables import load_durations
    from runtime.sched.budget import MemoryBudget
    from runtime.sched.simulator import simulate

    root, fixed, ready = runs
    run = fixed if which == "fixed" else ready
    path = tmp_path / f"realized{suffix}"
    result = run_cli(root, "trace", "export", str(run), "--durations", str(path), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)["durations"]
    tasks_per_iteration = 3 * 6 * (3 if run == ready else 2)  # zb splits backwards into I + W
    assert data["file"] == str(path) and data["iterations"] == [1, 2]  # --trace-iters 1:
    assert data["task_rows"] == 2 * tasks_per_iteration
    assert (data["latencies_measured"], data["latencies_filled"]) == (2 * 2 * 2 * 6, 0)  # F and B/I of 2 stages each

    frames = read_trace(run)
    meta = frames.meta[0]
    measured = dict(iteration_windows(frames).select("iteration", "makespan_ns").iter_rows())
    for iteration in data["iterations"]:
        table = load_durations(path, 3, 6, iteration=iteration)
        replay = simulate(trace_hint(frames, iteration), table, meta["policy"],
                          MemoryBudget.parse(meta["memory_budget"]))
        # No dispatch overhead in the simulator yet, so not tighter than this.
        assert replay.makespan == pytest.approx(measured[iteration] * 1e-9, rel=0.25)

    # The command the export prints replays the table's first iteration through `rrfp simulate`.
    args = data["replay"].split()[1:]
    assert args[args.index("--durations-iteration") + 1] == "1"
    simulated = run_cli(root, *args, "--json")
    assert simulated.returncode == 0, simulated.stderr
    assert json.loads(simulated.stdout)["makespan"] == pytest.approx(measured[1] * 1e-9, rel=0.25)


def test_export_durations_of_chosen_iterations_with_the_frames(runs, tmp_path):
    root, fixed, _ = runs
    table = tmp_path / "d.csv"
    result = run_cli(root, "trace", "export", str(fixed), "--durations", str(table), "--iterations", "2:",
                     "--parquet", str(tmp_path / "pq"))
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())  # rich wraps long lines
    assert f"wrote {table}: 36 task rows of 1 iteration (2); latencies: 24 measured, 0 filled" in out
    assert (tmp_path / "pq" / "tasks.parquet").exists()
    import polars as pl

    assert pl.read_csv(table).get_column("iteration").unique().to_list() == [2]


@pytest.mark.parametrize("args,message", [
    (lambda d: ["--durations", str(d / "missing" / "d.csv")], "no such directory"),
    (lambda d: ["--durations", str(d)], "is a directory"),
    (lambda d: ["--durations", str(d / "d.json")], "unknown extension '.json'"),
    (lambda d: [], "give --parquet DIR, --durations FILE, or both"),
    (lambda d: ["--parquet", str(d / "pq"), "--iterations", "1:"], "--iterations: applies to --durations only"),
    (lambda d: ["--durations", str(d / "d.csv"), "--iterations", "5:"], "no complete iteration in 5: (complete: 1..2)"),
    (lambda d: ["--durations", str(d / "d.csv"), "--iterations", "2"], "'2' is not A:B"),
])
def test_export_bad_input_is_one_line(runs, tmp_path, args, message):
    root, fixed, _ = runs
    result = run_cli(root, "trace", "export", str(fixed), *args(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert not (tmp_path / "d.csv").exists() and not (tmp_path / "missing").exists()

def test_decisions_filters(runs):
    root, _, ready = runs
    data = json.loads(run_cli(root, "trace", "decisions", str(ready), "--rank", "0", "--iteration", "2", "--json",
                           "--limit", "1000").stdout)
    assert data["total"] == 6 * 3 and all(d["rank"] == 0 and d["iteration"] == 2 for d in data["decisions"])
    absent = run_cli(root, "trace", "decisions", str(ready), "--rank", "3")  # 3 ranks: 0..2
    assert absent.returncode == 2 and absent.stderr.strip() == "error: --rank: the trace has ranks 0..2, not 3"


@pytest.mark.skipif(shutil.which("trace_processor_shell") is None, reason="trace_processor_shell not on PATH")
def test_perfettos_own_trace_processor_reads_it(runs):
    _, fixed, _ = runs
    query = "select count(*) from slice where name glob '*F*'"
    done = subprocess.run(["trace_processor_shell", "-q", "/dev/stdin", str(fixed / "trace.pftrace")],
                          input=query, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
