"""The simulated benchmark scripts (whose inputs the library checks: workloads, levels, jitter): bad input is one
``error:`` line and exit 2 before anything runs, whether the parser finds it or the library does once the
arguments are parsed (profiler.bench.script_args.run); Ctrl-C is one line and 130. The scripts run in this
process, as ``python benchmarks/NAME.py`` runs them (tests.helpers.cli.run_script)."""

from __future__ import annotations

import pytest

from profiler.bench.script_args import run
from tests.helpers.cli import run_script

CASES = [
    ("unknown_variability", ("--workloads", "sft-chat", "nosuch"), "argument --workloads: invalid choice: 'nosuch'"),
    ("unknown_variability", ("--ranks", "32", "0"), "--ranks must be >= 1, got 0"),
    ("unknown_variability", ("--tables", "0"), "--tables must be >= 1, got 0"),
    ("unknown_variability", ("--auto-iterations", "0"), "--auto-iterations must be >= 1, got 0"),
    ("unknown_variability", ("--jitter", "-1"), "--jitter: must be a finite number from 0 to 3, got -1.0"),
    ("unknown_variability", ("--levels", "moe=0.5"), "--levels: moe must be >= 1, got 0.5"),
    ("unknown_variability", ("--ranks", "64", "--large-levels", "nope"), "--large-levels: 'nope' is not KIND=LEVEL"),
    ("credit", ("--workloads", "nosuch"), "argument --workloads: invalid choice: 'nosuch'"),
    ("credit", ("--seeds", "0"), "--seeds must be >= 1, got 0"),
    ("credit", ("--tune-seconds", "-1"), "--tune-seconds must be >= 0, got -1.0"),
    ("credit", ("--jitter", "nan"), "--jitter: must be a finite number from 0 to 3, got nan"),
    ("never_lose", ("--workloads", "nosuch"), "argument --workloads: invalid choice: 'nosuch'"),
    ("never_lose", ("--ranks", "0"), "--ranks must be >= 1, got 0"),
    ("never_lose", ("--auto", "-1"), "--auto must be >= 0, got -1"),
    ("never_lose", ("--jitter", "5"), "--jitter: must be a finite number from 0 to 3, got 5.0"),
    ("bound_tightness", ("--workloads", "nosuch"), "argument --workloads: invalid choice: 'nosuch'"),
    ("bound_tightness", ("--seeds", "0"), "--seeds must be >= 1, got 0"),
    ("bound_tightness", ("--jitter", "-0.5"), "--jitter: must be a finite number from 0 to 3, got -0.5"),
    ("simulate_compare", ("--workloads", "nosuch"), "argument --workloads: invalid choice: 'nosuch'"),
    ("simulate_compare", ("--chunks", "0"), "--chunks must be >= 1, got 0"),
    ("simulate_compare", ("--jitter", "-2"), "--jitter: must be a finite number from 0 to 3, got -2.0"),
    ("simulate_compare", ("--nope",), "unrecognized arguments: --nope"),
    ("placement_bench", ("--workloads", "x"), "argument --workloads: invalid choice: 'x'"),
    ("placement_bench", ("--microbatches", "0"), "--microbatches must be >= 1, got 0"),
    ("placement_bench", ("--jitter", "9"), "--jitter: must be a finite number from 0 to 3, got 9.0"),
]


@pytest.mark.parametrize("script, args, message", CASES, ids=[f"{s}{' '.join(a)}" for s, a, _ in CASES])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, script, args, message):
    result = run_script(tmp_path, f"benchmarks/{script}.py", *args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert result.stdout == "" and not list(tmp_path.iterdir())  # nothing ran: nothing printed or written


def test_an_interrupt_is_one_line_and_130(capsys, monkeypatch):
    monkeypatch.delenv("RRFP_DEBUG", raising=False)

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as done:
        run(interrupted)
    assert done.value.code == 130 and capsys.readouterr().err == "interrupted (SIGINT)\n"


def test_rrfp_debug_shows_the_traceback(monkeypatch):
    from hints.errors import UserError

    monkeypatch.setenv("RRFP_DEBUG", "1")

    def refused():
        raise UserError("must be >= 1, got 0", "`ranks`")

    with pytest.raises(UserError):
        run(refused)
