"""The per-rank executor: a thin loop plus a dispatch table from task kind to handler.

Loop (one iteration)::

    until the arbiter has run every task of this rank:
        apply arrivals (store the tensors, tell the arbiter; notices go to the forecast)
        ask the arbiter for a task; if none, sleep on the inbox until a message arrives
            (or until the arbiter's wake-up time)
        run the handler of the task's kind; route its output (local hand-off or transport)
        tell the arbiter it finished; record it

With the lookahead rule an :class:`runtime.exec.forecast.ArrivalForecast` sends and
reads the notices that predict arrivals, and keeps the duration estimates.
On a TP follower the arbiter is a :class:`runtime.exec.tp_follow.FollowerArbiter` and the
leader's DECISION messages are arrivals too ([Note: TP coordination]); ranks
and destinations here are pipeline ranks (the worker hands the executor a
:class:`runtime.comm.grid.SliceTransport`).

Handlers (``F``, ``B``, ``I``, ``W``) are small and typed; none of them knows
about time, tracing or the transport. Conventions:

* ``received[consumer task id]`` holds the tensors a task consumes from
  another stage (an activation for ``F``, an output gradient for ``B``/``I``),
  whether they came over a link or from a stage on this rank.
* ``stash[(stage, microbatch)]`` holds what a backward needs from its forward:
  the input leaves and the outputs (the loss, on the last stage).
* Each microbatch's loss is divided by the microbatch count, so gradients
  accumulated over an iteration equal those of the mean loss.

[Note: blocking p2p in the runtime]
    ``--policy fixed --p2p blocking`` runs [Note: blocking p2p] of
    :mod:`runtime.sched.simulator` (Megatron's paired blocking send/receive) on
    the same buffered transport, whose receiver threads always receive at
    once, by one small control message: after a task, the rank sends its
    outputs, then posts the receives its next task in the order needs by
    sending each input's producer rank a POSTED frame for it, then waits,
    before starting anything, until (a) a POSTED has come back for every
    output it just sent (its receiver reached the point just before the
    consuming task and waits for it) and (b) its next task's inputs have
    arrived (the fixed arbiter's own rule). After its last task it waits
    for (a) too, as Megatron's last ``send_backward`` does. A POSTED that
    comes before the output was even sent is kept and the send then does
    not wait. Why this cannot hang where the simulator completes: a rank
    waits only on a POSTED its peer sends on reaching its own post point,
    and on data its peer sends on finishing a task: the wait-for graph of
    the simulator's note, so the order completes iff the simulator says so,
    and ``rrfp run`` checks that before any rank starts
    (:func:`runtime.sched.simulator.check_completes` with the run's ``p2p``).
    What differs from NCCL: the bytes already crossed the link while the
    receiver was busy, so a receiver never pays the transfer after posting.
    The time spent in (a) is recorded (``Recorder.rendezvous``) and the
    trace's bubble analysis names it ``rendezvous``.

[Note: split backward in the runtime]
    ``I`` computes the gradients of the stage inputs with
    ``torch.autograd.grad(..., retain_graph=True)`` and sends them upstream at
    once; ``W`` later computes the parameter gradients from the retained graph
    and accumulates them. This is exact, but the ``W`` pass re-traverses the
    graph between the outputs and the parameters, so a split backward costs
    more than a fused ``B`` on real models: ``W`` about a whole ``B``
    (``benchmarks/split_cost.py``; the emulated workload sleeps ``I`` and
    ``W`` as [Note: split backward durations] in :mod:`runtime.durations.variability`
    models it, ``--split-overhead``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from hints.tasks import B, F, I, Task, W
from runtime.sched.arbiter import Arbiter
from hints.deps import TaskGraph
from runtime.exec.forecast import ArrivalForecast
from runtime.exec.recording import NullRecorder, Recorder, TaskSpan
from runtime.comm.inbox import Arrival, Decided, Notice, Posted
from runtime.comm.transport import Transport
from runtime.workloads.base import Workload

IDLE_POLL_SECONDS = 0.5  # how long the dispatcher sleeps on the inbox before re-checking faults


class InjectedFault(RuntimeError):
    """Raised by ``--fail-at`` (testing failure handling)."""


@dataclass
class IterationResult:
    iteration: int
    start_ns: int
    end_ns: int  # end of this rank's last task
    busy_ns: int
    loss: float | None  # sum over microbatches of loss / m (last stage only)
    units: int  # tokens or samples consumed by this rank's first stage
    executed: list[Task] = field(default_factory=list)
    peak_in_flight: int = 0


class StageExecutor:
    """Runs this rank's tasks, in the order its arbiter picks, on real modules."""

    def __init__(
        self,
        rank: int,
        graph: TaskGraph,
        workload: Workload,
        modules: dict[int, torch.nn.Module],
        transport: Transport | None,
        device: torch.device,
        recorder: Recorder | None = None,
        delay: Callable[[int, Task, float], float] | None = None,
        fail_at: tuple[Task, int] | None = None,
        hang_at: tuple[Task, int] | None = None,
        progress: Callable[[], None] | None = None,
        lookahead: bool = False,
        blocking: bool = False,
    ) -> None:
        self.rank = rank
        self.graph = graph
        self.shape = graph.shape
        self.workload = workload
        self.modules = modules
        self.transport = transport
        self.device = device
        self.recorder = recorder or NullRecorder()
        self.delay = delay
        self.fail_at, self.hang_at = fail_at, hang_at
        self.progress = progress or (lambda: None)
        self.handlers = {F: self._forward, B: self._backward, I: self._backward_input, W: self._backward_weight}
        # Where each task's output goes: the consumer on another *stage* (the next stage's F, or the
        # previous stage's backward); consumers on the same stage read the stash instead.
        self.data_consumer: list[int | None] = [None] * len(graph)
        for tid, task in enumerate(graph.tasks):
            for consumer in graph.local_consumers[tid] + graph.remote_consumers[tid]:
                if graph.tasks[consumer].stage != task.stage:
                    self.data_consumer[tid] = consumer
        # Notices and estimates for the lookahead rule (None: the rule is off, nothing is sent).
        self.forecast = ArrivalForecast(rank, graph, transport, self.data_consumer) if lookahead else None
        # [Note: blocking p2p in the runtime]: per task id, the producers of its inputs on other ranks; the
        # outputs sent whose receiver has not posted yet, and the POSTED frames that came before their send.
        self.blocking = blocking
        self.remote_inputs = graph.remote_producers
        self.unposted: set[int] = set()
        self.posted_early: set[int] = set()
        self.arbiter: Arbiter | None = None
        self.received: dict[int, tuple[torch.Tensor, ...]] = {}
        self.stash: dict[tuple[int, int], tuple[tuple, tuple]] = {}
        self.weight_roots: dict[tuple[int, int], tuple[tuple, tuple | None]] = {}
        self.loss_sum = 0.0
        self.iteration = 0
        self.activation_bytes = 0  # bytes held in the stash (inputs and outputs kept for backward)

    # -- the loop ---------------------------------------------------------
    def run_iteration(self, iteration: int, arbiter: Arbiter) -> IterationResult:
        self.iteration, self.arbiter = iteration, arbiter
        self.loss_sum, has_loss = 0.0, False
        recorder, graph, clock = self.recorder, self.graph, time.monotonic_ns
        start = clock()
        recorder.begin_iteration(iteration, start, arbiter.order)
        forecast = self.forecast
        if forecast is not None:
            forecast.begin(iteration, arbiter)
        busy, executed, units = 0, [], 0
        idle_since = start
        last_end = start
        rendezvous = None  # (since, messages) while sends wait for their receivers ([Note: blocking p2p in ...])
        if self.blocking:
            self.unposted.clear()
            self.posted_early.clear()
            self._post_receives(arbiter, iteration)
        while True:
            self._apply_arrivals(iteration)
            if self.unposted:
                if rendezvous is None:
                    rendezvous = (clock(), tuple((graph.tasks[t], graph.rank[self.data_consumer[t]])
                                                 for t in sorted(self.unposted)))
                self.transport.inbox.wait(IDLE_POLL_SECONDS)
                continue
            if rendezvous is not None:
                recorder.rendezvous(iteration, rendezvous[0], clock(), rendezvous[1])
                rendezvous = None
            if arbiter.done:
                break
            now = clock()
            tid = arbiter.choose(now * 1e-9)
            if tid is None:
                if self.transport is None:
                    raise RuntimeError(f"rank {self.rank}: nothing ready and no transport to wait on")
                wake = arbiter.next_wakeup()
                wait = IDLE_POLL_SECONDS if wake is None else min(IDLE_POLL_SECONDS, max(0.0, wake - now * 1e-9))
                self.transport.inbox.wait(wait)
                continue
            task = graph.tasks[tid]
            if arbiter.decisions:
                recorder.decision(iteration, arbiter.decisions.pop(), now - idle_since)
            began = clock()
            recorder.task_started(iteration, task, began)
            if forecast is not None:
                forecast.started(tid)
            self._maybe_fault(task)
            outputs = self.handlers[task.kind](task, tid)
            if self.delay is not None:
                extra = self.delay(iteration, task, (clock() - began) * 1e-9)
                if extra > 0:
                    time.sleep(extra)
            self._route(tid, outputs)
            arbiter.finish(tid)
            ended = clock()
            if forecast is not None:
                forecast.finished(tid, (ended - began) * 1e-9)
            batch = self.workload.batch(iteration, task.microbatch)
            info = {"units": batch.units, "tokens": int(batch.spec.features()["tokens"])}
            if batch.spec.images:
                info["images"] = batch.spec.image_count
            if task.kind is F and task.stage == 0:
                units += batch.units
            if task.kind is F and task.stage == self.shape.stages - 1:
                has_loss = True
            recorder.task_finished(TaskSpan(iteration, task, began, ended, began - idle_since, info))
            recorder.counters(iteration, ended, {"ready": arbiter.ready_count, "in_flight": arbiter.in_flight,
                                                 "activation_bytes": self.activation_bytes})
            busy += ended - began
            executed.append(task)
            idle_since = last_end = ended
            if self.blocking:
                self._post_receives(arbiter, iteration)
            self.progress()
        sends: list = []
        if self.transport:
            # The last messages of the iteration are about to be received (peers wait for them); waiting for
            # them here costs nothing and lets the recorder see every send of this iteration.
            self.transport.wait_sent(timeout=60.0)
            sends = self.transport.take_sent()
        recorder.end_iteration(iteration, clock(), sends)
        return IterationResult(iteration, start, last_end, busy, self.loss_sum if has_loss else None, units,
                               executed, arbiter.peak_in_flight)

    def _apply_arrivals(self, iteration: int) -> None:
        if self.transport is None:
            return
        for arrival in self.transport.inbox.drain():
            arrival: Arrival | Notice
            if isinstance(arrival, Notice):
                if self.forecast is not None and arrival.iteration == iteration:
                    self.forecast.notice(arrival, time.monotonic_ns() * 1e-9)
                continue
            if isinstance(arrival, Posted):  # [Note: blocking p2p in the runtime]
                if arrival.iteration != iteration:
                    raise RuntimeError(f"rank {self.rank}: POSTED for {arrival.producer} of iteration "
                                       f"{arrival.iteration} arrived during iteration {iteration}")
                producer = self.graph.tid(arrival.producer)
                if producer in self.unposted:
                    self.unposted.discard(producer)
                else:
                    self.posted_early.add(producer)
                self.progress()
                continue
            if isinstance(arrival, Decided):  # a TP follower: the leader's next decision ([Note: TP coordination])
                if arrival.iteration != iteration:
                    raise RuntimeError(f"rank {self.rank}: decision {arrival.index} of iteration {arrival.iteration} "
                                       f"arrived during iteration {iteration}")
                self.arbiter.follow(arrival.index, arrival.task, arrival.decided_ns, arrival.arrived_ns)
                self.progress()
                continue
            if arrival.iteration != iteration:
                raise RuntimeError(f"rank {self.rank}: message {arrival.producer} of iteration {arrival.iteration} "
                                   f"arrived during iteration {iteration}")
            producer = self.graph.tid(arrival.producer)
            consumer = self.data_consumer[producer]
            # take(): on CUDA the compute stream waits for the receive first ([Note: CUDA streams], comm/links.py)
            self.received[consumer] = tuple(t.to(self.device) for t in arrival.take())
            self.recorder.arrival(iteration, arrival)
            if self.forecast is not None:
                self.forecast.data(producer, arrival.arrived_ns * 1e-9)
            self.arbiter.available(producer)
            self.progress()

    def _route(self, tid: int, outputs: tuple[torch.Tensor, ...] | None) -> None:
        consumer = self.data_consumer[tid]
        if consumer is None or outputs is None:
            return
        destination = self.graph.rank[consumer]
        if destination == self.rank:
            self.received[consumer] = outputs
        else:
            self.transport.send(destination, self.iteration, self.graph.tasks[tid], outputs)
            if self.blocking:  # wait for its receiver to post, unless it already has
                if tid in self.posted_early:
                    self.posted_early.discard(tid)
                else:
                    self.unposted.add(tid)

    def _post_receives(self, arbiter: Arbiter, iteration: int) -> None:
        """Tell each producer rank of the next task's remote inputs that its receive is posted."""
        h = arbiter.head
        if h < len(arbiter.tids):
            graph = self.graph
            for producer in self.remote_inputs[arbiter.tids[h]]:
                self.transport.posted(graph.rank[producer], iteration, graph.tasks[producer])

    def _maybe_fault(self, task: Task) -> None:
        if (task, self.iteration) == self.fail_at:
            raise InjectedFault(f"injected failure in task {task} of iteration {self.iteration} (--fail-at)")
        if (task, self.iteration) == self.hang_at:
            while True:  # --hang-at: never return; the watchdog must notice
                time.sleep(1.0)

    def _stash(self, key: tuple[int, int], inputs: tuple, outputs: tuple) -> None:
        self.stash[key] = (inputs, outputs)
        self.activation_bytes += _nbytes(inputs) + _nbytes(outputs)

    def _unstash(self, key: tuple[int, int]) -> None:
        inputs, outputs = self.stash.pop(key)
        self.activation_bytes -= _nbytes(inputs) + _nbytes(outputs)

    # -- handlers ---------------------------------------------------------
    def _forward(self, task: Task, tid: int) -> tuple[torch.Tensor, ...] | None:
        stage, mb = task.stage, task.microbatch
        batch = self.workload.batch(self.iteration, mb)
        received = self.received.pop(tid, None)
        if received is None:
            received = tuple(t.to(self.device) for t in self.workload.first_inputs(batch)) if stage == 0 else ()
        inputs = tuple(t.detach().requires_grad_(t.is_floating_point()) for t in received)
        outputs = self.modules[stage](inputs, batch)
        if stage == self.shape.stages - 1:
            loss = self.workload.loss(outputs, batch) / self.shape.microbatches
            self.loss_sum += float(loss.detach())
            self._stash((stage, mb), inputs, (loss,))
            return None
        self._stash((stage, mb), inputs, outputs)
        return tuple(o.detach() for o in outputs)

    def _roots(self, stage: int, mb: int, tid: int) -> tuple[tuple, tuple | None, tuple]:
        inputs, outputs = self.stash[(stage, mb)]
        if stage == self.shape.stages - 1:
            return outputs, None, inputs
        grads = self.received.pop(tid)
        pairs = [(o, g) for o, g in zip(outputs, grads) if o.requires_grad]
        return tuple(o for o, _ in pairs), tuple(g for _, g in pairs), inputs

    @staticmethod
    def _input_grads(inputs: tuple, grads) -> tuple[torch.Tensor, ...]:
        return tuple(g if g is not None else torch.zeros_like(x) for x, g in zip(inputs, grads))

    def _backward(self, task: Task, tid: int) -> tuple[torch.Tensor, ...] | None:
        stage, mb = task.stage, task.microbatch
        roots, root_grads, inputs = self._roots(stage, mb, tid)
        if roots:
            torch.autograd.backward(roots, root_grads)
        self._unstash((stage, mb))
        if stage == 0:
            return None
        return self._input_grads(inputs, [x.grad for x in inputs])

    def _backward_input(self, task: Task, tid: int) -> tuple[torch.Tensor, ...] | None:
        stage, mb = task.stage, task.microbatch
        roots, root_grads, inputs = self._roots(stage, mb, tid)
        self.weight_roots[(stage, mb)] = (roots, root_grads)
        wanted = [x for x in inputs if x.requires_grad]
        grads = (torch.autograd.grad(roots, wanted, root_grads, retain_graph=True, allow_unused=True)
                 if roots and wanted else [None] * len(wanted))
        if stage == 0:
            return None
        by_input = dict(zip(map(id, wanted), grads))
        return self._input_grads(inputs, [by_input.get(id(x)) for x in inputs])

    def _backward_weight(self, task: Task, tid: int) -> None:
        stage, mb = task.stage, task.microbatch
        roots, root_grads = self.weight_roots.pop((stage, mb))
        params = [p for p in self.modules[stage].parameters() if p.requires_grad]
        if roots and params:
            grads = torch.autograd.grad(roots, params, root_grads, allow_unused=True)
            for param, grad in zip(params, grads):
                if grad is not None:
                    param.grad = grad if param.grad is None else param.grad + grad
        self._unstash((stage, mb))
        return None


def _nbytes(tensors: tuple) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
