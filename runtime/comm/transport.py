"""Message-driven point-to-point transport between pipeline ranks.

All communication of the pipeline goes through this module, under one rule:

[Note: transport ordering rule]
    Every *directed link* ``src -> dst`` between two ranks that exchange
    pipeline data is a FIFO with its own process group (so a send and a
    receive on the same pair of ranks never block each other, and NCCL,
    which ignores tags, still sees one ordered stream per communicator) and,
    under gloo, its own TCP connection for the frames. Messages of a link go
    on the wire in the order they were posted, by one sender at a time
    ([Note: sending without a hand-off] says which); the receiving rank reads
    them in that order (under gloo the dispatcher itself, [Note: dispatcher
    reads the sockets]; under NCCL a receiver thread per incoming link).
    Each message carries a sequence number, checked on arrival. That is the
    only ordering there is: the receiver never needs to know in advance
    which message comes next, because every message says what it is.

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
write and one read; under gloo larger ones up to ``BODY_BYTES`` follow the
frame on the socket as its body ([Note: bodies]), and larger still
(``inline == 0``, and every tensor under NCCL) take the link's process group
as one send per tensor (zero-size tensors are never sent; the header has
their shape), under gloo into receives posted before they were sent ([Note:
pre-posted receives]). Frames are built and read on the host with ``struct``
and ``memmove``: a handful of microseconds, no per-word tensor operations.

[Note: bodies]
    A payload over ``INLINE_BYTES`` and at most ``BODY_BYTES`` (the header's
    ``inline`` word is 2) is written right after its frame, the tensors'
    own bytes with one ``sendmsg`` (no copy into the frame). The reader
    takes what it read with the frame, then reads the rest straight into
    the tensors it hands over (allocated from :class:`_Spares`, so their
    pages are not faulted in anew each time), without waiting: a body still
    arriving is finished by later reads, and its message is listed only
    once complete. Its arrival time is the kernel's receive time of its last
    bytes. A 1 MiB message then costs less than gloo's own send and receive
    (docs/benchmarks/transport-latency.md). Up to ``BODY_BYTES`` the kernel's socket
    buffers hold a body while the receiving rank computes; beyond it a
    message goes on gloo, whose own thread receives it meanwhile.

[Note: trimmed frames]
    Under gloo a frame is the header and the inline payload, nothing more,
    written to the link's socket back to back with the frames before it;
    the reader learns each frame's length from its header (the inline
    payload is the tensors it describes). A NOTICE is then a few hundred
    bytes, and a small activation costs what it weighs. NCCL needs matching
    sizes, so under NCCL every frame is exactly the header
    (``HEADER_BYTES``) and every tensor follows it: no payload is copied on
    the device to build a frame.

[Note: pre-posted receives]
    gloo moves a message only once its receive is posted: a tensor posted
    after its frame was read waits one more round of notifications, and on
    a round trip of 1 MiB that cost 1.5x plain gloo. So under gloo each
    incoming link keeps ``PREPOSTED_DEPTH`` receives *pre-posted* for each
    tensor slot of a message (tag ``PREPOSTED_TAG + slot``, matched in
    posting order), sized by the first tensor that followed a frame in that
    slot, and the sender sends a tensor there when it fits (gloo receives a
    shorter message into a larger buffer); one that does not fit, or the
    first of its slot, goes on ``LATE_TAG`` into a receive posted after the
    frame. Both ends apply the same rule (:func:`follow_tag`) to the same
    sequence of messages, so the sender always knows what the receiver has
    posted, without asking. A tensor that filled its buffer is handed over
    as it is; the receive that replaces it is posted at the reader's next
    :meth:`_SocketReader.settle` (the inbox's next drain or wait, after the
    message was handed over: posting costs about 30 us), into a buffer the
    slot handed over before whose consumer has let go of it
    (:class:`_Spares`: fresh pages cost more than the transfer), else a new
    one; meanwhile the slot's other receive is posted. A shorter tensor is
    copied out and its buffer posted again. CLOSE sends one byte into each
    pre-posted receive (the reader settles first, so both ends count
    ``PREPOSTED_DEPTH`` per sized slot), so no receive is left pending when
    the link ends. The sender puts a message's tensors on gloo *before* its
    frame on the socket, so a reader that finds the frame finds the tensors
    there or nearly (it waits for them then), and the dispatcher never
    blocks on a transfer that has only begun. NCCL ignores tags: there every
    tensor follows its frame on the one ordered stream, posted after the
    frame.

``type`` is HELLO (sent once per link at start, so every link is set up and
exercised before training), DATA, NOTICE, DECISION, POSTED or CLOSE (end of run). ``kind`` is
the Unicode code point of the producing task's letter (``ord("F")``), so the
header names the producing task ``<stage><kind><microbatch>`` directly.

A NOTICE carries no tensors: it tells the receiver that the producing task's
output is on its way, for the lookahead rule ([Note: lookahead admission] in
:mod:`runtime.sched.arbiter`). ``remaining_ns`` is the sender's estimate of how long
until the output leaves it (its duration estimate for a task it just started:
``firm`` = 1; or, relayed, its own predicted wait plus its duration estimate
for the next task: ``firm`` = 0). Times are relative, so no clock needs to be
shared. Notices travel in the link's one FIFO, so a notice always arrives
before the data it announces.

A DECISION carries no tensors either: a TP group's leader tells a follower
which task to run next, on the leader's decision link to it ([Note: TP
coordination] in :mod:`runtime.exec.tp`). The producer fields name the task, and
the two words a NOTICE uses for ``remaining_ns`` and ``firm`` hold the
decision's index in the iteration and the leader's clock at the decision
(ns, rank 0's clock domain), from which the follower's trace gets the follow
latency.

A POSTED carries no tensors either: under ``--p2p blocking`` the consumer's
rank tells the producer's rank that it has posted its receive for the
message the producer fields name ([Note: blocking p2p in the runtime] in
:mod:`runtime.exec.executor`). It travels on the link opposite to the data's.

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
    only every ``MAX_UNCOLLECTED`` sends, by :meth:`Transport.wait_sent` at
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

[Note: dispatcher reads the sockets]
    Under gloo nothing can learn of an arrival without blocking in gloo
    (``irecv(...).is_completed()`` stays False until ``wait()``, torch
    2.13), and a thread that blocks there must then wake the dispatcher: a
    hand-off that alone cost 1.4-1.5x plain gloo's one-way latency for a
    small message (docs/benchmarks/transport-latency.md). So frames travel over a TCP
    connection per link (set up at construction: each rank listens on its
    address on the route to ``MASTER_ADDR``, or on ``RRFP_SOCKET_ADDR``, and
    the addresses are all-gathered) and the dispatcher reads them itself:
    :meth:`Inbox.drain` reads what the sockets hold without waiting, and
    :meth:`Inbox.wait` sleeps in ``select`` on them. No thread, no hand-off:
    a small message costs about what plain gloo does. What the sockets hold
    while the dispatcher computes stays in the kernel; each read takes the
    kernel's receive time of its bytes (``SO_TIMESTAMPNS``), so an
    arrival's times in traces are when it arrived, not when it was read. A
    tensor that follows its frame is waited for by the dispatcher when it
    reads the frame (the sender put it on gloo first); its arrival time is
    the end of that wait if the wait was not instant, else the frame's.
    Anything that blocks the dispatcher at the end of an iteration
    (:meth:`Transport.wait_sent`, :meth:`Transport.close`) reads the sockets
    meanwhile, because a peer's send may be waiting for this rank to read
    (a full socket, or a tensor whose receive is posted once its frame is
    read). Under NCCL, a receiver thread per link fills the inbox's queue.

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
import os
import queue
import selectors
import socket
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
WIRE_VERSION = 2  # its high half; 1 added POSTED, 2 bodies (0: the frames before versions existed)
MAX_TENSORS = 4
MAX_DIMS = 6
FIXED_WORDS = 11
HEADER_WORDS = FIXED_WORDS + MAX_TENSORS * (2 + MAX_DIMS)
HEADER_BYTES = HEADER_WORDS * 8
INLINE_BYTES = 32 * 1024
BODY_BYTES = 4 << 20  # under gloo, a larger payload follows its frame on the socket up to this ([Note: bodies])
FRAME_BYTES = HEADER_BYTES + INLINE_BYTES
PREPOSTED_TAG = 1  # + the tensor's slot in its message: a receive posted before the message ([Note: pre-posted receives])
LATE_TAG = PREPOSTED_TAG + MAX_TENSORS  # a tensor whose receive is posted after its frame was read
PREPOSTED_DEPTH = 2  # receives a sized slot keeps posted ([Note: pre-posted receives])
MAX_UNCOLLECTED = 8  # sends in flight on a link before its thread is woken to collect them
HELLO, DATA, CLOSE, NOTICE, DECISION, POSTED = 1, 2, 3, 4, 5, 6
_IN_FRAME, _BODY = 1, 2  # the header's inline word: the payload in the frame, or after it on the socket
_ABOUT_A_TASK = frozenset((DATA, NOTICE, DECISION, POSTED))  # the types whose producer fields name a task
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool,
          torch.uint8)
_DTYPE_CODE = {dtype: code for code, dtype in enumerate(DTYPES)}
_FIXED = struct.Struct(f"={FIXED_WORDS}q")  # native order: frames never leave one kind of machine
_SPEC = struct.Struct(f"={2 + MAX_DIMS}q")  # dtype, ndim, d0..d5
_MAGIC_WORD = MAGIC | WIRE_VERSION << 32
_KIND_CODE = {kind: ord(kind.value) for kind in Kind}  # a task's kind on the wire
_CODE_KIND = {code: kind for kind, code in _KIND_CODE.items()}
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
    """Arrivals for the dispatcher (one thread), which sleeps on it while nothing is ready.

    Two kinds of source fill it ([Note: dispatcher reads the sockets]): under gloo the links' sockets, which
    the dispatcher reads itself whenever it drains or waits (no thread, no hand-off); under NCCL the
    receiver threads, through a C-level ``queue.SimpleQueue`` (the cheapest wake-up between Python
    threads). Failures of other threads come through the queue in both cases and wake a waiting dispatcher.
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


