"""A training script that drives rrfp.ReadyPipeline itself (run under torchrun by tests/multiproc/test_pipeline_api.py
and tests/multiproc/test_pipeline_group.py).

    torchrun --nproc-per-node 2 -m tests.helpers.pipeline_script OUT.json HINT[,HINT...] STEPS
    torchrun --nproc-per-node 3 -m tests.helpers.pipeline_script OUT.json HINT[,HINT...] STEPS --group

For each hint in turn it builds the model afresh (same seed), trains it STEPS steps through a ReadyPipeline with
that hint, and closes the pipeline. The last stage's rank writes ``{hint: [loss of every step]}`` to OUT.json.

With ``--group`` the pipeline is a 1-D ``DeviceMesh`` of the world that leaves global rank 0 out (``group=``:
pipeline rank = global rank - 1, [Note: a pipeline inside a larger job] in runtime/run/pipeline.py). Rank 0 hands
ReadyPipeline what it holds of the pipeline's group (the ``GroupMember.NON_GROUP_MEMBER`` that ``dist.new_group``
gave it, then the mesh), writes the two UserErrors' texts to OUT.json.refused, one a line, and then takes part in
nothing until the world's final barrier: if the pipeline did anything collective over the world, the job would hang.
"""

from __future__ import annotations

import itertools
import json
import sys

import torch
import torch.distributed as dist

import rrfp
from hints.errors import UserError
from runtime.config import RunConfig
from tests.helpers.user_models import tiny

MICROBATCHES = 3


def train(rank: int, ranks: int, hint: str, steps: int, group=None) -> list[float]:
    """This rank's share of STEPS steps of the tiny model through a ReadyPipeline with ``hint`` (``rank``:
    the pipeline rank): each step's loss."""
    ctx = rrfp.ModelContext(RunConfig(workload="tests.helpers.user_models:tiny"), ranks=ranks, chunks=1,
                            microbatches=MICROBATCHES, placement=((rank, 0),), seed=0)
    model = tiny(ctx)
    pipe = rrfp.ReadyPipeline({rank: model.stages[0]}, model.loss, microbatches=MICROBATCHES, hint=hint, group=group)
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


def main(out: str, hints: str, steps: int, on_group: bool) -> None:
    dist.init_process_group("gloo")
    world_rank = dist.get_rank()
    group = None
    if on_group:  # both collective over the world: every rank makes them, member or not
        from torch.distributed.device_mesh import DeviceMesh

        pipeline_ranks = list(range(1, dist.get_world_size()))
        given = [dist.new_group(pipeline_ranks), DeviceMesh("cpu", pipeline_ranks)]
        group = given[1]
    if on_group and world_rank == 0:
        with open(out + ".refused", "w") as handle:
            handle.writelines(_refusal(attempt) + "\n" for attempt in given)
    else:
        process_group = group.get_group() if group is not None else None
        rank, ranks = dist.get_rank(process_group), dist.get_world_size(process_group)
        losses = {hint: train(rank, ranks, hint, steps, group) for hint in hints.split(",")}
        if rank == ranks - 1:
            with open(out, "w") as handle:
                json.dump(losses, handle)
    dist.barrier()  # the world's, once: rank 0 has waited here all along
    dist.destroy_process_group()


def _refusal(group) -> str:
    """What ReadyPipeline says to a rank outside ``group`` ("accepted" if it says nothing)."""
    try:
        rrfp.ReadyPipeline({0: torch.nn.Identity()}, None, microbatches=MICROBATCHES, group=group)
    except UserError as err:
        return str(err)
    return "accepted"


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), "--group" in sys.argv[4:])
