"""A run that tests of two files read: one traced ``rrfp run --compare`` for the whole session."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.helpers.warm import run_warm


@pytest.fixture(scope="session")
def traced_compare(tmp_path_factory):
    """``rrfp run --compare`` of ready zb at 2x with fixed 1f1b and fixed zb (the emulated multimodal model, 3 ranks,
    6 microbatches, 3 iterations, iterations 1..2 traced), printing its summary on an 80-column terminal:
    ``root`` (the folder it ran in), ``run`` (the --compare directory, "c") and ``result``. Read, never changed,
    by test_trace_cli.py (the trace commands on its traces) and test_tables_80.py (their tables at 80 columns)."""
    root = tmp_path_factory.mktemp("traced-compare")
    result = run_warm(root, "run", "--workload", "emulated", "--stages", "3", "--microbatches", "6", "--iters", "3",
                      "--forward-time", "0.004", "--hint", "zb", "--memory-budget", "2x", "--compare",
                      "--trace-iters", "1:", "--out", "c", columns=80)
    return SimpleNamespace(root=root, run=root / "c", result=result)