# -- frames ---------------------------------------------------------------------------------------------------------
def encode_frame(kind_of_message: int, sequence: int, iteration: int = 0, producer: Task | None = None,
                 tensors: Sequence[torch.Tensor] = (), notice: tuple[int, bool] = (0, False),
                 inline: bool = True, body: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The frame of one message (a host byte tensor), and the tensors that must follow it.

    With ``inline`` a payload of at most ``INLINE_BYTES`` of host tensors travels in the frame, which
    ends right after it ([Note: trimmed frames]); a larger one of at most ``body`` bytes follows the frame
    as its *body* ([Note: bodies]); otherwise the frame is the header and every tensor follows it (NCCL,
    or a large payload).
    """
    frame, follow, _ = _frame(kind_of_message, sequence, iteration, producer, tensors, notice, inline, body)
    return torch.frombuffer(frame, dtype=torch.uint8), follow


def _frame(kind_of_message: int, sequence: int, iteration: int, producer: Task | None,
           tensors: Sequence[torch.Tensor], notice: tuple[int, bool], inline: bool,
           body: int = 0) -> tuple[bytearray, list, int]:
    """:func:`encode_frame`'s frame as the bytes a socket sends, the tensors that follow it, and where the
    payload goes (the header's ``inline`` word: 1 in the frame, ``_BODY`` in a body, 0 on the link's group)."""
    count = len(tensors)
    if count > MAX_TENSORS:
        raise TransportError(f"a message carries at most {MAX_TENSORS} tensors, got {count}")
    where, payload = _IN_FRAME if inline else 0, 0
    if count:
        tensors = [t.contiguous() for t in tensors]
        payload = sum(t.nbytes for t in tensors)
        host = all(t.is_cpu for t in tensors)
        if not (inline and payload <= INLINE_BYTES and host):
            where = _BODY if payload <= body and host else 0
    frame = bytearray(HEADER_BYTES + (payload if where == _IN_FRAME else 0))
    stage, kind, microbatch = (-1, 0, -1) if producer is None else \
        (producer.stage, _KIND_CODE[producer.kind], producer.microbatch)
    _FIXED.pack_into(frame, 0, _MAGIC_WORD, sequence, kind_of_message, iteration, stage, kind, microbatch, count,
                     where, notice[0], notice[1])
    if not count:
        return frame, [], where
    for i, tensor in enumerate(tensors):
        _SPEC.pack_into(frame, _FIXED.size + i * _SPEC.size, *_spec(tensor))
    if where != _IN_FRAME:
        return frame, tensors, where
    view, offset = memoryview(frame), HEADER_BYTES
    for tensor in tensors:
        if tensor.nbytes:
            view[offset:offset + tensor.nbytes] = _host_bytes(tensor)
            offset += tensor.nbytes
    return frame, [], where


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
    body: bool = False  # the payload follows the frame on the socket ([Note: bodies])


def decode_frame(frame: torch.Tensor) -> FrameHeader:
    """The header of a received frame (a contiguous byte tensor, on the host or a device)."""
    if frame.dtype != torch.uint8 or frame.numel() < HEADER_BYTES:
        raise TransportError(f"a frame is at least {HEADER_BYTES} bytes, got {frame.numel()} of {frame.dtype}")
    if frame.device.type != "cpu":
        frame = frame[:HEADER_BYTES].cpu()
    return _decode(_host_bytes(frame), 0)


def _decode(buffer, offset: int) -> FrameHeader:
    """The header of the frame that starts at ``offset`` of ``buffer`` (bytes on the host)."""
    magic, sequence, kind_of_message, iteration, stage, kind, microbatch, count, inline, remaining, firm = \
        _FIXED.unpack_from(buffer, offset)
    if magic != _MAGIC_WORD:
        if magic & 0xFFFFFFFF != MAGIC:
            raise TransportError(f"bad message header (magic {magic:#x})")
        raise TransportError(f"the peer speaks wire version {magic >> 32}, this rank {WIRE_VERSION}: run one rrfp "
                             f"version on every rank")
    producer = None
    if kind_of_message in _ABOUT_A_TASK:
        if kind not in _CODE_KIND:
            raise TransportError(f"bad message header (task kind {kind})")
        producer = Task(stage, _CODE_KIND[kind], microbatch)
    if not 0 <= count <= MAX_TENSORS:
        raise TransportError(f"bad message header ({count} tensors)")
    specs = []
    offset += _FIXED.size
    for i in range(count):
        dtype, ndim, *dims = _SPEC.unpack_from(buffer, offset + i * _SPEC.size)
        if not (0 <= dtype < len(DTYPES) and 0 <= ndim <= MAX_DIMS and min(dims) >= 0):
            raise TransportError(f"bad message header (tensor {i}: dtype {dtype}, {ndim} dims)")
        specs.append((DTYPES[dtype], tuple(dims[:ndim])))
    if inline not in (0, _IN_FRAME, _BODY):
        raise TransportError(f"bad message header (inline word {inline})")
    return FrameHeader(kind_of_message, sequence, iteration, producer, specs, inline == _IN_FRAME, remaining,
                       bool(firm), firm, inline == _BODY)


def inline_tensors(frame: torch.Tensor, specs) -> list[torch.Tensor]:
    """The payload tensors packed into a host ``frame`` (each copied out to its own storage)."""
    return _inline_at(frame.data_ptr() + HEADER_BYTES, specs)


def _inline_at(address: int, specs) -> list[torch.Tensor]:
    """The tensors ``specs`` describe, packed back to back from ``address`` on the host (copied out)."""
    tensors = []
    for dtype, shape in specs:
        tensor = torch.empty(shape, dtype=dtype)
        ctypes.memmove(tensor.data_ptr(), address, tensor.nbytes)
        tensors.append(tensor)
        address += tensor.nbytes
    return tensors


def payload_bytes(specs) -> int:
    """The bytes of the tensors ``specs`` describe."""
    return sum(_spec_bytes(dtype, shape) for dtype, shape in specs)


def _spec_bytes(dtype: torch.dtype, shape) -> int:
    """The bytes of one tensor a header describes."""
    return math.prod(shape) * dtype.itemsize


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
    """One directed link ``src -> dst`` with its own process group (``peer``: the other end's rank in it).

    Under gloo, ``sock`` is the link's TCP connection, which carries its frames ([Note: dispatcher reads the
    sockets]); tensors that follow a frame take the group.
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


