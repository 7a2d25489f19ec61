"""A static picture of the pipeline (``rrfp trace timeline RUN --svg FILE --png FILE``), for a README or a paper.

One row per rank, time to the right in milliseconds. Each task is a box: its
hue says the microbatch, its lightness the kind (``F`` light, ``W`` medium,
``B`` and ``I`` dark); the canonical task text is written in boxes wide
enough. The palette is 32 evenly spaced hues visited in steps of 13, so no
two of 32 consecutive microbatches share a colour and neighbours are far
apart on the colour wheel (:func:`task_colour`). Idle time between tasks is
hatched by its cause ([Note: bubble categories] in :mod:`profiler.analysis.bubbles`):
``dependency`` (nothing was ready), ``budget held`` (only admissions the
memory budget held back were ready) and ``misalignment`` (a task the budget
allowed was ready: what readiness-first could still recover), and under
``--p2p blocking`` ``rendezvous`` (a receiver had not posted); the dispatch
cost at the end of a gap stays white. The optimizer step, when the trace
records it, is a grey box after the rank's last task. A legend of swatches
sits under the picture.

Several runs (an ``rrfp run --compare`` directory, or two runs given) are
drawn as panels one above the other on one time axis: each panel starts at its
own iteration's first task, and every panel uses the same milliseconds per
pixel, so lengths compare directly.

The picture is built once as a :class:`Scene` (boxes, hatches, text, rules in
pixel coordinates) and written as SVG (text, scalable, no dependency) or PNG
(Pillow).
"""

from __future__ import annotations

import colorsys
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence
from xml.sax.saxutils import escape

import polars as pl

from hints.errors import UserError
from hints.outputs import Outputs
from profiler.analysis.bubbles import idle_segments
from profiler.analysis.windows import traced_iterations
from profiler.trace.reader import TraceFrames

RGB = tuple[int, int, int]

HUES = 32  # distinct hues: no colour repeats within this many consecutive microbatches
HUE_STEP = 13  # coprime with HUES: consecutive microbatches sit 13/32 of the wheel apart
LIGHTNESS = {"F": 0.78, "W": 0.60, "B": 0.42, "I": 0.42}
SATURATION = 0.62
STEP_FILL: RGB = (200, 200, 200)
INK: RGB = (0, 0, 0)
MUTED: RGB = (90, 90, 90)
GRID: RGB = (225, 225, 225)

# Idle causes drawn, each a hatch: (label, ink, stroke directions as (dx, dy) per unit along the stroke).
HATCHES: dict[str, tuple[str, RGB, tuple[tuple[int, int], ...]]] = {
    "rendezvous": ("rendezvous (--p2p blocking: a receiver had not posted)", (140, 60, 170), ((1, 1),)),
    "dependency": ("dependency (nothing ready)", (150, 150, 150), ((1, -1),)),
    "budget_held": ("budget held (only held-back admissions ready)", (40, 90, 200), ((1, 1),)),
    "misalignment": ("misalignment (an allowed task was ready)", (215, 35, 35), ((1, -1), (1, 1))),
}
HATCH_SPACING = 6  # pixels between strokes


def task_colour(microbatch: int, kind: str) -> RGB:
    """The box colour of a task: hue by microbatch (32 hues, see the module docstring), lightness by kind."""
    hue = (microbatch * HUE_STEP % HUES) / HUES
    red, green, blue = colorsys.hls_to_rgb(hue, LIGHTNESS.get(kind, 0.42), SATURATION)
    return round(red * 255), round(green * 255), round(blue * 255)


# -- the scene ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Box:
    x0: float
    y0: float
    x1: float
    y1: float
    fill: RGB | None = None
    hatch: str | None = None  # a key of HATCHES
    outline: RGB | None = None
    role: str = ""  # "task", "step", "idle", "swatch": what the SVG names it (class attribute)


@dataclass(frozen=True)
class Label:
    x: float
    y: float  # baseline
    text: str
    colour: RGB = INK
    anchor: str = "start"  # "start", "middle" or "end"
    bold: bool = False


@dataclass(frozen=True)
class Rule:
    x0: float
    y0: float
    x1: float
    y1: float
    colour: RGB = INK
    width: float = 1.0  # pixels
    role: str = ""  # what the SVG names it (class attribute): the charts of profiler.draw.charts name their lines


@dataclass
class Scene:
    width: int
    height: int = 0
    boxes: list[Box] = field(default_factory=list)
    labels: list[Label] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)


