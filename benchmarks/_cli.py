"""What the benchmark scripts share on the command line: a parser whose errors are one line, and a progress log.

The scripts run as ``python benchmarks/NAME.py``, so this folder is on ``sys.path`` and they import it as
``_cli``. Nothing here imports torch or rrfp.
"""

from __future__ import annotations

import argparse
import sys
import time


class Parser(argparse.ArgumentParser):
    """Bad input: one ``error:`` line and exit 2 (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def progress(message: str) -> None:
    """One timestamped line on stderr (stdout holds the results)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
