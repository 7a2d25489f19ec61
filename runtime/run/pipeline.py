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
    pipe = rrfp.ReadyPipeline({stage: module, ...}, loss_fn, microbatches=8, hint="1f1b")  # group=: below
    optimizer = torch.optim.AdamW(pipe.parameters(), lr=1e-3, weight_decay=0.0)  # rrfp run's (torch's decay: 0.01)
    for step in range(steps):
        loss = pipe.step(batches)                       # list of rrfp.Batch, the same on the pipeline's ranks
        optimizer.step(); optimizer.zero_grad()         # loss: on the last stage's rank, else None
    pipe.close()

:meth:`ReadyPipeline.step` runs one iteration (every forward and backward of
this rank's stages for every microbatch) with the same executor, arbiter,
transport and hints as ``rrfp run``: each rank runs the best-ranked task
whose inputs have arrived, within the memory budget. Gradients accumulate in
the stage modules' ``.grad`` (each microbatch's loss divided by the
microbatch count, as in ``rrfp run``); the step ends with a barrier on the
pipeline's group, so the next step's messages never overtake this one's.

[Note: a pipeline inside a larger job]
    By default the pipeline is the whole ``torch.distributed`` world:
    pipeline rank = global rank. ``group=`` makes it one process group of
    a larger job instead (one pipeline per data-parallel replica, beside
    the job's own FSDP or TP groups): its members are the pipeline's
    ranks, each at its rank in the group, and everything the pipeline
    does collectively runs on that group only: the transport's set-up
    ([Note: links inside a pipeline group] in
    :mod:`runtime.comm.bootstrap`), the barrier that ends each step, and
    :meth:`ReadyPipeline.close`. Pipelines on disjoint groups therefore
    run side by side without waiting for one another, and a rank outside
    the group never has to take part. What crosses pipelines (averaging
    gradients over a DP group after :meth:`ReadyPipeline.step`, say) is
    the script's, on groups of its own. examples/pp_in_dp.py is such a
    job, checked against torch's own pipelining.
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

    ``group`` is the pipeline's process group, or a 1-D ``DeviceMesh`` of
    it (None: the whole world of ``torch.distributed``, which must be
    initialised): ``ranks`` is its size, a rank's pipeline rank (``rank``)
    its rank in it ([Note: a pipeline inside a larger job]). ``modules``
    maps each model stage this rank holds to its module (stage ``k`` lives
    on pipeline rank ``k % ranks``); modules follow [Note: the model
    protocol] in :mod:`runtime.workloads.user`: called as
    ``module(inputs, batch)``, returning a tuple. ``loss(outputs, batch)``
    is applied on the last stage. ``hint``, ``policy``, ``lookahead`` and
    ``memory_budget`` mean what ``rrfp run``'s flags of those names mean.
    """

    def __init__(self, modules: dict[int, nn.Module], loss: Callable, *, microbatches: int, chunks: int = 1,
                 hint: str | None = None, policy: str = "ready", lookahead: bool | None = None,
                 memory_budget: str = "1f1b", vision_stages: int = 0, device: torch.device | str = "cpu",
                 timeout: float = 60.0, group=None) -> None:
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
        self.group = _pipeline_group(group)
        self.rank, ranks = dist.get_rank(self.group), dist.get_world_size(self.group)  # the pipeline's
        self.device = torch.device(device)
        # RunConfig validates the options exactly as `rrfp run` does (its workload field is unused here).
        self.config = RunConfig(ranks=ranks, chunks=chunks, microbatches=microbatches, hint=hint, policy=policy,
                                lookahead=lookahead, memory_budget=memory_budget, timeout=timeout)
        graph_shape = validate_run(self.config).shape  # the hint decides whether backwards are split
        shape = run_shape(self.config)
        mine = list(shape.stages_of_rank(self.rank))
        if sorted(modules) != mine:
            where = "" if self.group is None else f" (global rank {dist.get_rank()})"
            raise UserError(f"pipeline rank {self.rank}{where} holds model stages {mine} of {shape.describe()}, "
                            f"but was given {sorted(modules)}", "ReadyPipeline")
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
        self.transport = Transport(self.rank, pipeline_links(TaskGraph.build(shape).links()), self.device, timeout,
                                   group=self.group)
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
        dist.barrier(group=self.group)
        return result.loss

    def close(self) -> None:
        """End the links (collective over the pipeline's group: every member calls it)."""
        import torch.distributed as dist

        self.transport.close()
        dist.barrier(group=self.group)
        self.transport.release()  # after the barrier: no peer still reads from a link


def _pipeline_group(group):
    """The process group of ``group=`` (None stays None: the whole world); a ``UserError`` naming
    ReadyPipeline when it is not a group this rank belongs to."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    if group is None:
        return None
    if isinstance(group, DeviceMesh):
        if group.ndim != 1:
            raise UserError(f"group= must be a process group or a 1-D DeviceMesh, got a {group.ndim}-D DeviceMesh "
                            f"(pass one dimension: mesh[\"pp\"])", "ReadyPipeline")
        if group.get_coordinate() is None:  # a mesh of other ranks: torch lets this rank hold it, idle
            raise UserError(f"global rank {dist.get_rank()} is not in the DeviceMesh given as group= (global ranks "
                            f"{group.mesh.flatten().tolist()}); pass each rank the mesh of its own pipeline",
                            "ReadyPipeline")
        group = group.get_group()
    # A ProcessGroup object holds this rank: torch gives a rank that a group leaves out NON_GROUP_MEMBER, or None
    # (new_group with use_local_synchronization, split_group), which reads as the whole world here.
    if not isinstance(group, dist.ProcessGroup):
        if group == dist.GroupMember.NON_GROUP_MEMBER:
            raise UserError(f"group= is GroupMember.NON_GROUP_MEMBER: global rank {dist.get_rank()} is not in "
                            "the group (what dist.new_group returns to the ranks it leaves out); pass each rank "
                            "the group of its own pipeline", "ReadyPipeline")
        raise UserError(f"group= must be a torch.distributed ProcessGroup or a 1-D DeviceMesh, got "
                        f"{type(group).__name__}", "ReadyPipeline")
    return group


__all__ = ["ReadyPipeline"]
