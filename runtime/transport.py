"""Message-driven point-to-point transport between pipeline ranks.

All communication of the pipeline goes through this module, under one rule:

[Note: transport ordering rule]
    Every *directed link* ``src -> dst`` between two ranks that exchange
    pipeline data is a FIFO with its own process group (so a send and a
    receive on the same pair of ranks never block each other, and NCCL,
    which ignores tags, still sees one ordered stream per communicator).
    Messages of a link go on the wire in the order they were posted, each
    with an asynchronous send under the link's lock ([Note: sending without
    a hand-off] says by which thread); one receiver thread per incoming link
    receives them in that order. Each message carries a sequence number,
    checked on arrival. That is the only ordering there is: the receiver
    never needs to know in advance which message comes next, because every
    message says what it is.

Wire format of one message: a byte *frame*, an int64 header of
``HEADER_WORDS`` words, followed under gloo by up to ``INLINE_BYTES`` of
payload::

    [magic, sequence, type, iteration, stage, kind, microbatch, n_tensors, inline, remaining_ns, firm,
     (dtype, ndim, d0..d5) x MAX_TENSORS] [payload bytes, tensors back to back]

The magic word is versioned: its low 32 bits spell ``RRFP``, its high 32 bits
are :data:`WIRE_VERSION` (0 before versions existed). A frame of another
version is a :class:`TransportError` naming both versions, never a silent
misreading of a layout or a message type one side does not know.

Payloads that fit travel inside the frame, so a typical message costs one
send and one receive; larger ones (``inline == 0``) follow the frame as one
send per tensor (zero-size tensors are never sent; the header has their
shape), under gloo into receives posted before they were sent ([Note:
pre-posted receives]). Frames are built and read on the host with ``struct`` and
``memmove``: a handful of microseconds, no per-word tensor operations.

[Note: trimmed frames]
    Under gloo the receiver always posts a receive of ``FRAME_BYTES`` and the
    sender sends only the header and the inline payload, because gloo
    receives a shorter message into a larger buffer (tested in
    tests/test_transport.py) and the header says how much of it is meant. A
    NOTICE is then a few hundred bytes, and a small activation costs what it
    weighs. NCCL needs matching sizes, so under NCCL every frame is exactly
    the header (``HEADER_BYTES``) and every tensor follows it: no payload is
    copied on the device to build a frame.

[Note: pre-posted receives]
    gloo moves a message only once its receive is posted: a tensor posted
    after its frame was read waits one more round of notifications, and on
    a round trip of 1 MiB that cost 1.5x plain gloo. So under gloo each
    incoming link keeps a receive *pre-posted* for each tensor slot of a
    message (tag ``PREPOSTED_TAG + slot``), sized by the first tensor that
    followed a frame in that slot, and the sender sends a tensor there when
    it fits (gloo receives a shorter message into a larger buffer); one
    that does not fit, or the first of its slot, goes on ``LATE_TAG`` into
    a receive posted after the frame, as before. Both ends apply the same
    rule (:func:`follow_tag`) to the same sequence of messages, so the
    sender always knows what the receiver has posted, without asking. A
    tensor that filled its buffer is handed over as it is and a new buffer
    posted; a shorter one is copied out and the buffer posted again. CLOSE
    sends one byte into each pre-posted receive, so no receive is left
    pending when the link ends. NCCL ignores tags: there every tensor
    follows its frame on the one ordered stream, posted after the frame.

``type`` is HELLO (sent once per link at start, so every link is set up and
exercised before training), DATA, NOTICE, DECISION, POSTED or CLOSE (end of run). ``kind`` is
the Unicode code point of the producing task's letter (``ord("F")``), so the
header names the producing task ``<stage><kind><microbatch>`` directly.

A NOTICE carries no tensors: it tells the receiver that the producing task's
output is on its way, for the lookahead rule ([Note: lookahead admission] in
:mod:`runtime.arbiter`). ``remaining_ns`` is the sender's estimate of how long
until the output leaves it (its duration estimate for a task it just started:
``firm`` = 1; or, relayed, its own predicted wait plus its duration estimate
for the next task: ``firm`` = 0). Times are relative, so no clock needs to be
shared. Notices travel in the link's one FIFO, so a notice always arrives
before the data it announces.

A DECISION carries no tensors either: a TP group's leader tells a follower
which task to run next, on the leader's decision link to it ([Note: TP
coordination] in :mod:`runtime.tp`). The producer fields name the task, and
the two words a NOTICE uses for ``remaining_ns`` and ``firm`` hold the
decision's index in the iteration and the leader's clock at the decision
(ns, rank 0's clock domain), from which the follower's trace gets the follow
latency.

A POSTED carries no tensors either: under ``--p2p blocking`` the consumer's
rank tells the producer's rank that it has posted its receive for the
message the producer fields name ([Note: blocking p2p in the runtime] in
:mod:`runtime.executor`). It travels on the link opposite to the data's.

[Note: sending without a hand-off]
    gloo's ``isend`` is asynchronous (gloo writes in place when the peer has
    posted its receive, else its own thread writes later), so a message that
    can go on the wire as it is (host tensors on a host wire, no injected
    latency) is sent by the thread that posts it, the executor: no queue and
    no thread wakes up between a task's end and its output leaving. Each
    outgoing link still has one thread, for two jobs. It *collects* sends:
    waits for each to complete, in order (gloo's ``is_completed()`` stays
    False until ``wait()``, so someone must wait), which frees their tensors,
    records them for traces and reports a broken link; it is woken for that
    only every ``MAX_UNCOLLECTED`` sends, by :meth:`Transport.wait_sent` at
    the end of an iteration, and at close, so a message costs no wake-up.
    And it sends the messages that must wait first (an injected latency, a
    copy from CUDA to the host for gloo, any NCCL message: [Note: CUDA
    streams]). While such a message waits, the link has a *backlog* and
    every later message of the link goes through the thread too, so the FIFO
    holds: the poster sends itself only when the backlog is zero, and the
    thread takes a message off the backlog only after handing it to the
    wire, both under the link's lock. Compute never waits for a send.

Arrival is learned without polling: gloo's ``irecv(...).is_completed()``
stays False until ``wait()`` is called (torch 2.13), so receiver threads do
blocking receives, which release the GIL, and hand arrivals to the
dispatcher through an :class:`Inbox` (a C-level ``queue.SimpleQueue``, the
cheapest wake-up between Python threads); the dispatcher sleeps on it while
nothing is ready. That hand-off is the one left on a message's path.

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
      :meth:`Arrival.take` before it reads them: its current stream waits
      for the event, and ``record_stream`` tells the caching allocator that
      the tensors (allocated on the receive stream) are in use on the
      consumer's stream until its queued work is done.

    On CPU (gloo, no CUDA device) there are no streams and no events: the
    same code paths run with ``stream = None`` and ``ready = None``.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import queue
import struct
import threading
import time
from collections import deque
from datetime import timedelta
from typing import Any, Callable, NamedTuple, Sequence

import torch
import torch.distributed as dist

from hints.tasks import Kind, Task

MAGIC = 0x52524650  # "RRFP": the low half of a frame's first word
WIRE_VERSION = 1  # its high half; 1 added POSTED (0: the frames before versions existed)
MAX_TENSORS = 4
MAX_DIMS = 6
FIXED_WORDS = 11
HEADER_WORDS = FIXED_WORDS + MAX_TENSORS * (2 + MAX_DIMS)
HEADER_BYTES = HEADER_WORDS * 8
INLINE_BYTES = 32 * 1024
FRAME_BYTES = HEADER_BYTES + INLINE_BYTES
PREPOSTED_TAG = 1  # + the tensor's slot in its message: a receive posted before the message ([Note: pre-posted receives])
LATE_TAG = PREPOSTED_TAG + MAX_TENSORS  # a tensor whose receive is posted after its frame was read
MAX_UNCOLLECTED = 8  # sends in flight on a link before its thread is woken to collect them
HELLO, DATA, CLOSE, NOTICE, DECISION, POSTED = 1, 2, 3, 4, 5, 6
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool,
          torch.uint8)
_DTYPE_CODE = {dtype: code for code, dtype in enumerate(DTYPES)}
_FIXED = struct.Struct(f"={FIXED_WORDS}q")  # native order: frames never leave one kind of machine
_SPEC = struct.Struct(f"={2 + MAX_DIMS}q")  # dtype, ndim, d0..d5
_HEADER_VIEW = ctypes.c_char * HEADER_BYTES  # the header of a frame in place, for struct's pack_into/unpack_from
_ONE_BYTE = torch.zeros(1, dtype=torch.uint8)  # what CLOSE sends into each pre-posted receive
_NO_DIMS = [(0,) * (MAX_DIMS - n) for n in range(MAX_DIMS + 1)]


class TransportError(RuntimeError):
    """A link broke or delivered something unexpected."""


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
        """The tensors, safe to read on the calling thread's current CUDA stream ([Note: CUDA streams])."""
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


