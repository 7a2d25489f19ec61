"""What the benchmark scripts share on the command line: a parser whose errors are one line, and a progress log.

Used by :mod:`profiler.bench.external` and by the scripts in ``benchmarks/`` (through ``benchmarks/_cli.py``).
Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from hints.errors import UserError, as_flag

REPO = Path(__file__).resolve().parents[2]


class Parser(argparse.ArgumentParser):
    """Bad input: one ``error:`` line and exit 2 (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)

    def at_least(self, args: argparse.Namespace, least: int, *names: str) -> None:
        """An error naming the first of ``names`` (attributes of ``args``, a flag's name with underscores; of a
        list, its smallest value) that is under ``least``."""
        for name in names:
            value = getattr(args, name)
            value = min(value) if isinstance(value, list) else value
            if value < least:
                self.error(f"--{_flag(name)} must be >= {least}, got {value}")

    def positive(self, args: argparse.Namespace, *names: str) -> None:
        """An error naming the first of ``names`` (as :meth:`at_least`; every value of a list) that is not a
        finite number above 0: a time budget, a duration."""
        for name in names:
            values = getattr(args, name)
            for value in values if isinstance(values, list) else [values]:
                if not (math.isfinite(value) and value > 0):
                    self.error(f"--{_flag(name)} must be a finite number > 0, got {value}")

    def folder(self, path: str | Path, flag: str) -> None:
        """An error when ``path`` cannot be a folder: it, or the nearest of its parents that exists, is a file."""
        path = Path(path)
        found = next(p for p in (path, *path.absolute().parents) if p.exists())
        if not found.is_dir():
            self.error(f"{flag}: {found} is a file, not a folder")

    def commit(self, revision: str, flag: str) -> None:
        """An error when ``revision`` names no commit of this repository (``git rev-parse``)."""
        check = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"], cwd=REPO,
                               capture_output=True, text=True)
        if check.returncode != 0:
            self.error(f"{flag}: {revision!r} is not a commit of this repository")


def _flag(name: str) -> str:
    return name.replace("_", "-")


def run(main: Callable[[], object]) -> None:
    """A script's entry point: ``main()``, with bad input the library finds once the arguments are parsed (a
    :class:`UserError`: a level out of range, a workload's shape) one ``error:`` line and exit 2 as the parser's
    own errors are, and Ctrl-C ``interrupted (SIGINT)`` and exit 130, without a traceback (``RRFP_DEBUG=1``
    shows it). The scripts print their tables when they end, so neither leaves half a table behind."""
    try:
        main()
    except UserError as err:
        if os.environ.get("RRFP_DEBUG") == "1":
            raise
        print(f"error: {err.render(as_flag)}", file=sys.stderr)  # `jitter` -> --jitter, the scripts' convention
        sys.exit(2)
    except KeyboardInterrupt:
        if os.environ.get("RRFP_DEBUG") == "1":
            raise
        print("interrupted (SIGINT)", file=sys.stderr)
        sys.exit(130)


def progress(message: str) -> None:
    """One timestamped line on stderr (stdout holds the results)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
