"""The NCCL side of receiving: one thread per incoming link, blocked in the link's ordered stream.

Under NCCL nothing travels on a socket ([Note: dispatcher reads the sockets] in :mod:`runtime.comm.sockets`
is the gloo side): every frame is exactly the header and every tensor follows it on the link's one ordered
stream ([Note: trimmed frames] in :mod:`runtime.comm.frames`). Each incoming link has a thread of its own, on
a CUDA stream of its own ([Note: CUDA streams] in :mod:`runtime.comm.links`), which receives in FIFO order,
checks sequence numbers and hands what arrived to the inbox's queue.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from runtime.comm.errors import TransportError
from runtime.comm.frames import CLOSE, DATA, HEADER_BYTES, HELLO, decode_frame
from runtime.comm.inbox import Arrival, Inbox, check_sequence, item_of
from runtime.comm.links import Link, Wire, on_stream


class NcclReceiver:
    """One incoming link's thread under NCCL: receives in FIFO order, checks sequence numbers, fills the inbox."""

    def __init__(self, link: Link, wire: Wire, inbox: Inbox, hello: Callable[[int], None]) -> None:
        self.link, self.wire, self.inbox, self.hello = link, wire, inbox, hello
        self.stream = wire.stream()

    def run(self) -> None:
        try:
            with on_stream(self.stream):
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
            check_sequence(link, header, expected)
            expected += 1
            if header.kind_of_message == CLOSE:
                return
            if header.kind_of_message == HELLO:
                self.hello(link.src)
            elif header.kind_of_message != DATA:
                self.inbox.put(item_of(link, header, frame_ns))
            else:
                tensors = []
                for dtype, shape in header.specs:
                    buffer = self.wire.buffer(shape, dtype)
                    if buffer.numel():
                        link.recv(buffer)
                    tensors.append(buffer)
                self.inbox.put(Arrival(link.src, header.sequence, header.iteration, header.producer,
                                       tuple(tensors), frame_ns, time.monotonic_ns(), self.wire.arrived(self.stream)))