class Inbox:
    """Arrivals from all receiver threads, drained by the dispatcher (one thread); the dispatcher sleeps on it."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()  # C-level: the cheapest wake-up between threads
        self._taken: list = []  # what wait() took off the queue, for the next drain()
        self._failure: BaseException | None = None

    def put(self, item) -> None:
        self._queue.put(item)

    def fail(self, error: BaseException) -> None:
        if self._failure is None:
            self._failure = error
        self._queue.put(None)  # wake the dispatcher

    def drain(self) -> list:
        self._raise_failure()
        items, self._taken = self._taken, []
        while not self._queue.empty():
            items.append(self._queue.get())
        return [item for item in items if item is not None]

    def wait(self, timeout: float) -> None:
        """Sleep until something arrives (or ``timeout`` seconds pass)."""
        self._raise_failure()
        if not self._taken:
            try:
                self._taken.append(self._queue.get(timeout=max(0.0, timeout)))
            except queue.Empty:
                pass
        self._raise_failure()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure


# -- frames ---------------------------------------------------------------------------------------------------------
def encode_frame(kind_of_message: int, sequence: int, iteration: int = 0, producer: Task | None = None,
                 tensors: Sequence[torch.Tensor] = (), notice: tuple[int, bool] = (0, False),
                 inline: bool = True) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The frame of one message (a host byte tensor), and the tensors that must follow it.

    With ``inline`` a payload of at most ``INLINE_BYTES`` of host tensors travels in the frame, which
    ends right after it ([Note: trimmed frames]); otherwise the frame is the header and every tensor
    follows it (NCCL, or a large payload).
    """
    if len(tensors) > MAX_TENSORS:
        raise TransportError(f"a message carries at most {MAX_TENSORS} tensors, got {len(tensors)}")
    tensors = [t.contiguous() for t in tensors]
    payload = sum(t.nbytes for t in tensors)
    inline = inline and payload <= INLINE_BYTES and all(t.device.type == "cpu" for t in tensors)
    frame = torch.empty(HEADER_BYTES + (payload if inline else 0), dtype=torch.uint8)
    address = frame.data_ptr()
    header = _HEADER_VIEW.from_address(address)
    stage, kind, microbatch = (-1, 0, -1) if producer is None else \
        (producer.stage, ord(producer.kind.value), producer.microbatch)
    _FIXED.pack_into(header, 0, MAGIC | WIRE_VERSION << 32, sequence, kind_of_message, iteration, stage, kind, microbatch, len(tensors),
                     inline, notice[0], notice[1])
    for i, tensor in enumerate(tensors):
        _SPEC.pack_into(header, _FIXED.size + i * _SPEC.size, *_spec(tensor))
    if not inline:
        return frame, tensors
    address += HEADER_BYTES
    for tensor in tensors:
        ctypes.memmove(address, tensor.data_ptr(), tensor.nbytes)
        address += tensor.nbytes
    return frame, []


