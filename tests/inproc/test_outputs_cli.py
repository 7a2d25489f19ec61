"""Every command's outputs written all or none, in this process (issue 24, "Outputs" and "A full disk").

A place that refuses files (a read-only directory, a read-only file system, a path under a file) is named before
any work in one line; a disk that fills while a command writes is one line naming the disk (exit 1); either way no
output of the command is left, whole or half. Files and directories take the umask's permissions. A mismatched
extension is refused. ``tune-hint --check`` exits 3 when the run lies outside the predicted range.

Refusals are injected (tests run as root, where ``chmod 0555`` refuses nothing): creating a file or directory in a
chosen directory raises the OSError a kernel would give; a full disk makes the chosen output's writer fail with
ENOSPC after writing its bytes, as a full disk does (polars reports it as a ``ComputeError``, which is what it
raises). The chmod variant runs where it can (not as root).
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
from pathlib import Path

import pytest

import hints.outputs
from tests.helpers.cli import one_error_line, run_cli
from tests.helpers.disk import file_mode
from tests.helpers.trace_builder import ONE_F_ONE_B, build_run

HINT = ("1f1b", "-p", "2", "-m", "4")


@pytest.fixture
def run(tmp_path) -> Path:
    return build_run(tmp_path / "run", **ONE_F_ONE_B)


def _refuse_in(monkeypatch, directory: Path, code: int) -> None:
    """Creating a file or directory in ``directory`` fails with ``code``, as a read-only directory (EACCES) or
    file system (EROFS) refuses it."""
    create, mkdir = hints.outputs._create, pathlib.Path.mkdir

    def refuse(path: Path) -> None:
        if Path(path).parent == directory:
            raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(hints.outputs, "_create", lambda path: (refuse(path), create(path)))
    monkeypatch.setattr(pathlib.Path, "mkdir", lambda self, *a, **k: (refuse(self), mkdir(self, *a, **k))[1])


def _fill_disk_at(monkeypatch, name: str) -> None:
    """The output named ``name`` meets a full disk: its writer writes, then the disk says ENOSPC."""
    write = hints.outputs.Outputs.write

    def writing(self, target, writer):
        if Path(target).name != name:
            return write(self, target, writer)

        def full(temporary):
            writer(temporary)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write(self, target, full)

    monkeypatch.setattr(hints.outputs.Outputs, "write", writing)


def _left(root: Path) -> list[str]:
    """Every file and directory under ``root`` but the run's own."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.relative_to(root).parts[0] != "run")


# Each command with two outputs, the second in `second` (a directory the test may make refuse): (args, outputs).
COMMANDS = {
    "timeline": lambda run, d, second: (["trace", "timeline", run, "--svg", d / "a.svg", "--png", second / "a.png"],
                                        "a.png"),
    "export": lambda run, d, second: (["trace", "export", run, "--durations", d / "d.parquet", "--parquet",
                                       second / "pq"], "tasks.parquet"),
    "export --chrome": lambda run, d, second: (["trace", "export", run, "--durations", d / "d.csv", "--chrome",
                                                second / "c.json"], "c.json"),
    "merge": lambda run, d, second: (["trace", "merge", run, "--out", second / "m.pftrace"], "m.pftrace"),
    "hints export": lambda run, d, second: (["hints", "export", *HINT, "--torch-csv", d / "h.csv", "--out",
                                             second / "h.json"], "h.json"),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("code, exit_code, message", [
    (errno.EACCES, 2, "cannot write: Permission denied"),
    (errno.EROFS, 1, "the file system is read-only"),
])
def test_a_place_that_refuses_files_is_one_line_before_any_work(tmp_path, run, monkeypatch, command, code,
                                                                exit_code, message):
    refusing = tmp_path / "refusing"
    refusing.mkdir()
    args, _ = COMMANDS[command](run, tmp_path, refusing)
    _refuse_in(monkeypatch, refusing, code)
    done = run_cli(tmp_path, *args)
    assert done.returncode == exit_code and "Traceback" not in done.stderr, done
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], done.stderr  # no warning first
    assert str(refusing) in lines[0]
    assert _left(tmp_path) == ["refusing"]  # nothing written, nothing left behind


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a 0555 directory")
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_read_only_directory_refuses_before_any_work(tmp_path, run, command):
    refusing = tmp_path / "refusing"
    refusing.mkdir()
    refusing.chmod(0o555)
    try:
        args, _ = COMMANDS[command](run, tmp_path, refusing)
        line = one_error_line(run_cli(tmp_path, *args))
        assert "cannot write: Permission denied" in line and str(refusing) in line
        assert _left(tmp_path) == ["refusing"]
    finally:
        refusing.chmod(0o755)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_path_under_a_file_is_one_line(tmp_path, run, command):
    (tmp_path / "a-file").write_text("mine")
    args, _ = COMMANDS[command](run, tmp_path, tmp_path / "a-file")
    line = one_error_line(run_cli(tmp_path, *args))
    assert "is a file, not a directory" in line
    assert _left(tmp_path) == ["a-file"] and (tmp_path / "a-file").read_text() == "mine"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_full_disk_is_one_line_naming_it_and_nothing_is_left(tmp_path, run, monkeypatch, command):
    (tmp_path / "out").mkdir()
    args, last = COMMANDS[command](run, tmp_path, tmp_path / "out")
    _fill_disk_at(monkeypatch, last)
    done = run_cli(tmp_path, *args)
    assert done.returncode == 1 and "Traceback" not in done.stderr and "internal error" not in done.stderr, done
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors == done.stderr.splitlines()[-1:], done.stderr
    assert f"{last}: the disk is full (file system at " in errors[0] and " free)" in errors[0]
    assert _left(tmp_path) == ["out"]  # the outputs written before the full one are gone too


