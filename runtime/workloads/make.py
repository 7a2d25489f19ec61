"""Which workload a run trains (a built-in or a user's factory), its optimizer, and the single-process reference.

:func:`make_workload` is the one place that tells a built-in name (:data:`runtime.workloads.builtin.WORKLOADS`)
from a user's ``package.module:factory`` (:mod:`runtime.workloads.user`); :func:`reference_train` runs the same
model and data unpartitioned, what the gradient-equality tests compare against.
"""

from __future__ import annotations

import torch

from hints.tasks import PipelineShape
from runtime.config import RunConfig
from runtime.workloads.base import Workload
from runtime.workloads.builtin import WORKLOADS
from runtime.workloads.user import FactoryWorkload, ParallelGroups


def make_workload(config: RunConfig, shape: PipelineShape, device: torch.device | None = None,
                  replica: int = 0, groups: ParallelGroups | None = None) -> Workload:
    """The workload of ``config``; its microbatches are generated on the CPU and moved to ``device``.

    ``replica`` (data parallelism, ``config.dp`` replicas) picks the replica's share of the data.
    ``package.module:factory`` is a user's model ([Note: the model protocol] in :mod:`runtime.workloads.user`),
    told this process's place in the TP and DP dimensions by ``groups`` (default: replica ``replica``, no
    process group).
    """
    if config.workload not in WORKLOADS:
        return FactoryWorkload(config, shape, device=device, groups=groups or ParallelGroups(
            dp=config.dp, dp_rank=replica))
    return WORKLOADS[config.workload](config, shape, device=device or torch.device("cpu"), replica=replica,
                                      replicas=config.dp)


# -- single-process reference ---------------------------------------------------


def make_optimizer(params, config: RunConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)


def reference_train(config: RunConfig, shape: PipelineShape, iters: int
                    ) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same model and data on one process, unpartitioned.

    Returns the loss of every iteration and the gradients of the *first*
    iteration, keyed ``"<stage>.<parameter name>"``. Each microbatch's loss is
    divided by the microbatch count, as in the runtime.

    A built-in workload's ``--dp`` run is compared with ``dp = 1`` and ``dp x`` the microbatches (its data is
    one stream). A user's factory gives each replica its own stream ([Note: the model protocol]), so for a
    factory ``config.dp`` is kept: an iteration trains replica 0's microbatches, then replica 1's... (the
    modules are built unsharded and undivided whatever ``config.tp``).
    """
    if config.workload in WORKLOADS:
        workloads = [make_workload(config, shape)]
    else:
        workloads = [make_workload(config, shape, replica=r) for r in range(config.dp)]
    workload = workloads[0]
    modules = [workload.build_stage(stage) for stage in range(shape.stages)]
    optimizers = [make_optimizer(m.parameters(), config) for m in modules]
    losses: list[float] = []
    first_grads: dict[str, torch.Tensor] = {}
    count = shape.microbatches * len(workloads)
    for iteration in range(iters):
        total = 0.0
        for source, mb in ((w, mb) for w in workloads for mb in range(shape.microbatches)):
            batch = source.batch(iteration, mb)
            outputs = tuple(t.detach().requires_grad_(True) for t in source.first_inputs(batch))
            for module in modules:
                outputs = module(outputs, batch)
            loss = source.loss(outputs, batch) / count
            loss.backward()
            total += loss.item()
        losses.append(total)
        if iteration == 0:
            first_grads = {f"{stage}.{name}": p.grad.detach().clone()
                           for stage, module in enumerate(modules)
                           for name, p in module.named_parameters() if p.grad is not None}
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return losses, first_grads

