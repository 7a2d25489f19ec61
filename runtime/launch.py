"""Starting the ranks: on one machine through torch's elastic launcher, or joining a ``torchrun`` job.

:func:`launch` runs :func:`runtime.worker.worker_main` on every rank:

* Under ``torchrun`` (its environment variables are set) this process *is*
  one rank: it runs the worker directly, and multi-node jobs use torchrun
  unchanged.
* Otherwise it starts ``nproc`` ranks with ``torch.distributed.launcher``'s
  ``elastic_launch`` (c10d rendezvous on a free local port, no restarts). If
  any rank fails, the elastic agent stops the others at once; we then read
  the ranks' failure reports (``failures/rank<r>-*.json``) and raise
  :class:`RunFailed` naming the root cause: the first rank that raised, else
  the first that stalled, else the first transport error, else the first
  process the agent saw die.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

from runtime.worker import STALL_EXIT_CODE, Job, WorkerOptions, worker_main

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class RunFailed(RuntimeError):
    """A rank failed or stalled; the message names the root cause and what the other ranks saw."""


def under_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(jobs: list[Job], options: WorkerOptions, nproc: int) -> dict[int, Any]:
    """Run ``jobs`` on ``nproc`` ranks; returns each local rank's results.

    Every job is validated first (:func:`runtime.plan.validate_run`), so bad input fails here with one
    ``UserError`` before any rank starts.
    """
    from runtime.plan import validate_run

    for job in jobs:
        validate_run(job.config)
    if under_torchrun():
        return {int(os.environ["RANK"]): worker_main(jobs, options)}
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    os.environ.setdefault("PYTHONWARNINGS", "ignore:Failed to initialize NumPy")
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    out_root = Path(options.out_root)
    (out_root / "logs").mkdir(parents=True, exist_ok=True)
    settings = dict(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"rrfp-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=0, monitor_interval=0.1,
        start_method="spawn", logs_specs=DefaultLogsSpecs(log_dir=str(out_root / "logs" / "elastic")),
        shutdown_timeout=5, rdzv_configs={"timeout": max(60, int(options.timeout * 2))},
    )
    known = {f.name for f in dataclasses.fields(LaunchConfig)}  # older torch lacks e.g. shutdown_timeout
    config = LaunchConfig(**{k: v for k, v in settings.items() if k in known})
    began = time.time()
    try:
        return elastic_launch(config, worker_main)(jobs, options)
    except ChildFailedError as err:
        raise RunFailed(diagnose(out_root, err.failures, began, nproc)) from None


def diagnose(out_root: Path, failures: dict[int, Any], began: float, nproc: int) -> str:
    """One message: the root cause first, then what the other ranks reported."""
    reports = []
    for path in sorted((out_root / "failures").glob("rank*-*.json")):
        try:
            report = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if report.get("time", 0) >= began - 1:
            reports.append(report)
    # A raised error is the root cause; else a rank stalled *inside* a task (the others merely wait on
    # it); else any stall; transport errors are what the neighbours of a dead rank see.
    def rank_of_report(r: dict) -> tuple:
        kind = {"error": 0, "stall": 1 if r.get("task") else 2, "transport": 3}.get(r["kind"], 4)
        return kind, r.get("time", 0)

    reports.sort(key=rank_of_report)
    if reports:
        root = reports[0]
        message = _describe(root)
        others = [f"rank {r['rank']} {r['kind']}" for r in reports[1:]]
        stopped = sorted(set(range(nproc)) - {r["rank"] for r in reports})
        tail = []
        if others:
            tail.append("also reported: " + "; ".join(others))
        if stopped:
            tail.append(f"ranks {', '.join(map(str, stopped))} were stopped")
        details = [f"reports: {out_root / 'failures'}"]
        return "\n".join([message, *tail, *details])
    first = min(failures.values(), key=lambda f: f.timestamp, default=None)
    if first is None:
        return "a rank failed without a report"
    how = (f"stalled (exit code {STALL_EXIT_CODE})" if first.exitcode == STALL_EXIT_CODE
           else f"exited with code {first.exitcode}" if first.exitcode >= 0
           else f"was killed by signal {-first.exitcode}")
    return f"rank {first.local_rank} {how}; see {out_root / 'logs'}"


def _describe(report: dict) -> str:
    where = f"rank {report['rank']}"
    if report.get("task"):
        where += f" in task {report['task']}"
    if "iteration" in report:
        where += f" (iteration {report['iteration']} of job {report.get('job')})"
    if report["kind"] == "stall":
        lines = [f"{where} stalled: no progress for {report['seconds_without_progress']:.1f} s"]
        if report.get("ready") is not None:
            lines.append(f"  ready: {', '.join(report['ready']) or 'nothing'}")
        if report.get("waiting_for"):
            lines.append(f"  waiting for: {'; '.join(report['waiting_for'])}")
    else:
        lines = [f"{where} failed: {report['error']}"]
    if report.get("recent_decisions"):
        lines.append("  last decisions: " + " | ".join(report["recent_decisions"][-4:]))
    return "\n".join(lines)
