"""A training script that drives rrfp.ReadyPipeline itself (run under torchrun by tests/multiproc/test_pipeline_api.py).

    torchrun --nproc-per-node 2 -m tests.helpers.pipeline_script OUT.json HINT[,HINT...] STEPS

For each hint in turn it builds the model afresh (same seed), trains it STEPS steps through a ReadyPipeline with
that hint, and closes the pipeline. The last stage's rank writes ``{hint: [loss of every step]}`` to OUT.json.
"""

from __future__ import annotations

import itertools
import json
import sys

import torch
import torch.distributed as dist

import rrfp
from runtime.config import RunConfig
from tests.helpers.user_models import tiny

MICROBATCHES = 3


def train(rank: int, ranks: int, hint: str, steps: int) -> list[float]:
    """This rank's share of STEPS steps of the tiny model through a ReadyPipeline with ``hint``: each step's loss."""
    ctx = rrfp.ModelContext(RunConfig(workload="tests.helpers.user_models:tiny"), ranks=ranks, chunks=1,
                            microbatches=MICROBATCHES, placement=((rank, 0),), seed=0)
    model = tiny(ctx)
    pipe = rrfp.ReadyPipeline({rank: model.stages[0]}, model.loss, microbatches=MICROBATCHES, hint=hint)
    optimizer = torch.optim.AdamW(pipe.parameters(), lr=1e-3, weight_decay=0.0)
    data = iter(model.data)
    losses = []
    for _ in range(steps):
        loss = pipe.step(list(itertools.islice(data, MICROBATCHES)))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss)
    pipe.close()
    return losses


def main(out: str, hints: str, steps: int) -> None:
    dist.init_process_group("gloo")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    losses = {hint: train(rank, ranks, hint, steps) for hint in hints.split(",")}
    if rank == ranks - 1:
        with open(out, "w") as handle:
            json.dump(losses, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
