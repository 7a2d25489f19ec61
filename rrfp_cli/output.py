"""The single output helper every command uses: rich for people, ``--json`` for machines.

Human mode prints tables to stdout and notes/progress to stderr. JSON mode
prints exactly one JSON document to stdout and nothing else there, so
``rrfp ... --json | jq`` always works; progress bars are suppressed. Every
table goes through :func:`print_table` ([Note: tables at 80 columns]).
"""

from __future__ import annotations

import json
import math
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from rich.console import Console

from hints.errors import UserError, as_flag, render_inputs


def in_cli_terms(message: str) -> str:
    """A library message with its inputs named by this CLI's flags ([Note: inputs in messages] in hints.errors):
    every flag is its input's name with dashes (``memory_budget`` -> ``--memory-budget``). Every error the
    CLI prints goes through here."""
    return render_inputs(message, as_flag)


class Output:
    def __init__(self, json_mode: bool = False) -> None:
        self.json_mode = json_mode
        self.console = Console(highlight=False)
        self.err = Console(stderr=True, highlight=False)
        self.warnings: list[str] = []  # what :meth:`warn` said, for commands that put it in their JSON
        self._unshown = 0  # warnings not printed yet
        self._after_result: list[Callable[[], None]] = []  # :meth:`on_success`

    def on_success(self, action: Callable[[], None]) -> None:
        """Run ``action`` once the command's result is out (:meth:`result`): for what a command keeps only when
        it succeeds (the frames cache of ``rrfp trace``), never after a bad-input error."""
        self._after_result.append(action)

    def warn(self, message: str) -> None:
        """A warning: kept in :attr:`warnings` for the JSON, and shown on stderr for people once the command goes
        on to print something (its result, a note): a command that ends in a bad-input error prints that one
        ``error:`` line and nothing before it (the warnings of a trace it could not use are no help then)."""
        self.warnings.append(message)
        self._unshown += 1

    def _show_warnings(self) -> None:
        from rich.markup import escape

        unshown, self._unshown = self.warnings[len(self.warnings) - self._unshown:], 0
        if not self.json_mode:
            for message in unshown:
                self.err.print(f"[yellow]warning:[/] {escape(message)}")

    def result(self, data: Any, render: Callable[[Console], None]) -> None:
        """Emit the command's result: ``data`` as JSON, or ``render`` for people (after the warnings)."""
        self._show_warnings()
        if self.json_mode:
            sys.stdout.write(json.dumps(jsonable(data), indent=1) + "\n")
        else:
            render(self.console)
        actions, self._after_result = self._after_result, []
        for action in actions:
            action()

    def note(self, message: str) -> None:
        """A line for people (stderr), after the warnings so far; silent in JSON mode."""
        self._show_warnings()
        if not self.json_mode:
            self.err.print(message)

    @contextmanager
    def progress(self, description: str, total: int) -> Iterator[Callable[[int], None]]:
        """A transient progress bar on stderr; yields ``advance(n)``. No-op in JSON mode, and where stderr is no
        terminal (rich would leave an empty line there, before an error line too)."""
        if self.json_mode or total <= 1 or not self.err.is_terminal:
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
        if self.json_mode or not self.err.is_terminal:
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


def check_new_file(path: Path, force: bool, flag: str, suffixes: tuple[str, ...] = (), kind: str = "") -> None:
    """Fail before any work unless ``path`` can be written as a file: its directory exists, it is no directory,
    its name ends in one of ``suffixes`` (when given: the ``kind`` of file the flag writes), it does not exist
    yet unless ``force`` (``--force``) asks to overwrite it, and a file can be created beside it now (a
    read-only directory or file system refuses here, not after the work)."""
    where = f"{flag} {path}"
    if path.is_dir():
        raise UserError("is a directory; give a file name", where)
    _check_parent(path, where)
    if suffixes and not path.name.lower().endswith(suffixes):
        raise UserError(f"writes {kind or suffixes[0]}; give a name ending in {' or '.join(suffixes)}", where)
    if path.exists() and not force:
        raise UserError("exists; pass --force to overwrite it", where)
    check_writable(path, where)


def check_new_directory(path: Path, names: list[str], force: bool, flag: str) -> None:
    """Like :func:`check_new_file` for a directory that will hold ``names``: it may exist (then it must not hold
    any of ``names`` unless ``force``), its parent must."""
    where = f"{flag} {path}"
    if path.exists() and not path.is_dir():
        raise UserError("is a file; give a directory", where)
    _check_parent(path, where)
    clash = [name for name in names if (path / name).exists()]
    if clash and not force:
        raise UserError(f"already holds {clash[0]}; pass --force to overwrite", where)
    check_writable(path / names[0] if path.is_dir() else path, where)


def _check_parent(path: Path, where: str) -> None:
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise UserError(f"{str(parent)!r} is a file, not a directory", where)
    if not parent.is_dir():
        raise UserError(f"no such directory {str(parent)!r}", where)


def check_writable(path: Path, where: str) -> None:
    """Create (and remove) a file beside ``path``, as its writer will, with a block of the disk
    (:func:`hints.outputs.check_room`): a place that refuses files says so now, in one line naming ``where``: a permission
    is bad input (exit 2), a read-only or full file system a DiskError (exit 1)."""
    from hints.outputs import check_room

    try:
        check_room(path)
    except UserError as err:
        raise UserError(err.what, where) from None


