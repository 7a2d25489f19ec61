"""Each rank's process is named ``rrfp rank <r>`` (``/proc/<pid>/comm``: what ``ps -e``, ``ps -o comm``, ``top`` and
``pgrep`` show), under rrfp's own launcher here; under torchrun: tests/multiproc/test_torchrun_faults.py."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import start_rrfp
from tests.helpers.processes import status, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process names are Linux's /proc/<pid>/comm")


def test_every_rank_process_is_named_by_its_rank(tmp_path):
    run = tmp_path / "n"
    process = start_rrfp(tmp_path, "run", "--workload", "emulated", "-p", "2", "-m", "4", "--forward-time", "0.004",
                         "--iters", "400", "--out", "n")
    try:
        boards = wait_for(lambda: all((s := status(run, r)) and s["iteration"] is not None for r in (0, 1))
                          and [status(run, r) for r in (0, 1)], what="both ranks in their first iteration")
        names = [Path(f"/proc/{board['pid']}/comm").read_text() for board in boards]
        process.send_signal(signal.SIGTERM)  # a scheduler's stop: the ranks end with the launcher
        process.communicate(timeout=60)
    finally:
        process.kill()
    assert names == ["rrfp rank 0\n", "rrfp rank 1\n"]
