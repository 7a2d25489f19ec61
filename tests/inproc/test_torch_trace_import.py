"""``rrfp trace import`` on synthetic torch profiler traces (tests/helpers/kineto_builder.py): shapes, schedules,
the wait split, CUDA spans, messages, and every kind of bad input (one line, exit 2, nothing written).

Real torch jobs are imported in tests/multiproc/test_torch_import.py.
"""

from __future__ import annotations

import gzip
import json

import pytest

from hints.files.torch_import import import_torch_schedule
from hints.orders import builtin_hint
from profiler.trace.reader import read_trace
from profiler.trace.torch_profile import import_torch_traces
from tests.helpers.cli import run_cli
from tests.helpers.kineto_builder import kineto_traces

pytestmark = pytest.mark.inproc

SCHEDULES = [("1F1B", 1), ("GPipe", 1), ("Interleaved1F1B", 2), ("InterleavedZeroBubble", 2),
             ("ZBVZeroBubble", 2), ("DualPipeV", 2)]


@pytest.mark.parametrize("name,chunks", SCHEDULES)
def test_every_torch_schedule_imports_with_its_name_shape_and_tasks(tmp_path, name, chunks):
    hint = import_torch_schedule(name, 2, 4, chunks)
    kineto_traces(hint, tmp_path / "traces")
    imported = import_torch_traces([tmp_path / "traces"], tmp_path / "run")
    assert imported.schedule == name
    assert imported.shape == hint.shape
    frames = read_trace(tmp_path / "run")
    assert frames.tasks.height == 2 * hint.shape.total_tasks
    meta = next(iter(frames.meta.values()))
    assert (meta["source"], meta["policy"], meta["hint"]) == ("torch-profiler", "fixed", f"torch:{name}")
    for rank, order in enumerate(hint.orders):  # the order run is each iteration's hint
        hints = frames.iterations.filter(frames.iterations["rank"] == rank).get_column("hint").to_list()
        assert hints == [" ".join(map(str, order))] * 2


def test_the_wait_is_split_off_the_compute(tmp_path):
    hint = import_torch_schedule("Interleaved1F1B", 2, 4, 2)
    kineto_traces(hint, tmp_path / "traces", compute_us=100.0, wait_us=30.0)
    import_torch_traces([tmp_path / "traces"], tmp_path / "run")
    tasks = read_trace(tmp_path / "run").tasks
    assert set(tasks.get_column("duration_ns").to_list()) == {100_000}
    assert set(tasks.get_column("wait_ns").to_list()) == {30_000}


def test_cuda_traces_take_the_device_spans(tmp_path):
    hint = import_torch_schedule("ZBVZeroBubble", 2, 4)
    kineto_traces(hint, tmp_path / "traces", compute_us=80.0, wait_us=30.0, cuda=True, gpu_lag_us=7.0)
    imported = import_torch_traces([tmp_path / "traces"], tmp_path / "run")
    assert "device spans" in imported.timing
    frames = read_trace(tmp_path / "run")
    assert set(frames.tasks.get_column("duration_ns").to_list()) == {80_000}
    first = frames.tasks.filter(frames.tasks["rank"] == 0).sort("start_ns").row(0, named=True)
    assert first["start_ns"] == round((1_000_000.0 + 5.0 + 30.0 + 7.0) * 1000)  # the GPU span, not the range


def test_messages_become_transfers_that_arrive_before_their_consumer(tmp_path):
    hint = import_torch_schedule("Interleaved1F1B", 2, 4, 2)
    kineto_traces(hint, tmp_path / "traces")
    imported = import_torch_traces([tmp_path / "traces"], tmp_path / "run")
    frames = read_trace(tmp_path / "run")
    assert imported.transfers == frames.transfers.height > 0
    starts = {(r["iteration"], r["task"]): r["start_ns"] for r in frames.tasks.iter_rows(named=True)}
    for row in frames.transfers.iter_rows(named=True):
        assert row["src"] != row["dst"] and row["recv_end_ns"] is not None
        assert row["send_start_ns"] is not None and row["send_end_ns"] >= row["send_start_ns"]


def test_gpipe_names_and_gzipped_torchtitan_folders(tmp_path):
    hint = import_torch_schedule("GPipe", 2, 4)
    kineto_traces(hint, tmp_path / "profile_traces" / "iteration_10", names="gpipe", gz=True)
    imported = import_torch_traces([tmp_path / "profile_traces"], tmp_path / "run")
    assert imported.schedule == "GPipe" and imported.tasks == 2 * hint.shape.total_tasks