@dataclass(frozen=True)
class Panel:
    """One run's iteration to draw."""

    title: str
    frames: TraceFrames
    iteration: int


CHAR_WIDTH = 6.0  # pixels per character of the 11 px sans-serif text, for fitting labels into boxes
LEFT, RIGHT, ROW, GAP = 70, 20, 30, 8


def panels_for(runs: Sequence[tuple[str, TraceFrames]], iteration: int | None) -> list[Panel]:
    """The panel of each ``(title, frames)``: ``iteration``, or each trace's last traced one."""
    panels = []
    for title, frames in runs:
        iterations = traced_iterations(frames)
        if not iterations:
            raise UserError("the trace holds no tasks to draw", frames.path)
        chosen = iterations[-1] if iteration is None else iteration
        if chosen not in iterations:
            raise UserError(f"iteration {chosen} is not in the trace (traced: {iterations})", "`iteration`")
        panels.append(Panel(title, frames, chosen))
    return panels


def build_scene(panels: Sequence[Panel], width: int = 1600) -> Scene:
    """The picture of ``panels`` on one time axis (see the module docstring)."""
    scene = Scene(width)
    spans = [_span(panel) for panel in panels]
    longest = max(end - begin for begin, end in spans)
    scale = (width - LEFT - RIGHT) / max(1, longest)  # pixels per ns, the same for every panel
    y = 10
    for panel, span in zip(panels, spans):
        y = _draw_panel(scene, panel, span, scale, y)
    y = _draw_axis(scene, longest, scale, y)
    scene.height = int(_draw_legend(scene, panels, y) + 10)
    return scene


def _span(panel: Panel) -> tuple[int, int]:
    tasks = panel.frames.tasks.filter(pl.col("iteration") == panel.iteration)
    steps = panel.frames.steps.filter(pl.col("iteration") == panel.iteration)
    begin = tasks.get_column("start_ns").min()
    end = max(tasks.get_column("end_ns").max(), steps.get_column("end_ns").max() or 0)
    return begin, end


def _draw_panel(scene: Scene, panel: Panel, span: tuple[int, int], scale: float, top: float) -> float:
    frames, iteration = panel.frames, panel.iteration
    tasks = frames.tasks.filter(pl.col("iteration") == iteration)
    steps = frames.steps.filter(pl.col("iteration") == iteration)
    begin, end = span
    meta = next(iter(frames.meta.values()))
    scene.labels.append(Label(LEFT, top + 12, f"{panel.title}: {meta.get('policy')} policy, hint {meta.get('hint')}, "
                              f"memory budget {meta.get('memory_budget')}, iteration {iteration}, makespan "
                              f"{(end - begin) / 1e6:.1f} ms", bold=True))
    top += 22

    def x(t: int) -> float:
        return LEFT + (t - begin) * scale

    def row(rank: int) -> float:
        return top + rank * (ROW + GAP)

    for rank in range(frames.ranks):
        scene.labels.append(Label(8, row(rank) + ROW / 2 + 4, f"rank {rank}"))
        scene.rules.append(Rule(LEFT, row(rank) + ROW, LEFT + (end - begin) * scale, row(rank) + ROW, GRID))
    idle = idle_segments(frames).filter((pl.col("iteration") == iteration) & pl.col("cause").is_in(list(HATCHES)))
    for rank, cause, start, stop in idle.select("rank", "cause", "start_ns", "end_ns").iter_rows():
        scene.boxes.append(Box(x(start), row(rank), x(stop), row(rank) + ROW, hatch=cause, role="idle"))
    for rank, text, kind, mb, start, stop in tasks.select("rank", "task", "kind", "microbatch", "start_ns",
                                                          "end_ns").iter_rows():
        box = Box(x(start), row(rank), max(x(start) + 1, x(stop)), row(rank) + ROW, task_colour(mb, kind),
                  outline=(255, 255, 255), role="task")
        scene.boxes.append(box)
        if box.x1 - box.x0 > len(text) * CHAR_WIDTH + 4:
            scene.labels.append(Label((box.x0 + box.x1) / 2, row(rank) + ROW / 2 + 4, text, anchor="middle"))
    for rank, start, stop in steps.select("rank", "start_ns", "barrier_ns").iter_rows():
        scene.boxes.append(Box(x(start), row(rank), max(x(start) + 1, x(stop)), row(rank) + ROW, STEP_FILL,
                               outline=(255, 255, 255), role="step"))
    return row(frames.ranks) + 6