def test_polars_meeting_a_full_disk_is_a_disk_error(tmp_path, run, monkeypatch):
    import polars as pl

    def full(self, path, *args, **kwargs):
        Path(path).write_bytes(b"PAR1")  # what it wrote before the disk filled
        raise pl.exceptions.ComputeError("parquet: File out of specification: underlying IO error: No space left "
                                         "on device (os error 28)")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", full)
    done = run_cli(tmp_path, "trace", "export", run, "--parquet", tmp_path / "pq")
    assert done.returncode == 1 and done.stderr.startswith(f"error: cannot write {tmp_path / 'pq'}/"), done
    assert "the disk is full" in done.stderr and "ComputeError" not in done.stderr
    assert _left(tmp_path) == []


def test_merge_of_a_file_that_is_not_a_trace_writes_nothing(tmp_path):
    (tmp_path / "r" / "trace").mkdir(parents=True)
    rank0 = tmp_path / "r" / "trace" / "rank0.pftrace"
    rank0.write_bytes(b"this is not a trace at all\n")
    line = one_error_line(run_cli(tmp_path, "trace", "merge", tmp_path / "r"))
    assert line.startswith(f"error: {rank0}: not a Perfetto trace (byte 0: unexpected field tag")
    rank0.write_bytes(b"")  # a rank that wrote nothing: no packet anywhere
    line = one_error_line(run_cli(tmp_path, "trace", "merge", tmp_path / "r"))
    assert "no rank file holds a complete trace packet" in line and str(rank0) in line
    assert not (tmp_path / "r" / "trace.pftrace").exists()


def test_a_rank_file_cut_before_its_first_packet_is_merged_with_the_others(tmp_path):
    run = build_run(tmp_path / "run", **ONE_F_ONE_B)
    rank1 = run / "trace" / "rank1.pftrace"
    rank1.write_bytes(rank1.read_bytes()[:3])  # cut inside its first packet: a crashed rank, not a foreign file
    done = run_cli(tmp_path, "trace", "merge", run, "--force", "--json")
    assert done.returncode == 0, done
    assert json.loads(done.stdout)["warnings"] == [f"{rank1}: truncated at byte 0; 0 complete packets kept"]