def test_an_order_of_no_torch_schedule_is_custom_and_a_stated_one_is_checked(tmp_path):
    kineto_traces(builtin_hint("zb", 2, 1, 4), tmp_path / "zb")
    imported = import_torch_traces([tmp_path / "zb"], tmp_path / "run")
    assert imported.schedule == "custom" and any("none of torch's" in w for w in imported.warnings)
    kineto_traces(import_torch_schedule("Interleaved1F1B", 2, 4, 2), tmp_path / "traces")
    assert import_torch_traces([tmp_path / "traces"], tmp_path / "run2", schedule="Interleaved1F1B").schedule \
        == "Interleaved1F1B"
    result = run_cli(tmp_path, "trace", "import", "traces", "--out", "other", "--schedule", "LoopedBFS")
    assert result.returncode == 2 and "do not follow LoopedBFS" in result.stderr, result.stderr
    assert not (tmp_path / "other").exists()


def test_json_output_and_what_the_trace_cannot_say(tmp_path):
    kineto_traces(import_torch_schedule("Interleaved1F1B", 2, 4, 2), tmp_path / "traces")
    result = run_cli(tmp_path, "trace", "import", "traces", "--out", "run", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["schedule"] == "Interleaved1F1B" and "arbiter decisions" in data["not_in_a_torch_trace"]
    assert json.loads((tmp_path / "run" / "import.json").read_text())["files"] == data["files"]
    refused = run_cli(tmp_path, "trace", "decisions", "run")
    assert refused.returncode == 2 and "no arbiter decisions" in refused.stderr
    for command in ("summary", "bubbles", "critical-path", "sensitivity"):
        assert run_cli(tmp_path, "trace", command, "run").returncode == 0, command
    assert run_cli(tmp_path, "trace", "timeline", "run", "--svg", "t.svg").returncode == 0
    exported = run_cli(tmp_path, "trace", "export", "run", "--durations", "d.parquet")
    assert exported.returncode == 0 and "--hint torch:Interleaved1F1B" in exported.stdout


def _bad(tmp_path, *args) -> str:
    result = run_cli(tmp_path, "trace", "import", *args, "--out", "run")
    assert result.returncode == 2, result.stdout + result.stderr
    assert not (tmp_path / "run").exists()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr
    return lines[0]


def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path):
    hint = import_torch_schedule("Interleaved1F1B", 2, 4, 2)
    paths = kineto_traces(hint, tmp_path / "t")
    (tmp_path / "notjson.json").write_text("{not json")
    assert "notjson.json: not a JSON trace" in _bad(tmp_path, "notjson.json")
    raw = gzip.compress(paths[0].read_bytes())
    (tmp_path / "cut.json.gz").write_bytes(raw[: len(raw) // 2])
    assert "cut.json.gz: not a readable gzip file" in _bad(tmp_path, "cut.json.gz")
    assert "rank 1's is missing" in _bad(tmp_path, "t/rank0_trace.json")
    plain = json.loads(paths[0].read_text())
    del plain["distributedInfo"]
    (tmp_path / "single.json").write_text(json.dumps(plain))
    assert "no distributedInfo" in _bad(tmp_path, "single.json")
    assert "no such file" in _bad(tmp_path, "absent")


def test_a_job_that_is_not_pipeline_parallel_is_refused(tmp_path):
    for rank in range(2):
        events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0,
                   "dur": 100},
                  {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 20},
                  {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": 40, "dur": 5}]
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(
            {"distributedInfo": {"rank": rank, "world_size": 2}, "traceEvents": events}))
    assert "holds no pipeline work" in _bad(tmp_path, "rank0.json", "rank1.json")


def test_ranks_of_different_runs_are_refused(tmp_path):
    hint = import_torch_schedule("Interleaved1F1B", 2, 4, 2)
    kineto_traces(hint, tmp_path / "t", step_offset_us={1: 60_000_000.0})
    assert "ranks of different runs" in _bad(tmp_path, "t")
    kineto_traces(hint, tmp_path / "w", world=3)
    (tmp_path / "w" / "rank1_trace.json").unlink()
    kineto_traces(hint, tmp_path / "w2")
    assert "ranks of different runs" in _bad(tmp_path, "w/rank0_trace.json", "w2/rank1_trace.json")


def test_a_shape_that_does_not_match_the_trace_is_refused(tmp_path):
    kineto_traces(import_torch_schedule("Interleaved1F1B", 2, 4, 2), tmp_path / "t")
    assert "not the -m 8 given" in _bad(tmp_path, "t", "-m", "8")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("mine")
    result = run_cli(tmp_path, "trace", "import", "t", "--out", "run")
    assert result.returncode == 2 and "not empty" in result.stderr
    assert (tmp_path / "run" / "keep.txt").read_text() == "mine"


def _mutations():
    """Ways a rank's JSON can be damaged: each must import (the damage is harmless) or fail in one line."""
    def events(f):
        return lambda d: d.__setitem__("traceEvents", [f(e) for e in d["traceEvents"]])

    yield "ts as text", events(lambda e: {**e, "ts": str(e.get("ts"))})
    yield "negative durations", events(lambda e: {**e, "dur": -1} if e.get("ph") == "X" else e)
    yield "events not objects", lambda d: d.__setitem__("traceEvents", [1, "x", None] + d["traceEvents"])
    yield "names not text", events(lambda e: {**e, "name": 7} if str(e.get("name", "")).startswith("PP:") else e)
    yield "no steps", events(lambda e: {**e, "name": "other"} if str(e.get("name", "")).startswith("Profiler")
                             else e)
    yield "rank out of range", lambda d: d["distributedInfo"].__setitem__("rank", 9)
    yield "world as text", lambda d: d["distributedInfo"].__setitem__("world_size", "2")
    yield "traceEvents not a list", lambda d: d.__setitem__("traceEvents", {"a": 1})
    yield "actions of another stage", events(lambda e: {**e, "name": e["name"].replace("PP:1", "PP:7")}
                                             if isinstance(e.get("name"), str) else e)
    yield "half the events", lambda d: d.__setitem__("traceEvents", d["traceEvents"][::2])
    yield "a JSON list", None


@pytest.mark.parametrize("what,mutate", list(_mutations()), ids=[m[0] for m in _mutations()])
def test_damaged_traces_import_or_fail_in_one_line(tmp_path, what, mutate):
    paths = kineto_traces(import_torch_schedule("Interleaved1F1B", 2, 4, 2), tmp_path / "t")
    data = json.loads(paths[1].read_text())
    if mutate is None:
        data = [data]
    else:
        mutate(data)
    paths[1].write_text(json.dumps(data))
    result = run_cli(tmp_path, "trace", "import", "t", "--out", "run")
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode in (0, 2), result.stderr
    if result.returncode == 2:
        assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: ")
        assert not (tmp_path / "run").exists()


def test_torchtitan_windows_of_one_rank_are_joined_and_a_repeated_step_is_refused(tmp_path):
    hint = import_torch_schedule("ZBVZeroBubble", 2, 4)
    root = tmp_path / "profile_traces"
    kineto_traces(hint, root / "iteration_2", steps=(1, 2), gz=True)
    kineto_traces(hint, root / "iteration_4", steps=(3, 4), gz=True, step_offset_us={0: 1e6, 1: 1e6})
    imported = import_torch_traces([root], tmp_path / "run")
    assert imported.iterations == [1, 2, 3, 4] and imported.complete == [1, 2, 3, 4]
    kineto_traces(hint, root / "iteration_9", steps=(2,), gz=True)
    assert "two profiles of one rank" in _bad(tmp_path / "run", "../profile_traces")


def test_bad_destinations_and_schedule_names_are_refused_before_reading(tmp_path):
    kineto_traces(import_torch_schedule("Interleaved1F1B", 2, 4, 2), tmp_path / "t")
    (tmp_path / "afile").write_text("mine")
    for out, message in (("afile", "afile: is a file"), ("absent/run", "no such directory")):
        result = run_cli(tmp_path, "trace", "import", "t", "--out", out)
        assert result.returncode == 2 and message in result.stderr, result.stderr
    assert (tmp_path / "afile").read_text() == "mine" and not (tmp_path / "absent").exists()
    assert "--schedule: 'Foo' is not a torch schedule" in _bad(tmp_path, "t", "--schedule", "Foo")
    assert "do not follow 1F1B" in _bad(tmp_path, "t", "--schedule", "schedule1f1b")
    imported = import_torch_traces([tmp_path / "t"], tmp_path / "ok", schedule="scheduleinterleaved1f1b")
    assert imported.schedule == "Interleaved1F1B"
