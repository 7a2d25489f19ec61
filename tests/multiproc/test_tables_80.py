"""Every table of every command reads on an 80-column terminal ([Note: tables at 80 columns] in
rrfp_cli.output): no line wider than 80, nothing cut with "…". One small traced ``--compare`` run (2 ranks, three
jobs) feeds the trace commands, which also answer for each job of the ``--compare`` directory itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.cells import cell_len

from rrfp_cli.output import Column, shell_lines
from tests.helpers.cli import run_rrfp

WIDTH = 80
JOBS = ["fixed-1f1b", "fixed-zb", "ready-zb@2x"]


def narrow(cwd: Path, *args: str) -> str:
    """``rrfp ARGS`` at 80 columns: it succeeds and every line of its output fits, whole."""
    done = run_rrfp(cwd, *args, columns=WIDTH)
    assert done.returncode == 0, done.stderr
    for stream in (done.stdout, done.stderr):
        assert "…" not in stream, stream
        assert max(map(cell_len, stream.splitlines()), default=0) <= WIDTH, stream
    return done.stdout


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """``rrfp run --compare`` (fixed 1f1b, fixed zb, ready zb at 2x) and its summary table, at 80 columns."""
    root = tmp_path_factory.mktemp("narrow")
    table = narrow(root, "run", "--workload", "emulated", "-p", "2", "-m", "4", "--iters", "3", "--forward-time",
                   "0.003", "--hint", "zb", "--memory-budget", "2x", "--compare", "--out", "c")
    return root, root / "c", table


def test_the_run_table_holds_three_jobs(compared):
    _, _, table = compared
    for name in JOBS:
        assert name in table
    assert "first loss" in table and "samples/s" in table


TRACE_COMMANDS = [["summary"], ["bubbles"], ["bubbles", "--per-iteration"], ["misalign"], ["critical-path"],
                  ["sensitivity"], ["decisions", "--limit", "8"]]


@pytest.mark.parametrize("command", TRACE_COMMANDS, ids=" ".join)
def test_trace_tables(compared, command):
    root, run, _ = compared
    narrow(root, "trace", command[0], str(run / "ready-zb@2x"), *command[1:])


def test_bubbles_split_rather_than_cut(compared):
    root, run, _ = compared
    out = narrow(root, "trace", "bubbles", str(run / "fixed-1f1b"))
    for header in ("utilization", "makespan", "dependency", "budget", "misalignment"):
        assert header in out
    assert out.count("┃ rank ┃") == 2  # two parts, the rank repeated in each


def test_trace_compare_and_export(compared, tmp_path):
    root, run, _ = compared
    out = narrow(root, "trace", "compare", str(run / "fixed-1f1b"), str(run / "ready-zb@2x"))
    assert "utilization" in out and "misalignment" in out
    out = narrow(root, "trace", "export", str(run / "fixed-zb"), "--durations", str(tmp_path / "d.csv"))
    assert "rrfp simulate --durations" in out and " \\\n" in out  # the replay command, in lines that paste


@pytest.mark.parametrize("command", TRACE_COMMANDS, ids=" ".join)
def test_a_compare_directory_answers_for_each_job(compared, command):
    root, run, _ = compared
    out = narrow(root, "trace", command[0], str(run), *command[1:])
    assert [line for line in out.splitlines() if line.startswith("job ")] == [
        f"job {name} ({run / name})" for name in JOBS]
    data = json.loads(run_rrfp(root, "trace", command[0], str(run), *command[1:], "--json").stdout)
    single = json.loads(run_rrfp(root, "trace", command[0], str(run / "fixed-zb"), *command[1:], "--json").stdout)
    assert [job["job"] for job in data["jobs"]] == JOBS and [job["run"] for job in data["jobs"]] == [
        str(run / name) for name in JOBS]
    assert data["jobs"][1].keys() == {"job", "run", *single} and data["warnings"] == []


def test_a_compare_directory_is_still_refused_where_one_trace_is_needed(compared, tmp_path):
    root, run, _ = compared
    done = run_rrfp(root, "trace", "export", str(run), "--parquet", str(tmp_path / "pq"))
    assert done.returncode == 2 and "holds several jobs (fixed-1f1b, fixed-zb, ready-zb@2x)" in done.stderr


def test_a_compare_directory_is_drawn_as_one_panel_per_job(compared, tmp_path):
    root, run, _ = compared
    done = run_rrfp(root, "trace", "timeline", str(run), "--svg", str(tmp_path / "t.svg"), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["panels"] == JOBS
    titles = [line for line in (tmp_path / "t.svg").read_text().splitlines() if 'font-weight="bold"' in line]
    assert [job for job in JOBS for line in titles if f">{job}: " in line] == JOBS


@pytest.mark.parametrize("args", [
    ["simulate", "-p", "4", "-m", "8"],
    ["simulate", "-p", "4", "-m", "8", "--compare"],
    ["simulate", "-p", "8", "-v", "2", "-m", "32", "--compare"],  # interleaved-1f1b, times in seconds
    ["hints", "list"],
    ["hints", "show", "interleaved-1f1b", "-p", "4", "-v", "2", "-m", "8"],
], ids=" ".join)
def test_simulate_and_hints_tables(tmp_path, args):
    out = narrow(tmp_path, *args)
    if "--compare" in args:
        assert "interleaved-1f1b" in out or "1f1b" in out


def test_tune_report_tables(tmp_path):
    out = narrow(tmp_path, "tune-hint", "--workload", "multimodal", "-p", "2", "-m", "4", "--time-budget", "1s",
                 "--scenarios", "4", "--out", "tuned")
    assert "held-out" in out and "vs best" in out and "times in ms" in out
    assert "rrfp tune-hint --workload multimodal" in out


def test_shell_lines_paste_as_the_same_command():
    import shlex

    command = shlex.join(["rrfp", "simulate", "--durations", "a file.csv", *(["--stages", "4"] * 12)])
    lines = shell_lines(command, 40)
    assert max(map(len, lines.splitlines())) <= 40
    assert shlex.split(lines.replace("\\\n", " ")) == shlex.split(command)


def test_a_column_wider_than_the_terminal_folds_and_never_cuts():
    import io

    from rich.console import Console

    from rrfp_cli.output import print_table

    console = Console(file=io.StringIO(), width=30)
    print_table(console, [Column("name", text=True, key=True), Column("value")],
                [["x" * 40, "12345.678"], ["short", "1"]], title="a title longer than thirty columns, wrapped")
    text = console.file.getvalue()
    assert "…" not in text and "12345.678" in text
    assert max(map(cell_len, text.splitlines())) <= 30