def _draw_axis(scene: Scene, span: int, scale: float, top: float) -> float:
    scene.rules.append(Rule(LEFT, top, LEFT + span * scale, top))
    step = _tick(span)
    tick = 0
    while tick <= span:
        where = LEFT + tick * scale
        scene.rules.append(Rule(where, top, where, top + 4))
        scene.labels.append(Label(where, top + 16, f"{tick / 1e6:g}", anchor="middle"))
        tick += step
    scene.labels.append(Label(LEFT + span * scale, top + 30, "time since the iteration's first task (ms)",
                              MUTED, anchor="end"))
    return top + 40


def _draw_legend(scene: Scene, panels: Sequence[Panel], top: float) -> float:
    """Swatches: microbatch hues, kind lightness, the optimizer step, and one per idle cause drawn."""
    size, x = 12, float(LEFT)
    microbatches = min(HUES, max(p.frames.tasks.get_column("microbatch").max() + 1 for p in panels))
    scene.labels.append(Label(8, top + size, "microbatch", MUTED))
    for mb in range(microbatches):
        scene.boxes.append(Box(x, top, x + size, top + size, task_colour(mb, "B"), role="swatch"))
        if mb % 4 == 0:
            scene.labels.append(Label(x + size / 2, top + size + 12, str(mb), MUTED, anchor="middle"))
        x += size + 2
    if microbatches == HUES:
        scene.labels.append(Label(x + 4, top + size, "(repeats every 32)", MUTED))
    top += size + 22
    x = float(LEFT)
    scene.labels.append(Label(8, top + size, "kind", MUTED))
    for kind, name in (("F", "F forward"), ("W", "W weight gradient"), ("B", "B / I backward")):
        scene.boxes.append(Box(x, top, x + size, top + size, task_colour(0, kind), role="swatch"))
        scene.labels.append(Label(x + size + 4, top + size - 1, name))
        x += size + 8 + len(name) * CHAR_WIDTH + 14
    scene.boxes.append(Box(x, top, x + size, top + size, STEP_FILL, role="swatch"))
    scene.labels.append(Label(x + size + 4, top + size - 1, "optimizer step"))
    top += size + 10
    x = float(LEFT)
    scene.labels.append(Label(8, top + size, "idle", MUTED))
    for cause, (name, _, _) in HATCHES.items():
        scene.boxes.append(Box(x, top, x + 2 * size, top + size, hatch=cause, outline=GRID, role="swatch"))
        scene.labels.append(Label(x + 2 * size + 4, top + size - 1, name))
        x += 2 * size + 8 + len(name) * CHAR_WIDTH + 14
    return top + size


def _tick(span_ns: int) -> int:
    """A round tick step giving about eight ticks."""
    raw = span_ns / 8
    magnitude = 10 ** max(0, len(str(int(raw))) - 1)
    for factor in (1, 2, 5, 10):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def hatch_strokes(box: Box, direction: tuple[int, int], spacing: float = HATCH_SPACING
                  ) -> list[tuple[float, float, float, float]]:
    """The 45-degree strokes of a hatch inside ``box``, clipped to it: ``(x0, y0, x1, y1)`` each."""
    dx, dy = direction
    strokes = []
    height = box.y1 - box.y0
    # A stroke is x - s*y = c (s = dx/dy, +-1), for c every `spacing` pixels, clipped to the box.
    slope = dx / dy
    low = box.x0 - slope * (box.y1 if slope > 0 else box.y0)
    high = box.x1 - slope * (box.y0 if slope > 0 else box.y1)
    c = math.floor(low / spacing) * spacing
    while c <= high:
        points = []
        for y in (box.y0, box.y1):
            points.append((c + slope * y, y))
        (xa, ya), (xb, yb) = points
        # Clip the segment (xa, ya)-(xb, yb) to box.x0 <= x <= box.x1.
        if xa > xb:
            (xa, ya), (xb, yb) = (xb, yb), (xa, ya)
        if xb >= box.x0 and xa <= box.x1 and height > 0:
            if xa < box.x0:
                ya += (box.x0 - xa) / (xb - xa) * (yb - ya)
                xa = box.x0
            if xb > box.x1:
                yb -= (xb - box.x1) / (xb - xa) * (yb - ya)
                xb = box.x1
            strokes.append((xa, ya, xb, yb))
        c += spacing
    return strokes


# -- writers --------------------------------------------------------------------------------------


