"""`rrfp bench` in this process: a tiny simulated matrix end to end, the results schema, the section, the commit it
records, bad input. Its charts, matrix rows and readers of other runs' files: tests/unit/test_bench.py."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from profiler.bench import matrix
from profiler.bench.report import section_markdown
from profiler.bench.results import SCHEMA
from profiler.bench.suite import run_suite
from tests.helpers.cli import one_error, run_cli


def tiny_matrix(tmp_path, *extra):
    out = tmp_path / "bench"
    result = run_cli(tmp_path, "bench", "--out", str(out), "--ranks", "4", "--workloads", "language,multimodal",
                     "--seeds", "2", "--iterations", "1", "--tune-seconds", "0.5", "--no-real", "--no-external",
                     "--json", *extra)
    assert result.returncode == 0, result.stderr
    return out, json.loads(result.stdout)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One tiny matrix (4 ranks, two workloads, two seeds, simulated only): its folder and its --json summary.
    The tests below only read what it wrote."""
    return tiny_matrix(tmp_path_factory.mktemp("tiny"))


def test_tiny_matrix_writes_every_file_with_the_schema(tiny):
    out, summary = tiny
    data = json.loads((out / "results.json").read_text())
    assert data["schema"] == SCHEMA and data["complete"] is True
    assert data["command"].startswith("rrfp bench --out") and "--ranks 4" in data["command"]
    assert {"cpu", "cores"} <= set(data["machine"]) and {"python", "torch", "rrfp_commit"} <= set(data["versions"])
    assert [t["table_seed"] for t in data["settings"]["tables"]] == [0, 1000]
    cells = data["simulation"]["cells"]
    assert {(c["workload"], c["budget"]) for c in cells} == {(w, b) for w in ("language", "multimodal")
                                                             for b in ("1f1b", "2x")}
    for cell in cells:
        rows = {r["row"]: r for r in cell["rows"]}
        assert rows["fixed-1f1b"]["speedup_vs_fixed_1f1b"]["median"] == pytest.approx(1.0)
        blocking = rows["fixed-1f1b-blocking"]["speedup_vs_fixed_1f1b"]  # Megatron-style: never faster
        assert blocking["max"] <= 1.0 + 1e-9
        for name in ("ready-1f1b", "ready-bf", "ready-bfw", "ready-zb", "ready-cp", "ready-tuned"):
            row = rows[name]
            assert {"median", "p10", "p90", "min", "max", "n"} == set(row["speedup_vs_fixed_1f1b"])
            assert row["within_budget"] is True  # ready rules keep to the budget
            assert "ready_over_fixed_same_hint" in row and "fixed_same_hint_peak_in_flight" in row
            assert row["makespan_over_bound"]["min"] >= 1.0
            # [Note: bound per hint family]: a row's own bound is at least the universal one, so its ratio is lower
            assert row["makespan_over_universal_bound"]["median"] >= row["makespan_over_bound"]["median"] - 1e-9
        assert rows["ready-1f1b"]["bound_family"] == "full-backward" and rows["ready-zb"]["bound_family"] == "split"
        # readiness with the 1f1b hint: the same hint in fixed order is the baseline itself
        assert rows["ready-1f1b"]["fixed_same_hint_speedup"]["median"] == pytest.approx(1.0)
    assert {"variability", "bubbles"} <= set(data["simulation"])
    for entry in data["simulation"]["bubbles"]:
        assert sum(entry["share"].values()) == pytest.approx(1.0)  # busy + every cause tiles ranks x makespan
    plots = {p.name for p in (out / "plots").iterdir()}
    for kind in ("speedup-vs-stages-language-2x", "speedup-vs-variability-multimodal-1f1b",
                 "bubbles-language-1f1b", "makespan-over-bound-multimodal"):
        assert {f"{kind}.svg", f"{kind}.png"} <= plots
    assert {"results.md", "benchmarks_section.md", "results.json"} <= set(summary["files"])
    assert "### The paper's headline settings" in (out / "results.md").read_text()


def test_section_quotes_the_command_machine_and_paper_rows(tiny):
    out, _ = tiny
    data = json.loads((out / "results.json").read_text())
    section = (out / "benchmarks_section.md").read_text()
    assert section == section_markdown(data)
    assert f"Command: `{data['command']}`" in section
    assert f"{data['machine']['cores']} cores" in section
    assert "1.77x" in section and "2.77x" in section and "1.84x" in section
    # each paper row is read only from presets of its kind: the language rows have no multimodal cell
    table = [line for line in section.splitlines() if line.startswith("| language-only, 128 stages, BF hint")]
    header = next(line for line in section.splitlines() if line.startswith("| setting | paper (cited)"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    cells = dict(zip(columns, (c.strip() for c in table[0].strip("|").split("|"))))
    assert cells["ours: multimodal"] == "-" and cells["ours: language"].endswith("@2x")
    assert all(" | multimodal | " not in line for line in section.splitlines() if line.startswith("| language-only"))
    assert "not measured in this run" in section  # the external row, with --no-external


def test_the_commit_is_the_one_the_run_started_on(tmp_path, monkeypatch):
    commits = iter(f"{n:040x}" for n in range(1, 10**6))
    fake = lambda: {"python": "3", "torch": None, "rrfp_commit": next(commits)}  # noqa: E731
    monkeypatch.setattr("profiler.bench.results.versions", fake)  # what every save's header reads
    monkeypatch.setattr("profiler.bench.suite.versions", fake)  # what the suite reads as it starts
    settings = matrix.Settings(workloads=("uniform",), ranks=(2,), seeds=1, iterations=1, tune_seconds=0,
                              real=False, external=False, variability_ranks=2, bubble_ranks=2)

    @contextlib.contextmanager
    def progress(total):
        yield lambda done, status: None

    data = run_suite(settings, tmp_path / "b", "rrfp bench", progress)
    assert data["versions"]["rrfp_commit"] == f"{1:040x}"  # later saves (several here) keep it


@pytest.mark.parametrize("args, where", [
    (["--workloads", "speech"], "--workloads"),
    (["--ranks", "8,x"], "--ranks"),
    (["--ranks", "1"], "--ranks"),
    (["--budgets", "0.5x"], "--budgets"),
    (["--budgets", ","], "--budgets"),
    (["--budgets", "1"], "slot"),  # one slot cannot hold the interleaved row's two chunks
])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, args, where):
    result = run_cli(tmp_path, "bench", "--out", str(tmp_path / "b"), "--no-real", "--no-external", *args)
    one_error(result, where)
    assert not (tmp_path / "b").exists()


def test_unwritable_or_used_folder_is_refused(tmp_path):
    file = tmp_path / "file"
    file.write_text("")
    result = run_cli(tmp_path, "bench", "--out", str(file), "--no-real", "--no-external")
    one_error(result, "is a file")
    result = run_cli(tmp_path, "bench", "--out", str(tmp_path / "missing" / "b"), "--no-real", "--no-external")
    one_error(result, "no such directory")
    used = tmp_path / "used"
    used.mkdir()
    (used / "results.json").write_text("{}")
    result = run_cli(tmp_path, "bench", "--out", str(used), "--no-real", "--no-external")
    one_error(result, "--force")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, which refuses new files")
def test_a_folder_that_cannot_be_written_is_refused_before_any_work(tmp_path):
    """Root may write anywhere by os.access's word, /proc included: the folder is created and probed."""
    result = run_cli(tmp_path, "bench", "--out", "/proc/rrfp-bench", "--no-real", "--no-external")
    one_error(result, "cannot write there")


