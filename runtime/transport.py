"""Message-driven point-to-point transport between pipeline ranks.

All communication of the pipeline goes through this module, under one rule:

[Note: transport ordering rule]
    Every *directed link* ``src -> dst`` between two ranks that exchange
    pipeline data is a FIFO with its own process group (so a send and a
    receive on the same pair of ranks never block each other, and NCCL,
    which ignores tags, still sees one ordered stream per communicator). One
    sender thread per outgoing link sends messages in the order the executor
    queued them; one receiver thread per incoming link receives them in that
    order. Each message carries a sequence number, checked on arrival. That
    is the only ordering there is: the receiver never needs to know in
    advance which message comes next, because every message says what it is.

Wire format of one message: one fixed-size byte *frame*, an int64 header of
``HEADER_WORDS`` words followed by up to ``INLINE_BYTES`` of payload::

    [magic, sequence, type, iteration, stage, kind, microbatch, n_tensors, inline, remaining_ns, firm,
     (dtype, ndim, d0..d5) x MAX_TENSORS] [payload bytes, tensors back to back]

Payloads that fit travel inside the frame, so a typical message costs one
send and one receive; larger ones (``inline == 0``) follow the frame as one
send per tensor (zero-size tensors are never sent; the header has their
shape).

[Note: trimmed frames]
    The receiver always posts a receive of ``FRAME_BYTES``; under gloo the
    sender sends only the header and the inline payload, because gloo
    receives a shorter message into a larger buffer (tested in
    tests/test_transport.py) and the header says how much of it is meant. A
    NOTICE is then a few hundred bytes instead of 33 KB, and a small
    activation costs what it weighs. NCCL needs matching sizes, so under
    NCCL every frame is full size.

``type`` is HELLO (sent once per link at start, so every link is set up and
exercised before training), DATA, NOTICE or CLOSE (end of run). ``kind`` is
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

Arrival is learned without polling: gloo's ``irecv(...).is_completed()``
stays False until ``wait()`` is called (torch 2.13), so receiver threads do
blocking receives, which release the GIL, and hand arrivals to the
dispatcher through an :class:`Inbox` (a deque plus a condition variable); the
dispatcher sleeps on the condition while nothing is ready. Sends run on
sender threads, so compute never waits for a send.
"""

from __future__ import annotations

import queue
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from hints.tasks import Kind, Task

MAGIC = 0x52524650  # "RRFP"
MAX_TENSORS = 4
MAX_DIMS = 6
FIXED_WORDS = 11
HEADER_WORDS = FIXED_WORDS + MAX_TENSORS * (2 + MAX_DIMS)
HEADER_BYTES = HEADER_WORDS * 8
_HEADER = struct.Struct(f"={HEADER_WORDS}q")  # native order, as decode_frame reads it
INLINE_BYTES = 32 * 1024
FRAME_BYTES = HEADER_BYTES + INLINE_BYTES
HELLO, DATA, CLOSE, NOTICE = 1, 2, 3, 4
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool,
          torch.uint8)


class TransportError(RuntimeError):
    """A link broke or delivered something unexpected."""


@dataclass(frozen=True)
class Arrival:
    """A message that arrived on link ``src -> this rank``."""

    src: int
    sequence: int
    iteration: int
    producer: Task
    tensors: tuple[torch.Tensor, ...]
    frame_ns: int  # host monotonic clock: the frame was received
    arrived_ns: int  # the whole message was received and handed to the inbox


@dataclass(frozen=True)
class Notice:
    """A NOTICE from link ``src -> this rank``: ``producer``'s output should leave ``src`` in ``remaining`` s."""

    src: int
    iteration: int
    producer: Task
    remaining: float  # seconds, from when the notice was sent
    firm: bool  # the producer has started (else: a relayed prediction)
    arrived_ns: int  # host monotonic clock


@dataclass(frozen=True)
class Sent:
    """Bookkeeping of one message handed to the wire (for traces)."""

    dst: int
    sequence: int
    iteration: int
    producer: Task
    nbytes: int
    queued_ns: int
    started_ns: int
    finished_ns: int


