"""Starting the ranks: on one machine through torch's elastic launcher, or joining a ``torchrun`` job.

:func:`launch` runs :func:`runtime.run.worker.worker_main` on every rank:

* Under ``torchrun`` (its environment variables are set) this process *is*
  one rank: it runs the worker directly, and multi-node jobs use torchrun
  unchanged.
* Otherwise it starts ``nproc`` ranks with ``torch.distributed.launcher``'s
  ``elastic_launch`` (c10d rendezvous on a free local port, no restarts). If
  any rank fails, the elastic agent stops the others at once; we then read
  the ranks' failure reports (``failures/rank<r>-*.json``) and raise
  :class:`RunFailed` naming the root cause (:func:`runtime.run.diagnose.diagnose`;
  [Note: root cause] in :mod:`runtime.run.diagnose`).

[Note: ranks fork from a server that has imported torch]
    A rank started as a fresh interpreter (``spawn``) imports torch, and at
    its optimizer's first construction ``torch._dynamo``: about 6 s of CPU
    per rank on a 2-core machine, most of a short job's time and the same
    work in every rank. The ranks therefore start from multiprocessing's
    fork server (``forkserver``): one process, started fresh (``spawn``-like,
    with the launcher's environment and ``sys.path``), that imports those
    modules once (:data:`FORKSERVER_PRELOAD`) and forks a rank per request.
    It holds no thread, process group or CUDA context when it forks (it
    only imported modules), so a rank starts as clean as under ``spawn``,
    and each rank is prepared as under ``spawn`` (``sys.path``, the main
    module). The server lives as long as the launching process, so later
    launches of that process (``rrfp bench``, tests) start their ranks at
    once. Nothing else differs: the elastic agent, its monitoring, signals
    and exit codes are the same for either start method.

Interrupts: SIGINT / SIGTERM reach the elastic agent (which forwards the
signal to every rank and kills what is left after 5 s) and, from a
terminal, the ranks themselves; both end in :class:`hints.errors.Interrupted`
for the caller, after each rank has closed its trace. Under ``torchrun`` a
rank that is stopped because another one failed reports that failure, not
the signal.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

from hints.errors import Interrupted, UserError
from runtime.config import is_factory_path
from runtime.run.diagnose import diagnose, ended_without_report, failure_reports
from runtime.run.worker import Job, WorkerOptions, interrupted_once, worker_main

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# What every rank imports, imported once by the fork server ([Note: ranks fork from a server that has imported
# torch]): torch, torch._dynamo (the optimizer's first construction imports it) and the rank's own code.
FORKSERVER_PRELOAD = ("torch", "torch._dynamo", "torch.distributed", "runtime.run.worker")


class RunFailed(RuntimeError):
    """A rank failed or stalled; the message names the root cause and what the other ranks saw.

    ``reports``: whether this process tells the user and keeps what finished: the launcher; under ``torchrun``
    rank 0, or when rank 0 died, the lowest rank alive ([Note: who reports under torchrun])."""

    def __init__(self, message: str, reports: bool = True) -> None:
        super().__init__(message)
        self.reports = reports


def under_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(jobs: list[Job], options: WorkerOptions, nproc: int, checked: bool = False) -> dict[int, Any]:
    """Run ``jobs`` on ``nproc`` ranks; returns each local rank's results.

    Every job is checked first (:func:`preflight`), so bad input fails here with one ``UserError``
    before any rank starts; ``checked``: the caller already ran :func:`preflight` on these jobs.
    """
    if not checked:
        preflight([job.config for job in jobs])
    _import_signal_handling_libraries()  # [Note: a library's own SIGINT handler]
    if under_torchrun():
        return _run_under_torchrun(jobs, options)
    os.environ.setdefault("PYTHONWARNINGS", "ignore:Failed to initialize NumPy")
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    out_root = Path(options.out_root)
    (out_root / "logs").mkdir(parents=True, exist_ok=True)
    settings = dict(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"rrfp-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=0, monitor_interval=0.1,
        start_method="forkserver", logs_specs=DefaultLogsSpecs(log_dir=str(out_root / "logs" / "elastic")),
        shutdown_timeout=5, rdzv_configs={"timeout": max(60, int(options.timeout * 2))},
        signals_to_handle="SIGHUP,SIGQUIT",  # SIGINT and SIGTERM are _FirstSignal's
    )
    start_fork_server()
    known = {f.name for f in dataclasses.fields(LaunchConfig)}  # older torch lacks e.g. shutdown_timeout
    config = LaunchConfig(**{k: v for k, v in settings.items() if k in known})
    began = time.time()
    signals = _FirstSignal()
    try:
        with signals:
            return elastic_launch(config, _elastic_worker)(jobs, options)
    except ChildFailedError as err:
        if signals.received or _all_interrupted(out_root, began, err.failures):
            _ignore_interrupts()  # [Note: one interrupt, one shutdown]
            raise Interrupted(signals.received or signal.SIGINT) from None  # Ctrl-C reached the ranks first
        raise RunFailed(diagnose(out_root, err.failures, began, nproc, jobs[0].config)) from None
    except SignalException as err:  # SIGHUP / SIGQUIT: the agent stopped the ranks
        raise Interrupted(err.sigval) from None


def start_fork_server() -> None:
    """Start the fork server the ranks come from, if it is not running yet; it imports
    :data:`FORKSERVER_PRELOAD` meanwhile ([Note: ranks fork from a server that has imported torch]).
    A caller may start it early, so the imports overlap its own work."""
    import multiprocessing
    from multiprocessing import forkserver

    os.environ.setdefault("PYTHONWARNINGS", "ignore:Failed to initialize NumPy")  # the server imports torch
    multiprocessing.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    forkserver.ensure_running()


class _FirstSignal:
    """While launching: the first SIGINT/SIGTERM raises :class:`Interrupted` in the launcher, and from then on
    until the process exits every later one (a second Ctrl-C, ``timeout`` forwarding the signal) is ignored.

    [Note: one interrupt, one shutdown]
        The first interrupt starts the shutdown: the agent stops the ranks (a signal to each, SIGKILL after
        5 s), then the caller keeps what finished (``rrfp run`` turns ``metrics.jsonl`` into
        ``metrics.parquet`` and merges the rank traces) and exits 130 / 143. A second signal anywhere in
        that (even after the launch returned, or while the interpreter exits) would cut it short and lose
        outputs one interrupt keeps, or end the process by the signal instead of its exit code. So the
        handlers are not restored once a signal was received: SIGINT and SIGTERM stay ignored. A caller that
        goes on after catching :class:`Interrupted` restores them itself. Without a signal the handlers are
        restored as they were.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.received: int | None = None
        self._saved: dict = {}

    def __enter__(self) -> "_FirstSignal":
        self._saved = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        if self.received is not None:
            _ignore_interrupts()  # [Note: one interrupt, one shutdown]: ignored through the interpreter's exit too
            return
        for s, handler in self._saved.items():
            signal.signal(s, handler)

    def _handle(self, signum: int, frame) -> None:
        if self.received is None:
            self.received = signum
            interrupted_once(signum, frame)  # later ones ignored, then Interrupted raised


