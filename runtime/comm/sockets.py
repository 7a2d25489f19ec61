"""The gloo side of receiving: each incoming link's socket, read by the dispatcher itself, and the receives
posted on the link's group for the tensors that follow a frame.

[Note: dispatcher reads the sockets]
    Under gloo nothing can learn of an arrival without blocking in gloo
    (``irecv(...).is_completed()`` stays False until ``wait()``, torch 2.13),
    and a thread that blocks there must then wake the dispatcher: a hand-off
    that alone cost 1.4-1.5x plain gloo's one-way latency for a small message
    (docs/benchmarks/transport-latency.md). So frames travel over a TCP
    connection per link (set up at construction: each rank listens on its
    address on the route to ``MASTER_ADDR``, or on ``RRFP_SOCKET_ADDR``, and
    the addresses are all-gathered) and the dispatcher reads them itself:
    :meth:`Inbox.drain` reads what the sockets hold without waiting, and
    :meth:`Inbox.wait` sleeps in ``select`` on them
    (:mod:`runtime.comm.inbox`; the connections:
    :mod:`runtime.comm.bootstrap`). No thread, no hand-off: a small message
    costs about what plain gloo does. What the sockets hold while the
    dispatcher computes stays in the kernel; each read takes the kernel's
    receive time of its bytes (``SO_TIMESTAMPNS``), so an arrival's times in
    traces are when it arrived, not when it was read. A tensor that follows
    its frame is waited for by the dispatcher when it reads the frame (the
    sender put it on gloo first); its arrival time is the end of that wait if
    the wait was not instant, else the frame's. Anything that blocks the
    dispatcher at the end of an iteration (:meth:`Transport.wait_sent`,
    :meth:`Transport.close` in :mod:`runtime.comm.transport`) reads the
    sockets meanwhile, because a peer's send may be waiting for this rank to
    read (a full socket, or a tensor whose receive is posted once its frame is
    read). Under NCCL, a receiver thread per link fills the inbox's queue
    (:mod:`runtime.comm.nccl`).

[Note: pre-posted receives]
    gloo moves a message only once its receive is posted: a tensor posted
    after its frame was read waits one more round of notifications, and on a
    round trip of 1 MiB that cost 1.5x plain gloo. So under gloo each incoming
    link keeps ``PREPOSTED_DEPTH`` receives *pre-posted* for each tensor slot
    of a message (tag ``PREPOSTED_TAG + slot``, matched in posting order),
    sized by the first tensor that followed a frame in that slot, and the
    sender sends a tensor there when it fits (gloo receives a shorter message
    into a larger buffer); one that does not fit, or the first of its slot,
    goes on ``LATE_TAG`` into a receive posted after the frame. Both ends
    apply the same rule (:func:`runtime.comm.frames.follow_tag`) to the same
    sequence of messages, so the sender always knows what the receiver has
    posted, without asking. A tensor that filled its buffer is handed over as
    it is; the receive that replaces it is posted at the reader's next
    :meth:`SocketReader.settle` (the inbox's next drain or wait, after the
    message was handed over: posting costs about 30 us), into a buffer the
    slot handed over before whose consumer has let go of it (:class:`Spares`:
    fresh pages cost more than the transfer), else a new one; meanwhile the
    slot's other receive is posted. A shorter tensor is copied out and its
    buffer posted again. CLOSE sends one byte into each pre-posted receive
    (the reader settles first, so both ends count ``PREPOSTED_DEPTH`` per
    sized slot), so no receive is left pending when the link ends. The sender
    (:class:`runtime.comm.links.Wire`) puts a message's tensors on gloo
    *before* its frame on the socket, so a reader that finds the frame finds
    the tensors there or nearly (it waits for them then), and the dispatcher
    never blocks on a transfer that has only begun. NCCL ignores tags: there
    every tensor follows its frame on the one ordered stream, posted after the
    frame.
"""

from __future__ import annotations

import ctypes
import socket
import struct
import time
from collections import deque
from typing import Callable

import torch

from runtime.comm.errors import TransportError
from runtime.comm.frames import (
    CLOSE,
    DATA,
    FRAME_BYTES,
    HEADER_BYTES,
    HELLO,
    LATE_TAG,
    MAX_TENSORS,
    PREPOSTED_DEPTH,
    PREPOSTED_TAG,
    FrameHeader,
    decode_header,
    follow_tag,
    host_bytes,
    payload_bytes,
    spec_bytes,
    tensors_at,
)
from runtime.comm.inbox import Arrival, check_sequence, item_of
from runtime.comm.links import Link

_SO_TIMESTAMPNS = 35  # Linux: the kernel's receive time of the bytes a recvmsg returns (CLOCK_REALTIME)
_TIMESPEC = struct.Struct("=qq")


class _Body:
    """A body being read: its message's header, the tensors it fills, and the views of them still empty."""

    def __init__(self, header: FrameHeader, frame_ns: int, tensors: list, views: list) -> None:
        self.header, self.frame_ns, self.tensors, self.views = header, frame_ns, tensors, views
        self.received_ns = frame_ns  # the kernel's receive time of the last bytes read into it


class SocketReader:
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
        self._view = host_bytes(self._buffer)
        self._start = self._end = 0  # unread bytes: [start, end)
        self._early: list[deque] = [deque() for _ in range(MAX_TENSORS)]  # per slot: pre-posted (buffer, work)
        self._owed: list[list] = [[] for _ in range(MAX_TENSORS)]  # per slot: buffers to post when settled
        self.unsettled = False  # a receive is owed: settle() posts it, off the message's path
        self._sized = [False] * MAX_TENSORS  # the slot's receives were posted (it keeps PREPOSTED_DEPTH)
        self._spares = [Spares() for _ in range(MAX_TENSORS)]  # buffers handed over, reused once free
        self._body: _Body | None = None  # the body being read ([Note: bodies] in runtime.comm.frames)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            self._stamped = True
        except OSError:
            self._stamped = False

    def read(self, out: list) -> None:
        """Read what the socket holds; append what each complete message tells the dispatcher to ``out``."""
        link, view = self.link, self._view
        while not self.closed:
            if self._body is not None:  # the rest of a body goes straight into its tensors ([Note: bodies] in frames)
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
            nbytes = spec_bytes(dtype, shape)
            if not nbytes:
                tensors.append(torch.empty(shape, dtype=dtype))
                continue
            storage = self._spares[slot].take(nbytes).untyped_storage()
            tensors.append(torch.empty(0, dtype=dtype).set_(storage, 0, shape))
            self._spares[slot].keep(storage)
            views.append(memoryview(host_bytes(tensors[-1])))
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
            header = decode_header(self._view, self._start)
            size = HEADER_BYTES + (payload_bytes(header.specs) if header.inline else 0)  # a body is not counted
            if size > FRAME_BYTES:
                raise TransportError(f"{link}: message {header.sequence} claims a frame of {size} bytes")
            if self._end - self._start < size:
                return
            check_sequence(link, header, self._expected)
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
                    tensors, arrived = tensors_at(address + HEADER_BYTES, header.specs), frame_ns
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
                out.append(item_of(link, header, frame_ns))
        if self._start == self._end:
            self._start = self._end = 0

    def _follow(self, specs, frame_ns: int) -> tuple[list[torch.Tensor], int]:
        """The tensors that follow a frame on the group, and when the last was there: when the wait for it
        returned, or the frame's time when they were there already (the dispatcher read the frame late)."""
        tensors, waited = [], False
        for slot, (dtype, shape) in enumerate(specs):
            nbytes = spec_bytes(dtype, shape)
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


class Spares:
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