# -- tables ------------------------------------------------------------------------
#
# [Note: tables at 80 columns]
# Every table of every command goes through :func:`print_table`, so each reads on an 80-column terminal:
# headers are short whole words (units go in the title or the caption, never in every header) that wrap
# onto more lines rather than being cut; text cells wrap at spaces; number cells are never cut, nor wrapped.
# A table too wide even so is split into parts of whole columns, the key columns (``Column.key``: what
# names a row) repeated in each. Widths are fixed here, so rich never falls back to cutting with "…".

_CELL_EXTRA = 3  # a cell's padding (one space each side) and its border on the right
_TABLE_EXTRA = 1  # the table's left border


@dataclass(frozen=True)
class Column:
    """A column: its header (short whole words), whether its cells are text (wrap at spaces, left-aligned)
    or numbers (right-aligned, never broken), and whether it names the row (repeated when split)."""

    header: str
    text: bool = False
    key: bool = False
    style: str | None = None


def print_table(console: Console, columns: list[Column], rows: list[list[str]], *, title: str | None = None,
                caption: str | None = None, show_header: bool = True,
                row_styles: list[str | None] | None = None) -> None:
    """[Note: tables at 80 columns]: ``rows`` of plain strings (no markup) under ``title``, ``caption`` below."""
    from rich.table import Table
    from rich.text import Text

    if title:
        console.print(Text(title, style="table.title"))
    cells = [[row[i] for row in rows] for i in range(len(columns))]
    least = [_least_width(c, own, show_header) for c, own in zip(columns, cells)]
    most = [_most_width(c, own, show_header) for c, own in zip(columns, cells)]
    for part in _parts(columns, least, console.width):
        widths = _fit([least[i] for i in part], [most[i] for i in part], [columns[i].text for i in part],
                      console.width)
        table = Table(show_header=show_header)
        for i, width in zip(part, widths):
            column = columns[i]
            table.add_column(Text(column.header), justify="left" if column.text else "right", width=width,
                             overflow="fold", style=column.style)
        for r, row in enumerate(rows):
            table.add_row(*(Text(row[i]) for i in part), style=row_styles[r] if row_styles else None)
        console.print(table)
    if caption:
        console.print(Text(caption, style="dim"))


def _words(text: str) -> list[str]:
    return text.split() or [""]


def _longest(pieces) -> int:
    from rich.cells import cell_len

    return max([1, *map(cell_len, pieces)])


def _least_width(column: Column, cells: list[str], show_header: bool) -> int:
    """The narrowest the column may be: its longest header word, its longest number, or its longest word."""
    header = _longest(_words(column.header)) if show_header else 1
    return max(header, _longest([w for cell in cells for w in _words(cell)] if column.text else cells))


def _most_width(column: Column, cells: list[str], show_header: bool) -> int:
    header = _longest([column.header]) if show_header else 1
    return max(header, _longest([line for cell in cells for line in cell.splitlines()]))


def _parts(columns: list[Column], least: list[int], width: int) -> list[list[int]]:
    """Column indices of each part: the key columns, then as many others as fit at their least widths."""
    keys = [i for i, c in enumerate(columns) if c.key]
    room = width - _TABLE_EXTRA - sum(least[i] + _CELL_EXTRA for i in keys)
    parts: list[list[int]] = []
    used = room + 1  # forces a first part
    for i, column in enumerate(columns):
        if column.key:
            continue
        need = least[i] + _CELL_EXTRA
        if used + need > room and (not parts or parts[-1][len(keys):]):
            parts.append(list(keys))
            used = 0
        parts[-1].append(i)
        used += need
    return parts or [keys]


def _fit(least: list[int], most: list[int], foldable: list[bool], width: int) -> list[int]:
    """Each column's width: as wide as its content, narrowed (the most slack first) to fit ``width``: first
    down to the least widths, then, if it must, text columns below theirs (their words fold)."""
    widths = list(most)
    excess = sum(widths) + _CELL_EXTRA * len(widths) + _TABLE_EXTRA - width
    for floor in (least, [1 if fold else low for fold, low in zip(foldable, least)]):
        while excess > 0:
            slack, i = max((w - low, i) for i, (w, low) in enumerate(zip(widths, floor)))
            if slack <= 0:
                break
            widths[i] -= 1
            excess -= 1
    return widths


def print_pairs(console: Console, pairs: list[tuple[str, str]], title: str) -> None:
    """A table of names and values, no header ([Note: tables at 80 columns])."""
    print_table(console, [Column("", text=True, key=True, style="bold"), Column("", text=True)],
                [list(pair) for pair in pairs], title=title, show_header=False)


def time_unit(seconds: list[float]) -> tuple[str, Callable[[float], str]]:
    """One unit for a column of seconds (ms below a second, else s), for its title, and a value's text in it."""
    if max(map(abs, seconds), default=0.0) < 1.0:
        return "ms", lambda value: f"{value * 1e3:.2f}"
    return "s", lambda value: f"{value:.3f}"


def shell_lines(command: str, width: int) -> str:
    """A shell command to copy, broken between its words into lines of at most ``width`` that end in `` \\``
    (continuations indented), so it still pastes as one command; a word longer than a line stays whole."""
    import shlex

    try:
        words = [shlex.quote(word) for word in shlex.split(command)]
    except ValueError:  # not shell syntax: leave it whole
        return command
    lines: list[str] = []
    for word in words:
        if lines and len(lines[-1]) + len(word) + 3 <= width:  # " word" and the " \\" that ends the line
            lines[-1] += " " + word
        else:
            lines.append(("  " if lines else "") + word)
    return " \\\n".join(lines)
