"""The benchmark scripts (whose inputs the library checks too: workloads, levels, jitter, run flags): bad input is one
``error:`` line and exit 2 before anything runs, whether the parser finds it or the library does once the
arguments are parsed (profiler.bench.script_args.run); Ctrl-C is one line and 130. The scripts run in this
process, as ``python benchmarks/NAME.py`` runs them (tests.helpers.cli.run_script)."""

from __future__ import annotations

import pytest

from profiler.bench.script_args import run
from tests.helpers.cli import load_script, run_script

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
    ("checkpoint_bench", ("--iters", "1"), "--iters must be >= 2, got 1"),
    ("checkpoint_bench", ("--stages", "0"), "--stages must be >= 1, got 0"),
    ("checkpoint_bench", ("--layers-per-stage", "0"), "--layers-per-stage must be >= 1, got 0"),
    ("checkpoint_bench", ("--hidden", "30"), "--hidden must be a multiple of 4 (the model's attention heads), got 30"),
    ("checkpoint_bench", ("--nope",), "unrecognized arguments: --nope"),
    ("device_check", (), "--out is required"),
    ("device_check", ("--out", "report", "--device", "tpu"), "argument --device: invalid choice: 'tpu'"),
    ("device_check", ("--pingpong", "mpi"), "argument --pingpong: invalid choice: 'mpi'"),
    ("device_check", ("--out", "/dev/null", "--device", "cpu"), "--out: /dev/null is a file, not a folder"),
    ("foundation", ("--repeats", "0"), "--repeats must be >= 1, got 0"),
    ("foundation", ("--against", "no-such-rev"), "--against: 'no-such-rev' is not a commit of this repository"),
    ("foundation", ("--e2e-worker", "--repeats", "1"), "unrecognized arguments: --e2e-worker"),
    ("runtime_bench", ("--iters", "1"), "--iters must be >= 2, got 1"),
    ("runtime_bench", ("--stages", "4", "0"), "--stages must be >= 1, got 0"),
    ("runtime_bench", ("--microbatches-per-rank", "0"), "--microbatches-per-rank must be >= 1, got 0"),
    ("runtime_bench", ("--forward-time", "-1"), "--forward-time: must be a finite number from 0 to 3600, got -1.0"),
    ("runtime_bench", ("--jitter", "5"), "--jitter: must be a finite number from 0 to 3, got 5.0"),
    ("runtime_bench", ("--seed", "-1"), "--seed: must be a whole number >= 0, got -1"),
    ("runtime_bench", ("--out", "/dev/null"), "--out: /dev/null is a file, not a folder"),
    ("suite_time", (), "the following arguments are required: --against"),
    ("suite_time", ("--against", "HEAD", "--repeats", "0"), "--repeats must be >= 1, got 0"),
    ("suite_time", ("--against", "no-such-rev"), "--against: 'no-such-rev' is not a commit of this repository"),
    ("torch_import_fidelity", ("--schedules", "Interleaved1F1B,Nope"), "--schedules: 'Nope' is not a torch schedule"),
    ("torch_import_fidelity", ("--iters", "1"), "--iters must be >= 2, got 1"),
    ("torch_import_fidelity", ("-m", "0"), "--microbatches must be >= 1, got 0"),
    ("torch_import_fidelity", ("--width", "0"), "--width must be >= 1, got 0"),
    ("torch_import_fidelity", ("--schedules", "ZBVZeroBubble,Interleaved1F1B", "-m", "5"),
     "--microbatches: torch could not build 'Interleaved1F1B' for 2 ranks x 2 chunks, 5 microbatches"),
    ("tp_dp", ("--iters", "1"), "--iters must be >= 2, got 1"),
    ("tp_dp", ("--repeats", "0"), "--repeats must be >= 1, got 0"),
    ("tp_dp", ("--budgets", "1f1b,3y"), "--budgets: '3y' is not a budget"),
    ("tp_dp", ("--budgets", "2x,0"), "--budgets: 0 gives 0 slot(s) on some rank"),
    ("tp_dp", ("--only", "gpt-pp2-tp2,nope"), "--only: 'nope' is not a run; use emulated-pp4-tp2, emulated-pp2-dp2"),
    ("tp_dp", ("--out", "/dev/null"), "--out: /dev/null is a file, not a folder"),
    ("tp_dtensor", ("--iters", "0"), "--iters must be >= 1, got 0"),
    ("tp_dtensor", ("--nope",), "unrecognized arguments: --nope"),
    ("trace_bench", ("--iters", "1"), "--iters must be >= 2, got 1"),
    ("trace_bench", ("--stages", "0"), "--stages must be >= 1, got 0"),
    ("trace_bench", ("--microbatches", "0"), "--microbatches must be >= 1, got 0"),
    ("trace_bench", ("--reader-only", "--repeats", "0"), "--repeats must be >= 1, got 0"),
    ("trace_bench", ("--forward-time", "-1"), "--forward-time: must be a finite number from 0 to 3600, got -1.0"),
    ("trace_bench", ("--out", "/dev/null"), "--out: /dev/null is a file, not a folder"),
    ("tune_bench", ("--parts", "speed", "nope"), "argument --parts: invalid choice: 'nope'"),
    ("tune_bench", ("--time-budget", "-1"), "--time-budget must be a finite number > 0, got -1.0"),
    ("tune_bench", ("--time-budget", "inf"), "--time-budget must be a finite number > 0, got inf"),
    ("tune_bench", ("--work", "/dev/null"), "--work: /dev/null is a file, not a folder"),
    ("tune_budget", ("--time-budget", "5", "0"), "--time-budget must be a finite number > 0, got 0.0"),
    ("tune_budget", ("--repeats", "0"), "--repeats must be >= 1, got 0"),
    ("tune_budget", ("--jobs", "1", "0"), "--jobs must be >= 1, got 0"),
    ("tune_budget", ("--workload", "nosuch"), "argument --workload: invalid choice: 'nosuch'"),
    ("tune_budget", ("--ranks", "0"), "--ranks must be >= 1, got 0"),
    ("tune_budget", ("--microbatches", "0"), "--microbatches must be >= 1, got 0"),
]


