"""What the benchmark scripts share on the command line: a parser whose errors are one line, and a progress log.

Used by :mod:`profiler.bench.external` and by the scripts in ``benchmarks/`` (through ``benchmarks/_cli.py``).
Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable

from hints.errors import UserError, as_flag


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
                self.error(f"--{name.replace('_', '-')} must be >= {least}, got {value}")


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
