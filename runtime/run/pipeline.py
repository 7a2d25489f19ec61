"""The readiness-first pipeline as a library: drive it from your own training script.

``rrfp run`` owns the processes, the optimizer and the outputs. A training
script that owns them itself (launched by ``torchrun``, with its own loop,
optimizer, logging and checkpoints) uses :class:`ReadyPipeline` instead, the
counterpart of ``torch.distributed.pipelining``'s ``PipelineStage`` plus a
schedule::

    import torch.distributed as dist
    import rrfp

    dist.init_process_group("gloo")                     # one process per pipeline rank
    model = my_factory(ctx)                            # or build this rank's stage modules yourself
    pipe = rrfp.ReadyPipeline({stage: module, ...}, loss_fn, microbatches=8, hint="1f1b")
    optimizer = torch.optim.AdamW(pipe.parameters(), lr=1e-3, weight_decay=0.0)  # rrfp run's (torch's decay: 0.01)
    for step in range(steps):
        loss = pipe.step(batches)                       # list of rrfp.Batch, the same on every rank
        optimizer.step(); optimizer.zero_grad()         # loss: on the last stage's rank, else None
    pipe.close()

:meth:`ReadyPipeline.step` runs one iteration (every forward and backward of
this rank's stages for every microbatch) with the same executor, arbiter,
transport and hints as ``rrfp run``: each rank runs the best-ranked task
whose inputs have arrived, within the memory budget. Gradients accumulate in
the stage modules' ``.grad`` (each microbatch's loss divided by the
microbatch count, as in ``rrfp run``); the step ends with a barrier, so the
next step's messages never overtake this one's.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from hints.errors import UserError
from runtime.workloads.user import Batch, BatchWorkload


class _StepWorkload(BatchWorkload):
    """The microbatches of the step being run, as :meth:`ReadyPipeline.step` received them."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.given: dict[int, Sequence[Batch]] = {}

    def batches(self, iteration: int) -> Sequence[Batch]:
        return self.given.pop(iteration)


class ReadyPipeline:
    """This rank's share of a readiness-first pipeline (see the module docstring).

    ``modules`` maps each model stage this rank holds to its module (stage
    ``k`` lives on rank ``k % ranks``; ``ranks`` is the world size of
    ``torch.distributed``, which must be initialised); modules follow
    [Note: the model protocol] in :mod:`runtime.workloads.user`: called as
    ``module(inputs, batch)``, returning a tuple. ``loss(outputs, batch)``
    is applied on the last stage. ``hint``, ``policy``, ``lookahead`` and
    ``memory_budget`` mean what ``rrfp run``'s flags of those names mean.
    """

    def __init__(self, modules: dict[int, nn.Module], loss: Callable, *, microbatches: int, chunks: int = 1,
                 hint: str | None = None, policy: str = "ready", lookahead: bool | None = None,
                 memory_budget: str = "1f1b", vision_stages: int = 0, device: torch.device | str = "cpu",
                 timeout: float = 60.0) -> None:
        import torch.distributed as dist

        from hints.deps import TaskGraph
        from runtime.comm.links import pipeline_links
        from runtime.comm.transport import Transport
        from runtime.config import RunConfig, run_shape
        from runtime.exec.executor import StageExecutor
        from runtime.run.plan import HintPlan, validate_run
        from runtime.sched.budget import MemoryBudget
        from runtime.sched.fixed_order import SafeAdmission

        if not dist.is_initialized():
            raise UserError("call torch.distributed.init_process_group first (one process per pipeline rank)",
                            "ReadyPipeline")
        self.rank, ranks = dist.get_rank(), dist.get_world_size()
        self.device = torch.device(device)
        # RunConfig validates the options exactly as `rrfp run` does (its workload field is unused here).
        self.config = RunConfig(ranks=ranks, chunks=chunks, microbatches=microbatches, hint=hint, policy=policy,
                                lookahead=lookahead, memory_budget=memory_budget, timeout=timeout)
        graph_shape = validate_run(self.config).shape  # the hint decides whether backwards are split
        shape = run_shape(self.config)
        mine = list(shape.stages_of_rank(self.rank))
        if sorted(modules) != mine:
            raise UserError(f"rank {self.rank} holds model stages {mine} of {shape.describe()}, but was given "
                            f"{sorted(modules)}", "ReadyPipeline")
        self.modules = {stage: module.to(self.device) for stage, module in modules.items()}
        self.workload = _StepWorkload(self.config, shape, self.device, loss, vision_stages=vision_stages)
        # cp splits the stages of the checked shape on every step: the graph below is built once, for it
        self.plan = HintPlan(self.config, self.workload, split=graph_shape)
        self.rule = self.config.rule()
        self._iteration = 0
        self.graph = TaskGraph.build(graph_shape)
        budgets = MemoryBudget.parse(memory_budget).per_rank(graph_shape) if self.rule.uses_budget else None
        self.budget = budgets[self.rank] if budgets else None
        self.safe_admission = SafeAdmission(self.graph, budgets)  # [Note: safe-state admission]
        self.transport = Transport(self.rank, pipeline_links(TaskGraph.build(shape).links()), self.device, timeout)
        self.transport.start(timeout=timeout)
        self.executor = StageExecutor(self.rank, self.graph, self.workload, self.modules, self.transport,
                                      self.device, lookahead=self.rule.lookahead)

    def parameters(self) -> Iterator[nn.Parameter]:
        """The parameters of this rank's stages (for its optimizer)."""
        for module in self.modules.values():
            yield from module.parameters()

    def step(self, batches: Sequence[Batch]) -> float | None:
        """One iteration over ``batches`` (one :class:`Batch` per microbatch, the same list on every rank).

        Returns the mean loss over the microbatches on the rank of the last stage, None on the others.
        """
        import torch.distributed as dist

        from runtime.sched.rules import make_arbiter

        iteration = self._iteration
        self.workload.given[iteration] = batches
        hint = self.plan.for_iteration(iteration)
        forecast = self.executor.forecast
        arbiter = make_arbiter(self.rule, self.graph, self.rank, hint.orders[self.rank], self.budget,
                               estimates=forecast.estimates if forecast else None, safe=self.safe_admission(hint))
        result = self.executor.run_iteration(iteration, arbiter)
        self._iteration += 1
        dist.barrier()
        return result.loss

    def close(self) -> None:
        """End the links (collective: every rank calls it)."""
        import torch.distributed as dist

        self.transport.close()
        dist.barrier()


__all__ = ["ReadyPipeline"]
