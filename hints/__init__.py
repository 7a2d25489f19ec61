"""Hint orders: the task model, built-in schedules, hint files and torch import.

The bottom of rrfp's import graph: pure Python, no torch (``torch_import``
imports torch lazily, when called). See ``docs/ARCHITECTURE.md``.
"""

from hints.errors import HintError, UserError
from hints.files.hint_json import HINT_FORMAT, save_hint
from hints.files.load import load_hint, resolve_hint
from hints.files.torch_csv import save_torch_csv
from hints.orders import BUILTIN_HINTS, HintOrder, builtin_hint
from hints.tasks import B, F, I, Kind, PipelineShape, Task, W

__all__ = [
    "B",
    "BUILTIN_HINTS",
    "F",
    "HINT_FORMAT",
    "HintError",
    "HintOrder",
    "I",
    "Kind",
    "PipelineShape",
    "Task",
    "UserError",
    "W",
    "builtin_hint",
    "load_hint",
    "resolve_hint",
    "save_hint",
    "save_torch_csv",
]
