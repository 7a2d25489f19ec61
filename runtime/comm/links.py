"""The links and the sending side.

A :class:`Link` is one directed pair of ranks with its own process group (and, under gloo, its own TCP
connection); :func:`pipeline_links` lists the links a job's messages need. The :class:`Wire` says what the
backend moves and how (gloo: host tensors, frames on the sockets; NCCL: device tensors, everything on the
group), and puts one message on it. A :class:`Sender` per outgoing link keeps the link's FIFO, with its
backlog and its thread; :class:`Sent` is what it reports of each DATA message, for traces.

[Note: sending without a hand-off]
    A message that can go on the wire as it is (host tensors on a host wire,
    no injected latency) is sent by the thread that posts it, the executor:
    no queue and no thread wakes up between a task's end and its output
    leaving. Its frame is written to the socket without waiting
    (``MSG_DONTWAIT``); if the socket is full (the peer has not read for a
    while), the bytes left over go to the link's thread, and the link has a
    backlog (below) until it wrote them. gloo's ``isend`` for the tensors
    that follow is asynchronous (gloo writes in place when the peer has
    posted its receive, else its own thread writes later). Each outgoing
    link has one thread, for two jobs. It *collects* sends:
    waits for each to complete, in order (gloo's ``is_completed()`` stays
    False until ``wait()``, so someone must wait), which frees their tensors,
    records them for traces and reports a broken link; it is woken for that
    only every ``MAX_UNCOLLECTED`` sends, by :meth:`runtime.comm.transport.Transport.wait_sent` at
    the end of an iteration, and at close, so a message costs no wake-up.
    And it sends the messages that must wait first (an injected latency, a
    copy from CUDA to the host for gloo, any NCCL message: [Note: CUDA
    streams]). While such a message waits, the link has a *backlog* and
    every later message of the link goes through the thread too, so the FIFO
    holds: the poster sends itself only when the backlog is zero (under the
    link's lock), and while it is not, only the thread sends, taking a
    message off the backlog once it is on the wire. The thread may wait for
    a full socket without holding the lock, so a poster never waits for the
    wire: compute never waits for a send.

[Note: CUDA streams]
    A thread's current CUDA stream is its own; a new thread starts on the
    device's default stream, which is the executor's compute stream. NCCL
    makes its internal stream wait for the caller's current stream before a
    send or receive, and ``wait()`` makes the caller's current stream wait
    for it. A receiver thread on the compute stream would therefore queue
    every later kernel behind a receive that may depend on those kernels
    (this rank's output has to reach the peer first): a deadlock. So, on
    CUDA, every link thread runs on a stream of its own (a receive stream
    per incoming link, a send stream per outgoing one):

    * sending: the poster records an event on its current (compute) stream
      when it posts; the link thread makes its send stream wait for that
      event, then copies to the host (gloo) or builds the header frame and
      sends (NCCL) on the send stream. The compute stream never waits for a
      send.
    * receiving: the receive, the tensors it allocates and the copy of the
      header to the host all run on the receive stream; the thread then
      records an event on it, waits for that event (so an arrival means
      the bytes are there, and the arbiter's "ready" is true), and hands
      the event over with the tensors. The consumer calls
      :meth:`runtime.comm.inbox.Arrival.take` before it reads them: its current stream waits
      for the event, and ``record_stream`` tells the caching allocator that
      the tensors (allocated on the receive stream) are in use on the
      consumer's stream until its queued work is done.

    On CPU (gloo, no CUDA device) there are no streams and no events: the
    same code paths run with ``stream = None`` and ``ready = None``.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections import deque
from typing import Any, Callable, NamedTuple, Sequence

import torch
import torch.distributed as dist

from hints.tasks import Task
from runtime.comm.errors import TransportError
from runtime.comm.frames import (
    BODY_BYTES,
    CLOSE,
    IN_BODY,
    MAX_TENSORS,
    PREPOSTED_DEPTH,
    PREPOSTED_TAG,
    DecisionFields,
    MessageKind,
    NoticeFields,
    follow_tag,
    host_bytes,
    pack_frame,
)

MAX_UNCOLLECTED = 8  # sends in flight on a link before its thread is woken to collect them
_ONE_BYTE = torch.zeros(1, dtype=torch.uint8)  # what CLOSE sends into each pre-posted receive


class Link:
    """One directed link ``src -> dst`` with its own process group (``peer``: the other end's rank in it).

    Under gloo, ``sock`` is the link's TCP connection, which carries its frames ([Note: dispatcher reads the
    sockets] in :mod:`runtime.comm.sockets`); tensors that follow a frame take the group.
    """

    def __init__(self, src: int, dst: int, group, peer: int, sock: socket.socket | None = None) -> None:
        self.src, self.dst, self.group, self.peer, self.sock = src, dst, group, peer, sock
        self.posted = [0] * MAX_TENSORS  # bytes pre-posted per tensor slot, as both ends know it (follow_tag)

    def isend(self, tensor: torch.Tensor, tag: int = 0):
        return self.group.send([tensor], self.peer, tag)  # what dist.isend does, without its per-call checks

    def irecv(self, tensor: torch.Tensor, tag: int = 0):
        return self.group.recv([tensor], self.peer, tag)

    def recv(self, tensor: torch.Tensor, tag: int = 0) -> None:
        self.irecv(tensor, tag).wait()

    def __repr__(self) -> str:
        return f"link {self.src}->{self.dst}"


def pipeline_links(rank_of_consumer_pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Directed links from ``(producer rank, consumer rank)`` pairs, without self-links."""
    return sorted({(a, b) for a, b in rank_of_consumer_pairs if a != b})


