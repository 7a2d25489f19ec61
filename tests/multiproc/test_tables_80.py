"""Every table of `rrfp run` and the trace commands reads on an 80-column terminal ([Note: tables at 80 columns] in
rrfp_cli.output): no line wider than 80, nothing cut with "…", every word of a wide terminal's output still there
(tests.helpers.cli.narrow). The traced ``--compare`` run of tests/multiproc/conftest.py (3 ranks, three jobs) printed
its summary at 80 columns and feeds the trace commands, which also answer for each job of the ``--compare``
directory itself. simulate's, hints' and tune-hint's tables: tests/inproc/test_tables_80.py."""

from __future__ import annotations

import json

import pytest
from rich.cells import cell_len

from tests.helpers.cli import narrow, run_cli

WIDTH = 80
JOBS = ["fixed-1f1b", "fixed-zb", "ready-zb@2x"]


@pytest.fixture(scope="module")
def compared(traced_compare):
    """Its folder, its --compare directory, and the summary table it printed."""
    return traced_compare.root, traced_compare.run, traced_compare.result


def test_the_run_table_holds_three_jobs(compared):
    _, _, done = compared
    assert done.returncode == 0, done.stderr
    for stream in (done.stdout, done.stderr):
        assert "…" not in stream, stream
        assert max(map(cell_len, stream.splitlines()), default=0) <= WIDTH, stream
    table = done.stdout
    for name in JOBS:
        assert name in table
    assert "first loss" in table and "samples/s" in table
    # one column per job, in order, and every row a value for each, on one line (nothing broken or left out)
    header = next(line for line in table.splitlines() if all(name in line for name in JOBS))
    assert [cell.strip() for cell in header.strip("┃").split("┃")][1:] == JOBS
    rows = {cells[0]: cells[1:] for line in table.splitlines() if line.startswith("│")
            for cells in [[cell.strip() for cell in line.strip("│").split("│")]]}
    assert rows["iterations"] == ["3"] * 3 and "first loss" in rows and "median throughput" in rows
    assert all(len(values) == 3 and all(values) for values in rows.values()), rows


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
    out = narrow(root, "trace", "export", str(run / "fixed-zb"), "--durations", str(tmp_path / "d.csv"),
                 between=(tmp_path / "d.csv").unlink)
    assert "rrfp simulate --durations" in out and " \\\n" in out  # the replay command, in lines that paste


@pytest.mark.parametrize("command", TRACE_COMMANDS, ids=" ".join)
def test_a_compare_directory_answers_for_each_job(compared, command):
    root, run, _ = compared
    out = narrow(root, "trace", command[0], str(run), *command[1:])
    assert [line for line in out.splitlines() if line.startswith("job ")] == [
        f"job {name} ({run / name})" for name in JOBS]
    data = json.loads(run_cli(root, "trace", command[0], str(run), *command[1:], "--json").stdout)
    single = json.loads(run_cli(root, "trace", command[0], str(run / "fixed-zb"), *command[1:], "--json").stdout)
    assert [job["job"] for job in data["jobs"]] == JOBS and [job["run"] for job in data["jobs"]] == [
        str(run / name) for name in JOBS]
    assert data["jobs"][1].keys() == {"job", "run", *single} and data["warnings"] == []


def test_a_compare_directory_is_still_refused_where_one_trace_is_needed(compared, tmp_path):
    root, run, _ = compared
    done = run_cli(root, "trace", "export", str(run), "--parquet", str(tmp_path / "pq"))
    assert done.returncode == 2 and "holds several jobs (fixed-1f1b, fixed-zb, ready-zb@2x)" in done.stderr


def test_a_compare_directory_is_drawn_as_one_panel_per_job(compared, tmp_path):
    root, run, _ = compared
    done = run_cli(root, "trace", "timeline", str(run), "--svg", str(tmp_path / "t.svg"), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["panels"] == JOBS
    titles = [line for line in (tmp_path / "t.svg").read_text().splitlines() if 'font-weight="bold"' in line]
    assert [job for job in JOBS for line in titles if f">{job}: " in line] == JOBS