def _host_bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous host tensor, in place (valid while the tensor lives)."""
    return memoryview((ctypes.c_char * tensor.nbytes).from_address(tensor.data_ptr())).cast("B")


class _Wire:
    """What this backend moves and how: gloo moves host tensors with inline payloads, NCCL device tensors."""

    def __init__(self, device: torch.device, body_bytes: int = BODY_BYTES) -> None:
        nccl = dist.get_backend() == "nccl"
        self.device = device if nccl else torch.device("cpu")  # CUDA tensors under gloo are staged through the host
        self.sockets = not nccl  # frames (with inline payloads) on sockets: [Note: dispatcher reads the sockets]
        self.body_bytes = body_bytes if self.sockets else 0  # [Note: bodies]
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

    def isend(self, link: Link, sequence: int, message: _Message, wait: bool = True) -> tuple[list, _Rest | None]:
        """Put ``message`` on the wire: the works of its asynchronous sends, and what of its frame and body is
        left to write (only without ``wait``, when the link's socket is full: the caller must not block)."""
        frame, follow, where = _frame(message.kind_of_message, sequence, message.iteration, message.producer,
                                      message.tensors, message.notice, self.sockets, self.body_bytes)
        if not self.sockets:  # NCCL: the frame, then each tensor, on the link's one ordered stream
            works = [link.isend(torch.frombuffer(frame, dtype=torch.uint8).to(self.device))]
            return works + [link.isend(tensor) for tensor in follow if tensor.numel()], None
        if where == _BODY:  # [Note: bodies]
            rest = _write(link.sock, [frame] + [_host_bytes(t) for t in follow if t.nbytes], wait)
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
                 fail: Callable[[TransportError], None], collected: Callable[[], None] = lambda: None) -> None:
        self.link, self.wire = link, wire
        self.stream = wire.stream()
        self._done, self._fail, self._collected = done, fail, collected
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue = queue.SimpleQueue()  # _Message or _Rest (the thread sends it), _Collect
        self._in_flight: deque = deque()  # (message, sequence, started_ns, handed_ns, works), in posting order
        self._backlog = 0  # messages the thread has yet to send (or finish writing)
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

    def _send_waiting(self, message: _Message) -> None:
        """Send a message of the backlog. While the backlog is not empty only this thread sends, so it may
        wait for the wire without the lock: posters queue behind it meanwhile, never wait for it."""
        if message.delay > 0:
            time.sleep(message.delay)
        message = self.wire.prepare(message)
        self._isend(message, wait=True)
        with self._lock:
            self._backlog -= 1

    def _isend(self, message: _Message, wait: bool) -> _Rest | None:
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


