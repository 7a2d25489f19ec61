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

The dispatch table is a :class:`runtime.exec.handlers.HandlerTable` (``F``,
``B``, ``I``, ``W`` -> a small typed handler that knows nothing of time,
tracing or the transport). What adds to a task's work wraps its handler
there: fault injection and injected delays (installed by the worker), data
parallelism's gradient reduction (:mod:`runtime.run.dp`). The loop itself
records every task once, around its handler (``Recorder.task_started`` /
``task_finished``, named by the task's canonical text), and does only what
every task needs: the decision, the lookahead forecast's two calls, the
routing of its outputs, the arbiter's bookkeeping, counters and a progress
ping. ``--p2p blocking`` is :class:`BlockingP2P`, called at two points of the
loop (before choosing a task, and after each task). Around each handler the
loop opens the task's profiler ranges (:class:`runtime.exec.ranges.TaskRanges`):
``record_function("PP:<task>")`` while a torch profiler records, an NVTX range
on CUDA, off with ``RRFP_PROFILER_RANGES=0`` ([Note: profiler ranges] there,
with the measured cost: about 0.6 us per task when no profiler records).

[Note: blocking p2p in the runtime]
    ``--policy fixed --p2p blocking`` runs [Note: blocking p2p] of
    :mod:`runtime.sched.fixed_order` (Megatron's paired blocking send/receive) on
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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from hints.deps import TaskGraph
from hints.tasks import F, Task
from runtime.comm.inbox import Arrival, Decided, Notice, Posted
from runtime.comm.transport import Transport
from runtime.exec.forecast import ArrivalForecast
from runtime.exec.handlers import HandlerTable, Outputs, StageHandlers
from runtime.exec.ranges import TaskRanges
from runtime.exec.recording import NullRecorder, Recorder, TaskSpan
from runtime.sched.arbiter import Arbiter
from runtime.workloads.base import Workload

IDLE_POLL_SECONDS = 0.5  # how long the dispatcher sleeps on the inbox before re-checking faults


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
    spans: list[tuple[int, int, int]] = field(default_factory=list)  # (task id, start ns, end ns), this rank's clock
    arrivals: dict[int, int] = field(default_factory=dict)  # producer task id -> when its message arrived (ns)


class StageExecutor:
    """Runs this rank's tasks, in the order its arbiter picks, on real modules.

    ``handlers`` is the dispatch table (:class:`runtime.exec.handlers.HandlerTable`): wrap its handlers to
    add to every task of a kind; ``compute`` the computation the table starts from and the tensors it keeps.
    ``ranges``: the tasks' profiler ranges on or off; None reads ``RRFP_PROFILER_RANGES`` ([Note: profiler
    ranges] in :mod:`runtime.exec.ranges`).
    """

    def __init__(
        self,
        rank: int,
        graph: TaskGraph,
        workload: Workload,
        modules: dict[int, torch.nn.Module],
        transport: Transport | None,
        device: torch.device,
        recorder: Recorder | None = None,
        progress: Callable[[], None] | None = None,
        lookahead: bool = False,
        blocking: bool = False,
        ranges: bool | None = None,
    ) -> None:
        self.rank = rank
        self.graph = graph
        self.shape = graph.shape
        self.workload = workload
        self.transport = transport
        self.device = device
        self.recorder = recorder or NullRecorder()
        self.progress = progress or (lambda: None)
        self.compute = StageHandlers(workload, modules, device, self.shape.stages, self.shape.microbatches)
        self.handlers: HandlerTable = self.compute.table()
        self.ranges = TaskRanges(device, ranges)  # [Note: profiler ranges]
        # Where each task's output goes: the consumer on another *stage* (the next stage's F, or the
        # previous stage's backward); consumers on the same stage read the stash instead.
        self.data_consumer: list[int | None] = [None] * len(graph)
        for tid, task in enumerate(graph.tasks):
            for consumer in graph.local_consumers[tid] + graph.remote_consumers[tid]:
                if graph.tasks[consumer].stage != task.stage:
                    self.data_consumer[tid] = consumer
        # Notices and estimates for the lookahead rule (None: the rule is off, nothing is sent).
        self.forecast = ArrivalForecast(rank, graph, transport, self.data_consumer) if lookahead else None
        self.blocking = (BlockingP2P(rank, graph, transport, self.data_consumer, self.recorder)
                         if blocking else None)
        self.arbiter: Arbiter | None = None
        self.arrived: dict[int, int] = {}  # this iteration: producer task id -> arrival (ns), for --policy auto
        self.iteration = 0

    # -- the loop ---------------------------------------------------------
    def run_iteration(self, iteration: int, arbiter: Arbiter) -> IterationResult:
        self.iteration, self.arbiter = iteration, arbiter
        self.compute.loss_sum = 0.0
        recorder, forecast, blocking = self.recorder, self.forecast, self.blocking
        start = time.monotonic_ns()
        recorder.begin_iteration(iteration, start, arbiter.order)
        if forecast is not None:
            forecast.begin(iteration, arbiter)
        tally = _Tally(start, self.shape.stages - 1)
        self.arrived = {}
        if blocking is not None:
            blocking.begin(arbiter, iteration)
        while True:
            self._apply_arrivals(iteration)
            if blocking is not None and blocking.holds(iteration):
                continue
            if arbiter.done:
                break
            now = time.monotonic_ns()
            tid = arbiter.choose(now * 1e-9)
            if tid is None:
                self._wait_for_arrivals(arbiter, now)
                continue
            self._run_task(iteration, arbiter, tid, now, tally)
        sends: list = []
        if self.transport:
            # The last messages of the iteration are about to be received (peers wait for them); waiting for
            # them here costs nothing and lets the recorder see every send of this iteration.
            self.transport.wait_sent(timeout=60.0)
            sends = self.transport.take_sent()
        recorder.end_iteration(iteration, time.monotonic_ns(), sends)
        return IterationResult(iteration, start, tally.last_end, tally.busy,
                               self.compute.loss_sum if tally.has_loss else None, tally.units, tally.executed,
                               arbiter.peak_in_flight, tally.spans, self.arrived)

    def _run_task(self, iteration: int, arbiter: Arbiter, tid: int, now: int, tally: "_Tally") -> None:
        """One task, recorded once around its handler: decision, start, handler, route, finish, span, counters."""
        recorder, clock, forecast = self.recorder, time.monotonic_ns, self.forecast
        task = self.graph.tasks[tid]
        if arbiter.decisions:
            recorder.decision(iteration, arbiter.decisions.pop(), now - tally.idle_since)
        began = clock()
        recorder.task_started(iteration, task, began)
        if forecast is not None:
            forecast.started(tid)
        with self.ranges.around(task):  # [Note: profiler ranges]: PP:<task>, as torch's schedules name it
            outputs = self.handlers[task.kind](iteration, task, tid)
        self._route(tid, outputs)
        arbiter.finish(tid)
        ended = clock()
        if forecast is not None:
            forecast.finished(tid, (ended - began) * 1e-9)
        batch = self.workload.batch(iteration, task.microbatch)
        recorder.task_finished(TaskSpan(iteration, task, began, ended, began - tally.idle_since, _span_info(batch)))
        recorder.counters(iteration, ended, {"ready": arbiter.ready_count, "in_flight": arbiter.in_flight,
                                             "activation_bytes": self.compute.activation_bytes})
        tally.add(tid, task, batch.units, began, ended)
        if self.blocking is not None:
            self.blocking.post_receives(arbiter, iteration)
        self.progress()

    def _wait_for_arrivals(self, arbiter: Arbiter, now: int) -> None:
        """Nothing to run: sleep on the inbox until a message arrives, or the arbiter's wake-up time."""
        if self.transport is None:
            raise RuntimeError(f"rank {self.rank}: nothing ready and no transport to wait on")
        wake = arbiter.next_wakeup()
        wait = IDLE_POLL_SECONDS if wake is None else min(IDLE_POLL_SECONDS, max(0.0, wake - now * 1e-9))
        self.transport.inbox.wait(wait)

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
                self.blocking.posted(arrival, iteration)
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
            self.compute.received[consumer] = tuple(t.to(self.device) for t in arrival.take())
            self.recorder.arrival(iteration, arrival)
            self.arrived[producer] = arrival.arrived_ns
            if self.forecast is not None:
                self.forecast.data(producer, arrival.arrived_ns * 1e-9)
            self.arbiter.available(producer)
            self.progress()

    def _route(self, tid: int, outputs: Outputs) -> None:
        consumer = self.data_consumer[tid]
        if consumer is None or outputs is None:
            return
        destination = self.graph.rank[consumer]
        if destination == self.rank:
            self.compute.received[consumer] = outputs
        else:
            self.transport.send(destination, self.iteration, self.graph.tasks[tid], outputs)
            if self.blocking is not None:
                self.blocking.sent(tid)


class BlockingP2P:
    """``--p2p blocking`` ([Note: blocking p2p in the runtime]): the POSTED frames this rank sends and waits for.

    The loop calls it at two points: :meth:`holds` before choosing a task (wait while an output sent has a
    receiver that has not posted), :meth:`post_receives` after each task (and at the start of the iteration);
    and on the way, :meth:`sent` for each output sent and :meth:`posted` for each POSTED that arrives.
    """

    def __init__(self, rank: int, graph: TaskGraph, transport: Transport, data_consumer: list[int | None],
                 recorder: Recorder) -> None:
        self.rank, self.graph, self.transport, self.recorder = rank, graph, transport, recorder
        self.data_consumer = data_consumer
        self.remote_inputs = graph.remote_producers  # per task id, the producers of its inputs on other ranks
        self.unposted: set[int] = set()  # outputs sent whose receiver has not posted yet
        self.posted_early: set[int] = set()  # POSTED frames that came before their output was sent
        self.waiting: tuple[int, tuple] | None = None  # (since, messages) while sends wait for their receivers

    def begin(self, arbiter: Arbiter, iteration: int) -> None:
        self.unposted.clear()
        self.posted_early.clear()
        self.waiting = None
        self.post_receives(arbiter, iteration)

    def holds(self, iteration: int) -> bool:
        """Whether the rank must wait for receivers to post (then it has slept on the inbox a while); when a
        wait ends, it is recorded (``Recorder.rendezvous``)."""
        if self.unposted:
            if self.waiting is None:
                graph = self.graph
                self.waiting = (time.monotonic_ns(), tuple((graph.tasks[t], graph.rank[self.data_consumer[t]])
                                                           for t in sorted(self.unposted)))
            self.transport.inbox.wait(IDLE_POLL_SECONDS)
            return True
        if self.waiting is not None:
            self.recorder.rendezvous(iteration, self.waiting[0], time.monotonic_ns(), self.waiting[1])
            self.waiting = None
        return False

    def sent(self, tid: int) -> None:
        """Output ``tid`` went to another rank: wait for its receiver to post, unless it already has."""
        if tid in self.posted_early:
            self.posted_early.discard(tid)
        else:
            self.unposted.add(tid)

    def posted(self, arrival: Posted, iteration: int) -> None:
        if arrival.iteration != iteration:
            raise RuntimeError(f"rank {self.rank}: POSTED for {arrival.producer} of iteration "
                               f"{arrival.iteration} arrived during iteration {iteration}")
        producer = self.graph.tid(arrival.producer)
        if producer in self.unposted:
            self.unposted.discard(producer)
        else:
            self.posted_early.add(producer)

    def post_receives(self, arbiter: Arbiter, iteration: int) -> None:
        """Tell each producer rank of the next task's remote inputs that its receive is posted."""
        h = arbiter.head
        if h < len(arbiter.tids):
            graph = self.graph
            for producer in self.remote_inputs[arbiter.tids[h]]:
                self.transport.posted(graph.rank[producer], iteration, graph.tasks[producer])


class _Tally:
    """One iteration's counts for :class:`IterationResult`, kept as tasks end."""

    def __init__(self, start: int, last_stage: int) -> None:
        self.last_stage = last_stage
        self.idle_since = self.last_end = start
        self.busy, self.units, self.has_loss = 0, 0, False
        self.executed: list[Task] = []
        self.spans: list[tuple[int, int, int]] = []

    def add(self, tid: int, task: Task, units: int, began: int, ended: int) -> None:
        if task.kind is F and task.stage == 0:
            self.units += units
        if task.kind is F and task.stage == self.last_stage:
            self.has_loss = True
        self.busy += ended - began
        self.executed.append(task)
        self.spans.append((tid, began, ended))
        self.idle_since = self.last_end = ended


def _span_info(batch) -> dict:
    """What a task's span records of its microbatch: units, tokens, images."""
    info = {"units": batch.units, "tokens": int(batch.spec.features()["tokens"])}
    if batch.spec.images:
        info["images"] = batch.spec.image_count
    return info