def _spec(tensor: torch.Tensor) -> tuple[int, ...]:
    """The header words of one tensor: dtype code, number of dims, the dims padded with zeros."""
    code = _DTYPE_CODE.get(tensor.dtype)
    if code is None:
        raise TransportError(f"dtype {tensor.dtype} cannot be sent")
    if tensor.dim() > MAX_DIMS:
        raise TransportError(f"tensors of at most {MAX_DIMS} dims, got shape {tuple(tensor.shape)}")
    return code, tensor.dim(), *tensor.shape, *_NO_DIMS[tensor.dim()]


class FrameHeader(NamedTuple):
    kind_of_message: int
    sequence: int
    iteration: int
    producer: Task | None
    specs: list[tuple[torch.dtype, tuple[int, ...]]]
    inline: bool
    remaining_ns: int = 0  # NOTICE only (DECISION: the decision's index)
    firm: bool = False  # NOTICE only
    decided_ns: int = 0  # DECISION only: the leader's clock at the decision (the word NOTICE uses for firm)


def decode_frame(frame: torch.Tensor) -> FrameHeader:
    """The header of a received frame (a contiguous byte tensor, on the host or a device)."""
    if frame.dtype != torch.uint8 or frame.numel() < HEADER_BYTES:
        raise TransportError(f"a frame is at least {HEADER_BYTES} bytes, got {frame.numel()} of {frame.dtype}")
    if frame.device.type != "cpu":
        frame = frame[:HEADER_BYTES].cpu()
    header = _HEADER_VIEW.from_address(frame.data_ptr())
    magic, sequence, kind_of_message, iteration, stage, kind, microbatch, count, inline, remaining, firm = \
        _FIXED.unpack_from(header)
    if magic & 0xFFFFFFFF != MAGIC:
        raise TransportError(f"bad message header (magic {magic:#x})")
    if magic >> 32 != WIRE_VERSION:
        raise TransportError(f"the peer speaks wire version {magic >> 32}, this rank {WIRE_VERSION}: run one rrfp "
                             f"version on every rank")
    producer = (Task(stage, Kind(chr(kind)), microbatch) if kind_of_message in (DATA, NOTICE, DECISION, POSTED)
                else None)
    specs = []
    for i in range(count):
        dtype, ndim, *dims = _SPEC.unpack_from(header, _FIXED.size + i * _SPEC.size)
        specs.append((DTYPES[dtype], tuple(dims[:ndim])))
    return FrameHeader(kind_of_message, sequence, iteration, producer, specs, bool(inline), remaining, bool(firm),
                       firm)


