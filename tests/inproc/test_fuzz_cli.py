"""A fuzz of every command's options (issue 24's acceptance): hypothesis draws argument lists for every command of
``rrfp`` from the command tree itself (each command's options and arguments, their types, choices and ranges),
with valid and invalid values: numbers (0, negative, inf, nan, text), choices and non-choices, and paths that
exist or not (a traced run, a hint file, a torch CSV, a duration table, torch profiler traces, TOML files, a
directory, garbage, an empty file, a file where a directory is wanted, new paths with good and bad suffixes).

Each argument list runs in this process ([Note: the two CLI runners] in tests/helpers/cli.py) in a fresh copy of
those files. What it must do: exit 0; or exit 2 with exactly one ``error:`` line, nothing else on stderr, the
same thing not named twice ("error: X: X: ..."), and nothing written; or exit 1 (a named failure) starting with
an ``error:`` line. Never a traceback or an internal error, never another exit code.

Kept cheap: ``rrfp run`` and ``rrfp bench`` stop where they would start processes (the launcher and the suite
are replaced by a stub that ends the example as a success: everything before it, the validation, ran), tune-hint
searches for 0.1 s on 2 scenarios unless the draw says otherwise, numbers stay small (a shape of 10**30 ranks
is not drawn: nothing bounds integer options yet, and such a simulation never ends), and every example has a
time limit. Failures are collected, not shrunk: each command's test lists all it found, and with
``RRFP_FUZZ_REPORT=FILE`` every distinct failure (argv and output) is written to FILE at the end of the module.
Argument lists it found failing with more examples than that, whose fix lies in a command's body, are replayed
by test_argument_lists_the_fuzz_found. ``RRFP_FUZZ_EXAMPLES`` sets the examples per command (default 15); ``RRFP_FUZZ_LOG=FILE`` appends every example
(argv, exit code, last line of stderr) to FILE, to see what the fuzz reached.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
from pathlib import Path

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rrfp_cli.app import app
from tests.helpers.cli import run_cli

EXAMPLES = int(os.environ.get("RRFP_FUZZ_EXAMPLES", "15"))
REPORT = os.environ.get("RRFP_FUZZ_REPORT")
LOG = os.environ.get("RRFP_FUZZ_LOG")  # every example's argv, exit code and last stderr line, appended
TIME_LIMIT_S = 30  # one example; the slowest valid one here takes about a second


def _leaves() -> list[tuple[tuple[str, ...], object]]:
    found = []

    def walk(command, path: tuple[str, ...]) -> None:
        subs = getattr(command, "commands", None)
        if subs is None:
            found.append((path, command))
        for name, sub in (subs or {}).items():
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return found


LEAVES = _leaves()

# -- the values drawn --------------------------------------------------------------------------------------------------

# Each kind of value as (valid, invalid) spellings: most of an example's values are drawn valid, so it gets past
# the first check; about one in six is drawn from the invalid ones.
INTS = (["1", "2", "3", "4"], ["0", "-1", "8", "abc", "1.5", "", "1e3", "0x10"])
FLOATS = (["0", "0.01", "0.5", "1", "2"], ["-1", "1e308", "-1e308", "1e-320", "inf", "-inf", "nan", "abc", "", "1,5"])
TEXT = (["x", "1F0"], ["", "-1", "nan", "ünïcode", "a b", "--json", "[bold]x[/bold]", ":b:"])
HINTS = (["1f1b", "zb", "zbv", "interleaved-1f1b", "cp", "bfw", "gpipe", "torch:GPipe", "torch:Interleaved1F1B",
          "hint.json", "torch.csv"], ["torch:Nope", "nope", "garbage.bin", "empty.json", "missing.json", "dir", ""])
# Paths, relative to the example's folder (the fixture `inputs` writes the files), by what an option or argument
# of that name wants; any other path is an invalid one.
PATHS = ["run", "run/trace.pftrace", "hint.json", "torch.csv", "durations.csv", "config.toml", "bad.toml",
         "broken.toml", "garbage.bin", "empty.json", "dir", "kineto", "kineto/rank0_trace.json", "missing.json",
         "missing/out.csv", "garbage.bin/x", "new", "new.json", "new.csv", "new.parquet", "new.svg", "new.png",
         "new.pftrace", "new.json.gz", "new.toml", ""]
NEW = ["new", "new.json", "new.csv", "new.parquet", "new.svg", "new.png", "new.pftrace", "new.json.gz"]
VALID_PATHS = {
    **dict.fromkeys(("run", "a", "b", "other", "runs", "resume", "check"), ["run", "run/trace.pftrace"]),
    "traces": ["kineto", "kineto/rank0_trace.json"],
    "durations": ["durations.csv", *NEW],  # simulate and tune-hint read one, trace export writes one
    "cost_table": ["durations.csv"],
    "config_file": ["config.toml", "bad.toml"],
    "report_file": ["new.json"],
    **dict.fromkeys(("out", "out_dir", "out_file", "parquet", "chrome", "svg", "png", "torch_csv"), NEW),
}
BY_NAME = {  # text options with a grammar of their own (and the few numbers whose valid range is not 1..4)
    "hint": HINTS,
    "memory_budget": (["1f1b", "2x", "3"], ["0.5x", "0", "-1", "0x", "inf", "nan", "auto", "abc", "1e400", ""]),
    "iterations": (["1:3", ":", "2:", ":2", "0:"], ["3:1", "a:b", "1", "", "1:2:3", "-1:2", "0:0"]),
    "trace_iters": (["1:3", ":", "2:"], ["3:1", "a:b", "1", "", "-1:2"]),
    "objective": (["mean", "p90", "cvar:0.9"], ["p0", "p100", "p101", "cvar:1.5", "cvar:x", "median", ""]),
    "time_budget": (["0.1s", "0.2s"], ["0s", "-1s", "abc", "inf", "nans", "1e400s", "0.1"]),
    "unknown": (["moe=1.5", "cost-error=0.2", "slow-rank=0.2", "inter-node=0.5", "moe=1.5,cost-error=0.1"],
                ["moe=0.5", "slow-rank=2", "bogus=1", "moe", "moe=nan", "moe=inf", ""]),
    "unknown_sweep": (["moe=1.3:1.7", "cost-error=0.2", "none"], ["moe", "moe=0.5", "bogus=1", "moe=1.3:x", ""]),
    "workloads": (["uniform", "sft-chat,vlm-mixed"], ["nope", "", ","]),
    "ranks": (["8", "8,16"], ["0", "-8", "a", "", "8,8"]),  # bench's --ranks (a list); the shape's -p is an int
    "budgets": (["1f1b", "2x", "1f1b,2x"], ["0", "x", ""]),
    "schedule": (["1F1B", "GPipe", "Interleaved1F1B"], ["Nope", ""]),
    "placement": (["looping", "v"], ["x", ""]),
    "policy": (["ready", "fixed", "auto"], ["x", ""]),
    "device": (["cpu", "auto"], ["cuda", "tpu", ""]),
    "backend": (["gloo", "auto"], ["nccl", "mpi", ""]),
    "workload": (["gpt", "emulated", "multimodal"], ["uniform", "vlm-mixed", "os.path:join", "nope.mod:f", "nope", ""]),
    "emulate": (["uniform", "vlm-mixed", "multimodal"], ["nope", ""]),
    "delay": (["1B0=0.3", "0F0=0"], ["x", "1B0=inf", "1B0=-1", "9F9=1", "=1", "1B0="]),
    "fail_at": (["1F1", "0F0@1"], ["x", "0F0@-1", "9F9", ""]),
    "hang_at": (["1F1", "0F0@1"], ["x", "9F9", ""]),
    "out": (PATHS, PATHS),
}
# A shape's sizes may be drawn huge: [Note: shape limits] in hints/tasks.py refuses them before any work.
HUGE = ["100000", "100000000", "1000000000000000000000000000000"]
NUMBERS_BY_NAME = {  # number options whose valid values are not those of INTS and FLOATS
    "stages": (INTS[0], INTS[1] + HUGE),  # -p/--ranks/--stages of every command but bench
    "chunks": (INTS[0], INTS[1] + HUGE),
    "microbatches": (INTS[0], INTS[1] + HUGE),
    "width": (["400", "1600"], ["399", "0", "-1", "x"]),
    "jobs": (["1"], ["0", "-1", "x"]),  # no more: each job is a process
    "seed": (["0", "1", "7"], ["-1", "x", "1.5"]),
    "iteration": (["0", "1", "2"], ["-1", "9", "x"]),
    "durations_iteration": (["0", "1"], ["-1", "99", "x"]),
    "freeze_iteration": (["0", "1"], ["-1", "x"]),
    "rank": (["0", "1"], ["-1", "2", "x"]),
    "timeout": (["1", "30"], ["0", "-1", "inf", "nan", "x"]),
    "split_overhead": (["1", "1.2", "2"], ["0", "0.5", "11", "inf", "nan", "x"]),
    "straggler_slowdown": (["1", "2", "4"], ["0", "0.5", "1e308", "inf", "x"]),
    "straggler_prob": (["0", "0.1", "1"], ["-0.1", "1.5", "nan", "x"]),
    "holdout": (["0.3", "0.5"], ["0", "1", "-0.1", "inf", "x"]),
    "tune_seconds": (["0", "0.1"], ["-1", "inf", "nan", "x"]),
}
SHAPE = ["-p", "2", "-m", "4"]
PREFIX = {  # options a command gets before the drawn ones (a drawn one of the same name comes later and wins)
    ("simulate",): SHAPE, ("hints", "show"): SHAPE, ("hints", "check"): SHAPE, ("hints", "export"): SHAPE,
    ("tune-hint",): ["--time-budget", "0.1s", "--scenarios", "2"],
}


def _kind(param) -> tuple[str, list[str]]:
    """``(kind, choices)``: kind is flag, choice, path, int, float, bool or text."""
    if getattr(param, "is_flag", False):
        return "flag", []
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is not None:  # typer >= 0.20: its own parameter types
        annotation = descriptor.annotation
        if descriptor.is_choice:
            return "choice", [getattr(c, "value", c) for c in descriptor.choices]
        inner = typer_list_item(annotation)
        if descriptor.is_path or (isinstance(inner, type) and issubclass(inner, Path)):
            return "path", []
        return {int: "int", float: "float", bool: "bool"}.get(inner, "text"), []
    name = getattr(param.type, "name", "text")  # click's types
    if hasattr(param.type, "choices"):
        return "choice", list(param.type.choices)
    return ("path" if name == "path" else "int" if "integer" in name else "float" if "float" in name else
            "text"), []


def typer_list_item(annotation):
    args = getattr(annotation, "__args__", None)
    return args[0] if args and getattr(annotation, "__origin__", None) is list else annotation


def _values(param, invalid: bool) -> st.SearchStrategy[str]:
    kind, choices = _kind(param)
    if kind == "choice":
        return st.sampled_from(["nope", "", str(choices[0]).upper()] if invalid else choices)
    if kind == "path":
        valid = VALID_PATHS.get(param.name, PATHS)
        return st.sampled_from([p for p in PATHS if p not in valid] if invalid else valid)
    named = BY_NAME if kind == "text" else NUMBERS_BY_NAME
    pools = named.get(param.name) or {"int": INTS, "float": FLOATS}.get(kind, TEXT)
    return st.sampled_from(pools[invalid])


@st.composite
def argv_for(draw, path: tuple[str, ...], command) -> list[str]:
    args: list[str] = [*path, *PREFIX.get(path, [])]
    clean = not draw(st.integers(0, 2))  # one example in three draws only valid values: it reaches the work
    one_in = max(4, len(command.params) // 4)  # about four options an example (rrfp run has 45)
    for param in command.params:
        if param.name == "help":
            continue
        invalid = not clean and not draw(st.integers(0, 5))
        if param.param_type_name == "argument":
            values = _values(param, invalid) if param.name != "hint" else st.sampled_from(HINTS[invalid])
            given = draw(st.integers(0, 19)) > 0 if param.required else draw(st.booleans())
            count = (draw(st.integers(1, 2)) if param.nargs == -1 else 1) if given else 0
            args += [draw(values) for _ in range(count)]
            continue
        if draw(st.integers(0, one_in - 1)) and not (param.required and draw(st.integers(0, 19))):
            continue  # a required option nearly always
        name = draw(st.sampled_from([*param.opts, *getattr(param, "secondary_opts", [])]))
        if _kind(param)[0] == "flag":
            args.append(name)
            continue
        for _ in range(draw(st.integers(1, 2)) if param.multiple else 1):
            args += [name, draw(_values(param, invalid))]
    if not clean and not draw(st.integers(0, 15)):
        args.append(draw(st.sampled_from(["--bogus", "extra", "-x"])))
    return args


# -- the files ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Every file an argument may name, valid and not (see PATHS)."""
    from hints.orders import builtin_hint
    from tests.helpers.kineto_builder import kineto_traces
    from tests.helpers.trace_builder import MISALIGNED, build_run

    root = tmp_path_factory.mktemp("fuzz-inputs")
    build_run(root / "run", **MISALIGNED, iterations=3, period_us=200)
    for args in (["hints", "export", "1f1b", "-p", "2", "-m", "4", "--out", "hint.json", "--torch-csv", "torch.csv"],
                 ["trace", "export", "run", "--durations", "durations.csv", "--iterations", "0:"]):
        done = run_cli(root, *args)
        assert done.returncode == 0, done
    kineto_traces(builtin_hint("1f1b", 2, 1, 4), root / "kineto")
    (root / "config.toml").write_text("ranks = 2\nmicrobatches = 4\n")
    (root / "bad.toml").write_text('stages = "four"\nbogus = 1\n')
    (root / "broken.toml").write_text("[[[ not toml\n")
    (root / "garbage.bin").write_bytes(bytes(range(256)) * 4)
    (root / "empty.json").write_text("")
    (root / "dir").mkdir()
    return root


