"""The timeline picture's palette, hatches, idle segments and panels, from the scene (its command and its SVG:
tests/inproc/test_timeline_cli.py)."""

from __future__ import annotations

import colorsys

import pytest

from profiler.analysis.bubbles import bubbles, idle_segments
from profiler.draw.timeline import Box, Panel, build_scene, hatch_strokes, task_colour
from profiler.trace.reader import read_trace
from tests.helpers.trace_builder import MISALIGNED, ONE_F_ONE_B, build_run


def test_palette_does_not_repeat_within_32_microbatches_and_kinds_differ_in_lightness():
    for kind in "FBW":
        colours = [task_colour(mb, kind) for mb in range(32)]
        assert len(set(colours)) == 32
        assert task_colour(32, kind) == colours[0]
    assert len({task_colour(5, kind) for kind in "FWB"}) == 3 and task_colour(5, "I") == task_colour(5, "B")
    # neighbours are far apart on the wheel (13/32 of it), not adjacent hues
    assert task_colour(1, "B") != task_colour(2, "B")
    for kind in "FBW":
        hues = [_hls(task_colour(mb, kind))[0] for mb in range(33)]
        for mb in range(32):
            step = (hues[mb + 1] - hues[mb]) % 1.0
            assert min(step, 1 - step) == pytest.approx(13 / 32, abs=0.01), (kind, mb)
        # the 32 hues are the wheel's 32 evenly spaced ones, each once
        assert sorted(round(h * 32) % 32 for h in hues[:32]) == list(range(32))
    # lightness by kind, whatever the microbatch: F light, W medium, B and I dark
    for mb in range(32):
        light = {kind: _hls(task_colour(mb, kind))[1] for kind in "FWBI"}
        assert light["F"] > light["W"] + 0.05 and light["W"] > light["B"] + 0.05 and light["B"] == light["I"]


def _hls(rgb: tuple[int, int, int]) -> tuple[float, float, float]:
    return colorsys.rgb_to_hls(*(channel / 255 for channel in rgb))


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
