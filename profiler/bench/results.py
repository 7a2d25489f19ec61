"""The results folder of ``rrfp bench``: the suite's state, its JSON and Markdown, the machine and versions.

[Note: keep what finished]
    Every step of the suite ends with :func:`save`, which rewrites ``results.json`` and the Markdown
    atomically from what is done; an interrupted suite keeps every finished cell.

Summaries of a cell's tables are :func:`spread` (median, p10, p90, min, max, count).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from hints.errors import UserError
from hints.outputs import Outputs
from profiler.bench.matrix import MATRIX_ROWS, MICROBATCHES_PER_RANK, Settings, row_unavailable

SCHEMA = "rrfp-bench/1"
Progress = Callable[[int, str], None]  # (units done so far, what is running now)


def quantile(values: Sequence[float], level: float) -> float:
    ordered = sorted(values)
    position = level * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spread(values: Sequence[float | None]) -> dict | None:
    """Median, p10, p90, min, max and count of the finite values (None when there are none)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None
    return {"median": statistics.median(finite), "p10": quantile(finite, 0.1), "p90": quantile(finite, 0.9),
            "min": min(finite), "max": max(finite), "n": len(finite)}


@dataclass
class Suite:
    """The state of one run: what finished, written to ``out`` after every step ([Note: keep what finished])."""

    settings: Settings
    out: Path
    command: str
    results: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def note(self, message: str) -> None:
        if message not in self.notes:
            self.notes.append(message)


# -- environment ----------------------------------------------------------------------------------


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "machine": platform.machine()}


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch = version("torch")
    except PackageNotFoundError:
        torch = None
    root = Path(__file__).resolve().parents[2]
    commit = dirty = None
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10).stdout
        dirty = bool(status.strip()) if commit else None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"python": platform.python_version(), "torch": torch, "rrfp_commit": commit, "rrfp_dirty": dirty}


# -- the results folder ---------------------------------------------------------------------------

RESULTS_JSON, RESULTS_MD, SECTION_MD, PLOTS = "results.json", "results.md", "benchmarks_section.md", "plots"
OUTPUT_NAMES = [RESULTS_JSON, RESULTS_MD, SECTION_MD, PLOTS]


def header(suite: Suite) -> dict:
    settings = suite.settings
    return {"schema": SCHEMA, "command": suite.command, "started": suite.results.get("started"),
            "machine": machine(), "versions": versions(),
            "settings": {**asdict(settings), "microbatches_per_rank": MICROBATCHES_PER_RANK,
                         "tables": [{"seed": s, "iteration": i, "table_seed": 1000 * s + i}
                                    for s, i in settings.tables]},
            "matrix_rows": [{**asdict(r), "skipped": row_unavailable(r, settings)} for r in MATRIX_ROWS]}


def save(suite: Suite, final: bool = False) -> None:
    """[Note: keep what finished] Rewrite results.json and the Markdown (atomically) with what is done."""
    data = {**header(suite), **{k: v for k, v in suite.results.items() if k != "started"}, "notes": suite.notes,
            "complete": final and not suite.results.get("interrupted")}
    from profiler.bench.report import results_markdown, section_markdown

    with Outputs() as outputs:  # the three of one state, or the previous three ([Note: outputs written whole])
        outputs.directory(suite.out)  # check_out made it; made again if it was removed meanwhile
        outputs.write_text(suite.out / RESULTS_JSON, json.dumps(_jsonable(data), indent=1) + "\n")
        outputs.write_text(suite.out / RESULTS_MD, results_markdown(data))
        outputs.write_text(suite.out / SECTION_MD, section_markdown(data))


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def check_out(out: Path, force: bool) -> None:
    """The results folder: new, or holding none of the suite's files unless ``force``; writable."""
    if out.exists() and not out.is_dir():
        raise UserError("is a file; give a directory", f"`out` {out}")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"no such directory {str(parent)!r}", f"`out` {out}")
    clash = [name for name in OUTPUT_NAMES if (out / name).exists()]
    if clash and not force:
        raise UserError(f"already holds {clash[0]}; pass `force` to overwrite", f"`out` {out}")
    try:  # created now, and probed with a file: os.access says yes to root in read-only places (/proc)
        out.mkdir(exist_ok=True)
        probe = Outputs()
        probe.stage(out / RESULTS_JSON)
        probe.discard()
    except OSError as err:
        raise UserError(f"cannot write there: {err.strerror or err}", f"`out` {out}") from None
    except UserError as err:  # a full or read-only disk is a DiskError (exit 1), naming the disk
        raise UserError(f"cannot write there: {err.what.removeprefix('cannot write: ')}", f"`out` {out}") from None
