"""Arrival forecasts for the lookahead rule in the distributed runtime: notices, relays, link latencies.

The lookahead rule ([Note: lookahead admission] in :mod:`runtime.sched.arbiter`)
needs to know when a task's input from another rank should arrive: a forward's
activation, or a backward's output gradient. In the simulator that is
arithmetic on expected durations; across processes it takes messages. One
:class:`ArrivalForecast` per rank does all of it, called by the executor at
four points of its loop:

* :meth:`started` -- this rank started a forward whose output goes to another
  rank's forward, or a backward (``B`` or ``I``) whose input gradient goes to
  another rank's backward: send that rank a firm NOTICE with this rank's
  estimate of the task's duration (the running mean per (stage, kind),
  :class:`RunningMeans`). Nothing is sent while there is no estimate yet (the
  first tasks).
* :meth:`notice` -- a NOTICE arrived: ``eta = arrival + remaining + link
  latency`` goes to the arbiter (:meth:`Arbiter.expect`). A firm notice is
  also relayed one hop further when this rank's consumer (a forward, or a
  backward) sends its output on to a third rank: ``remaining = (eta - now) +
  estimate of that consumer``, not firm.
* :meth:`data` -- data arrived: the difference between its arrival and the
  firm forecast (notice arrival + remaining) updates that link's latency
  estimate, a running mean. It holds the transfer latency and any bias of
  the sender's estimates, in the receiver's own clock (notices carry relative
  times, so ranks need no common clock).
* :meth:`finished` -- a task of this rank ended: its duration updates the
  estimates.

Cost: one small NOTICE per forward or backward whose output crosses ranks, and
one relay; both travel in the link's FIFO (:mod:`runtime.comm.transport`), so a notice always
precedes the data it announces.

[Note: short tasks send no notices]
    A notice costs a message on each side (encoding, a send, a receive, a
    wake-up of the dispatcher) and a prediction is only as good as the
    timing it rests on. For tasks of a millisecond, on ranks that share
    cores, both are of the order of the task itself: measured on the ``gpt``
    workload (4 ranks on 2 cores, ~1 ms tasks), notices made the lookahead
    rule 15-25% slower than greedy readiness, half from the messages and half
    from waits on predictions that time-slicing made wrong. So a task (forward
    or backward) whose estimated duration is below :data:`MIN_NOTICE_SECONDS`
    sends no notice (and no relay), and without predictions the lookahead
    rule is the greedy one. The threshold only matters for short tasks; the emulated runs
    of BENCHMARKS.md (tasks of 2-20 ms) send every notice.
"""

from __future__ import annotations

from hints.deps import TaskGraph
from runtime.sched.arbiter import Arbiter

MIN_NOTICE_SECONDS = 0.002  # [Note: short tasks send no notices]


class RunningMeans:
    """The runtime's estimates: the running mean of measured durations per (stage, kind).

    Indexed by task id like any :data:`Estimates`; ``None`` until a task of that
    (stage, kind) has run. Task ids number the ``m`` microbatches of one
    (stage, kind) consecutively (:class:`hints.deps.TaskGraph`), so ``tid // m``
    names the (stage, kind). Kept across iterations by its owner.
    """

    def __init__(self, graph: TaskGraph) -> None:
        self.microbatches = graph.shape.microbatches
        blocks = len(graph) // self.microbatches
        self._sum = [0.0] * blocks
        self._count = [0] * blocks

    def add(self, tid: int, seconds: float) -> None:
        block = tid // self.microbatches
        self._sum[block] += seconds
        self._count[block] += 1

    def __getitem__(self, tid: int) -> float | None:
        block = tid // self.microbatches
        count = self._count[block]
        return self._sum[block] / count if count else None

    def __len__(self) -> int:
        return len(self._sum) * self.microbatches


class ArrivalForecast:
    def __init__(self, rank: int, graph: TaskGraph, transport, data_consumer: list[int | None]) -> None:
        self.rank, self.graph, self.transport = rank, graph, transport
        self.data_consumer = data_consumer  # task id -> the task on another stage that reads its output
        self.estimates = RunningMeans(graph)  # kept across iterations
        self.latency: dict[int, tuple[float, int]] = {}  # source rank -> (running mean seconds, samples)
        self._firm: dict[int, tuple[int, float]] = {}  # producer task id -> (source rank, forecast w/o latency)
        self.arbiter: Arbiter | None = None
        self.iteration = 0
        self.notices_sent = 0

    def begin(self, iteration: int, arbiter: Arbiter) -> None:
        self.iteration, self.arbiter = iteration, arbiter
        self._firm.clear()

    # -- this rank's tasks ---------------------------------------------------
    def started(self, tid: int) -> None:
        destination = self._destination(tid)
        if destination is None:
            return
        estimate = self.estimates[tid]
        if estimate is not None and estimate >= MIN_NOTICE_SECONDS:
            self.transport.notify(destination, self.iteration, self.graph.tasks[tid], estimate, True)
            self.notices_sent += 1

    def finished(self, tid: int, seconds: float) -> None:
        self.estimates.add(tid, seconds)

    # -- messages ------------------------------------------------------------
    def notice(self, notice, now: float) -> None:
        producer = self.graph.tid(notice.producer)
        arrived = notice.arrived_ns * 1e-9
        eta = arrived + notice.remaining + self.link_latency(notice.src)
        self.arbiter.expect(producer, eta, notice.firm)
        if not notice.firm:
            return
        self._firm[producer] = (notice.src, arrived + notice.remaining)
        consumer = self.data_consumer[producer]
        if consumer is None or self.graph.rank[consumer] != self.rank:
            return
        destination = self._destination(consumer)
        estimate = self.estimates[consumer] if destination is not None else None
        if estimate is not None and estimate >= MIN_NOTICE_SECONDS:
            self.transport.notify(destination, self.iteration, self.graph.tasks[consumer],
                                  max(0.0, eta - now) + estimate, False)
            self.notices_sent += 1

    def data(self, producer: int, arrived: float) -> None:
        forecast = self._firm.pop(producer, None)
        if forecast is None:
            return
        src, expected = forecast
        mean, samples = self.latency.get(src, (0.0, 0))
        self.latency[src] = (mean + (arrived - expected - mean) / (samples + 1), samples + 1)

    def link_latency(self, src: int) -> float:
        return self.latency.get(src, (0.0, 0))[0]

    def _destination(self, tid: int) -> int | None:
        """The other rank whose task of ``tid``'s direction ``tid`` feeds (a forward's next forward, a
        backward's previous backward), or None: what notices are sent for."""
        consumer = self.data_consumer[tid]
        if consumer is None or self.graph.is_forward[tid] != self.graph.is_forward[consumer]:
            return None
        destination = self.graph.rank[consumer]
        return None if destination == self.rank else destination


__all__ = ["ArrivalForecast"]