def inline_tensors(frame: torch.Tensor, specs) -> list[torch.Tensor]:
    """The payload tensors packed into a host ``frame`` (each copied out to its own storage)."""
    tensors, address = [], frame.data_ptr() + HEADER_BYTES
    for dtype, shape in specs:
        tensor = torch.empty(shape, dtype=dtype)
        ctypes.memmove(tensor.data_ptr(), address, tensor.nbytes)
        tensors.append(tensor)
        address += tensor.nbytes
    return tensors


def follow_tag(posted: list[int], slot: int, nbytes: int) -> int:
    """The tag a tensor of ``nbytes`` (> 0) in ``slot`` follows its frame on, under gloo; updates ``posted``.

    ``posted[slot]`` is the size of the receive the link keeps pre-posted for the slot (0: none yet).
    Both ends call this for the same tensors in the same order ([Note: pre-posted receives]).
    """
    capacity = posted[slot]
    if capacity >= nbytes:
        return PREPOSTED_TAG + slot
    if capacity == 0:
        posted[slot] = nbytes  # from the next message on, a receive of this size waits for the slot
    return LATE_TAG


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.nbytes for t in tensors)


# -- links ----------------------------------------------------------------------------------------------------------
class Link:
    """One directed link ``src -> dst`` with its own process group (``peer``: the other end's rank in it)."""

    def __init__(self, src: int, dst: int, group, peer: int) -> None:
        self.src, self.dst, self.group, self.peer = src, dst, group, peer
        self.posted = [0] * MAX_TENSORS  # bytes pre-posted per tensor slot, as both ends know it (follow_tag)

    def isend(self, tensor: torch.Tensor, tag: int = 0):
        return self.group.send([tensor], self.peer, tag)  # what dist.isend does, without its per-call checks

    def irecv(self, tensor: torch.Tensor, tag: int = 0):
        return self.group.recv([tensor], self.peer, tag)

    def recv(self, tensor: torch.Tensor, tag: int = 0) -> None:
        self.irecv(tensor, tag).wait()

    def __repr__(self) -> str:
        return f"link {self.src}->{self.dst}"


