"""Bad input through the CLI, in this process ([Note: the two CLI runners]): each case is one ``error:`` line
naming what is wrong and where, exit 2, nothing written (issue 24, "Bad input")."""

from __future__ import annotations

import polars as pl
import pytest

from tests.helpers.cli import one_error_line, run_cli

COLUMNS = {"stage": pl.Int64, "kind": pl.Utf8, "microbatch": pl.Int64, "duration": pl.Float64}


def rows(stages: int = 2, microbatches: int = 1) -> list[tuple[int, str, int, float]]:
    return [(k, kind, i, 0.1) for k in range(stages) for i in range(microbatches) for kind in "FB"]


def simulate(cwd, *args):
    return run_cli(cwd, "simulate", "-p", "2", "-m", "1", *args)


# -- item 1: duration tables -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["empty.csv", "empty.parquet", "empty_iterations.csv"])
def test_a_table_without_rows_is_refused(tmp_path, name):
    schema = ({"iteration": pl.Int64} if "iterations" in name else {}) | COLUMNS
    frame = pl.DataFrame([], schema=schema, orient="row")
    (frame.write_parquet if name.endswith(".parquet") else frame.write_csv)(tmp_path / name)
    line = one_error_line(simulate(tmp_path, "--durations", name))
    assert line == f"error: {name}: holds no rows (needs one per task of 2 stages x 1 microbatches)"


def test_a_directory_as_durations_is_named_as_one(tmp_path):
    (tmp_path / "tables").mkdir()
    line = one_error_line(simulate(tmp_path, "--durations", "tables"))
    assert line == "error: tables: is a directory; give a duration table (.csv, .parquet or .pq)"


def test_durations_stored_as_text_in_parquet_are_refused_by_column(tmp_path):
    frame = pl.DataFrame([(k, kind, i, str(d)) for k, kind, i, d in rows()],
                         schema={**COLUMNS, "duration": pl.Utf8}, orient="row")
    frame.write_parquet(tmp_path / "text.parquet")
    line = one_error_line(simulate(tmp_path, "--durations", "text.parquet"))
    assert line == "error: text.parquet: column 'duration' is stored as String, not as numbers"
    pl.DataFrame(rows(), schema=COLUMNS, orient="row").write_parquet(tmp_path / "ok.parquet")
    assert simulate(tmp_path, "--durations", "ok.parquet").returncode == 0


def test_a_workload_beside_a_recorded_table_is_refused(tmp_path):
    pl.DataFrame(rows(), schema=COLUMNS, orient="row").write_csv(tmp_path / "d.csv")
    line = one_error_line(simulate(tmp_path, "--durations", "d.csv", "--workload", "vlm-mixed"))
    assert line == "error: --workload: a recorded table has its own durations; give --workload or --durations"


# -- item 2: numbers are finite and in their model's range -----------------------------------------------------------