def _all_interrupted(out_root: Path, began: float, failures: dict[int, Any]) -> bool:
    """Every rank that ended wrote an ``interrupt`` report (the signal reached the ranks before the launcher)."""
    reports = {r["rank"]: r["kind"] for r in failure_reports(out_root, began)}
    return bool(failures) and all(reports.get(rank) == "interrupt" for rank in failures)


def preflight(configs: list) -> None:
    """Every check that needs no rank: each job's hint, budget and task flags, and the device. Raises
    ``UserError``; ``rrfp run`` calls it before it creates the run directory."""
    from runtime.run.plan import validate_run

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch without numpy: harmless
    for config in configs:
        validate_run(config)
    if is_factory_path(configs[0].workload):
        from runtime.workloads.user import check_factory

        check_factory(configs[0])
    _check_device(configs[0])
    if os.environ.get("RRFP_SOCKET_ADDR"):  # the address every rank on this host would listen on
        from runtime.comm.bootstrap import check_socket_address
        from runtime.comm.errors import TransportError

        try:
            check_socket_address()
        except TransportError as err:
            raise UserError(str(err).removeprefix("RRFP_SOCKET_ADDR="), "RRFP_SOCKET_ADDR") from None


def _check_device(config) -> None:
    """``--device cuda`` and ``--backend nccl`` need CUDA on this machine: say so before any rank starts."""
    if config.device != "cuda" and config.backend != "nccl":
        return
    import torch

    if not torch.cuda.is_available():
        what, flag = ("cuda", "`device`") if config.device == "cuda" else ("nccl", "`backend`")
        raise UserError(f"{what} needs CUDA, which this machine does not have (torch {torch.__version__}); "
                        f"use `device` cpu `backend` gloo", flag)
    if config.backend == "nccl" and config.device == "cpu":
        raise UserError("nccl moves CUDA tensors only; use `device` cuda or `backend` gloo", "`backend`")


REPORTED_EXIT_DELAY = 1.0  # seconds: > the agent's monitor interval (0.1 s), with room for a loaded machine


def _elastic_worker(jobs: list[Job], options: WorkerOptions) -> dict[str, Any]:
    """A rank under the elastic launcher.

    A rank that failed or was interrupted has written its report and closed
    its trace; it exits with ``os._exit`` (1, or 128 + the signal), since an
    interpreter shutdown would join threads blocked in a collective and the
    agent's SIGTERM would land in its exit handlers. A failed rank first
    waits :data:`REPORTED_EXIT_DELAY`: the agent names only the *first*
    process it finds exited, and a rank killed outright ([Note: root cause]
    in :mod:`runtime.run.diagnose`) must be that one, not the neighbour whose
    transport error it caused.
    """
    try:
        return worker_main(jobs, options)
    except BaseException as err:
        sys.stdout.flush()
        sys.stderr.flush()
        if isinstance(err, Interrupted):
            os._exit(err.exit_code)
        _ignore_interrupts()  # the agent's SIGTERM must not cut the wait short
        time.sleep(REPORTED_EXIT_DELAY)
        os._exit(1)