class _Message(NamedTuple):
    """One message posted on a link, as the poster gave it."""

    kind_of_message: int
    iteration: int = 0
    producer: Task | None = None
    tensors: tuple[torch.Tensor, ...] = ()
    notice: tuple[int, bool] = (0, False)
    delay: float = 0.0  # injected latency (variability models), slept by the link's thread before sending
    ready: Any = None  # CUDA event on the poster's stream after the tensors were computed ([Note: CUDA streams])
    queued_ns: int = 0


class _Wire:
    """What this backend moves and how: gloo moves host tensors with inline payloads, NCCL device tensors."""

    def __init__(self, device: torch.device) -> None:
        nccl = dist.get_backend() == "nccl"
        self.device = device if nccl else torch.device("cpu")  # CUDA tensors under gloo are staged through the host
        self.inline = not nccl  # [Note: trimmed frames]
        self.frame_bytes = FRAME_BYTES if self.inline else HEADER_BYTES
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

    def direct(self, message: _Message) -> bool:
        """Whether the poster may send ``message`` itself ([Note: sending without a hand-off])."""
        return self.host and message.delay <= 0 and message.ready is None

    def prepare(self, message: _Message) -> _Message:
        """``message`` with its tensors on the wire device; on the link thread, after they were computed."""
        if message.ready is not None:
            torch.cuda.current_stream().wait_event(message.ready)
        return message._replace(tensors=tuple(t.to(self.device) for t in message.tensors))

    def isend(self, link: Link, sequence: int, message: _Message) -> list:
        frame, follow = encode_frame(message.kind_of_message, sequence, message.iteration, message.producer,
                                     message.tensors, message.notice, self.inline)
        if not self.host:
            frame = frame.to(self.device)
        works = [link.isend(frame)]
        for slot, tensor in enumerate(follow):
            if tensor.numel():
                works.append(link.isend(tensor, follow_tag(link.posted, slot, tensor.nbytes) if self.inline else 0))
        if message.kind_of_message == CLOSE and self.inline:  # release the peer's pre-posted receives
            works += [link.isend(_ONE_BYTE, PREPOSTED_TAG + slot) for slot, size in enumerate(link.posted) if size]
        return works

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


def _on_stream(stream) -> contextlib.AbstractContextManager:
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


class _Sender:
    """One outgoing link: its FIFO, its backlog and its thread ([Note: sending without a hand-off])."""

    def __init__(self, link: Link, wire: _Wire, done: Callable[[int, _Message, int, int, int], None],
                 fail: Callable[[TransportError], None]) -> None:
        self.link, self.wire = link, wire
        self.stream = wire.stream()
        self._done, self._fail = done, fail
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue = queue.SimpleQueue()  # _Message (the thread sends it) or _Collect
        self._in_flight: deque = deque()  # (message, sequence, started_ns, handed_ns, works), in posting order
        self._backlog = 0  # messages the thread has yet to send
        self._collect_asked = False
        self._sequence = 0
        self.failure: TransportError | None = None

    def post(self, message: _Message) -> None:
        """Put ``message`` on the wire now, or behind the link's backlog; never waits for the wire."""
        with self._lock:
            if self.failure is not None:
                raise self.failure
            if self._backlog or not self.wire.direct(message):
                self._backlog += 1
                self._requests.put(message)
                return
            self._isend(message)
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
            self.post(_Message(CLOSE))
        except TransportError:
            pass
        self.collect(stop=True)

    def run(self) -> None:
        """The link's thread: send what must wait, wait for what was sent, in order."""
        try:
            with _on_stream(self.stream):
                while True:
                    request = self._requests.get()
                    if isinstance(request, _Message):
                        self._send_waiting(request)
                    self._collect()
                    if isinstance(request, _Collect):
                        request.done.set()
                        if request.stop:
                            return
        except Exception as err:  # a peer died or the group broke: the dispatcher reports it
            self._broken(err)

    def _send_waiting(self, message: _Message) -> None:
        if message.delay > 0:
            time.sleep(message.delay)
        message = self.wire.prepare(message)  # outside the lock: posters queue behind the backlog meanwhile
        with self._lock:
            self._isend(message)
            self._backlog -= 1

    def _isend(self, message: _Message) -> None:
        """Hand ``message`` to the wire; the link's lock is held, so the FIFO order is the posting order."""
        sequence, started = self._sequence, time.monotonic_ns()
        try:
            works = self.wire.isend(self.link, sequence, message)
        except TransportError:  # a message that cannot be framed: the caller's error, the link is fine
            raise
        except Exception as err:
            self.failure = TransportError(f"{self.link}: send failed: {err}")
            self._requests.put(_Collect(threading.Event(), stop=True))  # end the thread
            raise self.failure from err
        self._sequence += 1
        self._in_flight.append((message, sequence, started, time.monotonic_ns(), works))

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


