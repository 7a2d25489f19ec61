"""Naming a rank killed under torchrun without its exit code: the status file's lock says the process ended
([Note: a rank's life is a lock on its status file] in runtime.run.health), and the diagnosis puts that rank
ahead of the errors its neighbours report. End to end under torchrun: tests/multiproc/test_torchrun_faults.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from runtime.config import RunConfig
from runtime.run.diagnose import diagnose, ended_without_report
from runtime.run.health import StatusBoard


def _report(out_root: Path, rank: int, kind: str, error: str = "", **extra) -> None:
    folder = out_root / "failures"
    folder.mkdir(parents=True, exist_ok=True)
    report = {"rank": rank, "kind": kind, "time": time.time(), "error": error, **extra}
    (folder / f"rank{rank}-error.json").write_text(json.dumps(report))


def _board(out_root: Path, rank: int, task: str | None = None) -> StatusBoard:
    board = StatusBoard(out_root / "status" / f"rank{rank}")
    board.iteration("ready-1f1b@1f1b", 3)
    if task:
        board.running(task)
    return board


def test_a_status_board_says_when_its_writer_has_ended(tmp_path):
    path = tmp_path / "status" / "rank1"
    board = StatusBoard(path)
    assert not StatusBoard.ended(path)  # held by this (live) writer
    board.close()  # what the process's end does, however it ends
    assert StatusBoard.ended(path)
    assert not StatusBoard.ended(tmp_path / "status" / "rank9")  # no file: nothing known


def test_without_exit_codes_the_rank_that_ended_silently_is_the_root_cause(tmp_path):
    """torchrun's agent keeps the exit codes: the diagnosing rank gets no failure records (``{}``)."""
    began = time.time()
    boards = [_board(tmp_path, rank, task) for rank, task in enumerate([None, "1F4", "2B1", "3B0"])]
    boards[2].close()  # rank 2 was killed during 2B1
    # what its neighbours saw: a transport error, gloo's "Connection closed by peer"; rank 0 was stopped
    _report(tmp_path, 3, "transport", "TransportError: link 2->3: receive failed: rank 2 closed the connection",
            job="ready-1f1b@1f1b", iteration=3)
    _report(tmp_path, 1, "error", "RuntimeError: Connection closed by peer", job="ready-1f1b@1f1b", iteration=3)
    _report(tmp_path, 0, "interrupt", "Interrupted: SIGTERM")
    boards[0].close()  # stopped, and reported so: not taken for a silent death
    assert ended_without_report(tmp_path, began, 4) == [2]
    lines = diagnose(tmp_path, {}, began, 4, RunConfig(ranks=4)).splitlines()
    assert lines[0] == ("rank 2 (stage 2) died without a report during 2B1, iteration 3 of job ready-1f1b@1f1b "
                        "(killed or crashed; torchrun's summary gives its exit code)")
    assert lines[1] == "also reported: rank 1 error; rank 3 transport"
    assert lines[2] == "rank 0 was stopped"


def test_a_rank_killed_before_its_iterations_first_task_is_placed_in_the_iteration(tmp_path):
    began = time.time()
    _board(tmp_path, 1).close()  # iteration 3 had begun; no task had started
    line = diagnose(tmp_path, {}, began, 2, RunConfig(ranks=2)).splitlines()[0]
    assert line.startswith("rank 1 (stage 1) died without a report in iteration 3 of job ready-1f1b@1f1b ("), line


def test_a_finished_or_live_rank_is_never_taken_for_a_silent_death(tmp_path):
    began = time.time()
    finished, live = _board(tmp_path, 0), _board(tmp_path, 1, "1F0")
    finished.finished()
    finished.close()
    assert ended_without_report(tmp_path, began, 2) == []
    _report(tmp_path, 1, "error", "InjectedFault: boom", task="1F0", iteration=3, job="j")
    assert diagnose(tmp_path, {}, began, 2).splitlines()[0] == "rank 1 in task 1F0 (iteration 3 of job j) failed: " \
                                                               "InjectedFault: boom"
    live.close()
