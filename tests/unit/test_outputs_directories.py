"""hints.outputs beyond single files (issue 24): a directory made for a command's outputs goes with them when
they are discarded, and a writer that reports a refused write only in words (polars: "... (os error 28)") is
named as a full disk like any other."""

import errno

import polars as pl
import pytest

from hints.outputs import DiskError, Outputs, os_error_in, write_whole


def test_a_directory_made_for_discarded_outputs_is_removed(tmp_path):
    with pytest.raises(RuntimeError):
        with Outputs() as outputs:
            folder = outputs.directory(tmp_path / "pq")
            outputs.write_text(folder / "tasks.parquet", "x")
            raise RuntimeError("a later output failed")
    assert list(tmp_path.iterdir()) == []


def test_a_directory_that_was_there_stays(tmp_path):
    (tmp_path / "pq").mkdir()
    outputs = Outputs()
    outputs.write_text(outputs.directory(tmp_path / "pq") / "a", "x")
    outputs.discard()
    assert (tmp_path / "pq").is_dir() and list((tmp_path / "pq").iterdir()) == []


def test_committed_outputs_keep_their_directory(tmp_path):
    with Outputs() as outputs:
        outputs.write_text(outputs.directory(tmp_path / "pq") / "a", "x")
    assert (tmp_path / "pq" / "a").read_text() == "x"


def test_polars_full_disk_is_a_disk_error(tmp_path):
    def full(temporary):
        raise pl.exceptions.ComputeError("parquet: File out of specification: underlying IO error: No space left "
                                         "on device (os error 28)")

    with pytest.raises(DiskError, match=r"cannot write .*d\.parquet: the disk is full"):
        write_whole(tmp_path / "d.parquet", full)
    assert list(tmp_path.iterdir()) == []


def test_other_writer_errors_pass_through(tmp_path):
    def broken(temporary):
        raise ValueError("not about the disk")

    with pytest.raises(ValueError):
        write_whole(tmp_path / "d.parquet", broken)
    assert os_error_in(ValueError("x (os error 28)")).errno == errno.ENOSPC
    assert os_error_in(ValueError("x")) is None