class _Receiver:
    """One incoming link's thread: receives in FIFO order, checks sequence numbers, fills the inbox."""

    def __init__(self, link: Link, wire: _Wire, inbox: Inbox, hello: Callable[[int], None]) -> None:
        self.link, self.wire, self.inbox, self.hello = link, wire, inbox, hello
        self.stream = wire.stream() if wire.device.type == "cuda" else None  # staged tensors arrive on the host
        self._early: list[tuple[torch.Tensor, Any] | None] = [None] * MAX_TENSORS  # pre-posted (buffer, work)

    def run(self) -> None:
        try:
            with _on_stream(self.stream):
                self._loop()
        except Exception as err:
            self.inbox.fail(TransportError(f"{self.link}: receive failed: {err}"))

    def _loop(self) -> None:
        link, expected = self.link, 0
        frame = self.wire.buffer((self.wire.frame_bytes,), torch.uint8)  # reused: inline tensors are copied out
        while True:
            link.recv(frame)
            frame_ns = time.monotonic_ns()
            header = decode_frame(frame)
            if header.sequence != expected:
                raise TransportError(f"{link}: message {header.sequence} arrived, expected {expected} "
                                     f"(FIFO order broken)")
            expected += 1
            if header.kind_of_message == CLOSE:
                for early in self._early:  # the sender's CLOSE filled each with one byte
                    if early is not None:
                        early[1].wait()
                return
            if header.kind_of_message == HELLO:
                self.hello(link.src)
            elif header.kind_of_message == NOTICE:
                self.inbox.put(Notice(link.src, header.iteration, header.producer, header.remaining_ns * 1e-9,
                                      header.firm, frame_ns))
            elif header.kind_of_message == POSTED:
                self.inbox.put(Posted(link.src, header.iteration, header.producer, frame_ns))
            elif header.kind_of_message == DECISION:
                self.inbox.put(Decided(link.src, header.iteration, header.remaining_ns, header.producer,
                                       header.decided_ns, frame_ns))
            else:
                tensors = inline_tensors(frame, header.specs) if header.inline else self._follow(header.specs)
                self.inbox.put(Arrival(link.src, header.sequence, header.iteration, header.producer,
                                       tuple(tensors), frame_ns, time.monotonic_ns(), self.wire.arrived(self.stream)))

    def _follow(self, specs) -> list[torch.Tensor]:
        tensors = []
        for slot, (dtype, shape) in enumerate(specs):
            nbytes = math.prod(shape) * dtype.itemsize
            tag = follow_tag(self.link.posted, slot, nbytes) if nbytes and self.wire.inline else 0
            if tag >= PREPOSTED_TAG and tag != LATE_TAG:
                tensors.append(self._take_early(slot, dtype, shape, nbytes))
                continue
            buffer = self.wire.buffer(shape, dtype)
            if nbytes:
                self.link.recv(buffer, tag)
            tensors.append(buffer)
        for slot, size in enumerate(self.link.posted):  # a slot follow_tag just sized: post its first receive
            if size and self._early[slot] is None:
                self._post_early(slot, torch.empty(size, dtype=torch.uint8))
        return tensors

    def _post_early(self, slot: int, buffer: torch.Tensor) -> None:
        self._early[slot] = (buffer, self.link.irecv(buffer, PREPOSTED_TAG + slot))

    def _take_early(self, slot: int, dtype: torch.dtype, shape, nbytes: int) -> torch.Tensor:
        """The tensor that arrived in ``slot``'s pre-posted receive; that receive is posted again."""
        buffer, work = self._early[slot]
        work.wait()
        if nbytes == buffer.numel():  # filled: hand the buffer over, post a new one
            tensor = torch.empty(0, dtype=dtype).set_(buffer.untyped_storage(), 0, shape)
            self._post_early(slot, torch.empty(nbytes, dtype=torch.uint8))
        else:  # shorter: copy it out, post the buffer again
            tensor = torch.empty(shape, dtype=dtype)
            ctypes.memmove(tensor.data_ptr(), buffer.data_ptr(), nbytes)
            self._post_early(slot, buffer)
        return tensor


