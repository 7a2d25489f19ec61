"""Shared test helpers (unit-duration tables, small builders, the CLI runners), and the test layers.

Tests live in four layers, one folder each; every test is marked with its folder's name, so
``pytest -m unit`` (or ``pytest tests/unit``) runs one layer:

* ``unit``: pure functions and objects (schedules, the simulator, the reader on built traces, the wire
  format): no processes, no threads, no sockets. The whole layer runs in well under a minute.
* ``inproc``: one process, but real machinery: torch modules, threads, socket pairs, the CLI through
  its in-process runner.
* ``multiproc``: spawned ranks (gloo process groups, ``rrfp run`` jobs, torchrun): what only several
  processes can show (transport, faults, gradients across ranks).
* ``cli``: the console script as a user runs it, in a subprocess: exit codes, signals, stdout/stderr.

None needs a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from hints.orders import HintOrder
from hints.tasks import PipelineShape, Task
from hints.deps import TaskGraph

# Property tests run on a 2-core CI machine: keep examples modest and deterministic.
settings.register_profile("rrfp", max_examples=300, deadline=None, derandomize=True)
settings.load_profile("rrfp")


def unit_durations(graph: TaskGraph, f: float = 1.0, b: float = 2.0, latency: float = 0.0,
                   w: float | None = None):
    """F = f, B = b, and for a split backward I = b - w and W = w (default b/2 each)."""
    w = b / 2 if w is None else w
    per_kind = {"F": f, "B": b, "I": b - w, "W": w}
    compute = [per_kind[t.kind.value] for t in graph.tasks]
    transfer = [latency if graph.remote_consumers[t] else 0.0 for t in range(len(graph))]
    return compute, transfer


def hint_from_text(orders: list[list[str]], name: str = "hand-made", split: bool = False) -> HintOrder:
    parsed = [[Task.parse(t) for t in order] for order in orders]
    ranks = len(parsed)
    stages = max(t.stage for o in parsed for t in o) + 1
    mbs = max(t.microbatch for o in parsed for t in o) + 1
    shape = PipelineShape(ranks, stages // ranks, mbs, split)
    return HintOrder(shape, tuple(tuple(o) for o in parsed), name)


REPO = Path(__file__).resolve().parents[1]
# Variables that would make a child `rrfp run` believe it is one rank of a torchrun job, or show tracebacks.
_INHERITED = ("RRFP_DEBUG", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def run_rrfp(cwd: Path, *args: str, timeout: float = 180, python_flags: tuple[str, ...] = (),
             module: tuple[str, ...] = ("-m", "rrfp_cli"), columns: int = 200) -> subprocess.CompletedProcess:
    """Run the CLI in a subprocess, as a user would: real exit codes, stdout and stderr (on a terminal
    ``columns`` wide)."""
    env = {k: v for k, v in os.environ.items() if k not in _INHERITED}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["COLUMNS"] = str(columns)  # tables and grids laid out the same whatever the terminal
    return subprocess.run([sys.executable, *python_flags, *module, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


LAYERS = ("unit", "inproc", "multiproc", "cli")


def pytest_collection_modifyitems(config, items):
    """Mark each test with its layer (the folder it is in, under tests/)."""
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(REPO / "tests").parts
        if len(parts) > 1 and parts[0] in LAYERS:
            item.add_marker(getattr(pytest.mark, parts[0]))


@pytest.fixture
def make_unit():
    return unit_durations


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def live_ranks(run: Path) -> list[int]:
    """The ranks of a run directory whose processes still run (from their status files' pids)."""
    from runtime.run.health import StatusBoard

    boards = sorted((run / "status").glob("rank*"))
    assert boards, f"no status files in {run}"
    return [int(b.name[4:]) for b in boards if alive(StatusBoard.read(b)["pid"])]