@pytest.mark.parametrize("script, args, message", CASES, ids=[f"{s}{' '.join(a)}" for s, a, _ in CASES])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, script, args, message):
    result = run_script(tmp_path, f"benchmarks/{script}.py", *args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert result.stdout == "" and not list(tmp_path.iterdir())  # nothing ran: nothing printed or written


def test_device_check_without_a_gpu_is_one_error_line(tmp_path):
    """--device cuda (the default) where torch sees no GPU: refused before any check runs or any report is written."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = run_script(tmp_path, "benchmarks/device_check.py", "--out", "report")
    assert result.returncode == 2, result.stderr
    assert result.stderr == "error: --device cuda: torch sees no GPU here (--device cpu is the dry run)\n"
    assert result.stdout == "" and not list(tmp_path.iterdir())


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


class _Ended:
    def __init__(self, exitcode):
        self.exitcode = exitcode


class _Nothing:
    def get(self, timeout):
        import queue

        raise queue.Empty


@pytest.mark.parametrize("exitcodes, message", [
    ((None, 1), "error: rank 1 exited with 1 before rank 0 reported (its traceback is above)"),
    ((-9, None), "error: rank 0 exited with -9 before rank 0 reported (its traceback is above)"),
    ((0, 0), "error: both ranks exited without a result"),
])
def test_tp_dtensor_ends_when_a_rank_ends_without_its_timings(exitcodes, message):
    """A rank that fails leaves the other blocked in a collective: the script says so at once instead of waiting
    for ever on a result that cannot come."""
    tp_dtensor = load_script("benchmarks/tp_dtensor.py")
    with pytest.raises(SystemExit) as ended:
        tp_dtensor._result(_Nothing(), [_Ended(code) for code in exitcodes])
    assert ended.value.code == message