class Transport:
    """The links of one rank: a sender per outgoing link, a receiver thread per incoming one.

    Build it collectively (every rank constructs it with the same ``links``),
    then :meth:`start`; :meth:`send` posts a message; arrivals land in
    ``inbox``; :meth:`close` ends the threads after every posted message went out.
    """

    def __init__(
        self,
        rank: int,
        links: Sequence[tuple[int, int]],
        device: torch.device,
        timeout: float,
        latency: Callable[[int, Task], float] | None = None,
    ) -> None:
        self.rank = rank
        self.device = device
        self.inbox = Inbox()
        self.latency = latency  # injected per-message delay (variability models), slept on the link's thread
        self.sent: list[Sent] = []
        self._sent_lock = threading.Lock()
        group_timeout = timedelta(seconds=max(30.0, 2 * timeout))
        self.out_links: dict[int, Link] = {}
        self.in_links: dict[int, Link] = {}
        # new_group is collective over the default group: every rank creates every link, in one order.
        for src, dst in sorted(set(links)):
            group = dist.new_group(sorted({src, dst}), timeout=group_timeout)
            if src == rank:
                self.out_links[dst] = Link(src, dst, group, dist.get_group_rank(group, dst))
            if dst == rank:
                self.in_links[src] = Link(src, dst, group, dist.get_group_rank(group, src))
        self._wire = _Wire(device)
        self._senders = {dst: _Sender(link, self._wire, self._on_sent, self._on_send_failure)
                         for dst, link in self.out_links.items()}
        self._threads: list[threading.Thread] = []
        self._hellos = threading.Semaphore(0)  # released once per HELLO received
        self._hello_from: list[int] = []
        self._closed = False
        self._send_failure: TransportError | None = None

    # -- lifecycle -------------------------------------------------------
    def start(self, timeout: float) -> None:
        """Start the threads and exchange one HELLO per link; returns when every incoming link spoke."""
        for src, link in self.in_links.items():
            self._spawn(f"rrfp-recv-{src}->{self.rank}", _Receiver(link, self._wire, self.inbox, self._hello).run)
        for dst, sender in self._senders.items():
            self._spawn(f"rrfp-send-{self.rank}->{dst}", sender.run)
            sender.post(_Message(HELLO))
        deadline = time.monotonic() + timeout
        for _ in self.in_links:
            if not self._hellos.acquire(timeout=max(0.0, deadline - time.monotonic())):
                silent = sorted(set(self.in_links) - set(self._hello_from))
                raise TransportError(f"rank {self.rank}: no HELLO from rank(s) {silent} within {timeout:.0f} s")
        self.inbox.drain()  # raises if a link already failed

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _hello(self, src: int) -> None:
        self._hello_from.append(src)
        self._hellos.release()

    def close(self, timeout: float = 30.0) -> None:
        """Send CLOSE on every outgoing link, wait for every thread to end."""
        if self._closed:
            return
        self._closed = True
        for sender in self._senders.values():
            sender.close()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise TransportError(f"rank {self.rank}: transport threads did not stop: {', '.join(alive)}")

    # -- sending ---------------------------------------------------------
    def send(self, dst: int, iteration: int, producer: Task, tensors: Sequence[torch.Tensor]) -> None:
        """Post ``tensors`` (the output of ``producer``) for rank ``dst``; never waits for the wire."""
        tensors = tuple(t.detach() for t in tensors)
        delay = self.latency(dst, producer) if self.latency is not None else 0.0
        self._senders[dst].post(_Message(DATA, iteration, producer, tensors, (0, False), delay,
                                         self._wire.computed(tensors), time.monotonic_ns()))

    def notify(self, dst: int, iteration: int, producer: Task, remaining: float, firm: bool) -> None:
        """Post a NOTICE for rank ``dst``: ``producer``'s output should leave here in ``remaining`` seconds."""
        self._senders[dst].post(_Message(NOTICE, iteration, producer, notice=(max(0, int(remaining * 1e9)), firm),
                                         queued_ns=time.monotonic_ns()))

    def decide(self, dst: int, iteration: int, index: int, task: Task, decided_ns: int) -> None:
        """Post a DECISION for follower ``dst``: its ``index``-th task of ``iteration`` is ``task``."""
        self._senders[dst].post(_Message(DECISION, iteration, task, notice=(index, decided_ns),
                                         queued_ns=time.monotonic_ns()))

    def posted(self, dst: int, iteration: int, producer: Task) -> None:
        """Post a POSTED for rank ``dst``: this rank has posted its receive for ``producer``'s output."""
        self._senders[dst].post(_Message(POSTED, iteration, producer, queued_ns=time.monotonic_ns()))

    def wait_sent(self, timeout: float) -> None:
        """Block until every posted message was sent and received (the end of an iteration; peers wait for them)."""
        deadline = time.monotonic() + timeout
        for dst, done in [(dst, sender.collect()) for dst, sender in self._senders.items()]:
            if not done.wait(max(0.0, deadline - time.monotonic())):
                raise TransportError(f"rank {self.rank}: messages to rank {dst} not sent within {timeout:.0f} s")
        if self._send_failure is not None:
            raise self._send_failure

    def take_sent(self) -> list[Sent]:
        """The bookkeeping of every message sent since the last call (for traces)."""
        with self._sent_lock:
            sent, self.sent = self.sent, []
        return sent

    def _on_sent(self, dst: int, message: _Message, sequence: int, started_ns: int, finished_ns: int) -> None:
        if message.kind_of_message != DATA:
            return
        with self._sent_lock:
            self.sent.append(Sent(dst, sequence, message.iteration, message.producer,
                                  _nbytes(message.tensors), message.queued_ns, started_ns, finished_ns))

    def _on_send_failure(self, failure: TransportError) -> None:
        if self._send_failure is None:
            self._send_failure = failure
        self.inbox.fail(failure)