@pytest.mark.parametrize("args, line", [
    (("simulate", "-p", "2", "-m", "2", "--forward-time", "inf"),
     "error: --forward-time: must be a finite number from 0 to 3600, got inf"),
    (("simulate", "-p", "2", "-m", "2", "--jitter", "1e308"),
     "error: --jitter: must be a finite number from 0 to 3, got 1e+308"),
    (("simulate", "-p", "2", "-m", "2", "--straggler-slowdown", "1e9"),
     "error: --straggler-slowdown: must be a finite number from 1 to 1000, got 1000000000.0"),
    (("simulate", "-p", "2", "-m", "2", "--comm-latency", "1e6"),
     "error: --comm-latency: must be a finite number from 0 to 3600, got 1000000.0"),
    (("simulate", "-p", "2", "-m", "2", "--split-overhead", "1e300"),
     "error: --split-overhead: must be at most 10 (I + W over B), got 1e+300"),
    (("run", "--forward-time", "inf"), "error: --forward-time: must be a finite number from 0 to 3600, got inf"),
    (("run", "--jitter", "nan"), "error: --jitter: must be a finite number from 0 to 3, got nan"),
    (("run", "--lr", "inf"), "error: --lr: must be a finite number, got inf"),
    (("bench", "--out", "b", "--jitter", "5"), "error: --jitter: must be a finite number from 0 to 3, got 5.0"),
    (("bench", "--out", "b", "--tune-seconds", "inf"), "error: --tune-seconds: must be a finite number, got inf"),
    (("tune-hint", "--workload", "uniform", "-p", "2", "-m", "2", "--holdout", "nan"),
     "error: --holdout: must be a finite number, got nan"),
    (("trace", "sensitivity", "run", "--task-overhead", "inf"),
     "error: --task-overhead: must be a finite number from 0 to 3600, got inf"),
    (("hints", "show", "zb1p", "-p", "2", "-m", "2", "--split-overhead", "nan"),
     "error: --split-overhead: must be a finite number >= 1 (I + W over B), got nan"),
])
def test_every_number_option_is_finite_and_in_range(tmp_path, args, line):
    assert one_error_line(run_cli(tmp_path, *args)) == line
    assert list(tmp_path.iterdir()) == []


def test_the_model_refuses_what_the_flags_refuse():
    from hints.errors import UserError
    from runtime.durations.variability import VariabilityModel

    for knob, value in (("jitter", 1e308), ("forward_time", float("inf")), ("comm_jitter", float("nan"))):
        with pytest.raises(UserError, match=f"`{knob}`: must be a finite number from"):
            VariabilityModel(**{knob: value})


# -- item 3: a TOML value is named by its file and key ---------------------------------------------------------------


@pytest.mark.parametrize("toml, line", [
    ('stages = "four"', "error: job.toml: stages: must be a whole number >= 1, got 'four'"),
    ("jitter = inf", "error: job.toml: jitter: must be a finite number from 0 to 3, got inf"),
    ('memory-budget = "lots"',
     "error: job.toml: memory-budget: 'lots' is not a budget; use 1f1b, a multiple such as 2x, or a slot count such as 6"),
    ("heads = 3", "error: job.toml: heads: 3 heads do not divide the model width --hidden 64: each head takes "
                  "hidden / heads features"),
    ("hidden = 30\nheads = 4", "error: job.toml: heads: 4 heads do not divide the model width hidden 30: each head "
                               "takes hidden / heads features"),
    ('delay = {"1B0" = -1}', "error: job.toml: delay: 1B0 must take a finite number of seconds >= 0, got -1"),
])
def test_a_toml_value_is_blamed_on_its_file_and_key(tmp_path, toml, line):
    (tmp_path / "job.toml").write_text(toml + "\n")
    assert one_error_line(run_cli(tmp_path, "run", "--config", "job.toml")) == line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.toml"]


def test_a_flag_over_a_toml_value_is_blamed_as_the_flag(tmp_path):
    (tmp_path / "job.toml").write_text("jitter = 0.1\n")
    line = one_error_line(run_cli(tmp_path, "run", "--config", "job.toml", "--jitter", "9"))
    assert line == "error: --jitter: must be a finite number from 0 to 3, got 9.0"


# -- item 4: the option at fault is the one named ----------------------------------------------------------------------


@pytest.mark.parametrize("args, line", [
    (("bench", "--out", "b", "--budgets", "0"), "error: --budgets: 0 gives 0 slot(s) on some rank, below the "
     "smallest that can complete: one microbatch needs 2 slot(s) (one per chunk) on every rank (at 8 ranks)"),
    (("bench", "--out", "b", "--iterations", "0"), "error: --iterations: need at least one iteration per seed, got 0"),
    (("bench", "--out", "b", "--seeds", "0"), "error: --seeds: need at least one seed per cell, got 0"),
    (("run", "--heads", "3"),
     "error: --heads: 3 heads do not divide the model width --hidden 64: each head takes hidden / heads features"),
    (("run", "--split-overhead", "2"), "error: --split-overhead: prices the emulated workload's split backward; use "
     "--workload emulated (a real model's split costs what it measures)"),
])
def test_the_option_at_fault_is_the_one_named(tmp_path, args, line):
    assert one_error_line(run_cli(tmp_path, *args)) == line
    assert list(tmp_path.iterdir()) == []


