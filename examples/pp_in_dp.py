"""A pipeline inside a larger job: 2 data-parallel replicas x 2 pipeline stages, each replica's pipeline an
``rrfp.ReadyPipeline`` on its own process group; with ``--torch``, the same job on torch's own pipelining.

Run it from the repository root (CPU and gloo are enough)::

    torchrun --nproc-per-node 4 examples/pp_in_dp.py --hint 1f1b --losses rrfp.json
    torchrun --nproc-per-node 4 examples/pp_in_dp.py --hint 1f1b,zb,cp     # each hint in turn, from the same start
    torchrun --nproc-per-node 4 examples/pp_in_dp.py --torch --losses torch.json

The job. Global rank ``r`` is stage ``r % 2`` of replica ``r // 2``: the pipeline groups are {0, 1} and {2, 3}
(one per replica: ``ReadyPipeline(..., group=)``), the data-parallel groups {0, 2} and {1, 3} (the ranks that hold
the same stage's parameters). Each stage is Linear, tanh, Linear (``--width`` wide), seeded by its stage number,
so every replica starts from the same weights. A step draws ``replicas x microbatches`` microbatches of
``--samples`` rows (x, and the target y = sin of x's columns rotated by one) from a generator seeded by the step,
and each replica takes its own share of them, ``microbatches`` consecutive ones. Then:

1. ``pipe.step(batches)``: the replica's forward and backward of every microbatch, readiness-first under the
   hint; the gradients are those of the replica's mean loss. It runs on the pipeline group only, so the two
   pipelines run side by side.
2. the gradients are averaged over the data-parallel group (an all-reduce of their sum, divided by 2): the
   gradient of the mean loss over all ``2 x microbatches`` microbatches;
3. ``AdamW(lr=1e-3, weight_decay=0)`` steps (rrfp run's optimizer).

With ``--torch`` step 1 is ``torch.distributed.pipelining``'s ``PipelineStage`` plus ``Schedule1F1B`` on the same
stage modules, the same groups and the same data (its loss_fn is the same mean squared error, its gradients
scaled by the microbatch count, as rrfp's are). The stages' shapes are given to ``PipelineStage``
(``input_args``, ``output_args``): torch's shape inference needs numpy, which this environment may lack.

Output: each replica's loss of every step (its mean over its microbatches), printed by rank 0 as JSON, and
written to ``--losses``: ``{"1f1b": [[replica 0, replica 1], ...], ...}``, keyed by hint, or by ``torch-1f1b``.
The same job run both ways gives the same losses (tests/multiproc/test_pipeline_group.py checks it).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from datetime import timedelta
from pathlib import Path

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # before torch (no numpy here)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

STAGES = 2  # pipeline stages: one per rank of a pipeline group
TORCH = "torch-1f1b"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hint", default="1f1b", help="rrfp hint(s), comma-separated: each trains from the start")
    parser.add_argument("--torch", action="store_true", help="run torch.distributed.pipelining's Schedule1F1B instead")
    parser.add_argument("-m", "--microbatches", type=int, default=4, help="microbatches per replica and step")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4, help="rows per microbatch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--losses", type=Path, help="write the losses as JSON here")
    parser.add_argument("--timeout", type=float, default=60.0)
    return parser.parse_args(argv)


def build_stage(stage: int, width: int, seed: int) -> nn.Module:
    """Stage ``stage``'s layers, the same on every replica and in both runs."""
    torch.manual_seed(seed + stage)
    return nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width))


class ReadyStage(nn.Module):
    """A stage's layers as rrfp calls a stage: ``(inputs, batch) -> tuple`` ([Note: the model protocol])."""

    def __init__(self, layers: nn.Module) -> None:
        super().__init__()
        self.layers = layers

    def forward(self, inputs, batch):
        return (self.layers(inputs[0] if inputs else batch.tensors["x"]),)


def step_data(step: int, replica: int, replicas: int, args) -> tuple[torch.Tensor, torch.Tensor]:
    """This replica's share of step ``step``: its ``microbatches x samples`` rows of x and y, microbatch by
    microbatch (replica ``r`` takes microbatches ``r*m .. r*m+m-1`` of the step's ``replicas x m``)."""
    generator = torch.Generator().manual_seed(args.seed * 100003 + step)
    rows = args.microbatches * args.samples
    x = torch.randn(replicas * rows, args.width, generator=generator)
    y = torch.sin(x.roll(1, dims=1))
    return x[replica * rows:(replica + 1) * rows], y[replica * rows:(replica + 1) * rows]


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target)


