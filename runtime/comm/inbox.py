"""The inbox the dispatcher sleeps on, and the items it holds: what each received message tells the dispatcher.

A received DATA message is an :class:`Arrival` (its tensors), a NOTICE a :class:`Notice`, a DECISION a
:class:`Decided`, a POSTED a :class:`Posted`; HELLO and CLOSE never reach the inbox (the link's reader
handles them). :func:`item_of` turns a header into its item, for both readers (the gloo socket reader of
:mod:`runtime.comm.sockets`, the NCCL receiver thread of :mod:`runtime.comm.nccl`), and
:func:`check_sequence` is the one FIFO check they apply ([Note: transport ordering rule] in
:mod:`runtime.comm.transport`).
"""

from __future__ import annotations

import queue
import selectors
import socket
from typing import Any, NamedTuple, Sequence

import torch

from hints.tasks import Task
from runtime.comm.errors import TransportError
from runtime.comm.frames import DECISION, NOTICE, POSTED, FrameHeader


class Arrival(NamedTuple):
    """A message that arrived on link ``src -> this rank``."""

    src: int
    sequence: int
    iteration: int
    producer: Task
    tensors: tuple[torch.Tensor, ...]
    frame_ns: int  # host monotonic clock: the frame was received
    arrived_ns: int  # the whole message was received and handed to the inbox
    ready: Any = None  # CUDA event recorded on the receive stream after the receive; None on CPU

    def take(self) -> tuple[torch.Tensor, ...]:
        """The tensors, safe to read on the calling thread's current CUDA stream ([Note: CUDA streams] in
        :mod:`runtime.comm.links`)."""
        if self.ready is not None and self.tensors:
            stream = torch.cuda.current_stream(self.tensors[0].device)
            stream.wait_event(self.ready)
            for tensor in self.tensors:
                tensor.record_stream(stream)
        return self.tensors


class Notice(NamedTuple):
    """A NOTICE from link ``src -> this rank``: ``producer``'s output should leave ``src`` in ``remaining`` s."""

    src: int
    iteration: int
    producer: Task
    remaining: float  # seconds, from when the notice was sent
    firm: bool  # the producer has started (else: a relayed prediction)
    arrived_ns: int  # host monotonic clock


class Decided(NamedTuple):
    """A DECISION from the TP group's leader ``src``: run ``task`` as the ``index``-th task of ``iteration``."""

    src: int
    iteration: int
    index: int
    task: Task
    decided_ns: int  # the leader's clock at the decision, in rank 0's clock domain
    arrived_ns: int  # host monotonic clock (this rank's)


class Posted(NamedTuple):
    """A POSTED from link ``src -> this rank``: ``src`` posted its receive for ``producer``'s output."""

    src: int
    iteration: int
    producer: Task
    arrived_ns: int  # host monotonic clock (this rank's)


def item_of(link, header: FrameHeader, frame_ns: int) -> Notice | Posted | Decided:
    """What a NOTICE, POSTED or DECISION frame received on ``link`` (a :class:`runtime.comm.links.Link`) tells
    the dispatcher."""
    kind = header.kind_of_message
    if kind == NOTICE:
        notice = header.fields
        return Notice(link.src, header.iteration, header.producer, notice.remaining_ns * 1e-9, notice.firm, frame_ns)
    if kind == POSTED:
        return Posted(link.src, header.iteration, header.producer, frame_ns)
    if kind == DECISION:
        decision = header.fields
        return Decided(link.src, header.iteration, decision.index, header.producer, decision.decided_ns, frame_ns)
    raise TransportError(f"{link}: message {header.sequence} has unknown type {kind}")


def check_sequence(link, header: FrameHeader, expected: int) -> None:
    """Refuse a message that is not the next of ``link``'s FIFO."""
    if header.sequence != expected:
        raise TransportError(f"{link}: message {header.sequence} arrived, expected {expected} (FIFO order broken)")


