"""What a checkpoint costs on `rrfp run --workload gpt`: write time against step time, and size on disk.

    .venv/bin/python benchmarks/checkpoint_bench.py [--stages 4] [--hidden 256] [--layers-per-stage 2] [--iters 6]

One `rrfp run` (real processes, gloo, fixed 1F1B, fixed sequence length)
writes a checkpoint after every iteration (`--checkpoint-every 1`); its
`metrics.parquet` gives each iteration's step time and rank 0's checkpoint
write time (`checkpoint_seconds`: the collective DCP save, the manifest, the
rename, the deletion of the older one), both measured in the same run, so
their ratio holds on a loaded machine. Medians exclude the first iteration.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl
from _cli import Parser, run

REPO = Path(__file__).resolve().parents[1]
HEADS = 4


def rrfp(cwd: Path, *args: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "rrfp_cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)
    if done.returncode:
        raise SystemExit(f"rrfp {' '.join(args)} failed:\n{done.stderr}")


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers-per-stage", type=int, default=2)
    parser.add_argument("--iters", type=int, default=6)
    args = parser.parse_args()
    parser.at_least(args, 1, "stages", "hidden", "layers_per_stage")
    parser.at_least(args, 2, "iters")  # the medians leave the first iteration out
    if args.hidden % HEADS:
        parser.error(f"--hidden must be a multiple of {HEADS} (the model's attention heads), got {args.hidden}")
    model = ["--workload", "gpt", "--stages", str(args.stages), "--microbatches", str(2 * args.stages),
             "--hidden", str(args.hidden), "--layers-per-stage", str(args.layers_per_stage), "--heads", str(HEADS),
             "--seq-len", "64", "--policy", "fixed", "--no-trace"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rrfp(root, "run", *model, "--iters", str(args.iters), "--checkpoint-every", "1", "--out", "ckpt")
        metrics = pl.read_parquet(root / "ckpt" / "metrics.parquet")
        steady = metrics[1:]
        step = statistics.median(steady["wall_seconds"].to_list())
        write = statistics.median(steady["checkpoint_seconds"].to_list())
        (latest,) = (root / "ckpt" / "checkpoints").iterdir()
        files = list(latest.iterdir())
        size = sum(f.stat().st_size for f in files)
        manifest = json.loads((latest / "rrfp-checkpoint.json").read_text())
    print(f"# {platform.machine()}, {os.cpu_count()} cores, torch {__import__('torch').__version__}; "
          f"gpt {args.stages} stages x {args.layers_per_stage} layers, hidden {args.hidden}, "
          f"{2 * args.stages} microbatches of 2 x 64 tokens, {args.iters} iterations")
    print(f"checkpoint size on disk            {size / 2**20:8.2f} MiB ({len(files)} files)")
    print(f"median step time                   {step * 1e3:8.1f} ms")
    print(f"median checkpoint write (rank 0)   {write * 1e3:8.1f} ms  ({write / step:.2f} x a step; "
          f"DCP save alone {manifest['save_seconds'] * 1e3:.1f} ms in the last one)")


if __name__ == "__main__":
    run(main)
