"""Small charts for benchmark results (``rrfp bench``): lines and bars, written as SVG and PNG.

A chart is data (:class:`LineChart`, :class:`BarChart`): titles, series of
numbers, optional reference line. :func:`chart_scene` lays it out once as a
:class:`profiler.draw.timeline.Scene` (boxes, rules, text in pixel coordinates) and
the timeline's writers turn that scene into SVG (hand-written, no dependency)
or PNG (Pillow), so the two files always show the same picture. No
matplotlib.

Conventions: the plot area is a fixed rectangle; y runs up from its bottom
edge; the legend sits right of the plot. Colours come from :data:`PALETTE` in
series order unless a series names its own. A line series may carry a spread
per point (drawn as a whisker: p10..p90 or min..max, the caller says which
in the title) and may be dashed (``rrfp bench`` draws a hint in fixed order
dashed beside the same hint under readiness, solid, in one colour). SVG
elements carry a ``class``: ``bar``, ``marker``, ``swatch`` for boxes,
``line``, ``spread``, ``reference``, ``axis``, ``tick``, ``grid`` for rules,
so tests and scripts can find them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from hints.errors import UserError
from hints.outputs import Outputs
from profiler.draw.timeline import CHAR_WIDTH, GRID, MUTED, RGB, Box, Label, Rule, Scene, to_png, to_svg

PALETTE: tuple[RGB, ...] = (
    (31, 119, 180), (214, 39, 40), (44, 160, 44), (255, 127, 14), (148, 103, 189),
    (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207),
)
WIDTH, HEIGHT = 900, 460
PLOT_LEFT, PLOT_TOP, PLOT_RIGHT, PLOT_BOTTOM = 70, 40, 640, 390  # the plot rectangle, pixels
LEGEND_LEFT = 660
DASH, DASH_GAP = 7.0, 4.0  # pixels on and off along a dashed line


@dataclass(frozen=True)
class Series:
    """One line: ``points`` are ``(x, y)``; ``spread`` (optional) a ``(low, high)`` per point."""

    name: str
    points: Sequence[tuple[float, float]]
    spread: Sequence[tuple[float, float]] | None = None
    dashed: bool = False
    colour: RGB | None = None


@dataclass(frozen=True)
class LineChart:
    title: str
    x_label: str
    y_label: str
    series: Sequence[Series]
    x_ticks: Sequence[tuple[float, str]] | None = None  # where to put x ticks and what to write; default: numbers
    reference: float | None = None  # a horizontal line at this y (1.0: "as fast as the baseline")


@dataclass(frozen=True)
class Bars:
    """One series of bars: a value per group (NaN: no bar)."""

    name: str
    values: Sequence[float]
    colour: RGB | None = None


@dataclass(frozen=True)
class BarChart:
    title: str
    y_label: str
    groups: Sequence[str]
    bars: Sequence[Bars]
    stacked: bool = False  # stacked: the series pile up in each group; else side by side
    reference: float | None = None


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round values (1, 2 or 5 times a power of ten apart) covering ``low..high``."""
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError("ticks need finite bounds")
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(1, count)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(f * magnitude for f in (1, 2, 5, 10) if raw <= f * magnitude)
    first = math.floor(low / step + 1e-9) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < high - 1e-12:
        ticks.append(round(value, 12))
    return ticks


def _format_tick(value: float) -> str:
    return f"{value:.6g}"


def _colour(index: int, given: RGB | None) -> RGB:
    return given if given is not None else PALETTE[index % len(PALETTE)]


