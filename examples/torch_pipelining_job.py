"""A plain torch.distributed.pipelining job, profiled the way torch and torchtitan users profile theirs.

No rrfp inside: this is the job ``rrfp trace import`` reads and ``rrfp tune-hint --target torch`` hands a
schedule back to (docs/traces.md, "Importing torch profiler traces"). Each rank builds its stages (a small
MLP per stage, seeded per stage), runs a built-in torch schedule or a schedule CSV loaded into torch's
``_PipelineScheduleRuntime`` (what torchtitan's ``pipeline_parallel_schedule_csv`` does), and writes
``rank{r}_trace.json`` (or ``.json.gz``) with ``torch.profiler`` around every step::

    python examples/torch_pipelining_job.py --schedule Interleaved1F1B -p 2 -m 4 --profile-dir traces/
    rrfp trace import traces/ --out imported/
    python examples/torch_pipelining_job.py --csv tuned/schedule.csv -p 2 -m 4 --losses losses.json

The last step's losses (one per iteration, summed over microbatches) are printed as JSON and written to
``--losses``: two schedules of one job must give the same losses.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import socket
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # before torch (no numpy here)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

V_SCHEDULES = {"ZBVZeroBubble", "DualPipeV"}
SINGLE_STAGE = {"1F1B", "GPipe"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", default="Interleaved1F1B", help="torch schedule name, without 'Schedule'")
    parser.add_argument("--csv", type=Path, help="run this schedule CSV (torch's compute_only format) instead")
    parser.add_argument("-p", "--ranks", type=int, default=2)
    parser.add_argument("-m", "--microbatches", type=int, default=4)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--samples", type=int, default=2, help="samples per microbatch")
    parser.add_argument("--profile-dir", type=Path, help="write rank{r}_trace.json here (the first step warms up)")
    parser.add_argument("--gzip", action="store_true", help="write rank{r}_trace.json.gz")
    parser.add_argument("--losses", type=Path, help="write the losses as JSON here")
    parser.add_argument("--timeout", type=float, default=60.0)
    return parser.parse_args(argv)


def stage_ids(args, rank: int) -> list[int]:
    """The model stages this rank holds: from the CSV's row, else the schedule's placement."""
    if args.csv is not None:
        with open(args.csv, newline="") as handle:
            rows = list(csv.reader(handle))
        return sorted({_stage_of(cell) for cell in rows[rank] if cell.strip()})
    if args.schedule in SINGLE_STAGE:
        return [rank]
    if args.schedule in V_SCHEDULES:
        return [rank, 2 * args.ranks - 1 - rank]
    return [rank, rank + args.ranks]


def build_stage(stage: int, width: int) -> nn.Module:
    torch.manual_seed(1000 + stage)
    return nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width))


def worker(rank: int, args: argparse.Namespace, port: int) -> None:
    from datetime import timedelta

    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as S

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks, timeout=timedelta(seconds=args.timeout))
    try:
        ids = stage_ids(args, rank)
        total = args.ranks * (len(ids) if args.csv is None else _stages_in_csv(args.csv))
        stages, params = [], []
        for k in ids:
            module = build_stage(k, args.width)
            params += list(module.parameters())
            example = torch.zeros(args.samples, args.width, requires_grad=k > 0)
            stages.append(PipelineStage(module, k, total, torch.device("cpu"), input_args=example,
                                        output_args=module(example)))
        loss_fn = lambda output, target: ((output - target) ** 2).mean()  # noqa: E731
        if args.csv is not None:
            schedule = S._PipelineScheduleRuntime(stages, args.microbatches, loss_fn=loss_fn, scale_grads=False)
            schedule._load_csv(str(args.csv))
        else:
            cls = getattr(S, f"Schedule{args.schedule}")
            single = issubclass(cls, S.PipelineScheduleSingle)
            schedule = cls(stages[0] if single else stages, args.microbatches, loss_fn=loss_fn, scale_grads=False)
        optimizer = torch.optim.SGD(params, lr=0.05)
        first = any(s.is_first for s in stages)
        last = any(s.is_last for s in stages)
        losses = []
        profiler = _profiler(args, rank)
        with profiler:
            for iteration in range(args.iters):
                generator = torch.Generator().manual_seed(iteration)
                batch = args.microbatches * args.samples
                x = torch.randn(batch, args.width, generator=generator)
                y = torch.randn(batch, args.width, generator=generator)
                step_losses: list = []
                schedule.step(*((x,) if first else ()), target=y if last else None,
                              losses=step_losses if last else None, return_outputs=False)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                value = torch.tensor([sum(float(v.detach()) for v in step_losses) if last else 0.0], dtype=torch.float64)
                dist.all_reduce(value)  # only the last stage's rank contributes
                losses.append(float(value))
                profiler.step()
        if rank == 0:
            print(json.dumps({"losses": losses}))
            if args.losses is not None:
                args.losses.write_text(json.dumps({"losses": losses}))
    finally:
        dist.destroy_process_group()


def _stages_in_csv(path: Path) -> int:
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    ids = {_stage_of(cell) for row in rows for cell in row if cell.strip()}
    return (max(ids) + 1) // len(rows)


def _stage_of(cell: str) -> int:
    """The stage of a CSV action (``2F5`` -> 2)."""
    return int(re.match(r"\d+", cell.strip()).group())


def _profiler(args, rank: int):
    if args.profile_dir is None:
        return _NoProfiler()
    from torch.profiler import ProfilerActivity, profile, schedule

    args.profile_dir.mkdir(parents=True, exist_ok=True)
    name = args.profile_dir / f"rank{rank}_trace.json{'.gz' if args.gzip else ''}"
    return profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=args.iters - 1,
                                                                        repeat=1),
                   on_trace_ready=lambda p: p.export_chrome_trace(str(name)))


class _NoProfiler:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def step(self) -> None:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.profile_dir is not None and args.iters < 2:
        print("error: --iters: profiling needs 2 or more (the first step warms the profiler up)", file=sys.stderr)
        return 2
    torch.multiprocessing.spawn(worker, args=(args, free_port()), nprocs=args.ranks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
