"""Duration tables on disk: the one format ``rrfp simulate --durations`` reads and rrfp writes.

A table is CSV or Parquet, one row per task, chosen by the file's extension
(``.csv``; ``.parquet`` or ``.pq``). Reading takes any other extension as CSV,
as it always has; writing refuses it.

Columns
-------
``stage``, ``kind``, ``microbatch``, ``duration`` (required)
    The model stage (``0 .. stages-1``; not the rank), ``F``/``B``/``I``/``W``,
    the microbatch, and the task's seconds (a finite number >= 0). Every
    ``F`` and every ``B`` (or its ``I`` and ``W``) of the shape appears
    exactly once per iteration. A split table (``I`` and ``W``) loads ``B`` as
    ``I + W``.
``iteration`` (optional)
    Several iterations in one table; the reader picks one (default: the
    first). ``rrfp run`` (emulated workload) and ``rrfp trace export
    --durations`` write it.
``latency`` (optional)
    Seconds of the message the row's task sends to its consumer, if that
    consumer is on another rank: ``F(k, i)`` sends its activation downstream
    when ``k < stages - 1``, the upstream backward (``B(k, i)``, or ``I(k, i)``
    in a split table) sends its gradient upstream when ``k > 0``; ``W``,
    ``F`` of the last stage and ``B``/``I`` of stage 0 send nothing. The table
    does not know the rank count, so a latency between two stages that end up
    on one rank is read but never used. In :class:`Durations` these are
    ``send_forward[k][i]`` and ``send_backward[k][i]``.

Reading rules for ``latency``
-----------------------------
* With the column, every task that sends a message needs a latency that is a
  finite number >= 0; a task that sends nothing has it empty (null) or 0. In a split
  table the upstream latency is read from the ``I`` row (from the ``B`` row
  for a microbatch recorded with ``B`` only); a ``B`` row beside an ``I`` row
  may leave it empty or repeat it. ``comm_latency`` (``--comm-latency``) must
  then be 0: the table already says what each message takes.
* Without the column every cross-rank message takes ``comm_latency``, as
  tables always have.

Every problem is one :class:`UserError` naming the file and, for a bad row,
its row number as a spreadsheet shows the CSV (the header is row 1; the rows
of other iterations count too). A table without rows and a directory are
refused; so is a Parquet column of numbers stored as text (a CSV has no types:
each cell is read as a number, so one odd cell is named by its row).

Writing (:func:`write_durations`) is atomic: a temporary file in the target's
directory, renamed over the target once complete. An unsplit table is written
as ``F`` and ``B`` rows, a split one as ``F``, ``I`` and ``W`` rows; senders get
their latency, every other row an empty one.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from hints.errors import UserError
from hints.outputs import Outputs, write_whole
from runtime.durations.variability import Durations

COLUMNS = ("stage", "kind", "microbatch", "duration")
ITERATION = "iteration"
LATENCY = "latency"
_ROW = "__rrfp_row"  # row numbers taken before an iteration is picked, so errors point at the file's rows
_FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


# -- reading ---------------------------------------------------------------------


def load_durations(path: str | Path, stages: int, microbatches: int, comm_latency: float = 0.0,
                   iteration: int | None = None) -> Durations:
    """Read a duration table (see the module docstring) for ``stages`` x ``microbatches``.

    Latencies come from the ``latency`` column when the table has one (then
    ``comm_latency`` must be 0), otherwise every cross-rank message takes
    ``comm_latency``. ``iteration`` picks one iteration of a table with an
    ``iteration`` column (default: the first).
    """
    import polars as pl  # only this path needs polars

    where = str(path)
    path = Path(path)
    if not path.exists():
        raise UserError("no such file", where)
    if path.is_dir():  # polars would read a folder as a glob of its files, and say so in its own terms
        raise UserError("is a directory; give a duration table (.csv, .parquet or .pq)", where)
    parquet = path.suffix.lower() in (".parquet", ".pq")
    try:
        frame = pl.read_parquet(path) if parquet else pl.read_csv(path, infer_schema_length=10000)
    except Exception as err:  # polars raises several error types for unreadable files
        raise UserError(f"cannot read as {'Parquet' if parquet else 'CSV'}: {str(err).splitlines()[0]}",
                        where) from None
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise UserError(f"missing column {missing[0]!r} (needs {', '.join(COLUMNS)})", where)
    if frame.height == 0:
        raise UserError(f"holds no rows (needs one per task of {stages} stages x {microbatches} microbatches)",
                        where)
    if parquet:
        _check_stored_types(frame, where)
    has_latency = LATENCY in frame.columns
    if has_latency and comm_latency != 0:
        raise UserError(f"the table holds latencies (a {LATENCY!r} column), so `comm_latency` {comm_latency:g} "
                        f"would be ambiguous; leave `comm_latency` at 0", where)
    frame = frame.with_row_index(_ROW, offset=2)
    if ITERATION in frame.columns:
        present = sorted(frame.get_column(ITERATION).unique().to_list(), key=lambda x: (x is None, x))
        chosen = present[0] if iteration is None else iteration
        if chosen not in present:
            raise UserError(f"no iteration {chosen} (the table has {present[0]}..{present[-1]})", where)
        frame = frame.filter(pl.col(ITERATION) == chosen)
        where = f"{where} (iteration {chosen})"
    elif iteration is not None:
        raise UserError("has no iteration column, so `durations_iteration` does not apply", where)

    table: dict[str, list[list[float | None]]] = {k: [[None] * microbatches for _ in range(stages)] for k in "FBIW"}
    latency: dict[tuple[int, str, int], tuple[float | None, int]] = {}  # task -> (latency, row number)
    columns = [_ROW, *COLUMNS, *((LATENCY,) if has_latency else ())]
    for row_number, stage, kind, mb, duration, *rest in frame.select(columns).iter_rows():
        at = f"{where}: row {row_number}"
        duration = _number(duration)
        if not isinstance(stage, int) or not isinstance(mb, int):
            raise UserError(f"stage and microbatch must be whole numbers, got {stage!r}, {mb!r}", at)
        if kind not in ("F", "B", "I", "W"):
            raise UserError(f"kind must be F, B, I or W, got {kind!r}", at)
        if not 0 <= stage < stages or not 0 <= mb < microbatches:
            raise UserError(f"task {stage}{kind}{mb} is outside {stages} stages x {microbatches} microbatches", at)
        if not _is_seconds(duration):
            raise UserError(f"duration of {stage}{kind}{mb} must be a number >= 0, got {duration!r}", at)
        if table[kind][stage][mb] is not None:
            raise UserError(f"task {stage}{kind}{mb} appears twice", at)
        table[kind][stage][mb] = float(duration)
        if has_latency:
            latency[(stage, kind, mb)] = (_read_latency(rest[0], stage, kind, mb, stages, at), row_number)

    def complete(kind: str) -> bool:
        return all(value is not None for row in table[kind] for value in row)

    def first_missing(kind: str) -> str:
        for k in range(stages):
            for i in range(microbatches):
                if table[kind][k][i] is None:
                    return f"{k}{kind}{i}"
        return ""

    if not complete("F"):
        raise UserError(f"no duration for task {first_missing('F')}", where)
    split = complete("I") and complete("W")
    if not complete("B"):
        if not split:
            raise UserError(f"no duration for task {first_missing('B')} (or for its I and W)", where)
        table["B"] = [[table["I"][k][i] + table["W"][k][i] for i in range(microbatches)] for k in range(stages)]
    if has_latency:
        send_forward, send_backward = _latencies_from_column(latency, stages, microbatches, where)
    else:
        send_forward = [[comm_latency if k < stages - 1 else 0.0 for _ in range(microbatches)] for k in range(stages)]
        send_backward = [[comm_latency if k > 0 else 0.0 for _ in range(microbatches)] for k in range(stages)]
    costs = [sum(table["F"][k][i] + table["B"][k][i] for k in range(stages)) for i in range(microbatches)]
    return Durations(
        stages, microbatches, table["F"], table["B"], send_forward, send_backward, costs,
        input_grad=table["I"] if split else None, weight_grad=table["W"] if split else None, source=where,
    )


def _check_stored_types(frame, where: str) -> None:
    """A Parquet column stores one type: numbers stored as text are refused by column, not parsed cell by cell
    as a CSV's are (a CSV has no types; one odd cell makes polars read its column as text: :func:`_number`)."""
    for name in (ITERATION, "stage", "microbatch", "duration", LATENCY):
        if name not in frame.columns:
            continue
        dtype = frame.schema[name]
        whole = name in (ITERATION, "stage", "microbatch")
        if dtype.is_integer() or (not whole and dtype.is_float()) or str(dtype) == "Null":  # Null: all empty
            continue
        kind = "whole numbers" if whole else "numbers"
        raise UserError(f"column {name!r} is stored as {dtype}, not as {kind}", where)


