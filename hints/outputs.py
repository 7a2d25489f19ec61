"""Writing outputs whole: every file rrfp writes goes through here, from every package.

[Note: outputs written whole]
    A reader (rrfp, Perfetto, torch's ``_load_csv``, a user's script) must never find half a file and take it
    for whole, and a command that fails must not leave some of its outputs behind. So:

    - each file is written to a new temporary file beside its target and renamed over it once complete
      (:func:`write_whole`); a failure removes the temporary file and leaves what was there before;
    - the outputs of one command are staged together and renamed only when every one of them was written
      (:class:`Outputs`): all or none;
    - temporary files are created as ``open`` creates files, so the result has the permissions the umask
      gives (``tempfile.mkstemp`` would make them 0600, and ``mkdtemp`` directories 0700);
    - a failed write is one line naming the file: a full disk (or quota, read-only file system, I/O error)
      is a :class:`DiskError` naming the file system that refused and what is free on it (exit 1: the
      machine's fault, not the input's); a path that cannot be written (missing directory, no
      permission, a directory in the way) is bad input, a :class:`~hints.errors.UserError` (exit 2).

This module sits at the bottom of the import graph (beside :mod:`hints.errors`) so ``runtime``, ``profiler``
and ``rrfp_cli`` all write through it.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Callable

from hints.errors import Failure, UserError

# errno values that say the machine could not store the bytes, not that the path was wrong.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG})


class DiskError(Failure):
    """The file system refused to store an output (full, over quota, read-only, failing): exit 1, named."""

    def __init__(self, message: str, path: str | Path, details: str = "") -> None:
        self.path = str(path)
        super().__init__(message, details)


def mount_point(path: str | Path) -> Path:
    """The mount point of the file system that holds ``path`` (or would hold it, if it does not exist)."""
    current = Path(os.path.abspath(path))
    while not current.exists() and current != current.parent:
        current = current.parent
    while not os.path.ismount(current) and current != current.parent:
        current = current.parent
    return current


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def disk_message(err: OSError, path: str | Path) -> str:
    """One line for a write the file system refused: what, which file, which file system and what is free."""
    mount = mount_point(path)
    try:
        free = f", {_size(shutil.disk_usage(mount).free)} free"
    except OSError:
        free = ""
    reason = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
              errno.EROFS: "the file system is read-only", errno.EIO: "the disk reported an I/O error",
              errno.EFBIG: "the file is too large for the file system"}.get(err.errno, err.strerror or str(err))
    return f"cannot write {path}: {reason} (file system at {mount}{free})"


def write_error(err: OSError, path: str | Path, details: str = "") -> Exception:
    """The error to raise for ``err`` while writing ``path`` ([Note: outputs written whole])."""
    if err.errno in DISK_ERRNOS:
        return DiskError(disk_message(err, path), path, details)
    return UserError(f"cannot write: {err.strerror or err}", str(path))


_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def os_error_in(err: BaseException) -> OSError | None:
    """The OSError a library written in Rust (polars) reports only in its message (``... No space left on
    device (os error 28)``), or None when the message names none."""
    match = _OS_ERROR.search(str(err))
    if match is None:
        return None
    number = int(match.group(1))
    return OSError(number, os.strerror(number))


def is_disk_error(err: BaseException) -> bool:
    return isinstance(err, DiskError) or (isinstance(err, OSError) and err.errno in DISK_ERRNOS)


def _beside(target: Path, suffix: str) -> Path:
    """A fresh hidden name beside ``target`` for this process (``.<name>.<pid>-<random>.<suffix>``)."""
    return target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}.{suffix}")


def _temporary_beside(target: Path) -> Path:
    return _beside(target, "tmp")


def _create(path: Path) -> None:
    """Create an empty file as ``open`` does (mode 0666 less the umask), failing if it exists."""
    with open(path, "x"):
        pass


class Outputs:
    """The outputs of one command, written all or none ([Note: outputs written whole]).

    ``stage(target)`` returns a fresh temporary path beside ``target`` for a writer to fill (created empty,
    so a writer that opens its path for writing gets the umask's permissions). ``commit()`` renames every
    staged file over its target; ``discard()`` removes them, and the directories ``directory()`` made for
    them. As a context manager it commits when the block ends normally and discards on any exception (an
    interrupt included), turning a refused write into :func:`write_error`'s error.
    """

    def __init__(self) -> None:
        self.staged: list[tuple[Path, Path]] = []
        self.created: list[Path] = []  # directories made for the outputs (:meth:`directory`)

    def stage(self, target: str | Path) -> Path:
        target = Path(target)
        if target.is_dir():  # renaming a file over a directory fails with EBUSY for "." and EISDIR otherwise
            raise UserError("cannot write: Is a directory", str(target))
        temporary = _temporary_beside(target)
        try:
            _create(temporary)
        except OSError as err:
            raise write_error(err, target) from None
        self.staged.append((temporary, target))
        return temporary

    def write(self, target: str | Path, write: Callable[[Path], object]) -> Path:
        """Stage ``target`` and fill it with ``write(temporary)``; a refused write names ``target``."""
        temporary = self.stage(target)
        try:
            write(temporary)
        except OSError as err:
            raise write_error(err, target) from None
        except Exception as err:  # a writer in another language (polars) says its OSError in words
            refused = os_error_in(err)
            if refused is None:
                raise
            raise write_error(refused, target) from None
        return Path(target)

    def directory(self, target: str | Path) -> Path:
        """``target`` as a directory to stage outputs in: created now if missing (as ``mkdir`` creates it, the
        umask's permissions), and removed again, if it is still empty, when the outputs are discarded."""
        target = Path(target)
        if target.is_dir():
            return target
        try:
            target.mkdir()
        except OSError as err:
            raise write_error(err, target) from None
        self.created.append(target)
        return target

    def write_text(self, target: str | Path, text: str) -> Path:
        return self.write(target, lambda temporary: temporary.write_text(text))

    def write_bytes(self, target: str | Path, data: bytes) -> Path:
        return self.write(target, lambda temporary: temporary.write_bytes(data))

    def commit(self) -> list[Path]:
        done = []
        try:
            for temporary, target in self.staged:
                os.replace(temporary, target)
                done.append(target)
        except OSError as err:
            self.discard()
            raise write_error(err, target) from None
        self.staged, self.created = [], []
        return done

    def discard(self) -> None:
        for temporary, _ in self.staged:
            temporary.unlink(missing_ok=True)
        self.staged = []
        for directory in reversed(self.created):
            try:
                directory.rmdir()
            except OSError:  # something else was put there meanwhile: not ours to remove
                pass
        self.created = []

    def __enter__(self) -> "Outputs":
        return self

    def __exit__(self, kind, value, traceback) -> bool:
        if kind is None:
            self.commit()
            return False
        self.discard()
        if isinstance(value, OSError) and not isinstance(value, (UserError, Failure)):
            raise write_error(value, getattr(value, "filename", None) or "an output") from None
        return False


def write_whole(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Write one file whole or not at all: ``write(temporary)`` fills a file beside ``path`` that is then
    renamed over it ([Note: outputs written whole])."""
    with Outputs() as outputs:
        outputs.write(path, write)
    return Path(path)


def write_text(path: str | Path, text: str) -> Path:
    return write_whole(path, lambda temporary: temporary.write_text(text))


def allocate(fd: int, size: int, path: str | Path) -> None:
    """Give the open file ``fd`` (``path``) its first ``size`` bytes of disk now, so a full disk is refused here,
    as a :class:`DiskError` naming the file system, and not at a later write (or, for a memory-mapped file, as a
    SIGBUS). A file system that cannot allocate ahead (``EOPNOTSUPP``, ``EINVAL``) leaves the file as it is."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        if is_disk_error(err):
            raise write_error(err, path) from None


def check_room(target: str | Path, named: str | Path | None = None) -> None:
    """Whether a file can be written beside ``target`` now: one is created there as its writer would create it,
    given a block of the disk (:func:`allocate`), and removed. A refusal is :func:`write_error`'s error naming
    ``named`` (default ``target``): a path that takes no file (bad input), or a full or read-only file system
    (:class:`DiskError`)."""
    target = Path(target)
    named = target if named is None else named
    if target.is_dir():  # what Outputs.stage refuses
        raise UserError("cannot write: Is a directory", str(named))
    temporary = _temporary_beside(target)
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except OSError as err:
        raise write_error(err, named) from None
    try:
        allocate(fd, 4096, named)
    finally:
        os.close(fd)
        temporary.unlink(missing_ok=True)


def new_directory_beside(target: str | Path) -> Path:
    """A new, empty directory beside ``target`` to build it in before renaming it into place; created as
    ``mkdir`` creates directories (0777 less the umask), where ``tempfile.mkdtemp`` makes them 0700."""
    target = Path(target)
    while True:
        building = _beside(target, "building")
        try:
            building.mkdir()
            return building
        except FileExistsError:
            continue
        except OSError as err:
            raise write_error(err, target) from None
