"""Running the ``rrfp`` command (and the repository's scripts) in tests: in this process, or as a user does.

[Note: the two CLI runners]
``run_cli(cwd, *args)`` calls ``rrfp_cli.app.main(args)`` in the test's own process and returns a
:class:`Result` (``returncode``, ``stdout``, ``stderr``); ``run_rrfp(cwd, *args)`` runs ``python -m rrfp_cli``
in a subprocess and returns a ``subprocess.CompletedProcess`` with the same three fields. ``run_cli`` is what
a test of arguments, errors, help, tables or JSON uses: no interpreter to start, no torch or polars to import
again (a second or more per call on 2 cores). ``run_rrfp`` is for what only a fresh process shows: signals,
torchrun, threads that must end for the process to exit, what importing the CLI imports, tracebacks under
``RRFP_DEBUG=1``. ``rrfp run`` that starts ranks goes to a third runner, ``run_warm`` ([Note: the warm runner]
in tests/helpers/warm.py): the in-process runner in a process kept for the session, behind a hard timeout.

``run_cli`` sets up what the subprocess would see, for the duration of the call: the same environment
(``RRFP_DEBUG`` and a torchrun job's variables removed, ``COLUMNS`` set: rich and typer lay out tables, grids
and help for that width), the working directory ``cwd``, ``sys.argv`` as ``python -m rrfp_cli ARGS`` sets it
(tune-hint quotes it in its report), stdout and stderr captured (UTF-8, not a terminal, as a pipe is), a
``SystemExit`` turned into the exit code as the interpreter would (``None`` is 0, a string is printed and
is 1), warnings shown on stderr under the interpreter's default filters, and log records of WARNING and
above written to stderr as Python's last-resort handler does when nothing configured logging. The
environment, directory, ``sys.argv``, the SIGTERM handler ``main`` installs, the warning filters and the
root logger's handlers are restored afterwards. tests/cli/test_runners.py runs a sample of commands both
ways and checks that the two agree byte for byte.

``run_script(cwd, path, *args)`` does the same for a script of the repository (``benchmarks/*.py``,
``examples/*.py``): run as ``__main__`` with its own folder first on ``sys.path``, as ``python PATH`` does;
``load_script(path)`` loads one as a module instead, for a test of its functions.
"""

from __future__ import annotations

import importlib.util
import io
import logging
import os
import runpy
import signal
import subprocess
import sys
import traceback
import warnings
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator, NamedTuple

