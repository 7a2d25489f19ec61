"""Write a cost table for ``rrfp simulate --cost-table`` from a JSONL file of training samples.

    python examples/cost_table.py samples.jsonl --out costs.csv
    python examples/cost_table.py pretrain.jsonl --pack 8192 --out packed.csv
    rrfp simulate --workload vlm-mixed --cost-table costs.csv -p 8 -m 32 --compare

Each line is one sample, LLaVA/ShareGPT style (``conversations``: a list of
``{"from", "value"}``), chat style (``messages``: ``{"role", "content"}``),
or plain ``text``. Optional fields: ``image`` (a path or a list of paths),
``video``, and, when known, ``image_sizes`` (``[[width, height], ...]``),
``frames`` (frames sampled from the video) or ``duration`` (seconds), and
``text_tokens`` (an exact count from your tokenizer).

How the counts are made (say so when you report numbers from them):

* text tokens: ``text_tokens`` when the record has it, else characters /
  ``--chars-per-token`` (4.0 by default, an approximation for English with
  a BPE tokenizer; pass your tokenizer's ratio);
* tiles per image: with ``image_sizes``, InternVL's dynamic tiling (the
  grid of ``--tile``-pixel tiles, at most ``--max-tiles``, whose aspect
  ratio is closest to the image's) plus one thumbnail tile when the grid has
  more than one tile; without sizes, ``--tiles-per-image``;
* frames per video: ``frames``, else ``duration x --fps`` at most
  ``--max-frames``, else ``--frames-per-video``.

``--pack N`` writes one row per packed sequence of N tokens instead
(documents in file order, cut at sequence ends; the ``documents`` column
lists each sequence's document pieces). The table format is in
docs/workloads.md. Standard library only.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile


def text_of(record: dict) -> str:
    if "conversations" in record:
        return "\n".join(str(turn.get("value", "")) for turn in record["conversations"])
    if "messages" in record:
        return "\n".join(str(turn.get("content", "")) for turn in record["messages"])
    return str(record.get("text", ""))


def grid_tiles(width: int, height: int, tile: int, max_tiles: int) -> int:
    """InternVL's dynamic tiling: the grid (i x j <= max_tiles) closest in aspect ratio, plus a thumbnail."""
    aspect = width / height
    grids = sorted({(i, j) for n in range(1, max_tiles + 1) for i in range(1, n + 1) for j in range(1, n + 1)
                    if i * j <= max_tiles}, key=lambda g: g[0] * g[1])
    best, best_diff = (1, 1), float("inf")
    for i, j in grids:
        diff = abs(aspect - i / j)
        if diff < best_diff or (diff == best_diff and width * height > 0.5 * tile * tile * i * j):
            best, best_diff = (i, j), diff
    count = best[0] * best[1]
    return count + 1 if count > 1 else 1


def sample_row(record: dict, args) -> dict:
    text = record.get("text_tokens")
    if isinstance(text, int) and text < 0:
        raise ValueError(f"text_tokens is {text}")
    if not isinstance(text, int):
        text = max(1, round(len(text_of(record)) / args.chars_per_token))
    images = record.get("image") or []
    images = [images] if isinstance(images, str) else list(images)
    sizes = record.get("image_sizes") or []
    tiles = 0
    for index in range(len(images)):
        if index < len(sizes):
            width, height = sizes[index]
            if int(width) <= 0 or int(height) <= 0:
                raise ValueError(f"image_sizes[{index}] is {sizes[index]}")
            tiles += grid_tiles(int(width), int(height), args.tile, args.max_tiles)
        else:
            tiles += args.tiles_per_image
    frames = 0
    if record.get("video"):
        if isinstance(record.get("frames"), int):
            frames = record["frames"]
        elif isinstance(record.get("duration"), (int, float)):
            frames = max(1, min(args.max_frames, int(record["duration"] * args.fps)))
        else:
            frames = args.frames_per_video
    return {"text_tokens": text, "images": len(images), "tiles": tiles, "frames": frames}


def packed_rows(rows: list[dict], length: int):
    """Text of consecutive samples cut into sequences of ``length`` tokens (a trailing partial one dropped)."""
    pieces, room = [], length
    for row in rows:
        left = row["text_tokens"]
        while left > 0:
            piece = min(left, room)
            pieces.append(piece)
            left -= piece
            room -= piece
            if room == 0:
                yield {"text_tokens": length, "documents": " ".join(map(str, pieces))}
                pieces, room = [], length


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jsonl", help="one JSON sample per line")
    parser.add_argument("--out", required=True, help="CSV to write")
    parser.add_argument("--chars-per-token", type=float, default=4.0)
    parser.add_argument("--tile", type=int, default=448, help="tile side in pixels (InternVL 448)")
    parser.add_argument("--max-tiles", type=int, default=12)
    parser.add_argument("--tiles-per-image", type=int, default=5, help="when a record has no image_sizes")
    parser.add_argument("--fps", type=float, default=1.0)
    parser.add_argument("--max-frames", type=int, default=64)
    parser.add_argument("--frames-per-video", type=int, default=32, help="when a record has no frames/duration")
    parser.add_argument("--pack", type=int, default=0, help="write packed sequences of this many tokens")
    args = parser.parse_args(argv)
    for flag, value in (("--chars-per-token", args.chars_per_token), ("--tile", args.tile),
                        ("--max-tiles", args.max_tiles), ("--fps", args.fps), ("--max-frames", args.max_frames)):
        if not value > 0:
            return fail(f"{flag}: must be > 0, got {value}")
    if args.pack < 0 or args.tiles_per_image < 0 or args.frames_per_video < 0:
        return fail("--pack, --tiles-per-image and --frames-per-video must be >= 0")
    rows = []
    try:
        with open(args.jsonl) as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    return fail(f"{args.jsonl}: line {number}: not JSON: {err}")
                if not isinstance(record, dict):
                    return fail(f"{args.jsonl}: line {number}: not a JSON object")
                try:
                    rows.append(sample_row(record, args))
                except (TypeError, ValueError, AttributeError) as err:
                    return fail(f"{args.jsonl}: line {number}: a field has an unusable value ({err})")
    except (OSError, UnicodeDecodeError) as err:
        return fail(f"{args.jsonl}: cannot read: {getattr(err, 'strerror', None) or err}")
    columns = ["text_tokens", "images", "tiles", "frames"]
    if args.pack:
        rows, columns = list(packed_rows(rows, args.pack)), ["text_tokens", "documents"]
    if not rows:
        return fail(f"{args.jsonl}: no samples (or not enough text for one packed sequence)")
    try:  # written beside --out and renamed onto it: never half a table
        temporary = tempfile.NamedTemporaryFile("w", newline="", dir=os.path.dirname(os.path.abspath(args.out)),
                                                prefix=".cost_table.", suffix=".csv", delete=False)
    except OSError as err:
        return fail(f"--out {args.out}: cannot write: {err.strerror or err}")
    try:
        with temporary:
            writer = csv.DictWriter(temporary, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(temporary.name, args.out)
    except OSError as err:
        os.unlink(temporary.name)
        return fail(f"--out {args.out}: cannot write: {err.strerror or err}")
    print(f"{args.out}: {len(rows)} rows")
    return 0


def fail(message: str) -> int:
    sys.stderr.write(f"error: {message}\n")
    return 2

if __name__ == "__main__":
    sys.exit(main())