class _Frame:
    """The plot rectangle and the y axis: maps values to pixels and draws axes, ticks, title, legend."""

    def __init__(self, scene: Scene, title: str, y_label: str, y_values: Sequence[float], reference: float | None,
                 zero: bool) -> None:
        finite = [v for v in y_values if math.isfinite(v)]
        if reference is not None:
            finite.append(reference)
        if not finite:
            raise UserError("nothing to plot (no finite value)", title)
        low, high = min(finite), max(finite)
        if zero:
            low = min(0.0, low)
        pad = (high - low) * 0.05 or abs(high) * 0.05 or 0.5
        self.ticks = nice_ticks(low if zero else low - pad, high + pad)
        self.low, self.high = self.ticks[0], self.ticks[-1]
        self.scene = scene
        scene.labels.append(Label(PLOT_LEFT, 22, title, bold=True))
        scene.labels.append(Label(12, PLOT_TOP - 8, y_label, MUTED))
        for tick in self.ticks:
            y = self.y(tick)
            scene.rules.append(Rule(PLOT_LEFT, y, PLOT_RIGHT, y, GRID, role="grid"))
            scene.rules.append(Rule(PLOT_LEFT - 4, y, PLOT_LEFT, y, role="tick"))
            scene.labels.append(Label(PLOT_LEFT - 7, y + 4, _format_tick(tick), anchor="end"))
        scene.rules.append(Rule(PLOT_LEFT, PLOT_TOP, PLOT_LEFT, PLOT_BOTTOM, role="axis"))
        scene.rules.append(Rule(PLOT_LEFT, PLOT_BOTTOM, PLOT_RIGHT, PLOT_BOTTOM, role="axis"))
        if reference is not None:
            y = self.y(reference)
            scene.rules.append(Rule(PLOT_LEFT, y, PLOT_RIGHT, y, MUTED, width=1.5, role="reference"))
        self.legend_y = PLOT_TOP

    def y(self, value: float) -> float:
        return PLOT_BOTTOM - (value - self.low) / (self.high - self.low) * (PLOT_BOTTOM - PLOT_TOP)

    def legend(self, name: str, colour: RGB, dashed: bool = False, box: bool = False) -> None:
        y = self.legend_y
        if box:
            self.scene.boxes.append(Box(LEGEND_LEFT, y, LEGEND_LEFT + 14, y + 10, colour, role="swatch"))
        else:
            self.scene.rules.extend(_dashes(LEGEND_LEFT, y + 5, LEGEND_LEFT + 22, y + 5, colour, dashed))
        self.scene.labels.append(Label(LEGEND_LEFT + 28, y + 9, name))
        self.legend_y += 16


def _dashes(x0: float, y0: float, x1: float, y1: float, colour: RGB, dashed: bool, role: str = "line") -> list[Rule]:
    """The segment as one rule, or as dashes along it."""
    if not dashed:
        return [Rule(x0, y0, x1, y1, colour, width=2.0, role=role)]
    length = math.hypot(x1 - x0, y1 - y0)
    if length == 0:
        return []
    ux, uy = (x1 - x0) / length, (y1 - y0) / length
    rules, at = [], 0.0
    while at < length:
        end = min(length, at + DASH)
        rules.append(Rule(x0 + ux * at, y0 + uy * at, x0 + ux * end, y0 + uy * end, colour, width=2.0, role=role))
        at = end + DASH_GAP
    return rules


def line_scene(chart: LineChart) -> Scene:
    scene = Scene(WIDTH, HEIGHT)
    xs = [x for s in chart.series for x, _ in s.points]
    if chart.x_ticks:
        xs += [x for x, _ in chart.x_ticks]
    if not xs:
        raise UserError("nothing to plot (no point)", chart.title)
    ys = [y for s in chart.series for _, y in s.points]
    ys += [v for s in chart.series for pair in (s.spread or ()) for v in pair]
    frame = _Frame(scene, chart.title, chart.y_label, ys, chart.reference, zero=False)
    x_low, x_high = min(xs), max(xs)
    span = (x_high - x_low) or 1.0
    inset = 20  # pixels between the y axis and the first point

    def x(value: float) -> float:
        return PLOT_LEFT + inset + (value - x_low) / span * (PLOT_RIGHT - PLOT_LEFT - 2 * inset)

    ticks = chart.x_ticks or [(v, _format_tick(v)) for v in sorted(set(xs))]
    for value, text in ticks:
        scene.rules.append(Rule(x(value), PLOT_BOTTOM, x(value), PLOT_BOTTOM + 4, role="tick"))
        scene.labels.append(Label(x(value), PLOT_BOTTOM + 16, text, anchor="middle"))
    scene.labels.append(Label(PLOT_RIGHT, PLOT_BOTTOM + 34, chart.x_label, MUTED, anchor="end"))
    for index, series in enumerate(chart.series):
        colour = _colour(index, series.colour)
        points = [(x(a), frame.y(b)) for a, b in series.points if math.isfinite(b)]
        for (xa, ya), (xb, yb) in zip(points, points[1:]):
            scene.rules.extend(_dashes(xa, ya, xb, yb, colour, series.dashed))
        for (a, _), (low, high) in zip(series.points, series.spread or ()):
            if math.isfinite(low) and math.isfinite(high):
                xa = x(a)
                scene.rules.append(Rule(xa, frame.y(low), xa, frame.y(high), colour, role="spread"))
                for end in (low, high):
                    scene.rules.append(Rule(xa - 3, frame.y(end), xa + 3, frame.y(end), colour, role="spread"))
        for xa, ya in points:
            scene.boxes.append(Box(xa - 3, ya - 3, xa + 3, ya + 3, colour, role="marker"))
        frame.legend(series.name, colour, series.dashed)
    return scene