def _item(link: Link, header: FrameHeader, frame_ns: int) -> Notice | Posted | Decided:
    """What a received NOTICE, POSTED or DECISION frame tells the dispatcher."""
    kind = header.kind_of_message
    if kind == NOTICE:
        return Notice(link.src, header.iteration, header.producer, header.remaining_ns * 1e-9, header.firm, frame_ns)
    if kind == POSTED:
        return Posted(link.src, header.iteration, header.producer, frame_ns)
    if kind == DECISION:
        return Decided(link.src, header.iteration, header.remaining_ns, header.producer, header.decided_ns, frame_ns)
    raise TransportError(f"{link}: message {header.sequence} has unknown type {kind}")


def _check_sequence(link: Link, header: FrameHeader, expected: int) -> None:
    if header.sequence != expected:
        raise TransportError(f"{link}: message {header.sequence} arrived, expected {expected} (FIFO order broken)")


class _Receiver:
    """One incoming link's thread under NCCL: receives in FIFO order, checks sequence numbers, fills the inbox.

    Every frame is the header and every tensor follows it on the same ordered stream ([Note: trimmed frames]).
    """

    def __init__(self, link: Link, wire: _Wire, inbox: Inbox, hello: Callable[[int], None]) -> None:
        self.link, self.wire, self.inbox, self.hello = link, wire, inbox, hello
        self.stream = wire.stream()

    def run(self) -> None:
        try:
            with _on_stream(self.stream):
                self._loop()
        except Exception as err:
            self.inbox.fail(TransportError(f"{self.link}: receive failed: {err}"))

    def _loop(self) -> None:
        link, expected = self.link, 0
        frame = self.wire.buffer((HEADER_BYTES,), torch.uint8)
        while True:
            link.recv(frame)
            frame_ns = time.monotonic_ns()
            header = decode_frame(frame)
            _check_sequence(link, header, expected)
            expected += 1
            if header.kind_of_message == CLOSE:
                return
            if header.kind_of_message == HELLO:
                self.hello(link.src)
            elif header.kind_of_message != DATA:
                self.inbox.put(_item(link, header, frame_ns))
            else:
                tensors = []
                for dtype, shape in header.specs:
                    buffer = self.wire.buffer(shape, dtype)
                    if buffer.numel():
                        link.recv(buffer)
                    tensors.append(buffer)
                self.inbox.put(Arrival(link.src, header.sequence, header.iteration, header.producer,
                                       tuple(tensors), frame_ns, time.monotonic_ns(), self.wire.arrived(self.stream)))