class Sent(NamedTuple):
    """Bookkeeping of one message handed to the wire (for traces)."""

    dst: int
    sequence: int
    iteration: int
    producer: Task
    nbytes: int
    queued_ns: int  # posted
    started_ns: int  # framing began (after any injected latency)
    finished_ns: int  # handed to the wire: the asynchronous send was posted


class Message(NamedTuple):
    """One message posted on a link, as the poster gave it."""

    kind_of_message: MessageKind
    iteration: int = 0
    producer: Task | None = None
    tensors: tuple[torch.Tensor, ...] = ()
    fields: NoticeFields | DecisionFields | None = None  # a NOTICE's or a DECISION's own (frames.KIND_FIELDS)
    delay: float = 0.0  # injected latency (variability models), slept by the link's thread before sending
    ready: Any = None  # CUDA event on the poster's stream after the tensors were computed ([Note: CUDA streams])
    queued_ns: int = 0


class _Rest(NamedTuple):
    """What of a frame and its body the poster could not write without waiting: the link's thread writes it."""

    data: list  # memoryviews, in order
    keep: tuple = ()  # the tensors some of them view: alive until written


def _write(sock: socket.socket, buffers: list, wait: bool) -> list | None:
    """Write ``buffers`` to ``sock`` in order; without ``wait``, only what it takes now, and return the rest."""
    if wait:
        for buffer in buffers:
            sock.sendall(buffer)
        return None
    try:
        written = sock.sendmsg(buffers, (), socket.MSG_DONTWAIT) if len(buffers) > 1 else \
            sock.send(buffers[0], socket.MSG_DONTWAIT)
    except BlockingIOError:
        written = 0
    rest = []
    for buffer in buffers:
        size = len(buffer)
        if written >= size:
            written -= size
            continue
        rest.append(memoryview(buffer)[written:])
        written = 0
    return rest or None


