"""[Note: iterations cut short]: an iteration a killed run left half-traced is left out of every trace command,
with a warning naming it and how many of its tasks the trace holds (issue 24)."""

from __future__ import annotations

import json

import pytest

from profiler.analysis.windows import cut_short, select_iterations
from profiler.trace.reader import read_trace
from tests.helpers.cli import TRACE_COMMANDS, one_error_line, run_cli
from tests.helpers.trace_builder import MISALIGNED, build_run

pytestmark = pytest.mark.inproc

# Rank 1 was killed during iteration 3: the trace holds rank 0's 4 tasks of its 8.
WARNING = "left out iteration 3 (4 of 8 tasks): the run ended before it finished"


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    return build_run(tmp_path_factory.mktemp("killed") / "run", **MISALIGNED, iterations=4, period_us=200,
                     killed_rank=1)


def test_the_cut_iteration_is_found_and_left_out(killed):
    frames = read_trace(killed)
    assert cut_short(frames) == {3: 4}
    chosen, notes = select_iterations(frames)
    assert sorted(chosen.tasks.get_column("iteration").unique()) == [1, 2]
    assert notes == [WARNING]
    everything, _ = select_iterations(frames, (0, None))
    assert sorted(everything.tasks.get_column("iteration").unique()) == [0, 1, 2]


@pytest.mark.parametrize("command", sorted(TRACE_COMMANDS))
def test_every_trace_command_leaves_it_out_with_a_warning(killed, tmp_path, command):
    args = TRACE_COMMANDS[command]({"run": killed, "dir": tmp_path})
    done = run_cli(tmp_path, "trace", command, killed, *args, "--json")
    assert done.returncode == 0, done
    data = json.loads(done.stdout)
    assert WARNING in data["warnings"], data["warnings"]
    if command == "summary":
        assert data["iteration_numbers"] == [1, 2] and data["iterations"] == 2
    if command == "export":
        assert data["durations"]["iterations"] == [1, 2]


def test_a_window_of_only_the_cut_iteration_is_an_error(killed, tmp_path):
    line = one_error_line(run_cli(tmp_path, "trace", "summary", killed, "--iterations", "3:"))
    assert line == ("error: --iterations: cannot analyse iteration 3 (4 of 8 tasks): the run ended before it "
                    "finished (whole: 0..2)")