REPO = Path(__file__).resolve().parents[2]
# Variables that would make a child `rrfp run` believe it is one rank of a torchrun job, or show tracebacks.
INHERITED = ("RRFP_DEBUG", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def child_env(columns: int = 200) -> dict[str, str]:
    """The environment the CLI runs in: this one without :data:`INHERITED`, this checkout first on
    ``PYTHONPATH``, and a terminal ``columns`` wide (tables and grids laid out the same whatever the terminal)."""
    env = {k: v for k, v in os.environ.items() if k not in INHERITED}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["COLUMNS"] = str(columns)
    return env


# -- as a user runs it: a subprocess ---------------------------------------------------------------------------------


def run_rrfp(cwd: Path, *args: str, timeout: float = 180, python_flags: tuple[str, ...] = (),
             module: tuple[str, ...] = ("-m", "rrfp_cli"), columns: int = 200) -> subprocess.CompletedProcess:
    """Run the CLI in a subprocess, as a user would: real exit codes, stdout and stderr (on a terminal
    ``columns`` wide). ``module`` runs something else the same way (``("-m", "torch.distributed.run")``)."""
    return subprocess.run([sys.executable, *python_flags, *module, *map(str, args)], cwd=cwd,
                          env=child_env(columns), capture_output=True, text=True, timeout=timeout)


def start_rrfp(cwd: Path, *args: str) -> subprocess.Popen:
    """Start ``rrfp ARGS`` in a subprocess of its own session (a signal to its group reaches its ranks too)."""
    return subprocess.Popen([sys.executable, "-m", "rrfp_cli", *args], cwd=cwd, env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


class OnATerminal:
    """``rrfp ARGS`` in a subprocess of its own session whose stderr is a terminal (a pseudo-terminal ``columns``
    wide): what a user at a terminal sees, progress bars included, read as it comes (``stderr()``), so a test can
    wait for what the command shows (``wait_for("simulating")``) before it signals ``process``."""

    def __init__(self, cwd: Path, *args: str, columns: int = 200) -> None:
        import fcntl
        import pty
        import struct
        import termios
        import threading

        self._master, terminal = pty.openpty()
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
        env = child_env(columns)
        env.setdefault("TERM", "xterm")  # rich draws live progress on any terminal but a dumb one
        self.process = subprocess.Popen([sys.executable, "-m", "rrfp_cli", *args], cwd=cwd, env=env,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=terminal, text=True,
                                        start_new_session=True)
        os.close(terminal)
        self._seen = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._master, 4096)
            except OSError:  # EIO: the last writer closed the terminal (or the test closed it)
                break
            if not data:
                break
            self._seen.extend(data)

    def stderr(self) -> str:
        """What the command wrote to its terminal so far, without the escape sequences that draw it."""
        import re

        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", bytes(self._seen).decode("utf-8", "replace"))

    def wait_for(self, text: str, timeout: float = 120.0) -> None:
        """Wait until ``text`` shows on the terminal; fail if the command ends first, or after ``timeout`` s."""
        import time

        deadline = time.monotonic() + timeout
        while text not in self.stderr():
            assert self.process.poll() is None, f"the command ended before showing {text!r}:\n{self.stderr()}"
            assert time.monotonic() < deadline, f"{text!r} not shown within {timeout:.0f} s:\n{self.stderr()}"
            time.sleep(0.05)

    def communicate(self, timeout: float) -> tuple[str, str]:
        """Wait for the command to end; its stdout and everything its terminal showed."""
        stdout, _ = self.process.communicate(timeout=timeout)
        self._reader.join(timeout=10)
        return stdout, self.stderr()

    def kill(self) -> None:
        """Kill the command's whole session if it still runs, and close the terminal (the end of a test, whatever
        happened)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        if self._master >= 0:
            os.close(self._master)
            self._master = -1


# -- in this process ([Note: the two CLI runners]) -------------------------------------------------------------------


class Result(NamedTuple):
    """What a command left: its exit code and everything it wrote to stdout and stderr."""

    returncode: int
    stdout: str
    stderr: str


# The filters a fresh interpreter starts with (no -W, no PYTHONWARNINGS): pytest's own are set aside.
_DEFAULT_FILTERS = [("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, None),
                    ("ignore", PendingDeprecationWarning, None), ("ignore", ImportWarning, None),
                    ("ignore", ResourceWarning, None)]


def run_cli(cwd: Path, *args, columns: int = 200) -> Result:
    """``rrfp ARGS`` in this process, in ``cwd``, on a terminal ``columns`` wide ([Note: the two CLI runners])."""
    from rrfp_cli.app import main

    argv = [str(a) for a in args]
    return _in_process(cwd, [str(REPO / "rrfp_cli" / "__main__.py"), *argv], lambda: main(argv), columns)


def run_script(cwd: Path, script: str | Path, *args, columns: int = 200) -> Result:
    """``python SCRIPT ARGS`` in this process (``script`` relative to the repository, or absolute)."""
    path = REPO / script

    def run() -> None:
        with _folder_on_path(path):
            runpy.run_path(str(path), run_name="__main__")

    return _in_process(cwd, [str(path), *map(str, args)], run, columns)


def load_script(script: str | Path) -> ModuleType:
    """A script of the repository (relative to it, or absolute) as a module named after its file, for a test of
    its functions: loaded, not run as ``__main__``, with its folder first on ``sys.path`` as it loads, so that it
    imports its siblings (``benchmarks/_cli``) as ``python PATH`` lets it."""
    path = REPO / script
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    with _folder_on_path(path):
        spec.loader.exec_module(module)
    return module


@contextmanager
def _folder_on_path(script: Path) -> Iterator[None]:
    sys.path.insert(0, str(script.parent))
    try:
        yield
    finally:
        sys.path.remove(str(script.parent))


def _in_process(cwd: Path, argv: list[str], call: Callable[[], object], columns: int) -> Result:
    stdout, stderr = _pipe(), _pipe()
    code = 0
    with _as_a_child(cwd, argv, columns, stderr) as shown:
        with redirect_stdout(stdout), redirect_stderr(stderr):
            try:
                call()
            except SystemExit as done:
                code = _exit_code(done.code, stderr)
            except Exception:  # uncaught: the interpreter prints the traceback and exits 1
                traceback.print_exc(file=stderr)
                code = 1
            finally:
                for caught in shown:
                    stderr.write(warnings.formatwarning(caught.message, caught.category, caught.filename,
                                                        caught.lineno, caught.line))
                shown.clear()
    return Result(code, _text(stdout), _text(stderr))


def _pipe() -> io.TextIOWrapper:
    """A text stream as a pipe is: UTF-8, a binary buffer beneath, not a terminal."""
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    return stream.buffer.getvalue().decode("utf-8")


def _exit_code(code, stderr) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=stderr)  # sys.exit("message")
    return 1


@contextmanager
def _as_a_child(cwd: Path, argv: list[str], columns: int, stderr) -> Iterator[list]:
    """What a subprocess would see, for the duration of the block; yields the warnings shown in it."""
    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    saved_sigterm = signal.getsignal(signal.SIGTERM)
    root = logging.getLogger()
    saved_handlers = root.handlers[:]
    env = child_env(columns)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = argv
    root.handlers = []  # nothing configured: WARNING and above go to logging.lastResort, i.e. sys.stderr
    try:
        with warnings.catch_warnings(record=True) as shown:
            warnings.resetwarnings()
            for action, category, module in reversed(_DEFAULT_FILTERS):
                warnings.filterwarnings(action, category=category, module=module or "")
            for option in filter(None, os.environ.get("PYTHONWARNINGS", "").split(",")):
                _apply_warning_option(option)
            yield shown
    finally:
        root.handlers = saved_handlers
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        signal.signal(signal.SIGTERM, saved_sigterm)


def _apply_warning_option(option: str) -> None:
    """One ``PYTHONWARNINGS`` entry, read as the interpreter reads it (an invalid one is ignored, as there)."""
    try:
        warnings._setoption(option)
    except warnings._OptionError:
        pass


# -- what tests assert on a command's output -------------------------------------------------------------------------


def one_error_line(result) -> str:
    """A command that failed on bad input: exit 2, exactly one ``error:`` line on stderr, never a traceback;
    returns the line."""
    assert result.returncode == 2, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), f"expected one error line, got:\n{result.stderr}"
    return lines[0]


def one_error(result, message: str) -> None:
    """Exit 2, stderr exactly one ``error:`` line holding ``message`` (a warning the command met on the way is not
    shown: Output.warn keeps it for a result that never comes), no traceback, nothing on stdout."""
    line = one_error_line(result)
    assert message in line and result.stdout == "", result


def narrow(cwd: Path, *args, width: int = 80, between: Callable[[], object] | None = None) -> str:
    """``rrfp ARGS`` (in this process) on a terminal ``width`` wide ([Note: tables at 80 columns]): it succeeds, no
    line of its stdout or stderr is wider, nothing is cut with "…", and nothing is lost: every word the same
    command prints on a terminal wide enough for everything (1000 columns) is there, as many times (a table split
    in parts repeats its key columns; a wrapped cell keeps its words whole). Returns its stdout.

    The command runs twice, narrow then wide: ``between()`` undoes what the first wrote (a file it would refuse
    to overwrite). The one figure that may differ between two runs, simulate's own wall time ("64 in 0.00 s"),
    is left out of the comparison."""
    import re
    from collections import Counter

    from rich.cells import cell_len

    def words(text: str) -> Counter:
        text = re.sub(r"\bin \d+\.\d+ s\b", "in (time) s", text)
        return Counter(re.sub(r"[\u2500-\u257f\\]", " ", text).split())  # box drawing, and `\` ending a line

    done = run_cli(cwd, *args, columns=width)
    assert done.returncode == 0, done.stderr
    for stream in (done.stdout, done.stderr):
        assert "…" not in stream, stream
        assert max(map(cell_len, stream.splitlines()), default=0) <= width, stream
    if between is not None:
        between()
    wide = run_cli(cwd, *args, columns=1000)
    assert wide.returncode == 0, wide.stderr
    lost = words(wide.stdout) - words(done.stdout)
    assert not lost, f"at {width} columns these words are cut or missing: {dict(lost)}\n{done.stdout}"
    return done.stdout


# Every `rrfp trace` subcommand that analyses or draws one run, with what it needs besides RUN (`d["run"]`: another
# run to compare with, `d["dir"]`: a folder for what it writes).
TRACE_COMMANDS = {
    "summary": lambda d: [],
    "bubbles": lambda d: [],
    "misalign": lambda d: [],
    "critical-path": lambda d: [],
    "sensitivity": lambda d: [],
    "decisions": lambda d: [],
    "compare": lambda d: [d["run"]],
    "export": lambda d: ["--parquet", d["dir"] / "pq", "--durations", d["dir"] / "d.csv"],
    "timeline": lambda d: ["--png", d["dir"] / "t.png"],
}