class Wire:
    """What this backend moves and how: gloo moves host tensors with inline payloads, NCCL device tensors."""

    def __init__(self, device: torch.device, body_bytes: int = BODY_BYTES, group=None) -> None:
        nccl = dist.get_backend(group) == "nccl"  # the links' group's (None: the world's)
        self.device = device if nccl else torch.device("cpu")  # CUDA tensors under gloo are staged through the host
        self.sockets = not nccl  # frames (with inline payloads) on sockets ([Note: dispatcher reads the sockets])
        self.body_bytes = body_bytes if self.sockets else 0  # [Note: bodies] in runtime.comm.frames
        self.cuda = device if device.type == "cuda" else None  # the compute device, when it is a GPU
        self.host = self.device.type == "cpu"

    def stream(self) -> Any:
        """A stream of its own for a link thread ([Note: CUDA streams]); None on CPU."""
        return None if self.cuda is None else torch.cuda.Stream(self.cuda)

    def computed(self, tensors: Sequence[torch.Tensor]) -> Any:
        """An event on the caller's current stream, after the work that computes ``tensors``; None on CPU."""
        if self.cuda is None or not any(t.is_cuda for t in tensors):
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(tensors[0].device))
        return event

    def direct(self, message: Message) -> bool:
        """Whether the poster may send ``message`` itself ([Note: sending without a hand-off])."""
        return self.host and message.delay <= 0 and message.ready is None

    def prepare(self, message: Message) -> Message:
        """``message`` with its tensors on the wire device; on the link thread, after they were computed."""
        if message.ready is not None:
            torch.cuda.current_stream().wait_event(message.ready)
        return message._replace(tensors=tuple(t.to(self.device) for t in message.tensors))

    def isend(self, link: Link, sequence: int, message: Message, wait: bool = True) -> tuple[list, _Rest | None]:
        """Put ``message`` on the wire: the works of its asynchronous sends, and what of its frame and body is
        left to write (only without ``wait``, when the link's socket is full: the caller must not block)."""
        frame, follow, where = pack_frame(message.kind_of_message, sequence, message.iteration, message.producer,
                                          message.tensors, message.fields, self.sockets, self.body_bytes)
        if not self.sockets:  # NCCL: the frame, then each tensor, on the link's one ordered stream
            works = [link.isend(torch.frombuffer(frame, dtype=torch.uint8).to(self.device))]
            return works + [link.isend(tensor) for tensor in follow if tensor.numel()], None
        if where == IN_BODY:  # [Note: bodies] in runtime.comm.frames
            rest = _write(link.sock, [frame] + [host_bytes(t) for t in follow if t.nbytes], wait)
            return [], None if rest is None else _Rest(rest, tuple(follow))
        # gloo: the tensors that follow the frame go first, so that when the frame is read they are there or
        # on their way, and the dispatcher sleeps once, not once for the frame and once for the tensors
        works = [link.isend(tensor, follow_tag(link.posted, slot, tensor.nbytes))
                 for slot, tensor in enumerate(follow) if tensor.numel()]
        if message.kind_of_message == CLOSE:  # release the peer's pre-posted receives
            works += [link.isend(_ONE_BYTE, PREPOSTED_TAG + slot) for slot, size in enumerate(link.posted) if size
                      for _ in range(PREPOSTED_DEPTH)]
        rest = _write(link.sock, [frame], wait)
        return works, None if rest is None else _Rest(rest)

    def buffer(self, shape, dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=self.device)

    def arrived(self, stream) -> Any:
        """After a receive on ``stream``: an event the consumer's stream will wait for; None on CPU."""
        if stream is None:
            return None
        event = torch.cuda.Event()
        event.record(stream)
        event.synchronize()  # an arrival means the bytes are there: the arbiter's "ready" must be true
        return event


def on_stream(stream) -> contextlib.AbstractContextManager:
    """Run the calling thread on ``stream`` and its device; nothing without a stream (CPU)."""
    if stream is None:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(torch.cuda.device(stream.device))
    stack.enter_context(torch.cuda.stream(stream))
    return stack


class _Collect(NamedTuple):
    """Asks a link's thread to wait for every send posted before it; ``done`` is set then (``stop``: and end)."""

    done: threading.Event
    stop: bool = False


