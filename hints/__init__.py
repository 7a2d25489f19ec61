"""What should run, in which order: the bottom of rrfp's import graph. Pure Python, no torch
(``files.torch_import`` imports torch lazily, when called; ``files.torch_csv``'s export checks a CSV
with torch's own lowering when torch imports). Modules, in import order:

* :mod:`~hints.errors` -- the errors every package raises for bad input, failures and interrupts;
* :mod:`~hints.tasks` -- the task IR: pipeline shapes, placement, tasks in torch's action grammar;
* :mod:`~hints.deps` -- the one dependency model, compiled per shape into a task graph;
* :mod:`~hints.paths`, :mod:`~hints.priorities` -- longest paths on that graph, and the ``cp`` hint's
  list-scheduling priorities;
* :mod:`~hints.costs` -- per-(stage, kind) cost models, for cost-ranked hints;
* :mod:`~hints.orders` -- hint orders as data, and the built-in generators;
* :mod:`~hints.validate` -- structural checks derived from the dependency model, and the rank-by-step grid;
* :mod:`hints.files` -- hint files, torch's CSV and schedules, and the reading of a ``--hint`` value.

This package re-exports the names a user's script needs. See docs/ARCHITECTURE.md.
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