def test_outputs_take_the_umask(tmp_path, umask_027):
    run = build_run(tmp_path / "run", **ONE_F_ONE_B)
    assert run_cli(tmp_path, "trace", "merge", run, "--force").returncode == 0
    assert run_cli(tmp_path, "trace", "timeline", run, "--svg", "t.svg", "--png", "t.png").returncode == 0
    assert run_cli(tmp_path, "trace", "export", run, "--parquet", "pq", "--durations", "d.parquet", "--chrome",
                   "chrome").returncode == 0
    assert run_cli(tmp_path, "hints", "export", *HINT, "--out", "h.json", "--torch-csv", "h.csv").returncode == 0
    files = [run / "trace.pftrace", *map(tmp_path.joinpath, ["t.svg", "t.png", "d.parquet", "h.json", "h.csv"]),
             *(tmp_path / "pq").iterdir(), *(tmp_path / "chrome").iterdir()]
    assert {str(f): oct(file_mode(f)) for f in files} == {str(f): "0o640" for f in files}
    assert (file_mode(tmp_path / "pq"), file_mode(tmp_path / "chrome")) == (0o750, 0o750)


@pytest.mark.parametrize("args, line", [
    (["trace", "timeline", "RUN", "--png", "x.svg"], "error: --png x.svg: writes PNG; give a name ending in .png"),
    (["trace", "timeline", "RUN", "--svg", "x.png"], "error: --svg x.png: writes SVG; give a name ending in .svg"),
    (["trace", "export", "RUN", "--chrome", "c.gz"], "error: --chrome c.gz: writes Chrome trace JSON: give a name "
                                                     "ending in .json or .json.gz (one file) or a directory (one "
                                                     "file per rank)"),
    (["trace", "export", "RUN", "--durations", "d.csv", "--chrome", "d.csv"],
     "error: --chrome d.csv: writes Chrome trace JSON"),
    (["hints", "export", *HINT, "--torch-csv", "x.json"], "error: --torch-csv x.json: writes torch's CSV; give a "
                                                          "name ending in .csv"),
])
def test_a_mismatched_extension_is_refused(tmp_path, run, args, line):
    args = [run if a == "RUN" else a for a in args]
    assert one_error_line(run_cli(tmp_path, *args)).startswith(line)
    assert _left(tmp_path) == []


def test_two_outputs_of_one_export_may_not_share_a_path(tmp_path, run):
    line = one_error_line(run_cli(tmp_path, "trace", "export", run, "--durations", "d.json", "--chrome", "d.json"))
    assert "unknown extension" in line  # a duration table is .csv/.parquet: the one path cannot be both anyway
    (tmp_path / "c").mkdir()
    line = one_error_line(run_cli(tmp_path, "trace", "export", run, "--parquet", "c", "--chrome", "c"))
    assert line == "error: --chrome c: is also given to --parquet; give each output its own path"


def test_hints_export_never_overwrites_without_force(tmp_path):
    (tmp_path / "h.json").write_text("mine")
    line = one_error_line(run_cli(tmp_path, "hints", "export", *HINT, "--torch-csv", "h.csv", "--out", "h.json"))
    assert line == "error: --out h.json: exists; pass --force to overwrite it"
    assert (tmp_path / "h.json").read_text() == "mine" and not (tmp_path / "h.csv").exists()
    done = run_cli(tmp_path, "hints", "export", *HINT, "--torch-csv", "h.csv", "--out", "h.json", "--force")
    assert done.returncode == 0, done
    assert json.loads((tmp_path / "h.json").read_text())["format"] == "rrfp-hint/1"


def test_trace_import_meeting_a_full_disk_names_it_and_leaves_nothing(tmp_path, monkeypatch):
    import profiler.trace.torch_profile
    from hints.files.torch_import import import_torch_schedule
    from tests.helpers.kineto_builder import kineto_traces

    kineto_traces(import_torch_schedule("1F1B", 2, 4, 1), tmp_path / "traces", steps=(1, 2, 3))
    write_ranks = profiler.trace.torch_profile._write_ranks

    def full(root, *args):
        write_ranks(root, *args)  # the rank files fitted; what comes next does not
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(profiler.trace.torch_profile, "_write_ranks", full)
    done = run_cli(tmp_path, "trace", "import", tmp_path / "traces", "--out", tmp_path / "imported")
    assert done.returncode == 1 and done.stderr.startswith(f"error: cannot write {tmp_path / 'imported'}: the disk "
                                                           "is full (file system at "), done
    assert _left(tmp_path) == ["traces", "traces/rank0_trace.json", "traces/rank1_trace.json"]