_SO_TIMESTAMPNS = 35  # Linux: the kernel's receive time of the bytes a recvmsg returns (CLOCK_REALTIME)
_TIMESPEC = struct.Struct("=qq")


class _Body:
    """A body being read: its message's header, the tensors it fills, and the views of them still empty."""

    def __init__(self, header: FrameHeader, frame_ns: int, tensors: list, views: list) -> None:
        self.header, self.frame_ns, self.tensors, self.views = header, frame_ns, tensors, views
        self.received_ns = frame_ns  # the kernel's receive time of the last bytes read into it


class _SocketReader:
    """One incoming link under gloo, read by the dispatcher ([Note: dispatcher reads the sockets]).

    Frames come over the link's socket, back to back; a tensor that follows its frame comes on the link's
    gloo group, into a receive posted before it was sent where it can ([Note: pre-posted receives]).
    """

    def __init__(self, link: Link, hello: Callable[[int], None]) -> None:
        self.link, self.sock, self.hello = link, link.sock, hello
        self.closed = False  # CLOSE read (or, closing, the link failed)
        self._expected = 0
        self._buffer = torch.empty(4 * FRAME_BYTES, dtype=torch.uint8)  # several frames: one read can take them all
        self._base = self._buffer.data_ptr()
        self._view = _host_bytes(self._buffer)
        self._start = self._end = 0  # unread bytes: [start, end)
        self._early: list[deque] = [deque() for _ in range(MAX_TENSORS)]  # per slot: pre-posted (buffer, work)
        self._owed: list[list] = [[] for _ in range(MAX_TENSORS)]  # per slot: buffers to post when settled
        self.unsettled = False  # a receive is owed: settle() posts it, off the message's path
        self._sized = [False] * MAX_TENSORS  # the slot's receives were posted (it keeps PREPOSTED_DEPTH)
        self._spares = [_Spares() for _ in range(MAX_TENSORS)]  # buffers handed over, reused once free
        self._body: _Body | None = None  # the body being read ([Note: bodies])
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            self._stamped = True
        except OSError:
            self._stamped = False

    def read(self, out: list) -> None:
        """Read what the socket holds; append what each complete message tells the dispatcher to ``out``."""
        link, view = self.link, self._view
        while not self.closed:
            if self._body is not None:  # the rest of a body goes straight into its tensors ([Note: bodies])
                if not self._read_body(out):
                    return
                continue
            if len(view) - self._end < FRAME_BYTES:  # keep room for a whole frame after the unread bytes
                self._compact()
            room = len(view) - self._end
            count, received_ns = self._receive(view[self._end:])
            if count is None:
                return
            self._end += count
            try:
                self._parse(out, received_ns)
            except TransportError:
                raise
            except Exception as err:  # gloo, receiving a tensor that follows a frame
                raise TransportError(f"{link}: receive failed: {err}") from err
            if count < room and self._body is None:  # the socket held no more: more wakes the selector again
                return

    def _receive(self, into) -> tuple[int | None, int]:
        """Read what the socket holds into ``into`` without waiting: the byte count (None: nothing there) and
        the kernel's receive time of those bytes on the monotonic clock (the read's time without it)."""
        link, sock = self.link, self.sock
        try:
            if self._stamped:
                count, ancillary, _, _ = sock.recvmsg_into([into], 64, socket.MSG_DONTWAIT)
            else:
                count, ancillary = sock.recv_into(into, 0, socket.MSG_DONTWAIT), ()
        except BlockingIOError:
            return None, 0
        except OSError as err:
            raise TransportError(f"{link}: receive failed: {err}") from err
        if count == 0:
            raise TransportError(f"{link}: receive failed: rank {link.src} closed the connection")
        now = received_ns = time.monotonic_ns()
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
                seconds, nanoseconds = _TIMESPEC.unpack_from(data)
                received_ns = min(now, seconds * 1_000_000_000 + nanoseconds - (time.time_ns() - now))
        return count, received_ns

    def _start_body(self, header: FrameHeader, frame_ns: int) -> None:
        """Receive the body of ``header``'s message into tensors of their own: first what was read with the
        frame, the rest as it comes (:meth:`_read_body`)."""
        tensors, views = [], []
        for slot, (dtype, shape) in enumerate(header.specs):
            nbytes = _spec_bytes(dtype, shape)
            if not nbytes:
                tensors.append(torch.empty(shape, dtype=dtype))
                continue
            storage = self._spares[slot].take(nbytes).untyped_storage()
            tensors.append(torch.empty(0, dtype=dtype).set_(storage, 0, shape))
            self._spares[slot].keep(storage)
            views.append(memoryview(_host_bytes(tensors[-1])))
        self._body = _Body(header, frame_ns, tensors, views)
        for i, view in enumerate(views):  # the bytes read with the frame
            taken = min(len(view), self._end - self._start)
            view[:taken] = self._view[self._start:self._start + taken]
            self._start += taken
            if taken < len(view):
                self._body.views[:i + 1] = [view[taken:]]
                return
        self._body.views.clear()

    def _read_body(self, out: list) -> bool:
        """Read the open body on; list its message once complete (True), or return False if the socket is dry."""
        body = self._body
        while body.views:
            count, received_ns = self._receive(body.views[0])
            if count is None:
                return False
            body.received_ns = received_ns
            body.views[0] = body.views[0][count:]
            if not len(body.views[0]):
                body.views.pop(0)
        self._finish_body(out)
        return True

    def _finish_body(self, out: list) -> None:
        body, self._body = self._body, None
        header = body.header
        out.append(Arrival(self.link.src, header.sequence, header.iteration, header.producer, tuple(body.tensors),
                           body.frame_ns, max(body.frame_ns, body.received_ns)))

    def _compact(self) -> None:
        unread = self._end - self._start
        if self._start:
            ctypes.memmove(self._base, self._base + self._start, unread)
        self._start, self._end = 0, unread

    def _parse(self, out: list, frame_ns: int) -> None:
        link = self.link
        while self._end - self._start >= HEADER_BYTES:
            address = self._base + self._start
            header = _decode(self._view, self._start)
            size = HEADER_BYTES + (payload_bytes(header.specs) if header.inline else 0)  # a body is not counted
            if size > FRAME_BYTES:
                raise TransportError(f"{link}: message {header.sequence} claims a frame of {size} bytes")
            if self._end - self._start < size:
                return
            _check_sequence(link, header, self._expected)
            self._expected += 1
            self._start += size
            kind = header.kind_of_message
            if kind == DATA and header.body:
                self._start_body(header, frame_ns)
                if self._body.views:
                    return  # every byte read is in the body: the rest comes with the next reads
                self._finish_body(out)
            elif kind == DATA:
                if header.inline:
                    tensors, arrived = _inline_at(address + HEADER_BYTES, header.specs), frame_ns
                else:
                    tensors, arrived = self._follow(header.specs, frame_ns)
                out.append(Arrival(link.src, header.sequence, header.iteration, header.producer, tuple(tensors),
                                   frame_ns, arrived))
            elif kind == HELLO:
                self.hello(link.src)
            elif kind == CLOSE:
                self.settle()
                for early in self._early:  # the sender's CLOSE filled each with one byte
                    for _, work in early:
                        work.wait()
                self.closed = True
                return
            else:
                out.append(_item(link, header, frame_ns))
        if self._start == self._end:
            self._start = self._end = 0

    def _follow(self, specs, frame_ns: int) -> tuple[list[torch.Tensor], int]:
        """The tensors that follow a frame on the group, and when the last was there: when the wait for it
        returned, or the frame's time when they were there already (the dispatcher read the frame late)."""
        tensors, waited = [], False
        for slot, (dtype, shape) in enumerate(specs):
            nbytes = _spec_bytes(dtype, shape)
            if not nbytes:
                tensors.append(torch.empty(shape, dtype=dtype))
                continue
            began = time.monotonic_ns()
            tag = follow_tag(self.link.posted, slot, nbytes)
            if tag != LATE_TAG:
                tensors.append(self._take_early(slot, dtype, shape, nbytes))
            else:
                buffer = torch.empty(shape, dtype=dtype)
                self.link.recv(buffer, tag)
                tensors.append(buffer)
            waited = waited or time.monotonic_ns() - began > _WAITED_NS
        for slot, size in enumerate(self.link.posted):  # a slot follow_tag just sized: post its first receive
            if size and not self._sized[slot]:
                self._sized[slot] = True
                for _ in range(PREPOSTED_DEPTH):
                    self._post_early(slot, torch.empty(size, dtype=torch.uint8))
        return tensors, time.monotonic_ns() if waited else frame_ns

    def _post_early(self, slot: int, buffer: torch.Tensor) -> None:
        self._early[slot].append((buffer, self.link.irecv(buffer, PREPOSTED_TAG + slot)))

    def settle(self) -> None:
        """Post the receives owed since the last call (each sized slot keeps ``PREPOSTED_DEPTH`` posted)."""
        self.unsettled = False
        for slot, owed in enumerate(self._owed):
            while owed:
                try:
                    self._post_early(slot, self._spares[slot].take(owed[0]))
                except Exception as err:
                    raise TransportError(f"{self.link}: receive failed: {err}") from err
                owed.pop(0)

    def _take_early(self, slot: int, dtype: torch.dtype, shape, nbytes: int) -> torch.Tensor:
        """The tensor that arrived in ``slot``'s pre-posted receive; that receive is posted again."""
        if not self._early[slot]:  # every receive of the slot used since the last settle()
            self.settle()
        buffer, work = self._early[slot].popleft()
        work.wait()
        if nbytes == buffer.numel():  # filled: hand the buffer over, post another
            storage = buffer.untyped_storage()
            tensor = torch.empty(0, dtype=dtype).set_(storage, 0, shape)
            self._owed[slot].append(nbytes)  # posted by settle(), from the spares, once the message is out
            self.unsettled = True
            self._spares[slot].keep(storage)
        else:  # shorter: copy it out, post the buffer again
            tensor = torch.empty(shape, dtype=dtype)
            ctypes.memmove(tensor.data_ptr(), buffer.data_ptr(), nbytes)
            self._post_early(slot, buffer)
        return tensor