class Inbox:
    """Arrivals from all receiver threads, drained by the dispatcher; the dispatcher sleeps on it."""

    def __init__(self) -> None:
        self._items: deque = deque()
        self._cond = threading.Condition()
        self._failure: BaseException | None = None

    def put(self, item) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            if self._failure is None:
                self._failure = error
            self._cond.notify()

    def drain(self) -> list:
        with self._cond:
            self._raise_failure()
            items = list(self._items)
            self._items.clear()
            return items

    def wait(self, timeout: float) -> None:
        """Sleep until something arrives (or ``timeout`` seconds pass)."""
        with self._cond:
            if not self._items and self._failure is None:
                self._cond.wait(timeout)
            self._raise_failure()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure


def encode_frame(kind_of_message: int, sequence: int, iteration: int = 0, producer: Task | None = None,
                 tensors: Sequence[torch.Tensor] = (), device: torch.device | str = "cpu",
                 notice: tuple[int, bool] = (0, False), trim: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The frame of one message, and the tensors that must follow it (when they do not fit inline).

    ``trim``: the frame ends after its payload instead of filling ``FRAME_BYTES`` ([Note: trimmed
    frames]); only for backends that receive a short message into a full-size buffer (gloo).
    """
    if len(tensors) > MAX_TENSORS:
        raise TransportError(f"a message carries at most {MAX_TENSORS} tensors, got {len(tensors)}")
    payload = sum(t.numel() * t.element_size() for t in tensors)
    inline = payload <= INLINE_BYTES
    words = [MAGIC, sequence, kind_of_message, iteration, -1, 0, -1, len(tensors), int(inline), notice[0],
             int(notice[1])]
    if producer is not None:
        words[4:7] = [producer.stage, ord(producer.kind.value), producer.microbatch]
    for tensor in tensors:
        if tensor.dim() > MAX_DIMS:
            raise TransportError(f"tensors of at most {MAX_DIMS} dims, got shape {tuple(tensor.shape)}")
        try:
            dtype = DTYPES.index(tensor.dtype)
        except ValueError:
            raise TransportError(f"dtype {tensor.dtype} cannot be sent") from None
        words += [dtype, tensor.dim(), *tensor.shape, *[0] * (MAX_DIMS - tensor.dim())]
    words += [0] * (HEADER_WORDS - len(words))
    header = torch.frombuffer(bytearray(_HEADER.pack(*words)), dtype=torch.uint8)  # one copy, no per-word ops
    size = HEADER_BYTES + (payload if inline else 0) if trim else FRAME_BYTES
    if size == HEADER_BYTES and torch.device(device).type == "cpu":  # nothing inline: the header is the frame
        return header, ([] if inline else [t.contiguous() for t in tensors])
    frame = torch.zeros(size, dtype=torch.uint8, device=device)
    frame[:HEADER_BYTES] = header.to(device)
    if not inline:
        return frame, [t.contiguous() for t in tensors]
    offset = HEADER_BYTES
    for tensor in tensors:
        size = tensor.numel() * tensor.element_size()
        if size:
            frame[offset:offset + size] = tensor.contiguous().view(-1).view(torch.uint8)
        offset += size
    return frame, []


@dataclass(frozen=True)
class FrameHeader:
    kind_of_message: int
    sequence: int
    iteration: int
    producer: Task | None
    specs: list[tuple[torch.dtype, tuple[int, ...]]]
    inline: bool
    remaining_ns: int = 0  # NOTICE only
    firm: bool = False  # NOTICE only


def decode_frame(frame: torch.Tensor) -> FrameHeader:
    words = frame[:HEADER_BYTES].cpu().view(torch.int64).tolist()
    if words[0] != MAGIC:
        raise TransportError(f"bad message header (magic {words[0]:#x})")
    _, sequence, kind_of_message, iteration, stage, kind, microbatch, count, inline, remaining, firm = \
        words[:FIXED_WORDS]
    producer = Task(stage, Kind(chr(kind)), microbatch) if kind_of_message in (DATA, NOTICE) else None
    specs = []
    for i in range(count):
        base = FIXED_WORDS + i * (2 + MAX_DIMS)
        dtype, ndim = words[base], words[base + 1]
        specs.append((DTYPES[dtype], tuple(words[base + 2:base + 2 + ndim])))
    return FrameHeader(kind_of_message, sequence, iteration, producer, specs, bool(inline), remaining, bool(firm))


def inline_tensors(frame: torch.Tensor, specs) -> list[torch.Tensor]:
    """The payload tensors packed into ``frame`` (each copied out to its own storage)."""
    tensors, offset = [], HEADER_BYTES
    for dtype, shape in specs:
        tensor = torch.empty(shape, dtype=dtype, device=frame.device)
        size = tensor.numel() * tensor.element_size()
        if size:
            tensor.view(-1).view(torch.uint8).copy_(frame[offset:offset + size])
        tensors.append(tensor)
        offset += size
    return tensors


class Link:
    """One directed link ``src -> dst`` with its own process group."""

    def __init__(self, src: int, dst: int, group) -> None:
        self.src, self.dst, self.group = src, dst, group

    def __repr__(self) -> str:
        return f"link {self.src}->{self.dst}"


class Transport:
    """The links of one rank: sender threads for outgoing links, receiver threads for incoming ones.

    Build it collectively (every rank constructs it with the same ``links``),
    then :meth:`start`; :meth:`send` queues a message; arrivals land in
    ``inbox``; :meth:`close` ends the threads after every queued message went out.
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
        self.latency = latency  # injected per-message delay (variability models), applied on the sender thread
        self.sent: list[Sent] = []
        self._sent_lock = threading.Lock()
        group_timeout = timedelta(seconds=max(30.0, 2 * timeout))
        self.out_links: dict[int, Link] = {}
        self.in_links: dict[int, Link] = {}
        # new_group is collective over the default group: every rank creates every link, in one order.
        for src, dst in sorted(set(links)):
            group = dist.new_group(sorted({src, dst}), timeout=group_timeout)
            if src == rank:
                self.out_links[dst] = Link(src, dst, group)
            if dst == rank:
                self.in_links[src] = Link(src, dst, group)
        self._queues: dict[int, queue.Queue] = {dst: queue.Queue() for dst in self.out_links}
        self._sequence = {dst: 0 for dst in self.out_links}
        self._threads: list[threading.Thread] = []
        self._hellos = threading.Semaphore(0)  # released once per HELLO received
        self._hello_from: list[int] = []
        self._closed = False
        self._unsent = 0  # DATA messages queued and not yet handed to the wire
        self._send_failure: TransportError | None = None
        self._unsent_cond = threading.Condition()
        # gloo moves CPU tensors (CUDA tensors are staged through host memory); NCCL moves CUDA tensors.
        self._wire_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
        self._trim = dist.get_backend() != "nccl"  # [Note: trimmed frames]

    # -- lifecycle -------------------------------------------------------
    def start(self, timeout: float) -> None:
        """Start the threads and exchange one HELLO per link; returns when every incoming link spoke."""
        for src, link in self.in_links.items():
            self._spawn(f"rrfp-recv-{src}->{self.rank}", self._receive_loop, link)
        for dst, link in self.out_links.items():
            self._spawn(f"rrfp-send-{self.rank}->{dst}", self._send_loop, link)
            self._queues[dst].put((HELLO, 0, None, ()))
        deadline = time.monotonic() + timeout
        for _ in self.in_links:
            if not self._hellos.acquire(timeout=max(0.0, deadline - time.monotonic())):
                silent = sorted(set(self.in_links) - set(self._hello_from))
                raise TransportError(f"rank {self.rank}: no HELLO from rank(s) {silent} within {timeout:.0f} s")
        self.inbox.drain()  # raises if a link already failed

    def _spawn(self, name: str, target, link: Link) -> None:
        thread = threading.Thread(target=target, args=(link,), name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def close(self, timeout: float = 30.0) -> None:
        """Send CLOSE on every outgoing link, wait for every thread to end."""
        if self._closed:
            return
        self._closed = True
        for q in self._queues.values():
            q.put((CLOSE, 0, None, ()))
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise TransportError(f"rank {self.rank}: transport threads did not stop: {', '.join(alive)}")

    # -- sending ---------------------------------------------------------
    def send(self, dst: int, iteration: int, producer: Task, tensors: Sequence[torch.Tensor]) -> None:
        """Queue ``tensors`` (the output of ``producer``) for rank ``dst``; returns at once."""
        with self._unsent_cond:
            self._unsent += 1
        self._queues[dst].put((DATA, iteration, producer, tuple(t.detach() for t in tensors)))

    def notify(self, dst: int, iteration: int, producer: Task, remaining: float, firm: bool) -> None:
        """Queue a NOTICE for rank ``dst``: ``producer``'s output should leave here in ``remaining`` seconds."""
        self._queues[dst].put((NOTICE, iteration, producer, (max(0, int(remaining * 1e9)), firm)))

    def wait_sent(self, timeout: float) -> None:
        """Block until every queued message is on the wire (the end of an iteration; its peers are waiting)."""
        with self._unsent_cond:
            if not self._unsent_cond.wait_for(lambda: self._unsent == 0 or self._send_failure, timeout):
                raise TransportError(f"rank {self.rank}: {self._unsent} messages not sent within {timeout:.0f} s")
            if self._send_failure:
                raise self._send_failure

    def take_sent(self) -> list[Sent]:
        """The bookkeeping of every message sent since the last call (for traces)."""
        with self._sent_lock:
            sent, self.sent = self.sent, []
        return sent

    def _send_loop(self, link: Link) -> None:
        q = self._queues[link.dst]
        try:
            while True:
                kind_of_message, iteration, producer, payload = q.get()
                queued = time.monotonic_ns()
                if kind_of_message == DATA and self.latency is not None:
                    delay = self.latency(link.dst, producer)
                    if delay > 0:
                        time.sleep(delay)
                sequence = self._sequence[link.dst]
                self._sequence[link.dst] = sequence + 1
                notice = payload if kind_of_message == NOTICE else (0, False)
                wire = [] if kind_of_message == NOTICE else [self._to_wire(t) for t in payload]
                started = time.monotonic_ns()
                frame, follow = encode_frame(kind_of_message, sequence, iteration, producer, wire,
                                             self._wire_device, notice, trim=self._trim)
                dist.send(frame, link.dst, group=link.group)
                for tensor in follow:
                    if tensor.numel():
                        dist.send(tensor, link.dst, group=link.group)
                if kind_of_message == DATA:
                    with self._sent_lock:
                        self.sent.append(Sent(link.dst, sequence, iteration, producer,
                                              sum(t.numel() * t.element_size() for t in wire), queued, started,
                                              time.monotonic_ns()))
                    with self._unsent_cond:
                        self._unsent -= 1
                        self._unsent_cond.notify_all()
                if kind_of_message == CLOSE:
                    return
        except Exception as err:  # a peer died or the group broke: the dispatcher reports it
            failure = TransportError(f"{link}: send failed: {err}")
            with self._unsent_cond:
                self._send_failure = failure
                self._unsent_cond.notify_all()
            self.inbox.fail(failure)

    # -- receiving -------------------------------------------------------
    def _receive_loop(self, link: Link) -> None:
        expected = 0
        try:
            while True:
                frame = self._wire_buffer((FRAME_BYTES,), torch.uint8)
                dist.recv(frame, link.src, group=link.group)
                frame_ns = time.monotonic_ns()
                header = decode_frame(frame)
                if header.sequence != expected:
                    raise TransportError(f"{link}: message {header.sequence} arrived, expected {expected} "
                                         f"(FIFO order broken)")
                expected += 1
                if header.kind_of_message == CLOSE:
                    return
                if header.kind_of_message == HELLO:
                    self._hello_from.append(link.src)
                    self._hellos.release()
                    continue
                if header.kind_of_message == NOTICE:
                    self.inbox.put(Notice(link.src, header.iteration, header.producer, header.remaining_ns * 1e-9,
                                          header.firm, frame_ns))
                    continue
                if header.inline:
                    tensors = inline_tensors(frame, header.specs)
                else:
                    tensors = []
                    for dtype, shape in header.specs:
                        buffer = self._wire_buffer(shape, dtype)
                        if buffer.numel():
                            dist.recv(buffer, link.src, group=link.group)
                        tensors.append(buffer)
                self.inbox.put(Arrival(link.src, header.sequence, header.iteration, header.producer,
                                       tuple(tensors), frame_ns, time.monotonic_ns()))
        except Exception as err:
            self.inbox.fail(TransportError(f"{link}: receive failed: {err}"))

    # -- devices ---------------------------------------------------------
    def _to_wire(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self._wire_device).contiguous()

    def _wire_buffer(self, shape, dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=self._wire_device)


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
