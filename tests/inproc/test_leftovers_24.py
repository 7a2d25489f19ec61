"""Issue 24's leftovers, in this process: every file ``rrfp bench`` writes goes through hints.outputs (a full disk is
one line naming it, nothing half-written); ``trace merge --out`` takes only ``.pftrace``; a model knob beside a
recorded table is refused, naming the flag; ``--chunks`` is named for a V placement's chunk count.

A full disk is injected as in tests/inproc/test_outputs_cli.py: the chosen file's writer writes its bytes, then the
disk says ENOSPC (the tests run as root, and a real small tmpfs is tests/helpers/disk.py's, for ``rrfp run``).
"""

from __future__ import annotations

import errno
import os
import pathlib
import subprocess
from pathlib import Path

import pytest

from tests.helpers.cli import Result, one_error, one_error_line, run_cli
from tests.helpers.trace_builder import ONE_F_ONE_B, build_run

# The smallest bench that still draws plots: one workload, 4 ranks, one budget, one table, no tuning, no sweep.
TINY_BENCH = ("--ranks", "4", "--workloads", "language", "--budgets", "1f1b", "--seeds", "1", "--iterations", "1",
              "--tune-seconds", "0", "--unknown-sweep", "none", "--no-real")


def _full_disk_at(monkeypatch, name: str, code: int = errno.ENOSPC) -> None:
    """Writing a file whose name holds ``name`` (its temporary file's name holds it too) or making a directory
    named ``name`` meets a full disk (or the error ``code``): a file's bytes are written first, as a full disk
    lets them be."""
    write_text, mkdir = pathlib.Path.write_text, pathlib.Path.mkdir

    def full() -> OSError:
        return OSError(code, os.strerror(code))

    def writing(self, *args, **kwargs):
        written = write_text(self, *args, **kwargs)
        if name in self.name:
            raise full()
        return written

    def making(self, *args, **kwargs):
        if self.name == name:
            raise full()
        return mkdir(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", writing)
    monkeypatch.setattr(pathlib.Path, "mkdir", making)


class _CrossFramework:
    """``python -m profiler.bench.external`` as bench starts it, without torch: it prints its Markdown, writes no
    rows, exits 0."""

    returncode = 0

    def communicate(self):
        return "## torch.distributed.pipelining vs rrfp run\n", ""


def _fake_cross_framework(monkeypatch) -> None:
    popen = subprocess.Popen  # the module is shared: only the script is faked (git, for the versions, still runs)
    monkeypatch.setattr(subprocess, "Popen", lambda argv, *a, **k: _CrossFramework()
                        if "profiler.bench.external" in argv else popen(argv, *a, **k))


def _half_written(root: Path) -> list[str]:
    """Temporary files (and directories being built) left under ``root``."""
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*") if p.name.endswith((".tmp", ".building")))


@pytest.mark.parametrize("name, external", [("plots", "--no-external"), ("cross_framework.md", "--external"),
                                            ("cross_framework.stderr", "--external")])
def test_bench_meeting_a_full_disk_is_one_line_naming_it(tmp_path, monkeypatch, name, external):
    _fake_cross_framework(monkeypatch)
    _full_disk_at(monkeypatch, name)
    done = run_cli(tmp_path, "bench", "--out", tmp_path / "b", *TINY_BENCH, external)
    assert done.returncode == 1 and "Traceback" not in done.stderr and "internal error" not in done.stderr, done
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot write {tmp_path / 'b'}"), done.stderr
    assert f"{name}: the disk is full (file system at " in lines[0]
    assert _half_written(tmp_path) == []
    assert not (tmp_path / "b" / "plots").exists()  # made for the plots, removed with them
    # the Markdown and the stderr of the script are kept both or neither
    assert not (tmp_path / "b" / "external" / "cross_framework.md").exists()


def test_bench_refused_its_plots_folder_is_bad_input(tmp_path, monkeypatch):
    _full_disk_at(monkeypatch, "plots", errno.EACCES)
    done = run_cli(tmp_path, "bench", "--out", tmp_path / "b", *TINY_BENCH, "--no-external")
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and lines == [f"error: {tmp_path / 'b' / 'plots'}: cannot write: Permission denied"]


@pytest.mark.parametrize("name", ["merged.json", "merged.perfetto", "merged"])
def test_merge_out_must_end_in_pftrace(tmp_path, name):
    run = build_run(tmp_path / "run", **ONE_F_ONE_B)
    line = one_error_line(run_cli(tmp_path, "trace", "merge", run, "--out", tmp_path / name))
    assert line == f"error: --out {tmp_path / name}: writes a Perfetto trace; give a name ending in .pftrace"
    assert not (tmp_path / name).exists()
    done = run_cli(tmp_path, "trace", "merge", run, "--out", tmp_path / "MERGED.PFTRACE")  # as --png takes X.PNG
    assert done.returncode == 0 and (tmp_path / "MERGED.PFTRACE").is_file(), done


# -- a model knob beside a recorded table ------------------------------------------------------------------------------

KNOBS = [("--forward-time", "0.02"), ("--backward-ratio", "3"), ("--jitter", "0.5"), ("--straggler-prob", "0.1"),
         ("--straggler-slowdown", "2"), ("--comm-jitter", "0.001")]


def _table(tmp_path: Path) -> Path:
    lines = ["stage,kind,microbatch,duration"] + [f"{k},{kind},0,0.1" for k in range(2) for kind in "FB"]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    return tmp_path / "d.csv"


@pytest.mark.parametrize("flag, value", KNOBS + [("--jitter", "0")])  # given, even at the default's value
def test_simulate_refuses_a_model_knob_beside_a_recorded_table(tmp_path, flag, value):
    _table(tmp_path)
    line = one_error_line(run_cli(tmp_path, "simulate", "-p", "2", "-m", "1", "--durations", "d.csv", flag, value))
    assert line == f"error: {flag}: a recorded table has its own durations; give {flag} or --durations"


def test_simulate_takes_a_recorded_table_with_what_applies_to_it(tmp_path):
    _table(tmp_path)  # --comm-latency prices the messages of a table without a latency column; --seed is harmless
    done = run_cli(tmp_path, "simulate", "-p", "2", "-m", "1", "--durations", "d.csv", "--comm-latency", "0.001",
                   "--task-overhead", "0.0001", "--seed", "3")
    assert done.returncode == 0, done
    assert run_cli(tmp_path, "simulate", "-p", "2", "-m", "1", "--jitter", "0.5").returncode == 0  # a model's knob


@pytest.mark.parametrize("source", ["--durations", "RUN_DIR"])
@pytest.mark.parametrize("flag, value", [knob for knob in KNOBS if knob[0] != "--comm-jitter"]
                         + [("--comm-latency", "0.001")])
def test_tune_hint_refuses_a_model_knob_beside_traces_or_tables(tmp_path, source, flag, value):
    given = (["--durations", _table(tmp_path), "-p", "2", "-m", "1"] if source == "--durations"
             else [build_run(tmp_path / "r", **ONE_F_ONE_B)])
    line = one_error_line(run_cli(tmp_path, "tune-hint", *given, flag, value, "--time-budget", "1s",
                                  "--out", tmp_path / "o"))
    assert line == f"error: {flag}: sets a --workload model's durations; traces and tables keep what they recorded"
    assert not (tmp_path / "o").exists()


# -- the chunks of a V placement, named as the user gave them ----------------------------------------------------------


@pytest.mark.parametrize("args, toml, line", [
    (["--chunks", "3", "--hint", "zbv"], None,
     "error: --chunks: V placement holds 2 chunks per rank (stages r and 2p-1-r); got 3"),
    (["--config", "job.toml"], 'chunks = 3\nhint = "zbv"\n',
     "error: job.toml: chunks: V placement holds 2 chunks per rank (stages r and 2p-1-r); got 3"),
    (["--config", "job.toml", "--chunks", "4"], 'placement = "v"\n',
     "error: --chunks: V placement holds 2 chunks per rank (stages r and 2p-1-r); got 4"),
])
def test_v_placement_names_the_chunks_input(tmp_path, args, toml, line):
    if toml is not None:
        (tmp_path / "job.toml").write_text(toml)
    assert one_error_line(run_cli(tmp_path, "run", *args)) == line
    assert not (tmp_path / "runs").exists()


def test_one_error_takes_nothing_before_the_error_line():
    """Commands print only their error line on bad input (Output.warn keeps warnings for a result), so the helper
    asserting it no longer lets a warning through before it."""
    one_error(Result(2, "", "error: x.json: not a trace\n"), "not a trace")
    with pytest.raises(AssertionError):
        one_error(Result(2, "", "warning: left out iteration 3\nerror: x.json: not a trace\n"), "not a trace")
