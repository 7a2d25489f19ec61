"""Naming the root cause of a failed run, from the files its ranks left behind.

When a run fails, every rank that could has written a report
(``failures/rank<r>-error.json``, ``-stall.json``; :mod:`runtime.run.health`)
and every rank keeps where it was in ``status/rank<r>``
(:class:`runtime.run.health.StatusBoard`). :func:`diagnose` turns them, with
the exit codes the elastic agent saw, into one message: the root cause first,
then what the other ranks reported, then where the reports and logs are.
:mod:`runtime.run.launch` raises it as ``RunFailed``.

[Note: root cause]
    A rank that died without writing a report (killed by a signal, or an
    exit the runtime did not make) is the root cause: its neighbours'
    transport errors and failed collectives are what its death looks like
    from outside, and they always come with reports, so they are ranked
    after it. Among reports: a raised error, then a stall inside a task, then
    any stall, then transport errors; ties by time. Where a silent rank was
    comes from its status file (``runtime.run.health.StatusBoard``). The agent
    names only the first process it finds exited, so ranks that fail with a
    report wait a second before exiting (``_elastic_worker`` in
    :mod:`runtime.run.launch`): a rank that died outright is always the one
    the agent sees.

    Under ``torchrun`` the diagnosing rank sees no exit codes (torchrun's
    agent is every rank's parent, and keeps them). A rank that died without
    a report is then found from its status file instead
    (:func:`ended_without_report`; [Note: a rank's life is a lock on its
    status file] in :mod:`runtime.run.health`): the process that wrote it has
    ended, it had not finished, and it left no report, not even an interrupt
    one. Ranks the agent stopped are still alive, or have reported, when the
    diagnosis runs (they wait a second before exiting too), so they are never
    taken for it. Its exit code stays torchrun's to print.
"""

from __future__ import annotations

import json
import math
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.run.health import STALL_EXIT_CODE, StatusBoard, kept_reports


def failure_reports(out_root: Path, began: float, exclude_kinds: tuple[str, ...] = ()) -> list[dict]:
    """The failure reports written since ``began``: their files, and those the disk refused, kept in the ranks'
    status files ([Note: a report the disk refuses] in :mod:`runtime.run.health`)."""
    reports, written = [], set()
    for path in sorted((out_root / "failures").glob("rank*-*.json")):
        try:
            report = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if report.get("time", 0) >= began - 1:
            written.add((report.get("rank"), report.get("kind")))
            reports.append(report)
    reports += [r for r in kept_reports(out_root)
                if r.get("time", 0) >= began - 1 and (r["rank"], r["kind"]) not in written]
    return [r for r in reports if r.get("kind") not in exclude_kinds]


@dataclass(frozen=True)
class EndedWithoutReport:
    """A rank whose process ended without a report, known from its status file alone (:func:`ended_without_report`):
    shaped as the elastic agent's failure records are, with no exit code."""

    local_rank: int  # the rank (the agent's records name a rank by its local rank; one machine: the same)
    exitcode: int | None = None
    timestamp: float = math.inf  # unknown: after every failure the agent timed
    message: str = ""


def ended_without_report(out_root: Path, began: float, nproc: int) -> list[int]:
    """The ranks whose process has ended though they had not finished, and left no report (not even an
    interrupt one) since ``began``: killed outright, or crashed ([Note: root cause])."""
    reported = {r["rank"] for r in failure_reports(out_root, began)}
    ended = []
    for rank in range(nproc):
        path = out_root / "status" / f"rank{rank}"
        status = StatusBoard.read(path)
        if rank not in reported and status is not None and status["state"] != "finished" and StatusBoard.ended(path):
            ended.append(rank)
    return ended


def diagnose(out_root: Path, failures: dict[int, Any], began: float, nproc: int, config=None) -> str:
    """One message: the root cause first ([Note: root cause]), then what the other ranks reported.

    ``failures``: the elastic agent's records of the ranks that exited non-zero (empty under ``torchrun``, whose
    agent keeps them); a rank missing from them that ended without a report is found from its status file."""
    reports = failure_reports(out_root, began, exclude_kinds=("interrupt",))

    def rank_of_report(r: dict) -> tuple:
        kind = {"error": 0, "stall": 1 if r.get("task") else 2, "transport": 3}.get(r["kind"], 4)
        return kind, r.get("time", 0)

    reports.sort(key=rank_of_report)
    reported = {r["rank"] for r in reports}
    known = {f.local_rank for f in failures.values()}
    unseen = [EndedWithoutReport(rank) for rank in ended_without_report(out_root, began, nproc) if rank not in known]
    silent = sorted((f for f in [*failures.values(), *unseen] if f.local_rank not in reported),
                    key=lambda f: (f.timestamp, f.local_rank))
    if silent:
        message = _describe_silent(silent[0], out_root, config)
        others = [f"rank {f.local_rank} {_how(f)}" for f in silent[1:]] + [f"rank {r['rank']} {r['kind']}"
                                                                          for r in reports]
        accounted = {f.local_rank for f in silent} | reported
    elif reports:
        message = _describe(reports[0])
        others = [f"rank {r['rank']} {r['kind']}" for r in reports[1:]]
        accounted = reported
    else:
        return "a rank failed without a report; see " + str(out_root / "logs")
    tail = []
    if others:
        tail.append("also reported: " + "; ".join(others))
    stopped = sorted(set(range(nproc)) - accounted)
    if stopped:
        tail.append(f"rank {stopped[0]} was stopped" if len(stopped) == 1
                    else f"ranks {', '.join(map(str, stopped))} were stopped")
    tail.append(f"reports: {out_root / 'failures'}; logs: {out_root / 'logs'}")
    return "\n".join([message, *tail])


def _how(failure) -> str:
    if failure.exitcode is None:
        return "died without a report"
    if failure.exitcode == STALL_EXIT_CODE:
        return f"stalled (exit code {STALL_EXIT_CODE})"
    if failure.exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-failure.exitcode).name}"
        except ValueError:
            return f"was killed by signal {-failure.exitcode}"
    return f"exited with code {failure.exitcode} without a report"


def _describe_silent(failure, out_root: Path, config) -> str:
    """``rank 2 (stage 2) was killed by SIGKILL during 2B5, iteration 3 of job ready-1f1b@1f1b``."""
    rank = failure.local_rank
    where = f"rank {rank}"
    if config is not None:
        from runtime.config import run_shape

        stages = list(run_shape(config).stages_of_rank(rank))
        where += f" ({'stage' if len(stages) == 1 else 'stages'} {', '.join(map(str, stages))})"
    line = f"{where} {_how(failure)}"
    status = StatusBoard.read(out_root / "status" / f"rank{rank}")
    if status is None or status["iteration"] is None:
        line += " before its first iteration"
    elif status["state"] != "finished":
        if status["task"]:
            line += f" {'during' if status['state'] == 'running' else 'after'} {status['task']},"
        else:  # the iteration had begun, no task yet
            line += " in"
        line += f" iteration {status['iteration']} of job {status['job']}"
    message = failure.message if isinstance(failure.message, str) else ""
    if failure.exitcode is None:
        line += " (killed or crashed; torchrun's summary gives its exit code)"
    elif failure.exitcode >= 0 and message and not message.startswith("To enable traceback"):
        line += f": {message}"
    return line


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
