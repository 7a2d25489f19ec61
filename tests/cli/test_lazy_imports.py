"""``rrfp --help``, ``rrfp simulate`` and ``rrfp hints`` never import torch (a fresh interpreter's
``-X importtime`` says what importing and running them imported): they answer in a second, not after torch's
start-up. Only a new process shows what a command imports, so these stay subprocess tests."""

from __future__ import annotations

import pytest

from tests.helpers.cli import run_rrfp


def _imported_modules(stderr: str) -> set[str]:
    """Module names from ``python -X importtime`` output (``import time: self | cumulative | name``)."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and line.count("|") >= 2:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


@pytest.mark.parametrize("args", [
    ("--help",),
    ("simulate", "-p", "4", "-m", "8", "--json"),
    ("hints", "show", "1f1b", "-p", "4", "-m", "8"),
], ids=["help", "simulate", "hints-show"])
def test_commands_do_not_import_torch(tmp_path, args):
    proc = run_rrfp(tmp_path, *args, timeout=60, python_flags=("-X", "importtime"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    modules = _imported_modules(proc.stderr)
    assert "rrfp_cli.app" in modules  # the importtime output was parsed
    assert not any(line.endswith(" torch") for line in proc.stderr.splitlines())
    assert not {m for m in modules if m == "torch" or m.startswith("torch.")}
