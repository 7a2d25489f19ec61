"""Data parallelism: each stage's gradients averaged over the replicas, overlapped with the backwards left.

With ``--dp N`` the whole pipeline runs N times (replicas, :class:`runtime.comm.grid.ProcessGrid`), each on its
share of the data (:class:`runtime.workloads.base.Workload` ``replica``). Every stage's gradients must be the
mean over the replicas before the optimizer step, and a stage's gradients are final as soon as its *last*
gradient-writing task of the iteration has run (``B``; ``W`` when backwards are split; ``m`` of them per
stage). :class:`GradientReducer` counts them per stage, through a wrapper around the executor's ``B`` or
``W`` handler (installed with :meth:`runtime.exec.handlers.HandlerTable.wrap`, the table's one seam: the loop
does not change), and at the last one launches asynchronous ``torch.distributed.all_reduce`` calls on the
stage's DP group, one per *bucket* (the stage's gradients flattened in reverse registration order into
buckets of about ``bucket_bytes``, as DDP's reducer does). They run on the backend's threads while this
rank's remaining backwards (other chunks' stages) and the other ranks' drain go on;
:meth:`GradientReducer.finish`, after the rank's last task, waits for them, divides by N and writes the
gradients back.

Why not DDP itself: DDP's reducer fires from autograd hooks on ``loss.backward()`` over one module, and
needs ``no_sync`` for all but the last microbatch; a pipeline stage runs ``m`` backwards in an order the
arbiter decides, and the split ``W`` writes ``.grad`` outside autograd's accumulation, so neither its hooks
nor ``no_sync`` see the right moment. The collectives are torch's; only the trigger is ours.

Overlap (reported per iteration): ``reduce`` is the time from the first bucket's launch to the last one's
completion (completion stamped by the work's future), ``exposed`` the time the rank blocked waiting for
them after its last task; ``1 - exposed / reduce`` is the share hidden behind other work.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hints.tasks import B, Task, W
from runtime.exec.handlers import Handler, HandlerTable
from runtime.workloads.tp_layers import local_part

BUCKET_BYTES = 1 << 18


@dataclass
class ReduceStats:
    """One iteration of one rank (ns): launch of the first bucket to completion of the last, and the wait."""

    reduce_ns: int = 0
    exposed_ns: int = 0
    buckets: int = 0


class GradientReducer:
    """Averages the gradients of this rank's stages over the DP group, each stage once its last backward ran."""

    def __init__(self, modules: dict[int, torch.nn.Module], group, replicas: int, microbatches: int,
                 bucket_bytes: int = BUCKET_BYTES) -> None:
        self.group, self.replicas, self.microbatches = group, replicas, microbatches
        self.buckets: dict[int, list[list[torch.nn.Parameter]]] = {
            stage: _buckets([p for p in module.parameters() if p.requires_grad], bucket_bytes)
            for stage, module in modules.items()}
        self.left: dict[int, int] = {}
        self.pending: list[tuple[list[torch.nn.Parameter], torch.Tensor, object, list[int]]] = []
        self.launched_ns: int | None = None

    def begin_iteration(self) -> None:
        self.left = {stage: self.microbatches for stage in self.buckets}
        self.pending, self.launched_ns = [], None

    def counting(self, handler: Handler) -> Handler:
        """``handler`` (a gradient-writing one), then count its task towards its stage's reduction."""

        def counted(iteration: int, task: Task, tid: int):
            outputs = handler(iteration, task, tid)
            self.task_done(task)
            return outputs

        return counted

    def install(self, handlers: HandlerTable) -> None:
        """Wrap the executor's gradient-writing handlers, ``B`` and ``W`` (a stage's last backward task writes
        its weight gradients: ``W`` where the hint splits the stage's backward, ``B`` where it does not)."""
        handlers.wrap(self.counting, "dp", kinds=(B, W))

    def task_done(self, task: Task) -> None:
        self.left[task.stage] -= 1
        if self.left[task.stage] == 0:
            self._launch(task.stage)

    def _launch(self, stage: int) -> None:
        now = time.monotonic_ns()
        if self.launched_ns is None:
            self.launched_ns = now
        for params in self.buckets[stage]:
            flat = torch.cat([local_part(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                              for p in params])
            work = dist.all_reduce(flat, group=self.group, async_op=True)
            completed: list[int] = []
            work.get_future().then(lambda _, stamp=completed: stamp.append(time.monotonic_ns()))
            self.pending.append((params, flat, work, completed))

    def finish(self) -> ReduceStats:
        """After the rank's last task: wait for every bucket, average, write the gradients back."""
        if any(self.left.values()):
            raise RuntimeError(f"gradients of stages {[s for s, n in self.left.items() if n]} were never reduced")
        began = time.monotonic_ns()
        for _, _, work, _ in self.pending:
            work.wait()
        exposed = time.monotonic_ns() - began
        ends = []
        for params, flat, _, completed in self.pending:
            flat /= self.replicas
            offset = 0
            for p in params:  # a parameter no microbatch of this replica used gets zeros: the mean needs them
                local = local_part(p)  # a DTensor parameter (a user's TP plan): its shard, reduced as a shard
                n = local.numel()
                mean = flat[offset:offset + n].view_as(local).clone()
                p.grad = mean if local is p else _like(p, mean)
                offset += n
            ends.append(completed[0] if completed else began + exposed)
        reduce_ns = max(ends) - self.launched_ns if ends else 0
        return ReduceStats(reduce_ns, exposed, len(self.pending))


def _like(parameter, local: torch.Tensor):
    """``local`` as a DTensor placed as ``parameter`` is."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local, parameter.device_mesh, parameter.placements, run_check=False,
                              shape=parameter.shape, stride=parameter.stride())


def _buckets(params: list[torch.nn.Parameter], bucket_bytes: int) -> list[list[torch.nn.Parameter]]:
    """Parameters in reverse registration order (the order backward finishes them), cut every ``bucket_bytes``."""
    buckets, current, size = [], [], 0
    for p in reversed(params):
        current.append(p)
        size += local_part(p).numel() * p.element_size()
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets
