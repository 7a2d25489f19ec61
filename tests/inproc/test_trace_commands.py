"""Every `rrfp trace` subcommand, in process on hand-built traces: warnings in the JSON, iteration 0 left out by
default, and bad input as one `error:` line (exit 2, no traceback, nothing half-written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler.trace.reader import read_trace
from profiler.trace.schema import rank_trace_files, track_uuid
from tests.helpers.cli import TRACE_COMMANDS, one_error, run_cli
from tests.helpers.trace_builder import (
    MISALIGNED,
    ONE_F_ONE_B,
    build_run,
    build_taskless_run,
    drop_last_packet,
    packet_bounds,
)


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """MISALIGNED traced over iterations 0..2, unmerged (so every read warns)."""
    run = build_run(tmp_path_factory.mktemp("three") / "run", **MISALIGNED, iterations=3, period_us=200)
    (run / "trace.pftrace").unlink()
    return run


@pytest.mark.parametrize("command", sorted(TRACE_COMMANDS))
def test_every_json_carries_the_reader_warnings(three, tmp_path, command):
    args = TRACE_COMMANDS[command]({"run": three, "dir": tmp_path})
    done = run_cli(tmp_path, "trace", command, three, *args, "--json")
    assert done.returncode == 0, done
    data = json.loads(done.stdout)
    assert any("not merged" in w for w in data["warnings"]), data


def test_merge_json_carries_the_truncation_warning(tmp_path):
    run = build_run(tmp_path / "run", **ONE_F_ONE_B)
    (run / "trace.pftrace").unlink()
    rank0 = rank_trace_files(run)[0]
    data = rank0.read_bytes()
    rank0.write_bytes(data[:packet_bounds(data)[-1][0] + 1])
    done = run_cli(tmp_path, "trace", "merge", run, "--json")
    assert done.returncode == 0, done
    assert [w for w in json.loads(done.stdout)["warnings"] if "truncated at byte" in w]


@pytest.mark.parametrize("command", ["summary", "bubbles", "misalign", "critical-path", "sensitivity",
                                     "decisions", "compare", "timeline"])
def test_iteration_0_is_left_out_unless_asked(three, tmp_path, command):
    def iterations(*extra):
        args = TRACE_COMMANDS[command]({"run": three, "dir": tmp_path})
        done = run_cli(tmp_path, "trace", command, three, *args, *extra, "--json",
                       *(["--force"] if command == "timeline" else []))
        assert done.returncode == 0, done
        return done

    extra = ["--per-iteration"] if command == "bubbles" else []
    default, everything = iterations(*extra), iterations(*extra, "--iterations", "0:")
    if command == "timeline":  # draws the last iteration either way; -i picks one
        assert run_cli(tmp_path, "trace", "timeline", three, "--png", tmp_path / "0.png", "-i", "0").returncode == 0
        assert (tmp_path / "0.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        return
    if command == "compare":
        assert [r["iterations"] for r in json.loads(default.stdout)["rows"]] == ["1..2"] * 2
        assert [r["iterations"] for r in json.loads(everything.stdout)["rows"]] == ["0..2"] * 2
        return
    seen = {k: _iterations_in(json.loads(d.stdout)) for k, d in (("default", default), ("all", everything))}
    assert 0 not in seen["default"] and seen["default"], seen
    assert 0 in seen["all"] or command == "critical-path", seen


def _iterations_in(data) -> set[int]:
    """Every ``iteration`` value anywhere in a JSON document."""
    found = set()
    if isinstance(data, dict):
        for key, value in data.items():
            if key in ("iteration", "iteration_numbers", "iterations") and isinstance(value, (int, list)):
                found |= set(value) if isinstance(value, list) else {value}
            else:
                found |= _iterations_in(value)
    elif isinstance(data, list):
        for value in data:
            found |= _iterations_in(value)
    return found


def test_export_durations_leave_iteration_0_out(three, tmp_path):
    done = run_cli(tmp_path, "trace", "export", three, "--durations", tmp_path / "d.csv", "--json")
    assert json.loads(done.stdout)["durations"]["iterations"] == [1, 2]


def test_a_trace_of_iteration_0_alone_is_analysed_with_a_warning(tmp_path):
    run = build_run(tmp_path / "run", **ONE_F_ONE_B)
    data = json.loads(run_cli(tmp_path, "trace", "summary", run, "--json").stdout)
    assert data["iteration_numbers"] == [0] and any("only iteration 0" in w for w in data["warnings"])


# -- bad input --------------------------------------------------------------------


@pytest.mark.parametrize("extra,message", [([], "holds no tasks"), (["-i", "3"], "holds no tasks")])
def test_timeline_of_a_trace_without_tasks(tmp_path, extra, message):
    run = build_taskless_run(tmp_path / "run")
    one_error(run_cli(tmp_path, "trace", "timeline", run, "--png", tmp_path / "t.png", *extra), message)
    assert not (tmp_path / "t.png").exists()


def test_timeline_of_an_iteration_not_traced(three, tmp_path):
    one_error(run_cli(tmp_path, "trace", "timeline", three, "--png", tmp_path / "t.png", "-i", "99"),
              "--iteration: no traced iteration in 99:100 (traced: 0..2)")
    assert not (tmp_path / "t.png").exists()


def test_sensitivity_without_one_ranks_iteration_end(tmp_path):
    run = build_run(tmp_path / "run", **ONE_F_ONE_B, iterations=2, period_us=200)
    trace = run / "trace.pftrace"
    ends = track_uuid(1, "iterations")
    trace.write_bytes(drop_last_packet(trace.read_bytes(), lambda p: p.track_event.type == 2
                                       and p.track_event.track_uuid == ends))
    message = "iteration 1: rank 1's iteration record (its hint order) is missing"
    one_error(run_cli(tmp_path, "trace", "sensitivity", run), message)
    one_error(run_cli(tmp_path, "trace", "sensitivity", run, "--iterations", "1:"), message)
    only_0 = run_cli(tmp_path, "trace", "sensitivity", run, "-i", "0", "--json")
    assert only_0.returncode == 0, only_0
    assert json.loads(only_0.stdout)["iterations"] == [0]  # the iteration whose record is whole


def _destinations(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "a-file").write_bytes(b"mine")
    return {"missing": tmp_path / "absent" / "x", "directory": tmp_path / "a-dir", "existing": tmp_path / "a-file"}


OUTPUTS = {  # subcommand -> its arguments writing to `path`
    "timeline --png": lambda run, path: ["timeline", run, "--png", path],
    "timeline --svg": lambda run, path: ["timeline", run, "--svg", path],
    "export --parquet": lambda run, path: ["export", run, "--parquet", path],
    "export --durations": lambda run, path: ["export", run, "--durations", path],
    "merge --out": lambda run, path: ["merge", run, "--out", path],
}
MESSAGES = {"missing": "no such directory", "directory": "is a directory", "existing": "exists; pass --force"}
SUFFIXES = {"export --durations": ".csv", "timeline --png": ".png", "timeline --svg": ".svg",
            "merge --out": ".pftrace"}  # what each writes


@pytest.mark.parametrize("where", ["missing", "directory", "existing"])
@pytest.mark.parametrize("output", sorted(OUTPUTS))
def test_outputs_never_land_in_a_bad_place(tmp_path, output, where):
    run = build_run(tmp_path / "run", **ONE_F_ONE_B)
    paths = _destinations(tmp_path)
    path = paths[where]
    if output in SUFFIXES and where != "directory":
        path = path.with_suffix(SUFFIXES[output])
        if where == "existing":
            path.write_bytes(b"mine")
    message = MESSAGES[where]
    if output == "export --parquet":  # a directory is what it wants; a file is not
        message = {"missing": "no such directory", "directory": None, "existing": "is a file"}[where]
    before = sorted(p.name for p in tmp_path.iterdir())
    done = run_cli(tmp_path, "trace", *OUTPUTS[output](run, path))
    if message is None:
        assert done.returncode == 0, done
        return
    one_error(done, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, nothing left behind
    assert (tmp_path / "a-file").read_bytes() == b"mine" and not list((tmp_path / "a-dir").iterdir())


@pytest.mark.parametrize("output", sorted(OUTPUTS))
def test_force_overwrites_and_nothing_else_does(tmp_path, output):
    run = build_run(tmp_path / "run", **ONE_F_ONE_B)
    path = tmp_path / ("out" + SUFFIXES.get(output, ""))
    assert run_cli(tmp_path, "trace", *OUTPUTS[output](run, path)).returncode == 0
    if path.is_file():
        path.write_bytes(b"mine")  # what --force must replace, and nothing else may
    again = run_cli(tmp_path, "trace", *OUTPUTS[output](run, path))
    one_error(again, "pass --force")
    assert not path.is_file() or path.read_bytes() == b"mine"
    done = run_cli(tmp_path, "trace", *OUTPUTS[output](run, path), "--force")
    assert done.returncode == 0, done
    assert path.exists() and not (path.is_file() and path.read_bytes() == b"mine")  # written anew
    assert not [p for p in tmp_path.rglob(".*.tmp")]  # no temporary left


def test_merge_refuses_to_merge_a_merged_run_again(tmp_path):
    run = build_run(tmp_path / "run", **ONE_F_ONE_B)
    one_error(run_cli(tmp_path, "trace", "merge", run), "exists; pass --force to overwrite it")
    assert run_cli(tmp_path, "trace", "merge", run, "--force").returncode == 0
    frames = read_trace(run)  # merged again, whole
    assert frames.tasks.height == 8 and frames.warnings == []


@pytest.mark.parametrize("make,message", [
    (lambda d: d / "missing", "no such file or directory"),
    (lambda d: (d / "empty").mkdir() or d / "empty", "holds no trace"),
    (lambda d: (d / "x.pftrace").write_bytes(b"\x08\x01garbage") and d / "x.pftrace", "not a Perfetto trace"),
])
def test_bad_trace_input_is_one_line(tmp_path, make, message):
    result = run_cli(tmp_path, "trace", "summary", str(make(tmp_path)))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""
