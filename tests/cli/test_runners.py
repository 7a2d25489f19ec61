"""The in-process runner answers as the console script does ([Note: the two CLI runners] in tests/helpers/cli.py).

Most tests of arguments, errors, help and tables call ``run_cli`` (``rrfp_cli.app.main`` in the test's own
process) instead of starting ``python -m rrfp_cli``. This checks, on a sample of every kind of answer they rely
on (help, a group's help, tables at 200 and 80 columns, JSON, a usage error, user errors with and without
details, an error from a run's checks before any rank starts, a warning before the error), that the two give
the same exit code and the same stdout and stderr, byte for byte.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers.cli import run_cli, run_rrfp

DEADLOCK = {"format": "rrfp-hint/1", "shape": {"ranks": 2, "chunks": 1, "microbatches": 2},
            "orders": [["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]]}

SAMPLE = {
    "help": (["--help"], 200),
    "group-alone": (["trace"], 200),
    "run-help-80": (["run", "--help"], 80),
    "hints-show": (["hints", "show", "1f1b", "-p", "4", "-m", "8"], 200),
    "simulate-compare-80": (["simulate", "-p", "4", "-m", "8", "--compare"], 80),
    "hints-json": (["hints", "show", "zb", "-p", "4", "-m", "8", "--json"], 200),
    "usage-error": (["simulate", "-p", "0"], 200),
    "deadlock-grid": (["hints", "check", "deadlock.json"], 200),
    "run-refused": (["run", "--stages", "2", "--hint", "nope", "--out", "x"], 200),
    "run-device": (["run", "--stages", "2", "--device", "cuda", "--out", "x"], 200),
    "trace-missing": (["trace", "summary", "missing"], 200),
}


@pytest.mark.parametrize("name", sorted(SAMPLE))
def test_in_process_and_subprocess_answer_alike(tmp_path, name):
    args, columns = SAMPLE[name]
    answers = []
    for runner, where in ((run_rrfp, "subprocess"), (run_cli, "in-process")):
        cwd = tmp_path / where
        cwd.mkdir()
        (cwd / "deadlock.json").write_text(json.dumps(DEADLOCK))
        done = runner(cwd, *args, columns=columns)
        answers.append((done.returncode, done.stdout.replace(str(cwd), "CWD"), done.stderr.replace(str(cwd), "CWD")))
        assert sorted(p.name for p in cwd.iterdir()) == ["deadlock.json"]  # neither wrote anything
    subprocess_answer, in_process_answer = answers
    assert in_process_answer == subprocess_answer
    assert subprocess_answer[1] or subprocess_answer[2]  # it said something