class _WouldStart(BaseException):
    """Raised where ``rrfp run`` would start its ranks or ``rrfp bench`` its suite: the example ends there, having
    passed every check before it (a BaseException, so no ``except Exception`` on the way turns it into an error)."""


class _TooSlow(BaseException):
    pass


@pytest.fixture
def no_processes(monkeypatch):
    import profiler.bench.suite
    import runtime.run.launch

    def would_start(*args, **kwargs):
        raise _WouldStart()

    monkeypatch.setattr(runtime.run.launch, "start_fork_server", lambda *a, **k: None)
    monkeypatch.setattr(runtime.run.launch, "launch", would_start)
    monkeypatch.setattr(profiler.bench.suite, "run_suite", would_start)


# -- what each example must do -----------------------------------------------------------------------------------------


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def _problem(code: int, stdout: str, stderr: str, changed: list[str]) -> str | None:
    if "Traceback" in stdout + stderr:
        return "a traceback"
    if "internal error" in stderr:
        return "an internal error"
    lines = [line for line in stderr.splitlines() if line.strip()]
    if code == 0:
        return None
    if code == 2:
        if len(lines) != 1 or not lines[0].startswith("error: "):
            return f"exit 2 with {len(lines)} lines on stderr, not one error: line"
        if re.match(r"error: (.+?): \1:", lines[0]):
            return "the error line names the same thing twice"
        if changed:
            return f"exit 2, but wrote {sorted(changed)[:4]}"
        return None
    if code == 1:
        return None if lines and lines[0].startswith("error: ") else "exit 1 without an error: line first"
    return f"exit {code}"


