"""The frames cache beside a trace ([Note: the frames cache] in profiler/trace/cache.py): the second read loads the
same frames, any change to the trace is read afresh, and a cache that cannot be written or read is never an error."""

from __future__ import annotations

import os

import polars as pl
import pytest

from profiler.trace import cache as frames_cache
from profiler.trace.reader import read_trace as decode
from tests.helpers.cli import one_error_line, run_cli
from tests.helpers.trace_builder import ONE_F_ONE_B, build_run, corrupt_packet, packet_bounds


def read_trace(path, cache=None):
    """Read, then keep the frames as a command that succeeded does."""
    frames = decode(path, cache)
    frames_cache.keep(frames)
    return frames


@pytest.fixture
def run(tmp_path):
    return build_run(tmp_path / "run", **ONE_F_ONE_B)


def _same(a, b) -> None:
    for name in frames_cache.SAVED_FRAMES:
        assert getattr(a, name).equals(getattr(b, name), null_equal=True), name
        assert getattr(a, name).schema == getattr(b, name).schema, name
    assert (a.meta, a.member_meta, a.warnings, a.packets, a.path) == (b.meta, b.member_meta, b.warnings, b.packets,
                                                                      b.path)


def test_the_second_read_loads_the_frames_the_first_one_decoded(run, monkeypatch):
    fresh = read_trace(run, cache=False)
    assert not (run / ".trace.pftrace.rrfp-frames").exists()  # cache off: nothing written
    first = read_trace(run)
    assert (run / ".trace.pftrace.rrfp-frames" / frames_cache.KEY_FILE).is_file()
    decoded = []
    monkeypatch.setattr("profiler.trace.reader._read", lambda path: decoded.append(path))  # a decode would fail
    second = decode(run)
    assert not decoded
    _same(first, fresh)
    _same(second, fresh)


def test_a_trace_changed_in_place_is_read_afresh(run, tmp_path):
    trace = run / "trace.pftrace"
    read_trace(trace)  # cached
    data = trace.read_bytes()
    trace.write_bytes(corrupt_packet(data, len(packet_bounds(data)) // 4))  # same size, same instant
    frames = read_trace(trace)
    assert any("1 corrupt packets" in w for w in frames.warnings), frames.warnings
    _same(frames, read_trace(trace, cache=False))


def test_a_cut_trace_keeps_its_warning_through_the_cache(run, tmp_path):
    data = (run / "trace.pftrace").read_bytes()
    cut = tmp_path / "cut.pftrace"
    cut.write_bytes(data[:packet_bounds(data)[len(packet_bounds(data)) // 2][0] + 3])
    first = read_trace(cut)
    again = read_trace(cut)
    assert any("truncated at byte" in w for w in again.warnings) and again.warnings == first.warnings


def test_a_damaged_cache_is_ignored_and_replaced(run):
    read_trace(run)
    folder = run / ".trace.pftrace.rrfp-frames"
    (folder / "tasks.arrow").write_bytes(b"not arrow")
    frames = read_trace(run)
    _same(frames, read_trace(run, cache=False))
    assert pl.read_ipc(folder / "tasks.arrow").height == frames.tasks.height  # written again, whole


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a 0555 directory")
def test_a_directory_that_refuses_the_cache_is_read_without_one(run):
    os.chmod(run, 0o555)
    try:
        frames = read_trace(run)
    finally:
        os.chmod(run, 0o755)
    assert frames.tasks.height and not (run / ".trace.pftrace.rrfp-frames").exists()


def test_a_refused_write_leaves_no_partial_cache(run, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pl.DataFrame, "write_ipc", full)
    frames = read_trace(run)
    assert frames.tasks.height
    assert not [p for p in run.iterdir() if "rrfp-frames" in p.name]  # neither the cache nor its building dir


def test_rrfp_trace_cache_0_turns_it_off(run, monkeypatch):
    monkeypatch.setenv("RRFP_TRACE_CACHE", "0")
    read_trace(run)
    assert not (run / ".trace.pftrace.rrfp-frames").exists()


def test_reading_writes_nothing_until_a_command_keeps_the_frames(run):
    frames = decode(run)
    assert not (run / ".trace.pftrace.rrfp-frames").exists()
    frames_cache.keep(frames)
    assert (run / ".trace.pftrace.rrfp-frames" / frames_cache.KEY_FILE).is_file()


def test_rrfp_trace_keeps_the_frames_when_it_succeeds_and_not_on_bad_input(run, tmp_path):
    one_error_line(run_cli(tmp_path, "trace", "follow", str(run)))  # no TP group: bad input, exit 2
    assert not [p.name for p in run.iterdir() if "rrfp-frames" in p.name]
    done = run_cli(tmp_path, "trace", "bubbles", str(run), "--json")
    assert done.returncode == 0, done.stderr
    assert (run / ".trace.pftrace.rrfp-frames" / frames_cache.KEY_FILE).is_file()
    again = run_cli(tmp_path, "trace", "bubbles", str(run), "--json")
    assert again.returncode == 0 and again.stdout == done.stdout