class Inbox:
    """Arrivals for the dispatcher (one thread), which sleeps on it while nothing is ready.

    Two kinds of source fill it ([Note: dispatcher reads the sockets] in :mod:`runtime.comm.sockets`): under
    gloo the links' sockets, which the dispatcher reads itself whenever it drains or waits (no thread, no
    hand-off); under NCCL the receiver threads, through a C-level ``queue.SimpleQueue`` (the cheapest wake-up
    between Python threads). Failures of other threads come through the queue in both cases and wake a
    waiting dispatcher.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._taken: list = []  # what wait() or pump() read, for the next drain()
        self._failure: BaseException | None = None
        self._selector: selectors.BaseSelector | None = None
        self._wake_in: socket.socket | None = None  # a byte written here wakes a dispatcher in select()
        self._wake_out: socket.socket | None = None
        self._fresh = False  # wait() just read the sockets and found something
        self._readers: list = []

    def attach(self, readers: Sequence[Any]) -> None:
        """Read ``readers`` (each with ``sock``, ``closed`` and ``read(out)``) on the dispatcher's calls."""
        self._selector = selectors.DefaultSelector()
        self._wake_out, self._wake_in = socket.socketpair()
        for end in (self._wake_out, self._wake_in):
            end.setblocking(False)
        self._selector.register(self._wake_out, selectors.EVENT_READ, None)
        self._readers = list(readers)
        for reader in readers:
            self._selector.register(reader.sock, selectors.EVENT_READ, reader)

    def detach(self) -> None:
        """Stop reading the sockets (closing the transport); closes the wake-up pair."""
        if self._selector is not None:
            self._selector.close()
            self._wake_out.close()
            self._wake_in.close()
            self._selector = self._wake_in = self._wake_out = None

    def put(self, item) -> None:
        """From a receiver thread (NCCL; under gloo the dispatcher reads the sockets itself)."""
        self._queue.put(item)

    def fail(self, error: BaseException) -> None:
        if self._failure is None:
            self._failure = error
        self._queue.put(None)  # wake the dispatcher
        self.wake()

    def wake(self) -> None:
        """Wake the dispatcher if it sleeps in select() (another thread finished something it waits for)."""
        wake = self._wake_in
        if wake is not None:
            try:
                wake.send(b"\0")
            except OSError:  # full (it is awake anyway) or closed (the transport is closing)
                pass

    def drain(self) -> list:
        self._raise_failure()
        if self._selector is not None and not self._fresh:
            self.pump(0.0)
        self._fresh = False
        items, self._taken = self._taken, []
        while not self._queue.empty():
            items.append(self._queue.get())
        return [item for item in items if item is not None]

    def wait(self, timeout: float) -> None:
        """Sleep until something arrives (or ``timeout`` seconds pass)."""
        self._raise_failure()
        if not self._taken:
            if self._selector is not None:
                if self._queue.empty():
                    self.pump(timeout)
                    self._fresh = bool(self._taken)  # the drain that follows need not read the sockets again
            else:
                try:
                    self._taken.append(self._queue.get(timeout=max(0.0, timeout)))
                except queue.Empty:
                    pass
        self._raise_failure()

    def pump(self, timeout: float, quiet: bool = False) -> None:
        """Read every socket that has bytes, waiting up to ``timeout`` s for one (or a wake-up).

        What arrives waits for the next :meth:`drain`. A link that fails is the inbox's failure, or with
        ``quiet`` (closing) only that link's end.
        """
        selector = self._selector
        if selector is None:
            return
        for reader in self._readers:
            if reader.unsettled and not reader.closed:  # the receives it owes since it last listed a message
                try:
                    reader.settle()
                except TransportError as err:
                    reader.closed = True
                    if not quiet:
                        self.fail(err)
        for key, _ in selector.select(max(0.0, timeout)):
            reader = key.data
            if reader is None:
                try:
                    while self._wake_out.recv(4096):
                        pass
                except BlockingIOError:
                    pass
                continue
            try:
                reader.read(self._taken)
            except TransportError as err:
                reader.closed = True
                if not quiet:
                    self.fail(err)
            if reader.closed:
                selector.unregister(reader.sock)
        if not quiet:
            self._raise_failure()

    def check(self) -> None:
        """Raise the failure a link reported, if any."""
        self._raise_failure()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

