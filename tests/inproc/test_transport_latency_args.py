"""benchmarks/transport_latency.py: bad input is one ``error:`` line and exit 2, before any rank starts (the script run
in this process, as ``python benchmarks/transport_latency.py`` runs it: tests.helpers.cli.run_script)."""

from __future__ import annotations

import pytest

from tests.helpers.cli import run_script

SCRIPT = "benchmarks/transport_latency.py"


@pytest.mark.parametrize("args, message", [
    (("--sizes", "abc"), "--sizes: 'abc' is not a comma-separated list"),
    (("--sizes", "2048,6"), "positive multiple of 4 bytes"),
    (("--sizes", "0"), "positive multiple of 4 bytes"),
    (("--breakdown", "--round-trips", "0"), "--round-trips must be >= 1"),
    (("--rounds", "0"), "--rounds must be >= 1"),
])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, args, message):
    result = run_script(tmp_path, SCRIPT, *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert result.stdout == "" and not list(tmp_path.iterdir())  # it never started: nothing printed or written
