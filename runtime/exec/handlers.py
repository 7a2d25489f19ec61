"""The executor's dispatch table: one small typed handler per task kind, and the one way to change one (wrap).

A handler runs one task's computation and returns the tensors to route to
the task's consumer on another stage (None when nothing goes on)::

    handler(iteration, task, tid) -> tuple[Tensor, ...] | None

It knows nothing of time, tracing or the transport: the loop of
:class:`runtime.exec.executor.StageExecutor` records every task once around
its handler, and routes the outputs.

:class:`HandlerTable` maps ``F``, ``B``, ``I``, ``W`` to handlers (the
computation of :class:`StageHandlers` to begin with). Whatever adds to a
task's work does it by *wrapping* handlers, through :meth:`HandlerTable.wrap`,
never by assigning into the table: the worker installs fault injection
(:func:`inject_faults`) and injected delays (:func:`delay_after`), and data
parallelism counts the gradient-writing tasks (:meth:`runtime.run.dp.GradientReducer.install`).
Wrappers nest in the order they are installed: the last one installed runs
outermost (it sees the task first and its outputs last), and
:meth:`HandlerTable.layers` names them, outermost first.

Conventions of :class:`StageHandlers`:

* ``received[consumer task id]`` holds the tensors a task consumes from
  another stage (an activation for ``F``, an output gradient for ``B``/``I``),
  whether they came over a link or from a stage on this rank.
* ``stash[(stage, microbatch)]`` holds what a backward needs from its forward:
  the input leaves and the outputs (the loss, on the last stage).
* Each microbatch's loss is divided by the microbatch count, so gradients
  accumulated over an iteration equal those of the mean loss.

``I`` and ``W`` split a backward as [Note: split backward in the runtime] in
:mod:`runtime.exec.split_backward` says: ``I`` computes the input gradients and sends them upstream at
once, keeping the gradients ``W`` starts from; ``W`` runs only the weight-gradient kernels. The
emulated workload sleeps ``I`` and ``W`` as [Note: split backward durations] in
:mod:`runtime.durations.variability` models it (``--split-overhead``).
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Mapping

import torch

from hints.tasks import B, F, I, Kind, Task, W
from runtime.exec.split_backward import PendingWeights, SplitPlans, backward_input, backward_weight
from runtime.workloads.base import Workload

Outputs = tuple[torch.Tensor, ...] | None
Handler = Callable[[int, Task, int], Outputs]  # (iteration, task, task id) -> the outputs to route
HandlerWrapper = Callable[[Handler], Handler]


class HandlerTable:
    """Task kind -> handler. Changed only by :meth:`wrap`, so every layer a task runs through is named."""

    def __init__(self, handlers: Mapping[Kind, Handler]) -> None:
        self._handlers: dict[Kind, Handler] = dict(handlers)
        self._layers: dict[Kind, list[str]] = {kind: [] for kind in self._handlers}

    def __getitem__(self, kind: Kind) -> Handler:
        return self._handlers[kind]

    def wrap(self, wrapper: HandlerWrapper, name: str, kinds: Iterable[Kind] | None = None) -> None:
        """Replace the handler of each of ``kinds`` (default: every kind) by ``wrapper(handler)``.

        The last wrapper installed runs outermost; ``name`` says what it adds (:meth:`layers`).
        """
        for kind in (self._handlers if kinds is None else kinds):
            self._handlers[kind] = wrapper(self._handlers[kind])
            self._layers[kind].insert(0, name)

    def layers(self, kind: Kind) -> list[str]:
        """The wrappers around ``kind``'s handler, outermost (run first) first."""
        return list(self._layers[kind])


class InjectedFault(RuntimeError):
    """Raised by ``--fail-at`` (testing failure handling)."""


def inject_faults(fail_at: tuple[Task, int] | None, hang_at: tuple[Task, int] | None) -> HandlerWrapper:
    """``--fail-at`` / ``--hang-at``: before running ``task`` of ``iteration``, raise, or never return (the
    watchdog must notice)."""

    def wrapper(handler: Handler) -> Handler:
        def faulty(iteration: int, task: Task, tid: int) -> Outputs:
            if (task, iteration) == fail_at:
                raise InjectedFault(f"injected failure in task {task} of iteration {iteration} (`fail_at`)")
            if (task, iteration) == hang_at:
                while True:
                    time.sleep(1.0)
            return handler(iteration, task, tid)

        return faulty

    return wrapper


def delay_after(delay: Callable[[int, Task, float], float]) -> HandlerWrapper:
    """After the task's own work, sleep ``delay(iteration, task, seconds it took)`` (``--delay``, injected noise)."""

    def wrapper(handler: Handler) -> Handler:
        def delayed(iteration: int, task: Task, tid: int) -> Outputs:
            began = time.monotonic_ns()
            outputs = handler(iteration, task, tid)
            extra = delay(iteration, task, (time.monotonic_ns() - began) * 1e-9)
            if extra > 0:
                time.sleep(extra)
            return outputs

        return delayed

    return wrapper