# -- item 5: trace messages name the file once, and a corrupt task name is dropped ------------------------------------


@pytest.fixture
def trace(tmp_path):
    from tests.helpers.trace_builder import ONE_F_ONE_B, build_run

    return build_run(tmp_path / "run", **ONE_F_ONE_B) / "trace.pftrace"


@pytest.mark.parametrize("command", ["summary", "sensitivity", "export"])
def test_a_trace_cut_before_its_metadata_names_the_file_once(trace, tmp_path, command):
    from tests.helpers.trace_builder import packet_bounds

    start, _ = packet_bounds(trace.read_bytes())[1]
    (tmp_path / "cut.pftrace").write_bytes(trace.read_bytes()[:start + 2])
    extra = ["--durations", "d.csv"] if command == "export" else []
    line = one_error_line(run_cli(tmp_path, "trace", command, "cut.pftrace", *extra))
    assert line == (f"error: cut.pftrace: truncated at byte {start}; 1 complete packets kept, none with the "
                    f"rrfp-trace/1 metadata")
    assert not (tmp_path / "d.csv").exists()


def test_a_task_slice_not_named_as_its_task_is_dropped_not_parsed(trace, tmp_path):
    from profiler.trace.reader import read_trace

    data = trace.read_bytes()
    assert data.count(b"\x12\x031B1") == 2  # rank 1's interned names of its 1B1 slices (its decision, its task)
    (tmp_path / "renamed.pftrace").write_bytes(data.replace(b"\x12\x031B1", b"\x12\x031Bx"))
    frames = read_trace(tmp_path / "renamed.pftrace")
    assert "1Bx" not in frames.tasks["task"].to_list() and frames.tasks.height == 7
    assert any("events with missing or mistyped fields (dropped)" in w for w in frames.warnings)
    done = run_cli(tmp_path, "trace", "summary", "renamed.pftrace")
    assert "is not a task" not in done.stderr and "internal error" not in done.stderr, done


# -- item 6: a command that fails on bad input prints only its error line; one that succeeds keeps its warnings --------


def test_warnings_are_not_printed_before_an_error_line(trace, tmp_path):
    data = trace.read_bytes().replace(b"\x12\x031B1", b"\x12\x031Bx")  # rank 1's 1B1 dropped: no whole iteration
    (tmp_path / "renamed.pftrace").write_bytes(data)
    for json_mode in ([], ["--json"]):
        line = one_error_line(run_cli(tmp_path, "trace", "summary", "renamed.pftrace", *json_mode))
        assert line.startswith("error: renamed.pftrace: cannot analyse iteration 0"), line


def test_warnings_are_printed_when_the_command_succeeds(tmp_path):
    import json

    from tests.helpers.trace_builder import ONE_F_ONE_B, build_run, packet_bounds

    data = (build_run(tmp_path / "run", **ONE_F_ONE_B, iterations=2, period_us=200) / "trace.pftrace").read_bytes()
    start, _ = packet_bounds(data)[-1]
    (tmp_path / "cut.pftrace").write_bytes(data[:start + 2])
    done = run_cli(tmp_path, "trace", "summary", "cut.pftrace")
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert any("truncated at byte" in line for line in warned), done.stderr
    shown = json.loads(run_cli(tmp_path, "trace", "summary", "cut.pftrace", "--json").stdout)["warnings"]
    assert len(shown) == len(warned) and any("truncated at byte" in w for w in shown)
