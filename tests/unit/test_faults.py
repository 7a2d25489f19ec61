"""The pieces that make every failure of `rrfp run` end in a clear answer, without processes: the watchdog, the
status board a rank keeps, the diagnosis that names the root cause from the reports ranks leave, salvaging the
metrics log, run directories, the backend per node, clock domains. End to end: tests/multiproc/test_faults.py.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import polars as pl

from runtime.config import RunConfig
from runtime.run.diagnose import diagnose
from runtime.run.health import StatusBoard, Watchdog
from runtime.run.metrics import salvage_metrics
from tests.helpers.processes import status


def test_two_runs_in_the_same_second_get_two_directories(tmp_path, monkeypatch):
    from rrfp_cli.cmd_run import _claim_run_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "strftime", lambda *_: "20261130-120000")
    config = RunConfig(workload="emulated")
    first, second = _claim_run_dir(config), _claim_run_dir(config)
    assert (first.name, second.name) == ("20261130-120000-emulated", "20261130-120000-emulated-2")
    assert first.is_dir() and second.is_dir()


def test_watchdog_is_armed_per_iteration_and_withdraws_a_stale_report():
    reports, withdrawn = [], []
    watchdog = Watchdog(1.0, lambda seconds: reports.append(seconds) or False, lambda: withdrawn.append(True))
    watchdog.last = 0.0
    assert watchdog.check(30.0, None) is None and reports == []  # set-up, not armed: never a stall
    watchdog.arm()
    watchdog.last = 0.0
    exit_at = watchdog.check(5.0, None)
    assert reports == [5.0] and exit_at == 5.0 + 2.0  # an idle rank waits before it exits
    watchdog.last = 6.0  # progress resumed before the exit
    assert watchdog.check(6.5, exit_at) is None and withdrawn == [True]
    watchdog.disarm()
    assert watchdog.check(100.0, None) is None and len(reports) == 1


def test_status_board_survives_its_writer(tmp_path):
    board = StatusBoard(tmp_path / "status" / "rank2")
    assert status(tmp_path, 2) == {"state": "starting", "pid": os.getpid(), "job": None, "iteration": None,
                                   "task": None}
    board.iteration("ready-1f1b@1f1b", 3)
    board.running("2B5")
    assert status(tmp_path, 2) == {"state": "running", "pid": os.getpid(), "job": "ready-1f1b@1f1b", "iteration": 3,
                                   "task": "2B5"}
    board.idle()
    assert status(tmp_path, 2)["state"] == "idle" and status(tmp_path, 2)["task"] == "2B5"
    board.finished()
    assert status(tmp_path, 2)["state"] == "finished"


def _report(out_root: Path, rank: int, kind: str, error: str, **extra) -> None:
    folder = out_root / "failures"
    folder.mkdir(parents=True, exist_ok=True)
    report = {"rank": rank, "kind": kind, "time": time.time(), "error": error, **extra}
    (folder / f"rank{rank}-error.json").write_text(json.dumps(report))


def test_a_silent_death_outranks_the_errors_its_neighbours_report(tmp_path):
    began = time.time()
    board = StatusBoard(tmp_path / "status" / "rank2")
    board.iteration("ready-1f1b@1f1b", 3)
    board.running("2B5")
    # What a killed rank's neighbours see: a failed collective (an "error") and a transport error.
    _report(tmp_path, 1, "error", "RuntimeError: Connection closed by peer", job="ready-1f1b@1f1b", iteration=3)
    _report(tmp_path, 3, "transport", "TransportError: rank 2 closed the link", job="ready-1f1b@1f1b", iteration=3)
    failures = {2: SimpleNamespace(local_rank=2, exitcode=-9, timestamp=int(began) + 1, message="Signal 9"),
                1: SimpleNamespace(local_rank=1, exitcode=1, timestamp=int(began), message="")}
    message = diagnose(tmp_path, failures, began, 4, RunConfig(ranks=4))
    lines = message.splitlines()
    assert lines[0] == "rank 2 (stage 2) was killed by SIGKILL during 2B5, iteration 3 of job ready-1f1b@1f1b"
    assert lines[1] == "also reported: rank 1 error; rank 3 transport"
    assert lines[2] == "rank 0 was stopped"


def test_without_silent_deaths_the_raised_error_is_the_root_cause(tmp_path):
    began = time.time()
    _report(tmp_path, 0, "transport", "TransportError: peer 1 went away")
    _report(tmp_path, 1, "error", "InjectedFault: boom", task="1F2", iteration=0, job="j")
    failures = {1: SimpleNamespace(local_rank=1, exitcode=1, timestamp=int(began), message="")}
    lines = diagnose(tmp_path, failures, began, 2, RunConfig(ranks=2)).splitlines()
    assert lines[0] == "rank 1 in task 1F2 (iteration 0 of job j) failed: InjectedFault: boom"
    assert lines[1] == "also reported: rank 0 transport"


def test_salvage_keeps_every_complete_line(tmp_path):
    rows = [{"iteration": i, "loss": 1.0 / (i + 1), "idle_fraction": [0.1, 0.2]} for i in range(3)]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "metrics.jsonl").write_text(text + '{"iteration": 3, "lo')  # cut short by a kill
    assert salvage_metrics(tmp_path) == 3
    assert pl.read_parquet(tmp_path / "metrics.parquet")["iteration"].to_list() == [0, 1, 2]
    assert not (tmp_path / "metrics.jsonl").exists()
    assert salvage_metrics(tmp_path) == 0  # nothing left to salvage; the Parquet file stays
    assert (tmp_path / "metrics.parquet").exists()


def test_nccl_is_chosen_per_node_from_local_world_size(monkeypatch):
    import torch

    from runtime.run.worker import _device_and_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    config = RunConfig(device="cuda", ranks=8)
    device, backend = _device_and_backend(config, local_rank=5 % 4, world=8)  # 2 nodes x 4 GPUs
    assert (str(device), backend) == ("cuda:1", "nccl")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # 8 ranks on a node with 4 GPUs: gloo through the host
    assert _device_and_backend(config, local_rank=5, world=8)[1] == "gloo"


def test_one_host_is_one_clock_domain_and_offsets_below_their_error_are_not_applied():
    from runtime.comm.clock import _boot_id, choose_clock_offset

    assert _boot_id() > 0  # Linux: /proc/sys/kernel/random/boot_id
    assert choose_clock_offset((40_000, 25_000), boot=7, rank0_boot=7) == (0, 0)  # same host: exact
    assert choose_clock_offset((40_000, 25_000), boot=7, rank0_boot=9) == (40_000, 25_000)  # across hosts
    assert choose_clock_offset((10_000, 25_000), boot=7, rank0_boot=9) == (0, 25_000)  # within its error
    assert choose_clock_offset((40_000, 25_000), boot=0, rank0_boot=0) == (40_000, 25_000)  # boot unknown