def measure_clock_offset(rank: int, world: int, rounds: int = 8, group=None) -> tuple[int, int]:
    """This rank's clock offset to rank 0 (NTP-style ping-pong on the default group) and its error bound.

    Returns ``(offset_ns, error_ns)``: ``rank 0's monotonic time ~= local time + offset``, within
    ``error_ns`` (half of the best of ``rounds`` round trips). Collective: every rank must call it.
    ``group`` must move CPU tensors (gloo); None is the default group.
    """
    if world == 1:
        return 0, 0
    stamps = torch.zeros(2, dtype=torch.int64)
    if rank == 0:
        for peer in range(1, world):
            for _ in range(rounds):
                dist.recv(stamps, peer, group=group)
                received = time.monotonic_ns()
                dist.send(torch.tensor([received, time.monotonic_ns()], dtype=torch.int64), peer, group=group)
        return 0, 0
    best: tuple[int, int] | None = None
    for _ in range(rounds):
        sent = time.monotonic_ns()
        dist.send(torch.tensor([sent, 0], dtype=torch.int64), 0, group=group)
        dist.recv(stamps, 0, group=group)
        back = time.monotonic_ns()
        received, replied = stamps.tolist()
        round_trip = (back - sent) - (replied - received)
        offset = ((received - sent) + (replied - back)) // 2
        if best is None or round_trip < best[1]:
            best = (offset, round_trip)
    return best[0], best[1] // 2


def pipeline_links(rank_of_consumer_pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Directed links from ``(producer rank, consumer rank)`` pairs, without self-links."""
    return sorted({(a, b) for a, b in rank_of_consumer_pairs if a != b})
