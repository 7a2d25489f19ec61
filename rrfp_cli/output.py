"""The single output helper every command uses: rich for people, ``--json`` for machines.

Human mode prints tables to stdout and notes/progress to stderr. JSON mode
prints exactly one JSON document to stdout and nothing else there, so
``rrfp ... --json | jq`` always works; progress bars are suppressed.
"""

from __future__ import annotations

import json
import math
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from rich.console import Console

from hints.errors import UserError


class Output:
    def __init__(self, json_mode: bool = False) -> None:
        self.json_mode = json_mode
        self.console = Console(highlight=False)
        self.err = Console(stderr=True, highlight=False)
        self.warnings: list[str] = []  # what :meth:`warn` said, for commands that put it in their JSON

    def warn(self, message: str) -> None:
        """A warning: on stderr for people, kept in :attr:`warnings` for the JSON."""
        from rich.markup import escape

        self.warnings.append(message)
        self.note(f"[yellow]warning:[/] {escape(message)}")

    def result(self, data: Any, render: Callable[[Console], None]) -> None:
        """Emit the command's result: ``data`` as JSON, or ``render`` for people."""
        if self.json_mode:
            sys.stdout.write(json.dumps(jsonable(data), indent=1) + "\n")
        else:
            render(self.console)

    def note(self, message: str) -> None:
        """A line for people (stderr); silent in JSON mode."""
        if not self.json_mode:
            self.err.print(message)

    @contextmanager
    def progress(self, description: str, total: int) -> Iterator[Callable[[int], None]]:
        """A transient progress bar on stderr; yields ``advance(n)``. No-op in JSON mode."""
        if self.json_mode or total <= 1:
            yield lambda n=1: None
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.err,
            transient=True,
        ) as bar:
            task = bar.add_task(description, total=total)
            yield lambda n=1: bar.advance(task, n)


    @contextmanager
    def status_progress(self, description: str, total: int) -> Iterator[Callable[[int, str], None]]:
        """Like :meth:`progress`, with a status text; yields ``update(completed, status)``."""
        if self.json_mode:
            yield lambda completed, status="": None
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=self.err,
            transient=True,
        ) as bar:
            task = bar.add_task(description, total=max(1, total), status="")
            yield lambda completed, status="": bar.update(task, completed=min(completed, total), status=status)


def jsonable(value: Any) -> Any:
    """NaN/inf are not JSON; they become null."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def format_seconds(value: float) -> str:
    """Compact human time: 12.3 ms, 1.234 s, or plain units for unitless models."""
    if value == 0:
        return "0"
    if abs(value) < 1.0:
        return f"{value * 1e3:.2f} ms"
    return f"{value:.3f} s"


def check_new_file(path: Path, force: bool, flag: str) -> None:
    """Fail before any work unless ``path`` can be written as a file: its directory exists, it is no directory,
    and it does not exist yet unless ``force`` (``--force``) asks to overwrite it."""
    where = f"{flag} {path}"
    if path.is_dir():
        raise UserError("is a directory; give a file name", where)
    if not path.parent.is_dir():
        raise UserError(f"no such directory {str(path.parent)!r}", where)
    if path.exists() and not force:
        raise UserError("exists; pass --force to overwrite it", where)


def check_new_directory(path: Path, names: list[str], force: bool, flag: str) -> None:
    """Like :func:`check_new_file` for a directory that will hold ``names``: it may exist (then it must not hold
    any of ``names`` unless ``force``), its parent must."""
    where = f"{flag} {path}"
    if path.exists() and not path.is_dir():
        raise UserError("is a file; give a directory", where)
    if not path.parent.is_dir():
        raise UserError(f"no such directory {str(path.parent)!r}", where)
    clash = [name for name in names if (path / name).exists()]
    if clash and not force:
        raise UserError(f"already holds {clash[0]}; pass --force to overwrite", where)