class StageHandlers:
    """The computation of ``F``, ``B``, ``I`` and ``W`` on this rank's stage modules, and the tensors kept
    between tasks (``received``, ``stash``; see the module docstring)."""

    def __init__(self, workload: Workload, modules: dict[int, torch.nn.Module], device: torch.device,
                 stages: int, microbatches: int) -> None:
        self.workload, self.modules, self.device = workload, modules, device
        self.last_stage, self.microbatches = stages - 1, microbatches
        self.received: dict[int, tuple[torch.Tensor, ...]] = {}
        self.stash: dict[tuple[int, int], tuple[tuple, tuple]] = {}
        self.pending_weights: dict[tuple[int, int], tuple[PendingWeights, int]] = {}  # (what W needs, its bytes)
        self.split_plans = SplitPlans()  # the split's reading of each stage graph's shape, made once
        # each stage's parameters, listed once: module.parameters() walks every submodule (about 0.05-0.09 ms on a
        # two-block stage, per I task); a stage's parameters are all in place before its first task (built, sharded
        # by a TP plan, loaded from a checkpoint in place), and a lazy module has made them in its first forward
        self._stage_params: dict[int, list[torch.Tensor]] = {}
        self.loss_sum = 0.0  # this iteration's: sum over microbatches of loss / m (last stage only)
        # bytes held for backward: the stash (inputs and outputs), and from I to W the saved gradients W starts from
        self.activation_bytes = 0

    def table(self) -> HandlerTable:
        return HandlerTable({F: self.forward, B: self.backward, I: self.backward_input, W: self.backward_weight})

    def forward(self, iteration: int, task: Task, tid: int) -> Outputs:
        stage, mb = task.stage, task.microbatch
        batch = self.workload.batch(iteration, mb)
        received = self.received.pop(tid, None)
        if received is None:
            received = tuple(t.to(self.device) for t in self.workload.first_inputs(batch)) if stage == 0 else ()
        inputs = tuple(t.detach().requires_grad_(t.is_floating_point()) for t in received)
        outputs = self.modules[stage](inputs, batch)
        if stage == self.last_stage:
            loss = self.workload.loss(outputs, batch) / self.microbatches
            self.loss_sum += float(loss.detach())
            self._stash((stage, mb), inputs, (loss,))
            return None
        self._stash((stage, mb), inputs, outputs)
        return tuple(_sendable(o.detach()) for o in outputs)

    def backward(self, iteration: int, task: Task, tid: int) -> Outputs:
        stage, mb = task.stage, task.microbatch
        roots, root_grads, inputs = self._roots(stage, mb, tid)
        if roots:
            torch.autograd.backward(roots, root_grads)
        self._unstash((stage, mb))
        if stage == 0:
            return None
        return _input_grads(inputs, [x.grad for x in inputs])

    def backward_input(self, iteration: int, task: Task, tid: int) -> Outputs:
        stage, mb = task.stage, task.microbatch
        roots, root_grads, inputs = self._roots(stage, mb, tid)
        params = self._stage_params.get(stage)
        if params is None:
            params = self._stage_params[stage] = list(self.modules[stage].parameters())
        grads, pending = backward_input(roots, root_grads, inputs, params, self.split_plans)
        held = pending.nbytes
        self.pending_weights[(stage, mb)] = (pending, held)
        self.activation_bytes += held
        if stage == 0:
            return None
        return _input_grads(inputs, grads)

    def backward_weight(self, iteration: int, task: Task, tid: int) -> None:
        stage, mb = task.stage, task.microbatch
        pending, held = self.pending_weights.pop((stage, mb))
        backward_weight(pending)
        self.activation_bytes -= held
        self._unstash((stage, mb))
        return None

    def _roots(self, stage: int, mb: int, tid: int) -> tuple[tuple, tuple | None, tuple]:
        inputs, outputs = self.stash[(stage, mb)]
        if stage == self.last_stage:
            return outputs, None, inputs
        grads = self.received.pop(tid)
        pairs = [(o, g) for o, g in zip(outputs, grads) if o.requires_grad]
        return tuple(o for o, _ in pairs), tuple(g for _, g in pairs), inputs

    def _stash(self, key: tuple[int, int], inputs: tuple, outputs: tuple) -> None:
        self.stash[key] = (inputs, outputs)
        self.activation_bytes += _nbytes(inputs) + _nbytes(outputs)

    def _unstash(self, key: tuple[int, int]) -> None:
        inputs, outputs = self.stash.pop(key)
        self.activation_bytes -= _nbytes(inputs) + _nbytes(outputs)


def _sendable(tensor: torch.Tensor) -> torch.Tensor:
    """A plain tensor for the transport: the output of a stage sharded by a TP plan can be torch's
    ``AsyncCollectiveTensor`` (a collective's result not yet waited for: ``RowwiseParallel``'s output), which
    is waited for here. The autograd graph keeps the original, in the stash."""
    if type(tensor) is torch.Tensor:
        return tensor
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    return tensor.wait() if isinstance(tensor, AsyncCollectiveTensor) else tensor


def _input_grads(inputs: tuple, grads) -> tuple[torch.Tensor, ...]:
    return tuple(g if g is not None else torch.zeros_like(x) for x, g in zip(inputs, grads))


def _nbytes(tensors: tuple) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