def _hex(colour: RGB) -> str:
    return "#%02x%02x%02x" % colour


def to_svg(scene: Scene) -> str:
    """The scene as a standalone SVG document."""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{scene.width}" height="{scene.height}" '
           f'viewBox="0 0 {scene.width} {scene.height}" font-family="DejaVu Sans, Arial, sans-serif" '
           f'font-size="11">', "<defs>"]
    for cause, (_, ink, directions) in HATCHES.items():
        s = HATCH_SPACING
        lines = "".join(f'<line x1="0" y1="{0 if dy * dx > 0 else s}" x2="{s}" y2="{s if dy * dx > 0 else 0}" '
                        f'stroke="{_hex(ink)}" stroke-width="1.2"/>' for dx, dy in directions)
        out.append(f'<pattern id="hatch-{cause}" patternUnits="userSpaceOnUse" width="{s}" height="{s}">{lines}'
                   f'</pattern>')
    out += ["</defs>", f'<rect width="{scene.width}" height="{scene.height}" fill="white"/>']
    for rule in scene.rules:
        width = f' stroke-width="{rule.width:g}"' if rule.width != 1.0 else ""
        role = f' class="{rule.role}"' if rule.role else ""
        out.append(f'<line{role} x1="{rule.x0:.2f}" y1="{rule.y0:.2f}" x2="{rule.x1:.2f}" y2="{rule.y1:.2f}" '
                   f'stroke="{_hex(rule.colour)}"{width}/>')
    for box in scene.boxes:
        fill = f"url(#hatch-{box.hatch})" if box.hatch else (_hex(box.fill) if box.fill else "none")
        stroke = f' stroke="{_hex(box.outline)}" stroke-width="0.5"' if box.outline else ""
        role = f' class="{box.role}"' if box.role else ""
        hatch = f' data-cause="{box.hatch}"' if box.hatch else ""
        out.append(f'<rect{role}{hatch} x="{box.x0:.2f}" y="{box.y0:.2f}" width="{max(0.0, box.x1 - box.x0):.2f}" '
                   f'height="{box.y1 - box.y0:.2f}" fill="{fill}"{stroke}/>')
    for label in scene.labels:
        weight = ' font-weight="bold"' if label.bold else ""
        out.append(f'<text x="{label.x:.2f}" y="{label.y:.2f}" text-anchor="{label.anchor}" '
                   f'fill="{_hex(label.colour)}"{weight}>{escape(label.text)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def to_png(scene: Scene):
    """The scene as a Pillow image."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", (scene.width, scene.height), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    for rule in scene.rules:
        draw.line([(rule.x0, rule.y0), (rule.x1, rule.y1)], fill=rule.colour, width=max(1, round(rule.width)))
    for box in scene.boxes:
        if box.hatch:
            _, ink, directions = HATCHES[box.hatch]
            for direction in directions:
                for x0, y0, x1, y1 in hatch_strokes(box, direction):
                    draw.line([(x0, y0), (x1, y1)], fill=ink)
            if box.outline:
                draw.rectangle([box.x0, box.y0, box.x1, box.y1], outline=box.outline)
        else:
            draw.rectangle([box.x0, box.y0, max(box.x0, box.x1), box.y1], fill=box.fill, outline=box.outline)
    for label in scene.labels:
        width = draw.textlength(label.text, font=font)
        x = label.x - {"start": 0, "middle": width / 2, "end": width}[label.anchor]
        draw.text((x, label.y - 10), label.text, fill=label.colour, font=font)
    return image


def save_timeline(runs: Sequence[tuple[str, TraceFrames]], svg: str | Path | None = None,
                  png: str | Path | None = None, iteration: int | None = None, width: int = 1600) -> list[Path]:
    """Draw ``runs`` (``(title, frames)``, one panel each) and write the SVG and/or PNG, both or neither
    ([Note: outputs written whole] in hints.outputs); the paths written."""
    scene = build_scene(panels_for(runs, iteration), width)
    with Outputs() as outputs:
        if svg is not None:
            outputs.write_text(svg, to_svg(scene))
        if png is not None:
            image = to_png(scene)
            outputs.write(png, lambda temporary: image.save(temporary, format="PNG"))
    return [Path(path) for path in (svg, png) if path is not None]


__all__ = ["HATCHES", "Scene", "build_scene", "hatch_strokes", "panels_for", "save_timeline", "task_colour",
           "to_png", "to_svg"]
