"""`benchmarks/trace_bench.py --reader-only` reports the reader as a multiple of a plain parse of the same file, the
steps taking turns, with the absolute figure beside it and the 3x target of issue 26 said met or not."""

from __future__ import annotations

import re

from tests.helpers.cli import run_script


def test_reader_only_reports_the_multiple_of_a_plain_parse_beside_the_seconds(tmp_path):
    done = run_script(tmp_path, "benchmarks/trace_bench.py", "--reader-only", "--events", "3000", "--repeats", "2",
                      "--out", tmp_path / "bench")
    assert done.returncode == 0, done
    assert "2 rounds, the steps taking turns" in done.stdout
    assert re.search(r"\| read_trace \(parse \+ frames\) \| [\d.]+ s \| [\d.]+ s \| [\d.]+ us \| "
                     r"[\d.]+x \([\d.]+-[\d.]+x\) \|", done.stdout), done.stdout
    assert re.search(r"read_trace: [\d.]+x a plain parse of the same file \([\d.]+ s CPU for [\d,]+ packets\); "
                     r"target at most 3x: (met|not met)", done.stdout), done.stdout