def _signature(path: tuple[str, ...], problem: str, stderr: str) -> str:
    """What makes two failures the same: the command, the problem, and the first line with names and numbers
    blanked."""
    first = next((line for line in stderr.splitlines() if line.strip()), "")
    first = re.sub(r"'[^']*'|\"[^\"]*\"|\S*/\S*|-?\d[\d.e+-]*", "_", first)[:120]
    return f"{' '.join(path)} | {problem} | {first}"


FOUND: dict[str, tuple[list[str], int, str]] = {}  # signature -> (argv, exit code, output)


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    if REPORT:
        with open(REPORT, "w") as out:
            out.write(f"{len(FOUND)} distinct failures of the fuzz of every command's options "
                      f"(tests/inproc/test_fuzz_cli.py)\n\n")
            for signature, (argv, code, output) in sorted(FOUND.items()):
                out.write(f"{signature}\n  rrfp {' '.join(map(repr, argv))}\n  exit {code}\n")
                out.write("".join(f"  | {line}\n" for line in output.splitlines()[-8:]) + "\n")


def _run_one(folder: Path, argv: list[str]) -> tuple[int, str, str]:
    def too_slow(*_):
        raise _TooSlow()

    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(TIME_LIMIT_S)
    try:
        done = run_cli(folder, *argv, columns=100)
        return done.returncode, done.stdout, done.stderr
    except _WouldStart:
        return 0, "", ""
    except _TooSlow:
        return -1, "", f"took over {TIME_LIMIT_S} s"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("path, command", LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_every_option_of_every_command(tmp_path, inputs, no_processes, path, command):
    failures: list[str] = []
    examples = iter(range(10**6))

    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(argv=argv_for(path, command))
    def explore(argv: list[str]) -> None:
        folder = tmp_path / f"example{next(examples)}"
        shutil.copytree(inputs, folder)
        before = _snapshot(folder)
        code, stdout, stderr = _run_one(folder, argv)
        after = _snapshot(folder)
        changed = [name for name, stamp in after.items() if before.get(name) != stamp]
        problem = _problem(code, stdout, stderr, changed)
        if LOG:
            with open(LOG, "a") as log:
                log.write(f"{code} {argv!r}\n   {stderr.strip().splitlines()[-1:] if stderr.strip() else ''}\n")
        shutil.rmtree(folder, ignore_errors=True)
        if problem is not None:
            signature = _signature(path, problem, stderr)
            FOUND.setdefault(signature, (argv, code, stderr))
            failures.append(f"{signature}\n  rrfp {' '.join(map(repr, argv))}")

    explore()
    assert not failures, f"{len(failures)} of {EXAMPLES} argument lists failed:\n" + "\n".join(dict.fromkeys(failures))


# Argument lists the fuzz found failing (with more examples than the suite runs), whose fix lies in a command's
# body: replayed every run, judged as the fuzz judges, so they fail until fixed and then guard the fix.
FOUND_BEFORE = [
    ("tune-hint", "--check", "run", "--report", "run/trace.pftrace"),  # a binary --report: UnicodeDecodeError
]


@pytest.mark.parametrize("argv", FOUND_BEFORE, ids=[" ".join(a) for a in FOUND_BEFORE])
def test_argument_lists_the_fuzz_found(tmp_path, inputs, no_processes, argv):
    folder = tmp_path / "example"
    shutil.copytree(inputs, folder)
    before = _snapshot(folder)
    code, stdout, stderr = _run_one(folder, list(argv))
    changed = [name for name, stamp in _snapshot(folder).items() if before.get(name) != stamp]
    problem = _problem(code, stdout, stderr, changed)
    if problem is not None:
        FOUND.setdefault(_signature(tuple(argv[:1]), problem, stderr), (list(argv), code, stderr))
    assert problem is None, f"rrfp {' '.join(argv)}: {problem}\n{stderr}"
