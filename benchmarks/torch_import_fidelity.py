"""How faithfully ``rrfp trace import`` reads a torch profiler trace: busy time per rank after import against the
sum of the profiler's own compute slices in the raw JSON.

Runs examples/torch_pipelining_job.py (2 ranks, gloo, CPU) under each schedule given, profiled with
torch.profiler, imports the traces, and prints per schedule and rank: the raw sum (each ``PP:`` compute
range from its first operator to its end, i.e. without the input wait), rrfp's busy time
(``rrfp trace bubbles``), and their difference. Usage::

    python benchmarks/torch_import_fidelity.py [--schedules Interleaved1F1B,ZBVZeroBubble] [-m 8]
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _cli import Parser, run

from hints.errors import HintError
from hints.files.torch_names import TORCH_SCHEDULES

REPO = Path(__file__).resolve().parents[1]


def raw_compute_ns(folder: Path) -> dict[int, int]:
    """Per rank: the sum over ``PP:`` compute ranges (F, B, I, W, OVERLAP_F_B) of end minus first operator start."""
    out = {}
    for path in sorted(folder.glob("rank*_trace.json*")):
        raw = path.read_bytes()
        data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        events = [e for e in data["traceEvents"] if e.get("ph") == "X"]
        total = 0
        for action in events:
            name = action["name"]
            if action.get("cat") != "user_annotation" or not name.startswith("PP:") or \
                    ("SEND" in name or "RECV" in name or "SHARD" in name or "REDUCE" in name):
                continue
            lo, hi = action["ts"], action["ts"] + action["dur"]
            inner = [e["ts"] for e in events if e is not action and e["tid"] == action["tid"] and lo <= e["ts"]
                     and e["ts"] + e["dur"] <= hi and not e["name"].startswith(("gloo:", "c10d::", "nccl:"))]
            total += round((hi - min(inner, default=lo)) * 1000)
        out[data["distributedInfo"]["rank"]] = total
    return out


def main(argv=None) -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", default="Interleaved1F1B,InterleavedZeroBubble,ZBVZeroBubble,DualPipeV")
    parser.add_argument("-m", "--microbatches", type=int, default=8)
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args(argv)
    schedules = args.schedules.split(",")
    for name in schedules:
        if name not in TORCH_SCHEDULES:  # the job runs torch's Schedule<NAME>, spelt as torch spells it
            parser.error(f"--schedules: {name!r} is not a torch schedule; use {', '.join(TORCH_SCHEDULES)}")
    parser.at_least(args, 1, "microbatches", "width")
    parser.at_least(args, 2, "iters")  # the profiled job's first step warms the profiler up
    from hints.files.torch_import import import_torch_schedule  # imports torch

    for name in schedules:  # torch's own shape checks (the job's 2 ranks), before any job runs
        try:
            import_torch_schedule(name, 2, args.microbatches)
        except HintError as err:
            parser.error(f"--microbatches: {err.what}")
    print("| schedule | rank | profiler compute slices (ms) | rrfp busy after import (ms) | difference |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as root:
        for name in schedules:
            traces, run = Path(root) / name, Path(root) / f"{name}-run"
            subprocess.run([sys.executable, str(REPO / "examples" / "torch_pipelining_job.py"), "--schedule", name,
                            "-p", "2", "-m", str(args.microbatches), "--iters", str(args.iters), "--width",
                            str(args.width), "--profile-dir", str(traces)], check=True, capture_output=True,
                           timeout=600)
            subprocess.run([sys.executable, "-m", "rrfp_cli", "trace", "import", str(traces), "--out", str(run)],
                           check=True, capture_output=True)
            bubbles = subprocess.run([sys.executable, "-m", "rrfp_cli", "trace", "bubbles", str(run), "--iterations",
                                      "0:", "--json"], check=True, capture_output=True, text=True)
            busy = {row["rank"]: row["busy_ns"] for row in json.loads(bubbles.stdout)["rows"]}
            for rank, raw in sorted(raw_compute_ns(traces).items()):
                mine = busy[str(rank)]
                print(f"| {name} | {rank} | {raw / 1e6:.3f} | {mine / 1e6:.3f} | {(mine - raw) / raw:+.4%} |")


if __name__ == "__main__":
    run(main)
