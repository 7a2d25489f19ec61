"""`rrfp trace timeline` through the CLI: the SVG's content (every task, the idle causes, a legend, a millisecond
axis), both formats and two panels, and where it refuses to write. The picture itself: tests/unit/test_timeline.py."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from profiler.draw.timeline import HATCHES
from tests.helpers.cli import one_error, run_cli
from tests.helpers.trace_builder import MISALIGNED, ONE_F_ONE_B, build_run

SVG = "{http://www.w3.org/2000/svg}"


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


def test_cli_draws_both_formats_and_two_panels(tmp_path):
    a, b = build_run(tmp_path / "a", **MISALIGNED), build_run(tmp_path / "b", **ONE_F_ONE_B)
    done = run_cli(tmp_path, "trace", "timeline", a, b, "--svg", tmp_path / "t.svg", "--png", tmp_path / "t.png",
                   "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["panels"] == [str(a), str(b)]  # both jobs are "hand-made": the paths tell them apart
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "t.svg").read_text().startswith("<svg")
    # one picture in two formats: the PNG is the SVG's size, and both hold the two panels' 8 + 8 tasks
    from PIL import Image

    root = ET.parse(tmp_path / "t.svg").getroot()
    assert Image.open(tmp_path / "t.png").size == (int(root.get("width")), int(root.get("height")))
    assert [r.get("class") for r in root.iter(f"{SVG}rect")].count("task") == 16


def test_cli_needs_somewhere_to_write(tmp_path):
    run = build_run(tmp_path / "run", **MISALIGNED)
    one_error(run_cli(tmp_path, "trace", "timeline", run), "give --svg FILE and/or --png FILE")
    (tmp_path / "t.svg").write_text("mine")
    one_error(run_cli(tmp_path, "trace", "timeline", run, "--svg", tmp_path / "t.svg"), "exists; pass --force")
    assert (tmp_path / "t.svg").read_text() == "mine"
