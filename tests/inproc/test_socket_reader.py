"""The gloo socket reader (runtime.comm.sockets.SocketReader) on socket pairs: frames and bodies rebuilt
whatever the reads cut them into, the FIFO check, a peer that hangs up ([Note: dispatcher reads the
sockets]). One process; no process group (nothing here follows a frame on gloo)."""

from __future__ import annotations

import socket

import pytest
import torch

from hints.tasks import F, Task
from runtime.comm.errors import TransportError
from runtime.comm.frames import CLOSE, DATA, HEADER_BYTES, HELLO, INLINE_BYTES, NOTICE, encode_frame
from runtime.comm.inbox import Arrival
from runtime.comm.links import Link
from runtime.comm.sockets import SocketReader


def _frames(messages, body: int = 0) -> bytes:
    """The bytes a socket carries for ``messages``: each frame, and its body when it has one."""
    data = b""
    for sequence, (kind, producer, tensors) in enumerate(messages):
        frame, follow = encode_frame(kind, sequence, 0, producer, tensors, body=body)
        assert body or not follow
        data += bytes(frame.tolist()) + b"".join(bytes(t.contiguous().view(torch.uint8).flatten().tolist())
                                                 for t in follow)
    return data


def test_the_socket_reader_rebuilds_frames_whatever_the_reads_cut_them_into():
    # The dispatcher reads what the socket holds, which may end inside a header or a payload.
    import random

    messages = [(HELLO, None, ())] + [
        (DATA, Task(0, F, mb), (torch.full((mb % 5, 3), float(mb)), torch.tensor([mb]))) if mb % 3 else
        (NOTICE, Task(0, F, mb), ()) for mb in range(40)] + [(DATA, Task(0, F, 99), (torch.randn(INLINE_BYTES // 4),))]
    # [Note: bodies]: payloads over INLINE_BYTES follow their frames, and a read can end anywhere in them
    messages += [(DATA, Task(0, F, 100 + mb), (torch.randn(INLINE_BYTES // 4 + mb + 1), torch.zeros(0),
                                               torch.arange(mb + 3))) for mb in range(3)]
    data = _frames(messages, body=1 << 20)
    mine, theirs = socket.socketpair()
    hellos, got = [], []
    reader = SocketReader(Link(0, 1, None, 0, theirs), hellos.append)
    chunks, rng, at = [], random.Random(3), 0
    while at < len(data):
        size = rng.choice([1, 7, HEADER_BYTES - 1, HEADER_BYTES + 3, 5000, 70000])
        chunks.append(data[at:at + size])
        at += size
    for chunk in chunks:
        mine.sendall(chunk)
        reader.read(got)
    mine.sendall(bytes(encode_frame(CLOSE, len(messages))[0].tolist()))
    reader.read(got)
    assert hellos == [0] and reader.closed
    assert [(type(item).__name__, item.producer.microbatch) for item in got] == \
        [("Arrival" if kind == DATA else "Notice", producer.microbatch) for kind, producer, _ in messages[1:]]
    for item, (_, _, tensors) in zip(got, messages[1:]):
        if isinstance(item, Arrival):
            assert all(torch.equal(a, b) for a, b in zip(item.tensors, tensors))
    mine.close()
    theirs.close()


def test_the_socket_reader_refuses_a_frame_out_of_order_and_a_peer_that_hangs_up():
    mine, theirs = socket.socketpair()
    reader = SocketReader(Link(0, 1, None, 0, theirs), lambda src: None)
    mine.sendall(bytes(encode_frame(NOTICE, 1, 0, Task.parse("0F0"))[0].tolist()))  # sequence 0 never came
    with pytest.raises(TransportError, match=r"link 0->1: message 1 arrived, expected 0"):
        reader.read([])
    mine2, theirs2 = socket.socketpair()
    reader = SocketReader(Link(0, 1, None, 0, theirs2), lambda src: None)
    mine2.sendall(bytes(encode_frame(HELLO, 0)[0].tolist())[:10])
    mine2.close()  # hangs up inside a frame
    reader.read([])  # the first read takes the 10 bytes; the hang-up wakes the selector again
    with pytest.raises(TransportError, match="link 0->1: receive failed: rank 0 closed the connection"):
        reader.read([])
    for end in (mine, theirs, theirs2):
        end.close()