def sends_message(stage: int, kind: str, stages: int) -> bool:
    """Whether task ``stage``/``kind`` sends a message to another stage (the tasks a latency belongs to)."""
    return (kind == "F" and stage < stages - 1) or (kind in ("B", "I") and stage > 0)


def _number(value):
    """A cell as a number when it parses as one.

    One odd cell (``nan``, ``soon``) makes polars read a whole CSV column as
    text; parsing each cell keeps the good ones and lets the error name the
    odd cell's row rather than the first row.
    """
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _is_seconds(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _read_latency(value, stage: int, kind: str, mb: int, stages: int, at: str) -> float | None:
    task = f"{stage}{kind}{mb}"
    value = _number(value)
    if value is None:
        return None
    if not _is_seconds(value):
        raise UserError(f"latency of {task} must be a number >= 0, got {value!r}", at)
    if not sends_message(stage, kind, stages) and value != 0:
        raise UserError(f"task {task} sends nothing, so its latency must be empty or 0, got {value!r}", at)
    return float(value)


def _latencies_from_column(latency: dict[tuple[int, str, int], tuple[float | None, int]], stages: int,
                           microbatches: int, where: str) -> tuple[list[list[float]], list[list[float]]]:
    """``send_forward`` and ``send_backward`` from the rows' latencies (every sender needs one)."""

    def required(stage: int, kind: str, mb: int) -> float:
        value, row_number = latency[(stage, kind, mb)]
        if value is None:
            raise UserError(f"no latency for task {stage}{kind}{mb}, which sends a message "
                            f"(the table has a {LATENCY!r} column)", f"{where}: row {row_number}")
        return value

    send_forward = [[required(k, "F", i) if k < stages - 1 else 0.0 for i in range(microbatches)]
                    for k in range(stages)]
    send_backward = [[0.0] * microbatches for _ in range(stages)]
    for k in range(1, stages):
        for i in range(microbatches):
            if (k, "I", i) not in latency:
                send_backward[k][i] = required(k, "B", i)
                continue
            send_backward[k][i] = required(k, "I", i)
            beside, row_number = latency.get((k, "B", i), (None, 0))
            if beside is not None and beside != send_backward[k][i]:
                raise UserError(f"latency of {k}B{i} ({beside!r}) differs from that of {k}I{i} "
                                f"({send_backward[k][i]!r}), which sends the gradient", f"{where}: row {row_number}")
    return send_forward, send_backward


# -- writing ---------------------------------------------------------------------


def durations_frame_rows(durations: Durations) -> list[tuple[int, str, int, float]]:
    """``(stage, kind, microbatch, duration)`` of every ``F`` and ``B``: a table without latencies."""
    rows = []
    for k in range(durations.stages):
        for i in range(durations.microbatches):
            rows.append((k, "F", i, durations.forward[k][i]))
            rows.append((k, "B", i, durations.backward[k][i]))
    return rows


def duration_rows(durations: Durations, iteration: int | None = None, latency: bool = True) -> list[dict]:
    """The table rows of ``durations``: ``F`` and ``B``, or ``F``, ``I`` and ``W`` when split.

    Each row has ``stage, kind, microbatch, duration``; ``iteration`` when
    given; ``latency`` when asked (the sent message's seconds for a sender,
    None for a task that sends nothing).
    """
    split = durations.input_grad is not None and durations.weight_grad is not None
    stages = durations.stages
    rows = []
    for k in range(stages):
        for i in range(durations.microbatches):
            tasks = [("F", durations.forward[k][i], durations.send_forward[k][i])]
            if split:
                tasks += [("I", durations.input_grad[k][i], durations.send_backward[k][i]),
                          ("W", durations.weight_grad[k][i], None)]
            else:
                tasks.append(("B", durations.backward[k][i], durations.send_backward[k][i]))
            for kind, seconds, sent in tasks:
                row = {} if iteration is None else {ITERATION: iteration}
                row.update(stage=k, kind=kind, microbatch=i, duration=seconds)
                if latency:
                    row[LATENCY] = sent if sends_message(k, kind, stages) else None
                rows.append(row)
    return rows


def check_destination(path: str | Path) -> str:
    """The format (``csv`` or ``parquet``) a table written to ``path`` gets; a ``UserError`` if it cannot be."""
    path = Path(path)
    where = str(path)
    if path.is_dir():
        raise UserError("is a directory; give a file name ending in .csv, .parquet or .pq", where)
    if not path.parent.is_dir():
        raise UserError(f"no such directory {str(path.parent)!r}", where)
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        what = f"unknown extension {path.suffix!r}" if path.suffix else "no extension"
        raise UserError(f"{what}: a duration table is .csv, .parquet or .pq", where)
    return fmt


def write_durations(path: str | Path, tables: Sequence[tuple[int | None, Durations]], latency: bool = True,
                    outputs: Outputs | None = None) -> int:
    """Write ``(iteration, durations)`` tables to one CSV or Parquet file, atomically; returns the row count.
    Staged among a command's ``outputs`` when given (renamed into place with them), else written at once.

    The ``iteration`` column is written when the iterations are numbers (all
    of them or none: a single table may have None); ``latency`` adds the
    ``latency`` column.
    """
    import polars as pl

    fmt = check_destination(path)
    numbered = {it is not None for it, _ in tables}
    if len(numbered) > 1 or (False in numbered and len(tables) > 1):
        raise ValueError("several tables need an iteration number each")
    iterations = [it for it, _ in tables if it is not None]
    if len(set(iterations)) != len(iterations):
        raise ValueError(f"iterations repeat: {iterations}")
    schema = {ITERATION: pl.Int64} if iterations else {}
    schema.update(stage=pl.Int64, kind=pl.Utf8, microbatch=pl.Int64, duration=pl.Float64)
    if latency:
        schema[LATENCY] = pl.Float64
    rows = [row for it, durations in tables for row in duration_rows(durations, it, latency)]
    frame = pl.DataFrame(rows, schema=schema)
    write = frame.write_parquet if fmt == "parquet" else frame.write_csv
    if outputs is None:
        write_whole(path, write)
    else:
        outputs.write(path, write)
    return frame.height