def bar_scene(chart: BarChart) -> Scene:
    scene = Scene(WIDTH, HEIGHT)
    groups = list(chart.groups)
    if not groups or not chart.bars:
        raise UserError("nothing to plot (no bar)", chart.title)
    if chart.stacked:
        values = [sum(v for v in column if math.isfinite(v)) for column in zip(*(b.values for b in chart.bars))]
    else:
        values = [v for b in chart.bars for v in b.values]
    frame = _Frame(scene, chart.title, chart.y_label, values, chart.reference, zero=True)
    slot = (PLOT_RIGHT - PLOT_LEFT) / len(groups)
    inner = slot * 0.8
    width = inner if chart.stacked else inner / len(chart.bars)
    for g, name in enumerate(groups):
        left = PLOT_LEFT + g * slot + (slot - inner) / 2
        # Long names alternate between two lines so neighbours do not overlap.
        lines = 2 if max(len(n) for n in groups) * CHAR_WIDTH > slot else 1
        scene.labels.append(Label(PLOT_LEFT + (g + 0.5) * slot, PLOT_BOTTOM + 16 + 13 * (g % lines), name,
                                  anchor="middle"))
        base = frame.y(0.0) if frame.low <= 0 else PLOT_BOTTOM
        for b, bars in enumerate(chart.bars):
            value = bars.values[g]
            if not math.isfinite(value):
                continue
            colour = _colour(b, bars.colour)
            if chart.stacked:
                top = base - (frame.y(0.0) - frame.y(value))
                scene.boxes.append(Box(left, top, left + width, base, colour, outline=(255, 255, 255), role="bar"))
                base = top
            else:
                x0 = left + b * width
                y0, y1 = sorted((frame.y(0.0), frame.y(value)))
                scene.boxes.append(Box(x0, y0, x0 + width, y1, colour, outline=(255, 255, 255), role="bar"))
    for b, bars in enumerate(chart.bars):
        frame.legend(bars.name, _colour(b, bars.colour), box=True)
    return scene


def chart_scene(chart: LineChart | BarChart) -> Scene:
    return line_scene(chart) if isinstance(chart, LineChart) else bar_scene(chart)


def save_chart(chart: LineChart | BarChart, stem: str | Path, outputs: Outputs | None = None) -> list[Path]:
    """Write ``stem.svg`` and ``stem.png``, both or neither ([Note: outputs written whole] in hints.outputs);
    the paths written. With ``outputs`` they are staged there, to be committed with the caller's other outputs."""
    if outputs is None:
        with Outputs() as own:
            return save_chart(chart, stem, own)
    scene = chart_scene(chart)
    stem = Path(stem)  # suffixes appended, not swapped: a stem ending "1.5x" keeps its ".5x"
    image = to_png(scene)
    svg = outputs.write_text(stem.parent / f"{stem.name}.svg", to_svg(scene))
    png = outputs.write(stem.parent / f"{stem.name}.png", lambda temporary: image.save(temporary, format="PNG"))
    return [svg, png]


__all__ = ["BarChart", "Bars", "LineChart", "PALETTE", "Series", "bar_scene", "chart_scene", "line_scene",
           "nice_ticks", "save_chart"]
