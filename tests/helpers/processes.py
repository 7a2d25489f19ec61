"""Waiting on runs and their processes: a condition with a timeout, the status boards ranks write, live ranks."""

from __future__ import annotations

import time
from pathlib import Path


def wait_for(condition, timeout: float = 120.0, what: str = "condition"):
    """Poll ``condition()`` until it returns something true (returned), failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def status(run: Path, rank: int) -> dict | None:
    """What rank ``rank`` of the run in ``run`` last said it was doing (its status board), or None."""
    from runtime.run.health import StatusBoard

    return StatusBoard.read(run / "status" / f"rank{rank}")


def live_ranks(run: Path) -> list[int]:
    """The ranks of a run directory whose processes still run (from their status files' pids)."""
    from runtime.run.health import StatusBoard

    boards = sorted((run / "status").glob("rank*"))
    assert boards, f"no status files in {run}"
    return [int(b.name[4:]) for b in boards if alive(StatusBoard.read(b)["pid"])]


def metrics_lines(run: Path) -> int:
    """How many iterations rank 0 has logged to the run's metrics.jsonl so far."""
    try:
        return len((run / "metrics.jsonl").read_text().splitlines())
    except OSError:
        return 0
