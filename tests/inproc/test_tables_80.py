"""The tables of rrfp simulate, rrfp hints and rrfp tune-hint read on an 80-column terminal ([Note: tables at 80
columns] in rrfp_cli.output): no line wider than 80, nothing cut with "…", every word of a wide terminal's output
still there (tests.helpers.cli.narrow). The trace commands' tables: tests/multiproc/test_tables_80.py."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers.cli import narrow, run_cli


@pytest.mark.parametrize("args", [
    ["simulate", "-p", "4", "-m", "8"],
    ["simulate", "-p", "4", "-m", "8", "--compare"],
    ["simulate", "-p", "8", "-v", "2", "-m", "32", "--compare"],  # interleaved-1f1b, times in seconds
    ["hints", "list"],
    ["hints", "show", "interleaved-1f1b", "-p", "4", "-v", "2", "-m", "8"],
], ids=" ".join)
def test_simulate_and_hints_tables(tmp_path, args):
    out = narrow(tmp_path, *args)
    if "--compare" in args:
        assert "interleaved-1f1b" in out or "1f1b" in out
        # every hint of the comparison, under every rule, is a row of the table
        rows = json.loads(run_cli(tmp_path, *args, "--json").stdout)["rows"]
        words = set(out.split())  # a name with a space ("planned @1f1b") is two words of the table
        assert {part for row in rows for part in row["hint"].split()} <= words and len(rows) >= 3 * 5


def test_tune_report_tables(tmp_path):
    out = narrow(tmp_path, "tune-hint", "--workload", "multimodal", "-p", "2", "-m", "4", "--evaluations", "2000",
                 "--scenarios", "4", "--out", "tuned", between=lambda: shutil.rmtree(tmp_path / "tuned"))
    assert "held-out" in out and "vs best" in out and "times in ms" in out
    assert "rrfp tune-hint --workload multimodal" in out
