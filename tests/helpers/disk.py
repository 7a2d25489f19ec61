"""Disks for tests: a real full disk (a small tmpfs filled to a given free space; root only, skipped elsewhere),
and the umask and file modes ([Note: outputs written whole] in hints/outputs.py)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest


@contextmanager
def full_tmpfs(where: Path, free_kib: int, size_kib: int = 1024) -> Iterator[Path]:
    """A tmpfs of ``size_kib`` mounted at ``where`` with about ``free_kib`` left free (a file ``filler`` holds the
    rest); unmounted afterwards. Skips the test where mounting is not permitted (not root, no tmpfs)."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        fill = shutil.disk_usage(where).free - free_kib * 1024
        if fill > 0:
            fd = os.open(where / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.posix_fallocate(fd, 0, fill)
            finally:
                os.close(fd)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def take_the_rest(disk: Path, name: str = "filler-rest") -> None:
    """Write a file ``name`` on ``disk`` until the disk refuses: nothing is left free."""
    fd = os.open(disk / name, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 1024)
    except OSError:
        pass
    finally:
        os.close(fd)


def file_mode(path: Path) -> int:
    """The permission bits of ``path``."""
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask_027():
    """The process's umask set to 027 for the test (files 0640, directories 0750), then put back."""
    old = os.umask(0o027)
    yield 0o027
    os.umask(old)