_WAITED_NS = 20_000  # a wait for a tensor shorter than this found it there already
_STORAGE_USERS = getattr(torch._C, "_storage_Use_Count", None)  # references to a storage (torch 2.x, private)


class _Spares:
    """The buffers one pre-posted slot handed over, reused for its next receives once nobody else holds them.

    A fresh buffer's pages are faulted in while gloo writes into it: about 150 faults and 250 us for a
    1 MiB tensor on a small VM, more than the rest of its latency. So the storages handed to the executor
    are kept (at most ``SPARES``), and a receive is posted into one whose only reference is ours (the
    consumer has let go of it: its use count is 1) when there is one. What is kept but not yet reused is
    at most ``SPARES`` buffers per slot, which the process would otherwise hand back to the allocator.
    """

    SPARES = 4

    def __init__(self) -> None:
        self._kept: list = []  # UntypedStorage

    def keep(self, storage) -> None:
        if _STORAGE_USERS is not None and len(self._kept) < self.SPARES:
            self._kept.append(storage)

    def take(self, nbytes: int) -> torch.Tensor:
        """A byte buffer of ``nbytes`` to receive into: a free kept one, else a new one."""
        for i, storage in enumerate(self._kept):
            if storage.nbytes() == nbytes and _STORAGE_USERS(storage._cdata) == 1:
                del self._kept[i]
                return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (nbytes,))
        return torch.empty(nbytes, dtype=torch.uint8)