def average_gradients(module: nn.Module, dp_group, replicas: int) -> None:
    """The gradients' mean over the data-parallel group (gloo has no AVG: a sum, then a division)."""
    for parameter in module.parameters():
        dist.all_reduce(parameter.grad, group=dp_group)
        parameter.grad.div_(replicas)


def train(schedule: str, args, groups) -> list[list[float]]:
    """Train from the start with ``schedule`` (an rrfp hint, or TORCH): every replica's loss of every step."""
    rank, replicas = dist.get_rank(), dist.get_world_size() // STAGES
    stage, replica = rank % STAGES, rank // STAGES
    pp_group, dp_group = groups
    layers = build_stage(stage, args.width, args.seed)
    run_step, finish = (_torch_pipeline if schedule == TORCH else _ready_pipeline)(schedule, stage, layers,
                                                                                  pp_group, args)
    optimizer = torch.optim.AdamW(layers.parameters(), lr=1e-3, weight_decay=0.0)
    losses = []
    for step in range(args.steps):
        loss = run_step(*step_data(step, replica, replicas, args))  # the replica's mean loss on its last stage
        average_gradients(layers, dp_group, replicas)
        optimizer.step()
        optimizer.zero_grad()
        each = torch.zeros(replicas, dtype=torch.float64)
        if loss is not None:
            each[replica] = loss
        dist.all_reduce(each)  # the world's: every replica's loss on every rank, for the report
        losses.append(each.tolist())
    finish()
    return losses


def _ready_pipeline(hint: str, stage: int, layers: nn.Module, pp_group, args):
    """rrfp: one ReadyPipeline per replica, on its pipeline group."""
    import rrfp

    def loss(outputs, batch):
        return mse(outputs[0], batch.tensors["y"])

    pipe = rrfp.ReadyPipeline({stage: ReadyStage(layers)}, loss, microbatches=args.microbatches, hint=hint,
                              timeout=args.timeout, group=pp_group)

    def run_step(x: torch.Tensor, y: torch.Tensor) -> float | None:
        batches = [rrfp.Batch({"x": xs, "y": ys}, tokens=len(xs))
                   for xs, ys in zip(x.split(args.samples), y.split(args.samples))]
        return pipe.step(batches)

    return run_step, pipe.close


def _torch_pipeline(_: str, stage: int, layers: nn.Module, pp_group, args):
    """torch: a PipelineStage and Schedule1F1B per replica, on the same pipeline group."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    example = torch.zeros(args.samples, args.width, requires_grad=stage > 0)
    # not under no_grad: torch reads from the example output's requires_grad that a gradient comes back for it
    pipeline_stage = PipelineStage(layers, stage, STAGES, torch.device("cpu"), input_args=example,
                                   output_args=layers(example), group=pp_group)
    schedule = Schedule1F1B(pipeline_stage, args.microbatches, loss_fn=mse)  # scale_grads: the mean's gradient
    first, last = stage == 0, stage == STAGES - 1

    def run_step(x: torch.Tensor, y: torch.Tensor) -> float | None:
        losses: list = []
        schedule.step(*((x,) if first else ()), target=y if last else None, losses=losses if last else None,
                      return_outputs=False)
        return sum(float(value.detach()) for value in losses) / len(losses) if last else None

    return run_step, lambda: None


def main(argv=None) -> int:
    args = parse_args(argv)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    try:
        world, rank = dist.get_world_size(), dist.get_rank()
        if world % STAGES:
            if rank == 0:
                print(f"error: {world} processes: run a multiple of {STAGES} (torchrun --nproc-per-node 4)",
                      file=sys.stderr)
            return 2
        replicas = world // STAGES
        # new_group is collective over the world: every rank creates every group, in one order
        pp_groups = [dist.new_group(list(range(r * STAGES, (r + 1) * STAGES))) for r in range(replicas)]
        dp_groups = [dist.new_group(list(range(s, world, STAGES))) for s in range(STAGES)]
        groups = (pp_groups[rank // STAGES], dp_groups[rank % STAGES])
        schedules = [TORCH] if args.torch else args.hint.split(",")
        losses = {schedule: train(schedule, args, groups) for schedule in schedules}
        if rank == 0:
            print(json.dumps(losses))
            if args.losses is not None:
                args.losses.write_text(json.dumps(losses))
        return 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
