"""`rrfp bench`: the chart module, a tiny matrix end to end, the results schema, bad input, the section."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from PIL import Image

from profiler import bench, bench_runs
from profiler.bench_report import section_markdown
from profiler.charts import HEIGHT, WIDTH, BarChart, Bars, LineChart, Series, nice_ticks, save_chart
from tests.test_trace_commands import one_error, rrfp

SVG = "{http://www.w3.org/2000/svg}"


def test_line_chart_svg_is_xml_with_lines_markers_whiskers_and_legend(tmp_path):
    chart = LineChart("speedup", "ranks", "x", [
        Series("ready-1f1b", [(3, 1.0), (4, 1.2), (5, 1.4)], [(0.9, 1.1), (1.1, 1.3), (1.3, 1.5)]),
        Series("fixed zb", [(3, 1.1), (4, 1.1), (5, 1.2)], dashed=True)], [(3, "8"), (4, "16"), (5, "32")], 1.0)
    svg, png = save_chart(chart, tmp_path / "c")
    root = ET.parse(svg).getroot()
    rects = root.findall(f"{SVG}rect")
    lines = root.findall(f"{SVG}line")
    assert sum(r.get("class") == "marker" for r in rects) == 6
    assert sum(l.get("class") == "spread" for l in lines) == 9  # a whisker and two caps per point
    assert sum(l.get("class") == "reference" for l in lines) == 1
    assert sum(l.get("class") == "line" for l in lines) > 2 + 2  # solid segments, and dashes along the dashed line
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert {"ready-1f1b", "fixed zb", "8", "16", "32", "speedup"} <= set(texts)
    assert Image.open(png).size == (WIDTH, HEIGHT)


def test_bar_chart_stacked_and_grouped(tmp_path):
    stacked = BarChart("idle", "share", ["a", "b"], [Bars("dep", [0.1, 0.2]), Bars("mis", [0.3, float("nan")])],
                       stacked=True)
    svg, png = save_chart(stacked, tmp_path / "s")
    rects = [r for r in ET.parse(svg).getroot().findall(f"{SVG}rect") if r.get("class") == "bar"]
    assert len(rects) == 3  # NaN draws no bar
    grouped = BarChart("bound", "x", ["a", "b", "c"], [Bars("1f1b", [1.5, 1.2, 1.1]), Bars("2x", [1.3, 1.1, 1.0])],
                       reference=1.0)
    svg, png = save_chart(grouped, tmp_path / "g")
    assert sum(r.get("class") == "bar" for r in ET.parse(svg).getroot().findall(f"{SVG}rect")) == 6
    assert Image.open(png).size == (WIDTH, HEIGHT)
    assert nice_ticks(0.93, 1.52) == [0.8, 1.0, 1.2, 1.4, 1.6]


def tiny_matrix(tmp_path, *extra):
    out = tmp_path / "bench"
    result = rrfp("bench", "--out", str(out), "--ranks", "4", "--workloads", "language,multimodal", "--seeds", "2",
                  "--iterations", "1", "--tune-seconds", "0.5", "--no-real", "--no-external", "--json", *extra)
    assert result.code == 0, result.err
    return out, json.loads(result.out)


def test_tiny_matrix_writes_every_file_with_the_schema(tmp_path):
    out, summary = tiny_matrix(tmp_path)
    data = json.loads((out / "results.json").read_text())
    assert data["schema"] == bench.SCHEMA and data["complete"] is True
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


def test_section_quotes_the_command_machine_and_paper_rows(tmp_path):
    out, _ = tiny_matrix(tmp_path)
    data = json.loads((out / "results.json").read_text())
    section = (out / "benchmarks_section.md").read_text()
    assert section == section_markdown(data)
    assert f"Command: `{data['command']}`" in section
    assert f"{data['machine']['cores']} cores" in section
    assert "1.77x" in section and "2.77x" in section and "1.84x" in section
    assert "not measured in this run" in section  # the external row, with --no-external


@pytest.mark.parametrize("args, where", [
    (["--workloads", "speech"], "--workloads"),
    (["--ranks", "8,x"], "--ranks"),
    (["--ranks", "1"], "--ranks"),
    (["--budgets", "0.5x"], "--memory-budget"),
])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, args, where):
    result = rrfp("bench", "--out", str(tmp_path / "b"), "--no-real", "--no-external", *args)
    one_error(result, where)
    assert not (tmp_path / "b").exists()


def test_unwritable_or_used_folder_is_refused(tmp_path):
    file = tmp_path / "file"
    file.write_text("")
    result = rrfp("bench", "--out", str(file), "--no-real", "--no-external")
    one_error(result, "is a file")
    result = rrfp("bench", "--out", str(tmp_path / "missing" / "b"), "--no-real", "--no-external")
    one_error(result, "no such directory")
    used = tmp_path / "used"
    used.mkdir()
    (used / "results.json").write_text("{}")
    result = rrfp("bench", "--out", str(used), "--no-real", "--no-external")
    one_error(result, "--force")


def test_the_tuned_row_says_why_it_is_skipped():
    row = next(r for r in bench.MATRIX_ROWS if r.hint == bench.TUNED)
    assert bench.row_unavailable(row, bench.Settings(tune_seconds=0)) == "--tune-seconds 0"
    assert "TUNE_MAX_RANKS" in bench.row_unavailable(row, bench.Settings(), ranks=bench.TUNE_MAX_RANKS * 2)


def test_cross_framework_output_is_parsed():
    text = """### multimodal: emulated multimodal, jitter 0.2

| runner | schedule (hint) | policy | memory budget | median step | min - max | samples/s | vs torch 1F1B | vs rrfp fixed 1f1b | peak in flight | last loss |
|---|---|---|---|---|---|---|---|---|---|---|
| torch | Schedule1F1B | fixed | - | 200.0 ms | 190.0 - 210.0 ms | 41 | 1.000x | 1.019x | 4 (by construction) | 0.01215 |
| torch | ScheduleGPipe | fixed | - | 160.0 ms | 150.0 - 170.0 ms | 44 | 1.084x | 1.104x | 16 (by construction) | 0.01215 |
| rrfp | bf | ready | 2x | 100.0 ms | 90.0 - 1,100.0 ms | 47 | 1.153x | 1.175x | 8 | 0.01215 |

### Summary: speedup over torch Schedule1F1B (median step time ratio, > 1 is faster)

| rrfp ready bf @2x | 1.2x |
"""
    cases = bench_runs.parse_cross_framework(text)
    assert [r["schedule"] for r in cases["multimodal"]["rows"]] == ["Schedule1F1B", "ScheduleGPipe", "bf"]
    assert cases["multimodal"]["rows"][2]["max_step_s"] == pytest.approx(1.1)
    (m,) = bench_runs.external_measurements({"cases": cases})
    assert m["vs_torch_1f1b"] == pytest.approx(2.0) and m["fastest_torch"] == "ScheduleGPipe"
    assert m["vs_fastest_torch"] == pytest.approx(1.6) and m["rrfp_peak_in_flight"] == "8"