def _local_address() -> tuple[int, str]:
    """The address family and the address other ranks reach this one at: ``RRFP_SOCKET_ADDR`` if set (a host
    with several networks), else this host's address on the route to ``MASTER_ADDR``."""
    chosen = os.environ.get("RRFP_SOCKET_ADDR")
    try:
        family, _, _, _, where = socket.getaddrinfo(chosen or os.environ.get("MASTER_ADDR", "127.0.0.1"), 1,
                                                    type=socket.SOCK_DGRAM)[0]
        if chosen:
            return family, where[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(where)  # no packet leaves: it only picks the route
            return family, probe.getsockname()[0]
    except OSError as err:
        if chosen:
            raise TransportError(f"RRFP_SOCKET_ADDR={chosen!r}: {err}") from err
        return socket.AF_INET, "127.0.0.1"


def _listener() -> socket.socket:
    """A socket bound to the address other ranks reach this one at (:func:`_local_address`), on a free port."""
    family, host = _local_address()
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.bind((host, 0))
    except OSError as err:
        listener.close()
        chosen = "RRFP_SOCKET_ADDR" if os.environ.get("RRFP_SOCKET_ADDR") else "the route to MASTER_ADDR"
        raise TransportError(f"cannot listen on {host} (from {chosen}): {err}") from err
    return listener


def check_socket_address() -> None:
    """What a rank would listen on can be listened on here (``RRFP_SOCKET_ADDR``: an address of this host);
    raises :class:`TransportError` before any rank starts."""
    _listener().close()


def _connect_links(rank: int, out_links: dict[int, Link], in_links: dict[int, Link], timeout: float) -> None:
    """Give every link a TCP connection, src connecting to dst (collective: every rank calls it)."""
    listener = _listener()
    host = listener.getsockname()[0]
    try:
        listener.listen(max(8, len(in_links)))
        addresses = _gather_addresses(host, listener.getsockname()[1])
        for dst, link in out_links.items():
            try:
                sock = socket.create_connection(addresses[dst][:2], timeout=timeout)
            except OSError as err:
                raise TransportError(f"{link}: cannot connect to rank {dst} at {addresses[dst][0]}:"
                                     f"{addresses[dst][1]}: {err}") from err
            sock.sendall(struct.pack("=q", rank))
            link.sock = sock
        deadline = time.monotonic() + timeout
        while missing := sorted(src for src, link in in_links.items() if link.sock is None):
            try:
                listener.settimeout(max(0.001, deadline - time.monotonic()))
                sock, _ = listener.accept()
            except OSError as err:
                raise TransportError(f"rank {rank}: no connection from rank(s) {missing} within {timeout:.0f} s "
                                     f"({err})") from err
            try:
                sock.settimeout(min(5.0, max(0.001, deadline - time.monotonic())))  # a rank says who it is at once
                src = struct.unpack("=q", _receive_exactly(sock, 8))[0]
            except OSError as err:
                sock.close()
                if time.monotonic() < deadline:  # a stranger that connected and went or said nothing: not ours
                    continue
                raise TransportError(f"rank {rank}: no connection from rank(s) {missing} within {timeout:.0f} s "
                                     f"({err})") from err
            if src in missing:
                in_links[src].sock = sock
            else:  # not a rank this one expects (a port scan, a stray process): not ours to fail on
                sock.close()
    finally:
        listener.close()
    for link in (*out_links.values(), *in_links.values()):
        link.sock.settimeout(None)  # blocking: the dispatcher reads with MSG_DONTWAIT, the link threads wait
        link.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


_ADDRESS_BYTES = 64  # an IPv4 or IPv6 address, as text


def _gather_addresses(host: str, port: int) -> list[tuple[str, int]]:
    """Every rank's ``(host, port)``: a collective over the default group (host tensors, no pickling)."""
    text = host.encode()
    if len(text) > _ADDRESS_BYTES:
        raise TransportError(f"address {host!r} is longer than {_ADDRESS_BYTES} bytes")
    mine = torch.zeros(_ADDRESS_BYTES + 2, dtype=torch.int64)
    mine[:len(text)] = torch.tensor(list(text), dtype=torch.int64)
    mine[-2:] = torch.tensor([len(text), port])
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return [(bytes(row[:int(row[-2])].tolist()).decode(), int(row[-1])) for row in everyone]


def _receive_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        data += chunk
    return data


class Transport:
    """The links of one rank: a sender per outgoing link; under gloo a socket per incoming link that the
    dispatcher reads, under NCCL a receiver thread per incoming link.

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
        body_bytes: int = BODY_BYTES,
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
        self._wire = _Wire(device, body_bytes)
        self._readers: list[_SocketReader] = []
        if self._wire.sockets:
            _connect_links(rank, self.out_links, self.in_links, group_timeout.total_seconds())
            self._readers = [_SocketReader(link, self._hello) for link in self.in_links.values()]
            self.inbox.attach(self._readers)
        self._senders = {dst: _Sender(link, self._wire, self._on_sent, self._on_send_failure, self.inbox.wake)
                         for dst, link in self.out_links.items()}
        self._threads: list[threading.Thread] = []
        self._hellos = threading.Semaphore(0)  # released once per HELLO received
        self._hello_from: list[int] = []
        self._closed = False
        self._send_failure: TransportError | None = None

    # -- lifecycle -------------------------------------------------------
    def start(self, timeout: float) -> None:
        """Start the threads and exchange one HELLO per link; returns when every incoming link spoke."""
        if not self._wire.sockets:
            for src, link in self.in_links.items():
                self._spawn(f"rrfp-recv-{src}->{self.rank}", _Receiver(link, self._wire, self.inbox, self._hello).run)
        for dst, sender in self._senders.items():
            self._spawn(f"rrfp-send-{self.rank}->{dst}", sender.run)
            sender.post(_Message(HELLO))
        deadline = time.monotonic() + timeout
        for _ in self.in_links:
            while not self._hellos.acquire(blocking=False):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    silent = sorted(set(self.in_links) - set(self._hello_from))
                    raise TransportError(f"rank {self.rank}: no HELLO from rank(s) {silent} within {timeout:.0f} s")
                if self._readers:  # they read the HELLOs; what comes after them waits in the inbox
                    self.inbox.pump(min(0.1, remaining))
                elif self._hellos.acquire(timeout=remaining):  # the receiver threads' HELLOs
                    break
        self.inbox.check()  # raises if a link already failed (what arrived stays for the dispatcher)

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _hello(self, src: int) -> None:
        self._hello_from.append(src)
        self._hellos.release()

    def close(self, timeout: float = 30.0) -> None:
        """Send CLOSE on every outgoing link, wait for every link's CLOSE and for every thread to end."""
        if self._closed:
            return
        self._closed = True
        for sender in self._senders.values():
            sender.close()
        deadline = time.monotonic() + timeout
        while any(not reader.closed for reader in self._readers) and time.monotonic() < deadline:
            self.inbox.pump(min(0.1, max(0.0, deadline - time.monotonic())), quiet=True)
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        silent = sorted(reader.link.src for reader in self._readers if not reader.closed)
        self.inbox.detach()
        for link in (*self.out_links.values(), *self.in_links.values()):
            if link.sock is not None:
                link.sock.close()
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise TransportError(f"rank {self.rank}: transport threads did not stop: {', '.join(alive)}")
        if silent:
            raise TransportError(f"rank {self.rank}: no CLOSE from rank(s) {silent} within {timeout:.0f} s")

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
        """Block until every posted message was sent and received (the end of an iteration; peers wait for them).

        Under gloo the incoming sockets are read meanwhile: a peer's sends may wait for this rank to read.
        """
        deadline = time.monotonic() + timeout
        for dst, done in [(dst, sender.collect()) for dst, sender in self._senders.items()]:
            while not done.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TransportError(f"rank {self.rank}: messages to rank {dst} not sent within {timeout:.0f} s")
                if self._readers:
                    self.inbox.pump(remaining)  # woken by the sender's thread when it is done
                else:
                    done.wait(remaining)
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
