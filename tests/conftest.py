"""The test layers, and the settings every test shares. Helpers tests share live in tests/helpers/.

Tests live in four layers, one folder each; every test is marked with its folder's name, so
``pytest -m unit`` (or ``pytest tests/unit``) runs one layer:

* ``unit``: pure functions and objects (schedules, the simulator, the reader on built traces, the wire
  format): no processes, no threads, no sockets. The whole layer runs in well under a minute.
* ``inproc``: one process, but real machinery: torch modules, threads, socket pairs, the CLI through
  its in-process runner ([Note: the two CLI runners] in tests/helpers/cli.py).
* ``multiproc``: spawned ranks (gloo process groups, ``rrfp run`` jobs, torchrun): what only several
  processes can show (transport, faults, gradients across ranks).
* ``cli``: the console script as a user runs it, in a subprocess: exit codes, signals, stdout/stderr.

None needs a GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

from tests.helpers.disk import umask_027  # noqa: F401 (a fixture, for every test)

# The test process itself trains the single-process references and runs commands with torch, on two OpenMP
# threads; by default they spin at every barrier, and when the machine's two cores are busy with anything else
# (ranks of another test, another job on a shared CI runner) each spin waits for the other thread's next time
# slice: a reference training took 37 times as long with two busy loops beside it (23.5 s against 0.64 s idle;
# 0.78 s with passive waits). Set before any test module imports torch; ranks inherit it (one thread each).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Property tests run on a 2-core CI machine: keep examples modest and deterministic.
settings.register_profile("rrfp", max_examples=300, deadline=None, derandomize=True)
settings.load_profile("rrfp")

TESTS = Path(__file__).resolve().parent
LAYERS = ("unit", "inproc", "multiproc", "cli")


def pytest_collection_modifyitems(config, items):
    """Mark each test with its layer (the folder it is in, under tests/)."""
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(TESTS).parts
        if len(parts) > 1 and parts[0] in LAYERS:
            item.add_marker(getattr(pytest.mark, parts[0]))
