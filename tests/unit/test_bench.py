"""`rrfp bench`'s pieces: the chart module (SVG and PNG), the matrix rows, the rows of cross_framework.py's JSON
and their equal-memory pairs, the real runs' jobs. The command itself: tests/inproc/test_bench.py."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from PIL import Image

from profiler.bench import matrix
from profiler.bench import runs as bench_runs
from profiler.draw.charts import HEIGHT, WIDTH, BarChart, Bars, LineChart, Series, nice_ticks, save_chart

SVG = "{http://www.w3.org/2000/svg}"


def test_line_chart_svg_is_xml_with_lines_markers_whiskers_and_legend(tmp_path):
    chart = LineChart("speedup", "ranks", "x", [
        Series("ready-1f1b", [(3, 1.0), (4, 1.2), (5, 1.4)], [(0.9, 1.1), (1.1, 1.3), (1.3, 1.5)]),
        Series("fixed zb", [(3, 1.1), (4, 1.1), (5, 1.2)], dashed=True)], [(3, "8"), (4, "16"), (5, "32")], 1.0)
    svg, png = save_chart(chart, tmp_path / "c")
    assert (svg.name, png.name) == ("c.svg", "c.png")
    assert [p.name for p in save_chart(chart, tmp_path / "s-1.5x")] == ["s-1.5x.svg", "s-1.5x.png"]  # not s-1
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


def test_the_tuned_row_says_why_it_is_skipped():
    row = next(r for r in matrix.MATRIX_ROWS if r.hint == matrix.TUNED)
    assert matrix.row_unavailable(row, matrix.Settings(tune_seconds=0)) == "--tune-seconds 0"
    assert "TUNE_MAX_RANKS" in matrix.row_unavailable(row, matrix.Settings(), ranks=matrix.TUNE_MAX_RANKS * 2)


def _xf_row(system, schedule, policy, budget, step, peak, chunks=1, placement="looping", paired_with=None,
            equal_memory=True, case="multimodal"):
    """One row as cross_framework.py's --json writes it (the fields the bench reads)."""
    return {"case": case, "system": system, "schedule": schedule, "policy": policy, "budget": budget,
            "chunks": chunks, "placement": placement, "paired_with": paired_with, "equal_memory": equal_memory,
            "median_step_s": step, "min_step_s": step, "max_step_s": step, "peak_in_flight": peak}


def test_cross_framework_json_is_read_into_measurements_and_equal_memory_pairs(tmp_path):
    rows = [
        _xf_row("torch", "Schedule1F1B", "fixed", "-", 0.200, 2, paired_with="Schedule1F1B"),
        _xf_row("torch", "ScheduleGPipe", "fixed", "-", 0.160, 4, paired_with="ScheduleGPipe"),
        _xf_row("torch", "ScheduleDualPipeV", "fixed", "-", 0.150, 5, 2, "v", "ScheduleDualPipeV"),
        _xf_row("rrfp", "1f1b", "fixed", "-", 0.190, 2, paired_with="Schedule1F1B"),
        _xf_row("rrfp", "1f1b", "ready", "1f1b", 0.180, 2, paired_with="Schedule1F1B"),
        _xf_row("rrfp", "torch:ScheduleDualPipeV", "fixed", "-", 0.140, 5, 2, "v", "ScheduleDualPipeV"),
        _xf_row("rrfp", "torch:ScheduleDualPipeV", "ready", "5", 0.120, 5, 2, "v", "ScheduleDualPipeV",
                equal_memory=False),
        _xf_row("rrfp", "bf", "ready", "2x", 0.100, 8),
    ]
    (tmp_path / "xf.json").write_text(json.dumps(rows))
    read = bench_runs.read_cross_framework(tmp_path / "xf.json")
    assert read == rows and bench_runs.read_cross_framework(tmp_path / "missing.json") == []
    (m,) = bench_runs.external_measurements(read)
    assert m["vs_torch_1f1b"] == pytest.approx(2.0) and m["fastest_torch"] == "ScheduleDualPipeV"
    assert m["vs_fastest_torch"] == pytest.approx(1.5) and m["rrfp_peak_in_flight"] == 8
    pairs = {p["torch_schedule"]: p for p in bench_runs.external_pairs(read)}
    assert pairs["Schedule1F1B"]["ready_over_fixed"] == pytest.approx(0.190 / 0.180)
    assert pairs["Schedule1F1B"]["ready_vs_torch"] == pytest.approx(0.200 / 0.180)
    assert pairs["ScheduleGPipe"]["fixed_step_s"] is None  # not run on the rrfp side: shown as "-"
    dual = pairs["ScheduleDualPipeV"]
    assert dual["equal_memory"] is False and dual["ready_budget"] == "5" and dual["chunks"] == 2
    from profiler.bench.report import external_table

    table = "\n".join(external_table({"external": {"command": "x", "measurements": [m], "pairs": list(pairs.values())}}))
    assert "ScheduleDualPipeV | torch:ScheduleDualPipeV (v=2, V)" in table and "(@5*)" in table
    assert "(@1f1b)" in table and "1.250x*" in table


def test_the_real_runs_emulate_presets_and_measure_the_blocking_baseline():
    from runtime.durations.presets import PRESETS

    emulated = [s for s in (*bench_runs.REAL_SETS, *bench_runs.QUICK_REAL_SETS) if s.workload == "emulated"]
    assert emulated and all(s.emulate in PRESETS for s in emulated)
    blocking = [r for r in bench_runs.REAL_ROWS if r.p2p == "blocking"]
    assert [(r.hint, r.policy) for r in blocking] == [("1f1b", "fixed")]
    jobs = bench_runs._jobs(bench_runs.QUICK_REAL_SETS[0], matrix.Settings.quick_defaults(), Path("/tmp/unused"))
    configs = {row.name: job.config for row, repetition, job in jobs if repetition == 0}
    assert configs["fixed-1f1b-blocking"].p2p == "blocking" and configs["fixed-1f1b"].p2p == "async"
    assert configs["ready-zb@1f1b"].emulate == "vlm-mixed" and configs["ready-zb@1f1b"].split_overhead is None
    assert "ScheduleZBVZeroBubble" in bench_runs.EXTERNAL_ARGS and "ScheduleDualPipeV" in bench_runs.EXTERNAL_ARGS
