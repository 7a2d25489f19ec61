"""rrfp tune-hint's outputs and --check's exit code, in this process (issue 24): the --out directory takes the umask
(mkdtemp made it 0700), a full disk while writing it is one line naming the disk with nothing left, and a check
whose run lies outside the predicted range exits 3 ([Note: a check that fails] in rrfp_cli/cmd_tune.py)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from tests.helpers.cli import run_cli
from tests.helpers.disk import file_mode
from tests.helpers.trace_builder import ONE_F_ONE_B, build_run


def test_tune_hint_directory_takes_the_umask(tmp_path, umask_027):
    done = run_cli(tmp_path, "tune-hint", "--workload", "uniform", "-p", "2", "-m", "4", "--time-budget", "1s",
                   "--scenarios", "4", "--out", "tuned")
    assert done.returncode == 0, done.stderr
    assert file_mode(tmp_path / "tuned") == 0o750  # mkdtemp made it 0700
    assert {p.name: file_mode(p) for p in (tmp_path / "tuned").iterdir()} == {
        name: 0o640 for name in ("hint.json", "job.toml", "report.json", "report.md")}


def test_tune_hint_full_disk_names_the_disk_and_leaves_nothing(tmp_path, monkeypatch):
    import rrfp_cli.cmd_tune

    def full(path, values, data, target):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(rrfp_cli.cmd_tune, "_write_toml", full)
    done = run_cli(tmp_path, "tune-hint", "--workload", "uniform", "-p", "2", "-m", "4", "--time-budget", "1s",
                   "--scenarios", "4", "--out", "tuned")
    assert done.returncode == 1 and done.stderr.startswith(f"error: cannot write tuned: the disk is full"), done
    assert list(tmp_path.iterdir()) == []


def _report(tmp_path: Path, low: float, high: float) -> Path:
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"format": "rrfp-tune-report/1", "shape": {"ranks": 2, "chunks": 1,
                                                                            "microbatches": 2},
                                  "prediction": {"makespan_range": [low, high], "makespan": {"mean": low}}}))
    return report


def test_tune_check_outside_the_predicted_range_exits_3(tmp_path):
    run = build_run(tmp_path / "run", **ONE_F_ONE_B, iterations=3, period_us=200)
    measured = json.loads(run_cli(tmp_path, "tune-hint", "--check", run, "--report", _report(tmp_path, 0, 1),
                                  "--json").stdout)["measured_makespan_s"]
    inside = run_cli(tmp_path, "tune-hint", "--check", run, "--report", _report(tmp_path, measured / 2, measured * 2))
    assert inside.returncode == 0 and "inside the predicted range" in inside.stdout, inside
    outside = run_cli(tmp_path, "tune-hint", "--check", run, "--report", _report(tmp_path, measured * 2,
                                                                                   measured * 3))
    assert outside.returncode == 3 and "OUTSIDE the predicted range" in outside.stdout, outside
    assert outside.stderr == (f"check failed: the median makespan of {run} lies outside the predicted range "
                              "(exit 3)\n")
    as_json = run_cli(tmp_path, "tune-hint", "--check", run, "--report", _report(tmp_path, measured * 2,
                                                                                   measured * 3), "--json")
    assert as_json.returncode == 3 and json.loads(as_json.stdout)["passed"] is False
