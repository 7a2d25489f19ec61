"""Any hint a user names: a built-in, ``torch:SCHEDULE`` or a file (rrfp-hint JSON or torch CSV), as a :class:`HintOrder`.

:func:`resolve_hint` is what a ``--hint`` value goes through; :func:`load_hint` reads a file by its
extension (``.csv``: :mod:`hints.files.torch_csv`, else :mod:`hints.files.hint_json`). torch is
imported only for ``torch:SCHEDULE`` (:mod:`hints.files.torch_import`).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Mapping, Sequence

from hints.errors import HintError, input_name
from hints.files.hint_json import hint_from_json
from hints.files.torch_csv import hint_from_torch_rows
from hints.files.torch_names import TORCH_PREFIX, V_SCHEDULES
from hints.orders import BUILTIN_HINTS, HintOrder, baseline_hint_name, builtin_hint
from hints.tasks import LOOPING, PipelineShape, Task, V, check_placement, default_chunks


def load_hint(path: str | Path, placement: str | None = None) -> HintOrder:
    """Load an ``rrfp-hint/1`` JSON file or a torch CSV (by extension ``.csv``).

    ``placement`` states the placement of a CSV (checked against its stages; None: inferred).
    """
    path = Path(path)
    where = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise HintError("no such file", where) from None
    except (OSError, UnicodeDecodeError) as err:
        raise HintError(f"cannot read: {err}", where) from None
    if path.suffix.lower() == ".csv":
        rows = list(csv.reader(text.splitlines()))
        while rows and not any(cell.strip() for cell in rows[-1]):
            rows.pop()  # trailing blank lines are not ranks
        return hint_from_torch_rows(rows, where, path.stem, placement)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise HintError(f"not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}", where) from None
    return hint_from_json(data, where)


def hint_or_baseline(spec: str | None, chunks: int | None = None, placement: str | None = None) -> str:
    """The hint a job follows: ``spec``, else the baseline order of its chunks and placement (1F1B, interleaved
    1F1B with several chunks, ZB-V under V placement: :func:`hints.orders.baseline_hint_name`)."""
    placement = placement or LOOPING
    return spec or baseline_hint_name(chunks or default_chunks(placement), placement)


def hint_shape(spec: str | None, ranks: int, chunks: int | None, microbatches: int,
               placement: str | None = None) -> PipelineShape:
    """The shape (full backward) a job of ``ranks`` x ``microbatches`` runs ``spec`` on: the placement asked,
    else the hint's own (:func:`hint_placement`; no hint: looping), and the chunks asked, else that
    placement's default. The one reading of the shape options, for every command."""
    placed = hint_placement(spec, placement) if spec is not None else (placement or LOOPING)
    return PipelineShape(ranks, chunks or default_chunks(placed), microbatches, placement=placed)


def hint_placement(spec: str, stated: str | None = None) -> str:
    """The placement hint ``spec`` runs under, without building it: ``stated`` if given, else the hint's own.

    A built-in's own placement, V for torch's V schedules (:data:`hints.files.torch_names.V_SCHEDULES`; the
    import then checks it against torch's stage ids), a file's, or looping.
    """
    if stated is not None:
        return check_placement(stated, "`placement`")
    if spec in BUILTIN_HINTS:
        return BUILTIN_HINTS[spec].placement
    if spec.startswith(TORCH_PREFIX):
        name = spec[len(TORCH_PREFIX):].lower()
        return V if name.removeprefix("schedule") in V_SCHEDULES else LOOPING
    if Path(spec).is_file():
        return load_hint(spec).shape.placement
    return LOOPING


def resolve_hint(
    spec: str,
    ranks: int | None = None,
    chunks: int | None = None,
    microbatches: int | None = None,
    costs: Sequence[float] | None = None,
    priorities: Mapping[Task, Sequence[float]] | None = None,
    placement: str | None = None,
) -> HintOrder:
    """A built-in name or ``torch:SCHEDULE`` (built for the given shape), or a hint file (checked against it).

    For a file, any of ``ranks``/``chunks``/``microbatches``/``placement`` that is given must
    match the file's shape. ``costs`` feed ``bfw``, ``priorities`` feed ``cp``
    (``runtime.sched.evaluate.resolve`` computes both from expected durations). ``placement`` None is the
    hint's own: V for ``zbv`` and torch's V schedules, what a file says, looping otherwise; ``chunks``
    None is 2 under V placement, else 1.
    """
    if placement is not None:
        check_placement(placement, "`placement`")
    if spec in BUILTIN_HINTS or spec.startswith(TORCH_PREFIX):
        if ranks is None or microbatches is None:
            raise HintError(f"hint {spec!r} needs `ranks` and `microbatches`")
        if spec in BUILTIN_HINTS:
            chunks = chunks or default_chunks(placement or BUILTIN_HINTS[spec].placement)
            return builtin_hint(spec, ranks, chunks, microbatches, costs, priorities, placement)
        from hints.files.torch_import import import_torch_schedule  # imports torch: only on this path

        return import_torch_schedule(spec[len(TORCH_PREFIX):], ranks, microbatches, chunks, placement)
    path = Path(spec)
    if not path.exists():
        raise HintError(
            f"unknown hint {spec!r}: not a built-in ({', '.join(BUILTIN_HINTS)}), not torch:SCHEDULE, "
            f"and no such file"
        )
    hint = load_hint(path, placement)
    for name, given, actual in (
        ("ranks", ranks, hint.shape.ranks),
        ("chunks", chunks, hint.shape.chunks),
        ("microbatches", microbatches, hint.shape.microbatches),
        ("placement", placement, hint.shape.placement),
    ):
        if given is not None and given != actual:
            raise HintError(f"the file is for {name} {actual} but {input_name(name)} {given} was asked", spec)
    return hint
