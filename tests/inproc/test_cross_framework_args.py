"""benchmarks/cross_framework.py: bad input is one ``error:`` line and exit 2 before any rank starts (the script run in
this process, as ``python benchmarks/cross_framework.py`` runs it: tests.helpers.cli.run_script)."""

from __future__ import annotations

import pytest

from tests.helpers.cli import run_script

SCRIPT = "benchmarks/cross_framework.py"


@pytest.mark.parametrize("args, message", [
    (("--stages", "2", "--microbatches", "1"), "need --stages >= 2"),
    (("--layers-per-rank", "3"), "--layers-per-rank must be a positive multiple"),
    (("--stages", "2", "--microbatches", "5", "--schedules", "ScheduleInterleavedZeroBubble"),
     "multiple of the number of rounds"),
    (("--schedules", "ScheduleNope"), "invalid choice"),
])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, args, message):
    tiny = ("--cases", "uniform", "--iters", "1", "--forward-time", "0.001", "--hints")  # should it run after all
    result = run_script(tmp_path, SCRIPT, *tiny, *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert result.stdout == "" and not list(tmp_path.iterdir())  # it never started: nothing printed or written
