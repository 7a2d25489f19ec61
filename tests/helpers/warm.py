"""``rrfp run`` in a warm process: what multi-process tests use to start ranks, without paying each time for an
interpreter, torch, and the fork server the ranks come from.

[Note: the warm runner]
A test that launches ranks through ``rrfp run`` (or a list of jobs through ``runtime.run.launch``) pays, in a
fresh ``python -m rrfp_cli``, about 4 s on 2 cores before the first rank starts: the interpreter, torch, and the
fork server that imports torch, ``torch._dynamo`` and the worker ([Note: ranks fork from a server that has
imported torch] in runtime/run/launch.py); the ranks' own work in a small job is under a second. The fork
server lives as long as the process that started it, so a process that launches again starts its ranks at once
(as ``rrfp bench`` does). ``run_warm(cwd, *args)`` sends the command to one such process, the *warm server*
(``python -m tests.helpers.warm``, started at the first call and kept for the test session), which runs it
through the in-process runner ([Note: the two CLI runners] in tests/helpers/cli.py): the same
``rrfp_cli.app.main``, the same environment, directory, argv, captured stdout and stderr and exit code.
``run_jobs_warm(spec, results)`` does the same for tests.helpers.runtime_harness.

What stays a fresh subprocess (``run_rrfp``): signals to the command, torchrun, an environment the test changes
(the fork server keeps the environment it started with), a workload module in the test's folder (the fork
server's directory and ``sys.path`` are the repository's), ``python -X importtime``.

A hard limit holds as with a subprocess: a call that does not answer within ``timeout`` seconds kills the server
and everything it started (its session: the fork server, the elastic agent's ranks) and raises
``subprocess.TimeoutExpired``; the next call starts a new server. A server that dies (a command that calls
``os._exit``) fails the call with the end of its log, and is replaced too. tests/cli/test_runners.py checks that a
run, a failing run and a refused run answer alike warm and in a subprocess.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from tests.helpers.cli import REPO, Result, child_env

_LOG_TAIL = 3000  # characters of the server's log shown when it dies


class WarmServer:
    """The client side: one server process, started on first use, replaced after a timeout or a crash."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._requests = self._answers = None
        self._log: Path | None = None

    def call(self, request: dict, timeout: float) -> dict:
        if self._process is None or self._process.poll() is not None:
            self._start()
        self._requests.write(json.dumps(request) + "\n")
        self._requests.flush()
        line = self._read_line(timeout, request)
        return json.loads(line)

    def close(self) -> None:
        """Stop the server and everything it started."""
        if self._process is None:
            return
        for stream in (self._requests, self._answers):
            try:
                stream.close()
            except OSError:
                pass
        if self._process.poll() is None:
            try:
                self._process.wait(timeout=5)  # end of input: it returns, its fork server ends with it
            except subprocess.TimeoutExpired:
                pass
        _kill_session(self._process)
        self._process = None
        self._log.unlink(missing_ok=True)  # kept only when the server died (its tail is in the failure)

    def _start(self) -> None:
        request_read, request_write = os.pipe()
        answer_read, answer_write = os.pipe()
        fd, log = tempfile.mkstemp(prefix="rrfp-warm-", suffix=".log")
        self._log = Path(log)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.warm", str(request_read), str(answer_write)], cwd=REPO,
            env=child_env(), pass_fds=(request_read, answer_write), stdin=subprocess.DEVNULL, stdout=fd,
            stderr=subprocess.STDOUT, start_new_session=True)
        for theirs in (request_read, answer_write, fd):
            os.close(theirs)
        self._requests = os.fdopen(request_write, "w")
        self._answers = os.fdopen(answer_read, "r")

    def _read_line(self, timeout: float, request: dict) -> str:
        ready, _, _ = select.select([self._answers], [], [], timeout)
        if not ready:
            self._kill()
            raise subprocess.TimeoutExpired(["warm"] + request.get("args", []), timeout)
        line = self._answers.readline()
        if not line:
            self._kill()
            raise AssertionError(f"the warm server died during {request}:\n{self._log_tail()}")
        return line

    def _kill(self) -> None:
        _kill_session(self._process)
        self._process = None

    def _log_tail(self) -> str:
        try:
            return self._log.read_text(errors="replace")[-_LOG_TAIL:]
        except OSError:
            return "(no log)"


def _kill_session(process: subprocess.Popen) -> None:
    """SIGKILL to the server's session (itself, its fork server and the ranks forked from it)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


_SERVER = WarmServer()
atexit.register(_SERVER.close)


def run_warm(cwd: Path, *args, timeout: float = 180, columns: int = 200) -> Result:
    """``rrfp ARGS`` in the warm server, in ``cwd`` ([Note: the warm runner])."""
    answer = _SERVER.call({"kind": "cli", "cwd": str(cwd), "args": [str(a) for a in args], "columns": columns},
                          timeout)
    return Result(answer["returncode"], answer["stdout"], answer["stderr"])


def run_jobs_warm(spec: Path, results: Path, timeout: float) -> Result:
    """``tests.helpers.runtime_harness SPEC RESULTS`` in the warm server ([Note: the warm runner])."""
    answer = _SERVER.call({"kind": "jobs", "args": [str(spec), str(results)]}, timeout)
    return Result(answer["returncode"], answer["stdout"], answer["stderr"])


# -- the server ------------------------------------------------------------------------------------------------------


def _serve(request_fd: int, answer_fd: int) -> None:
    from runtime.run.launch import start_fork_server
    from tests.helpers.cli import run_cli

    for fd in (request_fd, answer_fd):
        os.set_inheritable(fd, False)  # the fork server and ranks must not hold the pipes open
    start_fork_server()  # here, in the repository: its directory and sys.path are every rank's
    import rrfp_cli.app  # noqa: F401  (imported once, as the subprocess would at every call)

    with os.fdopen(request_fd) as requests, os.fdopen(answer_fd, "w") as answers:
        for line in requests:
            request = json.loads(line)
            began = time.monotonic()
            if request["kind"] == "cli":
                result = run_cli(Path(request["cwd"]), *request["args"], columns=request["columns"])
            else:
                result = _run_harness(*request["args"])
            print(f"{time.monotonic() - began:6.1f} s  exit {result.returncode}  {request}", flush=True)
            answers.write(json.dumps(result._asdict()) + "\n")
            answers.flush()


def _run_harness(spec: str, results: str) -> Result:
    from tests.helpers.runtime_harness import main

    try:
        main(spec, results)
    except BaseException:  # the subprocess would print it and exit 1
        return Result(1, "", traceback.format_exc())
    return Result(0, "", "")


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