def _import_signal_handling_libraries() -> None:
    """Import what installs a SIGINT handler of its own on import, before any handler of ours is set.

    [Note: a library's own SIGINT handler]
        polars (2.x) registers a SIGINT handler at the OS level when it is first imported (signal-hook,
        over whatever is there: ``SIG_IGN`` included) and a query it runs then raises ``KeyboardInterrupt``
        when a SIGINT arrives. The launcher's first use of polars is the shutdown's: turning
        ``metrics.jsonl`` into ``metrics.parquet`` after the first interrupt ([Note: one interrupt, one
        shutdown]). Imported there, over the ``SIG_IGN`` that keeps later signals out, a second Ctrl-C
        during the write cut it short: no ``metrics.parquet``, no "kept" line, exit 130 all the same
        (CI saw it; here about 1 run in 60 of tests/multiproc/test_repeated_interrupts.py under load, and
        every time in a script that imports polars after ``SIG_IGN``). Imported before, its handler is the
        one ours replace, and polars does not install it again.
    """
    import polars  # noqa: F401


def _ignore_interrupts() -> None:
    """From here on SIGINT and SIGTERM are ignored: this rank is already on its way out."""
    for signum in _FirstSignal.SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


WRONG_WORLD_WAIT = 60.0  # seconds a quiet rank waits for torchrun to stop it (local rank 0 starting slowly)


def _exit_quietly_after_local_rank_0(code: int) -> None:
    """A rank whose error every rank of the node finds (a wrong world size): local rank 0 prints it, this one exits
    with the same code and says nothing, once torchrun's agent stops it (SIGTERM, sent when local rank 0 has
    exited). Exiting first would make the agent stop local rank 0 before its one error line; bounded by
    :data:`WRONG_WORLD_WAIT`."""
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(code))
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(128 + signum))  # Ctrl-C: the whole group's
    time.sleep(WRONG_WORLD_WAIT)
    os._exit(code)


def _run_under_torchrun(jobs: list[Job], options: WorkerOptions) -> dict[int, Any]:
    """This process is one rank of a ``torchrun`` job: check the world, run, and diagnose as the launcher does.

    [Note: who reports under torchrun]
        Every rank that fails diagnoses the run, but rank 0 reports: the other
        ranks' output goes to ``logs/rank<r>.log``. When rank 0 itself died
        without a report (killed), the lowest rank whose lower ranks all did so
        reports instead: it gives its output back to the terminal it was
        started on and its ``RunFailed`` says ``reports``, so ``rrfp run``
        keeps what finished there. Ranks only learn that from the status files
        ([Note: a rank's life is a lock on its status file] in
        :mod:`runtime.run.health`), after the same one-second wait, so exactly
        one rank reports: a lower rank that is alive, or has reported, is never
        taken for dead.
    """
    config = jobs[0].config
    world = int(os.environ["WORLD_SIZE"])
    if world != config.world_size:
        if os.environ.get("LOCAL_RANK", os.environ["RANK"]) != "0":
            _exit_quietly_after_local_rank_0(2)
        raise UserError(f"torchrun started {world} processes but {config.ranks} pipeline ranks x tp {config.tp} x "
                        f"dp {config.dp} need {config.world_size}; use --nproc-per-node (x nodes) = "
                        f"{config.world_size}", "`ranks`")
    out_root = Path(options.out_root)
    rank = int(os.environ["RANK"])
    began = time.time()
    terminal = os.dup(1), os.dup(2)  # before worker_main sends this rank's output to logs/
    try:
        return {rank: worker_main(jobs, options)}
    except (Exception, Interrupted) as err:
        _ignore_interrupts()  # torchrun now stops the other ranks: let this one finish its diagnosis
        time.sleep(REPORTED_EXIT_DELAY)  # the rank that failed first has written its report by now
        ended = ended_without_report(out_root, began, world)
        if (isinstance(err, Interrupted) and not failure_reports(out_root, began, exclude_kinds=("interrupt",))
                and not ended):
            raise  # a real interrupt: no rank failed (torchrun's SIGTERM after a rank was killed is not one)
        reports = set(range(rank)) <= set(ended)  # [Note: who reports under torchrun]
        if reports and rank != 0:
            _restore_output(terminal)
        raise RunFailed(diagnose(out_root, {}, began, world, config), reports) from None
    finally:
        for fd in terminal:
            os.close(fd)


def _restore_output(terminal: tuple[int, int]) -> None:
    """Give stdout and stderr back to what they were when the rank started (the terminal torchrun runs on)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(terminal[0], 1)
    os.dup2(terminal[1], 2)
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
