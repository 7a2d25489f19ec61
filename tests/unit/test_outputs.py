"""hints.outputs: files written whole, a command's outputs all or none, the umask's permissions, a full disk named."""

import errno
import os

import pytest

from hints.errors import UserError
from hints.outputs import DiskError, Outputs, new_directory_beside, write_text, write_whole
from tests.helpers.disk import file_mode

pytestmark = pytest.mark.unit




def test_files_and_directories_take_the_umask(tmp_path, umask_027):
    write_text(tmp_path / "a.json", "{}")
    write_whole(tmp_path / "b.parquet", lambda temporary: temporary.write_bytes(b"x"))
    assert file_mode(tmp_path / "a.json") == 0o640  # mkstemp would give 0600
    assert file_mode(tmp_path / "b.parquet") == 0o640
    assert file_mode(new_directory_beside(tmp_path / "run")) == 0o750  # mkdtemp would give 0700


def test_outputs_are_all_or_none(tmp_path):
    (tmp_path / "a.svg").write_text("old")

    def refuse(temporary):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(DiskError) as caught:
        with Outputs() as outputs:
            outputs.write_text(tmp_path / "a.svg", "new")
            outputs.write(tmp_path / "a.png", refuse)
    assert (tmp_path / "a.svg").read_text() == "old"  # the first output was not renamed over the old one
    assert not (tmp_path / "a.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.svg"]  # no temporary file left behind
    message = str(caught.value)
    assert "a.png" in message and "disk is full" in message and "file system at /" in message and "free" in message


def test_an_interrupt_discards_every_staged_output(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with Outputs() as outputs:
            outputs.write_text(tmp_path / "a.txt", "a")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_a_path_that_cannot_be_written_is_bad_input(tmp_path):
    with pytest.raises(UserError, match="missing.*cannot write: No such file or directory"):
        write_text(tmp_path / "missing" / "a.json", "{}")
    (tmp_path / "d").mkdir()
    with pytest.raises(UserError, match="cannot write: Is a directory"):
        write_text(tmp_path / "d", "{}")
    assert [p.name for p in tmp_path.iterdir()] == ["d"]


def test_a_failed_write_keeps_what_was_there(tmp_path):
    target = tmp_path / "hint.json"
    target.write_text("before")

    def half_then_full(temporary):
        temporary.write_text("hal")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(DiskError):
        write_whole(target, half_then_full)
    assert target.read_text() == "before"
    assert [p.name for p in tmp_path.iterdir()] == ["hint.json"]


def test_check_room_asks_the_disk_for_a_block_and_leaves_nothing(tmp_path, monkeypatch):
    from hints.outputs import check_room

    check_room(tmp_path / "out.parquet")  # room: nothing said, nothing left
    assert list(tmp_path.iterdir()) == []

    def full(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(DiskError, match="cannot write .*run: the disk is full"):
        check_room(tmp_path / "probe", named=tmp_path / "run")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UserError, match="No such file or directory"):
        check_room(tmp_path / "missing" / "x")
