"""`rrfp trace timeline`: the picture's content (from the scene and the SVG), its palette, hatches, panels."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from profiler.analysis.bubbles import bubbles, idle_segments
from profiler.trace.reader import read_trace
from profiler.draw.timeline import HATCHES, Box, Panel, build_scene, hatch_strokes, task_colour
from tests.helpers.cli import one_error, run_cli
from tests.helpers.trace_builder import MISALIGNED, ONE_F_ONE_B, build_run

SVG = "{http://www.w3.org/2000/svg}"


def test_palette_does_not_repeat_within_32_microbatches_and_kinds_differ_in_lightness():
    for kind in "FBW":
        colours = [task_colour(mb, kind) for mb in range(32)]
        assert len(set(colours)) == 32
        assert task_colour(32, kind) == colours[0]
    assert len({task_colour(5, kind) for kind in "FWB"}) == 3 and task_colour(5, "I") == task_colour(5, "B")
    # neighbours are far apart on the wheel (13/32 of it), not adjacent hues
    assert task_colour(1, "B") != task_colour(2, "B")


def test_idle_segments_tile_the_gaps_and_sum_to_the_bubble_columns(tmp_path):
    frames = read_trace(build_run(tmp_path / "run", **MISALIGNED))
    segments = idle_segments(frames)
    assert segments.filter(segments["cause"] == "misalignment").rows() == [(0, 0, "misalignment", 10_000, 40_000)]
    totals = bubbles(frames, dispatch_s=0.0)
    for cause in ("dependency", "misalignment", "budget_held", "dispatch"):
        for rank in (0, 1):
            mine = segments.filter((segments["rank"] == rank) & (segments["cause"] == cause))
            drawn = sum(end - start for *_, start, end in mine.rows())
            assert drawn == totals.filter(totals["rank"] == rank)[f"{cause}_ns"].item()


def test_hatch_strokes_stay_inside_their_box():
    box = Box(10.0, 20.0, 47.0, 50.0, hatch="misalignment")
    for direction in ((1, -1), (1, 1)):
        strokes = hatch_strokes(box, direction)
        assert len(strokes) >= 5
        for x0, y0, x1, y1 in strokes:
            for x, y in ((x0, y0), (x1, y1)):
                assert box.x0 - 1e-9 <= x <= box.x1 + 1e-9 and box.y0 - 1e-9 <= y <= box.y1 + 1e-9
            assert abs(abs(x1 - x0) - abs(y1 - y0)) < 1e-9  # 45 degrees


def test_svg_holds_every_task_the_idle_causes_a_legend_and_a_millisecond_axis(tmp_path):
    run = build_run(tmp_path / "run", **MISALIGNED)
    done = run_cli(tmp_path, "trace", "timeline", run, "--svg", tmp_path / "t.svg", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["written"] == [str(tmp_path / "t.svg")]
    root = ET.parse(tmp_path / "t.svg").getroot()  # well-formed XML
    rects = root.iter(f"{SVG}rect")
    classes = [(r.get("class"), r.get("data-cause")) for r in rects]
    assert classes.count(("task", None)) == 8
    assert ("idle", "misalignment") in classes and ("idle", "dependency") in classes
    assert {f"hatch-{cause}" for cause in HATCHES} <= {p.get("id") for p in root.iter(f"{SVG}pattern")}
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "0F1" in texts and "time since the iteration's first task (ms)" in texts
    assert any(text and text.startswith("misalignment") for text in texts)  # the legend names each hatch


def test_two_runs_share_one_time_axis(tmp_path):
    slow = read_trace(build_run(tmp_path / "slow", **MISALIGNED))  # 115 us
    fast = read_trace(build_run(tmp_path / "fast", **ONE_F_ONE_B))  # 90 us
    scene = build_scene([Panel("slow", slow, 0), Panel("fast", fast, 0)], width=1090)
    tasks = [b for b in scene.boxes if b.role == "task"]
    first, second = tasks[:8], tasks[8:]
    # one scale for both: the slow run fills the width (1000 px for 115 us), the fast one 90/115 of it
    assert max(b.x1 for b in first) == pytest.approx(1090 - 20)
    assert max(b.x1 for b in second) - 70 == pytest.approx(1000 * 90 / 115)
    assert min(b.y0 for b in second) > max(b.y1 for b in first)  # panels one above the other


def test_cli_draws_both_formats_and_two_panels(tmp_path):
    a, b = build_run(tmp_path / "a", **MISALIGNED), build_run(tmp_path / "b", **ONE_F_ONE_B)
    done = run_cli(tmp_path, "trace", "timeline", a, b, "--svg", tmp_path / "t.svg", "--png", tmp_path / "t.png",
                   "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["panels"] == [str(a), str(b)]  # both jobs are "hand-made": the paths tell them apart
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "t.svg").read_text().startswith("<svg")


def test_cli_needs_somewhere_to_write(tmp_path):
    run = build_run(tmp_path / "run", **MISALIGNED)
    one_error(run_cli(tmp_path, "trace", "timeline", run), "give --svg FILE and/or --png FILE")
    (tmp_path / "t.svg").write_text("mine")
    one_error(run_cli(tmp_path, "trace", "timeline", run, "--svg", tmp_path / "t.svg"), "exists; pass --force")
    assert (tmp_path / "t.svg").read_text() == "mine"
