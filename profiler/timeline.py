"""A static picture of the pipeline (``rrfp trace timeline RUN --png FILE``), for a README or a paper.

One row per rank, time to the right. Each task is a box coloured by its
microbatch: forwards light, backwards (``B``, ``I``) dark, weight gradients
(``W``) medium; the canonical task text is written in boxes wide enough.
Idle time stays white, and the part of it that was *misalignment* (a task the
budget allowed was ready, beyond the dispatch cost; see [Note: bubble
categories] in :mod:`profiler.analysis`) is underlined in red, so the bubbles
readiness-first can recover stand out. The optimizer step, when the trace
records it, is a grey box after the rank's last task. Drawn with Pillow.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from hints.errors import UserError
from profiler.analysis import misalignment_gaps, traced_iterations
from profiler.reader import TraceFrames
from profiler.schema import write_atomically

PALETTE = ((66, 133, 244), (52, 168, 83), (251, 188, 5), (234, 67, 53), (171, 71, 188), (0, 172, 193),
           (255, 112, 67), (158, 157, 36), (92, 107, 192), (240, 98, 146), (38, 166, 154), (141, 110, 99))
SHADE = {"F": 0.45, "B": 1.0, "I": 1.0, "W": 0.7}
STEP = (200, 200, 200)


def _colour(microbatch: int, kind: str) -> tuple[int, int, int]:
    base = PALETTE[microbatch % len(PALETTE)]
    mix = SHADE.get(kind, 1.0)
    return tuple(int(255 - (255 - c) * mix) for c in base)


def render_timeline(frames: TraceFrames, iteration: int | None = None, width: int = 1600):
    from PIL import Image, ImageDraw, ImageFont

    iterations = traced_iterations(frames)
    if not iterations:
        raise UserError("the trace holds no tasks to draw", frames.path)
    if iteration is None:
        iteration = iterations[-1]
    if iteration not in iterations:
        raise UserError(f"iteration {iteration} is not in the trace (traced: {iterations})", "--iteration")
    tasks = frames.tasks.filter(pl.col("iteration") == iteration)
    steps = frames.steps.filter(pl.col("iteration") == iteration)
    ranks = frames.ranks
    font = ImageFont.load_default()
    left, right, top, row, gap = 70, 20, 44, 30, 8
    height = top + ranks * (row + gap) + 50
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    begin = tasks.get_column("start_ns").min()
    end = max(tasks.get_column("end_ns").max(), steps.get_column("end_ns").max() or 0)
    span = max(1, end - begin)
    scale = (width - left - right) / span

    def x(t: int) -> float:
        return left + (t - begin) * scale

    meta = next(iter(frames.meta.values()))
    title = (f"{meta.get('job')}: {meta.get('policy')} policy, hint {meta.get('hint')}, iteration {iteration}, "
             f"makespan {span / 1e6:.1f} ms")
    draw.text((left, 10), title, fill="black", font=font)
    for rank in range(ranks):
        y = top + rank * (row + gap)
        draw.text((8, y + row / 2 - 6), f"rank {rank}", fill="black", font=font)
        draw.line([(left, y + row), (width - right, y + row)], fill=(225, 225, 225))
    for rank, text, kind, mb, start, stop in tasks.select("rank", "task", "kind", "microbatch", "start_ns",
                                                          "end_ns").iter_rows():
        y = top + rank * (row + gap)
        box = [x(start), y, max(x(start) + 1, x(stop)), y + row]
        draw.rectangle(box, fill=_colour(mb, kind), outline="white")
        label_width = draw.textlength(text, font=font)
        if box[2] - box[0] > label_width + 4:
            draw.text(((box[0] + box[2] - label_width) / 2, y + row / 2 - 6), text, fill="black", font=font)
    for rank, start, stop in steps.select("rank", "start_ns", "barrier_ns").iter_rows():
        y = top + rank * (row + gap)
        draw.rectangle([x(start), y, max(x(start) + 1, x(stop)), y + row], fill=STEP, outline="white")
    gaps = misalignment_gaps(frames).filter(pl.col("iteration") == iteration)
    for rank, start, misaligned in gaps.select("rank", "misaligned_from_ns", "misaligned_ns").iter_rows():
        y = top + rank * (row + gap) + row + 2
        draw.rectangle([x(start), y, x(start + misaligned), y + 3], fill=(220, 40, 40))
    axis = top + ranks * (row + gap) + 6
    step = _tick(span)
    tick = 0
    while tick <= span:
        draw.line([(x(begin + tick), axis), (x(begin + tick), axis + 4)], fill="black")
        draw.text((x(begin + tick) - 10, axis + 6), f"{tick / 1e6:g} ms", fill="black", font=font)
        tick += step
    draw.text((left, height - 16), "colour = microbatch; light = F, dark = B/I, medium = W; "
              "grey = optimizer step; red underline = misalignment (idle while another allowed task was ready)", fill=(90, 90, 90), font=font)
    return image


def _tick(span_ns: int) -> int:
    """A round tick step giving about eight ticks."""
    raw = span_ns / 8
    magnitude = 10 ** max(0, len(str(int(raw))) - 1)
    for factor in (1, 2, 5, 10):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def save_timeline(frames: TraceFrames, path: str | Path, iteration: int | None = None, width: int = 1600) -> Path:
    image = render_timeline(frames, iteration, width)
    return write_atomically(path, lambda temporary: image.save(temporary, format="PNG"))