class Sender:
    """One outgoing link: its FIFO, its backlog and its thread ([Note: sending without a hand-off])."""

    def __init__(self, link: Link, wire: Wire, done: Callable[[int, Message, int, int, int], None],
                 fail: Callable[[TransportError], None], collected: Callable[[], None] = lambda: None) -> None:
        self.link, self.wire = link, wire
        self.stream = wire.stream()
        self._done, self._fail, self._collected = done, fail, collected
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue = queue.SimpleQueue()  # Message or _Rest (the thread sends it), _Collect
        self._in_flight: deque = deque()  # (message, sequence, started_ns, handed_ns, works), in posting order
        self._backlog = 0  # messages the thread has yet to send (or finish writing)
        self._collect_asked = False
        self._sequence = 0
        self.failure: TransportError | None = None

    def post(self, message: Message) -> None:
        """Put ``message`` on the wire now, or behind the link's backlog; never waits for the wire."""
        with self._lock:
            if self.failure is not None:
                raise self.failure
            if self._backlog or not self.wire.direct(message):
                self._backlog += 1
                self._requests.put(message)
                return
            rest = self._isend(message, wait=False)
            if rest is not None:  # the socket is full: the thread writes the rest, later messages queue behind it
                self._backlog += 1
                self._requests.put(rest)
            if len(self._in_flight) >= MAX_UNCOLLECTED and not self._collect_asked:
                self._collect_asked = True
                self._requests.put(_Collect(threading.Event()))

    def collect(self, stop: bool = False) -> threading.Event:
        """Ask the thread to wait for every send posted so far; the event is set when it did (or the link broke)."""
        request = _Collect(threading.Event(), stop)
        with self._lock:
            if self.failure is None:
                self._requests.put(request)
            else:
                request.done.set()
        return request.done

    def close(self) -> None:
        """Send CLOSE (unless the link broke), then let the thread collect it and end."""
        try:
            self.post(Message(CLOSE))
        except TransportError:
            pass
        self.collect(stop=True)

    def run(self) -> None:
        """The link's thread: send what must wait, wait for what was sent, in order."""
        try:
            with on_stream(self.stream):
                while True:
                    request = self._requests.get()
                    if isinstance(request, Message):
                        self._send_waiting(request)
                    elif isinstance(request, _Rest):
                        _write(self.link.sock, request.data, wait=True)
                        with self._lock:
                            self._backlog -= 1
                    self._collect()
                    if isinstance(request, _Collect):
                        request.done.set()
                        self._collected()
                        if request.stop:
                            return
        except Exception as err:  # a peer died or the group broke: the dispatcher reports it
            self._broken(err)

    def _send_waiting(self, message: Message) -> None:
        """Send a message of the backlog. While the backlog is not empty only this thread sends, so it may
        wait for the wire without the lock: posters queue behind it meanwhile, never wait for it."""
        if message.delay > 0:
            time.sleep(message.delay)
        message = self.wire.prepare(message)
        self._isend(message, wait=True)
        with self._lock:
            self._backlog -= 1

    def _isend(self, message: Message, wait: bool) -> _Rest | None:
        """Hand ``message`` to the wire; the bytes of its frame left for the thread to write, if any.

        One sender at a time, so the FIFO order is the posting order: a poster under the link's lock while the
        backlog is empty, else the link's thread.
        """
        sequence, started = self._sequence, time.monotonic_ns()
        try:
            works, rest = self.wire.isend(self.link, sequence, message, wait)
        except TransportError:  # a message that cannot be framed: the caller's error, the link is fine
            raise
        except Exception as err:
            self.failure = TransportError(f"{self.link}: send failed: {err}")
            self._requests.put(_Collect(threading.Event(), stop=True))  # end the thread
            raise self.failure from err
        self._sequence += 1
        self._in_flight.append((message, sequence, started, time.monotonic_ns(), works))
        return rest

    def _collect(self) -> None:
        with self._lock:
            self._collect_asked = False
        while self._in_flight:
            message, sequence, started, handed, works = self._in_flight[0]
            for work in works:
                work.wait()
            self._in_flight.popleft()
            self._done(self.link.dst, message, sequence, started, handed)

    def _broken(self, err: Exception) -> None:
        failure = err if isinstance(err, TransportError) else TransportError(f"{self.link}: send failed: {err}")
        with self._lock:
            self.failure = failure
            while not self._requests.empty():  # nobody will serve these: release whoever waits on them
                request = self._requests.get()
                if isinstance(request, _Collect):
                    request.done.set()
        self._fail(failure)


