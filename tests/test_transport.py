"""Transport wire format and inbox, without processes (the multi-process paths run in test_runtime.py)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from hints.tasks import Task
from runtime.transport import (
    CLOSE,
    DATA,
    FRAME_BYTES,
    INLINE_BYTES,
    HELLO,
    Inbox,
    TransportError,
    decode_frame,
    encode_frame,
    inline_tensors,
    pipeline_links,
)


@pytest.mark.parametrize("tensors", [
    (torch.randn(2, 32, 64),),
    (torch.randn(0, 4, 64),),  # a microbatch without images
    (torch.arange(6, dtype=torch.int64).reshape(2, 3), torch.tensor([True, False]), torch.randn(3).half()),
    (),
])
def test_inline_round_trip(tensors):
    frame, follow = encode_frame(DATA, 7, 3, Task.parse("2F5"), tensors)
    assert frame.numel() == FRAME_BYTES and follow == []
    header = decode_frame(frame)
    assert (header.kind_of_message, header.sequence, header.iteration) == (DATA, 7, 3)
    assert header.producer == Task.parse("2F5") and header.inline
    for got, want in zip(inline_tensors(frame, header.specs), tensors):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_large_payload_follows_the_frame():
    big = torch.randn(INLINE_BYTES // 4 + 1)
    frame, follow = encode_frame(DATA, 0, 0, Task.parse("0B1"), (big,))
    header = decode_frame(frame)
    assert not header.inline and header.specs == [(torch.float32, tuple(big.shape))]
    assert len(follow) == 1 and torch.equal(follow[0], big)


def test_control_messages_and_bad_frames():
    for kind in (HELLO, CLOSE):
        header = decode_frame(encode_frame(kind, 1)[0])
        assert header.kind_of_message == kind and header.producer is None
    with pytest.raises(TransportError, match="bad message header"):
        decode_frame(torch.zeros(FRAME_BYTES, dtype=torch.uint8))
    with pytest.raises(TransportError, match="at most 4 tensors"):
        encode_frame(DATA, 0, 0, Task.parse("0F0"), [torch.zeros(1)] * 5)
    with pytest.raises(TransportError, match="cannot be sent"):
        encode_frame(DATA, 0, 0, Task.parse("0F0"), [torch.zeros(1, dtype=torch.complex64)])


def test_inbox_wakes_the_waiter_and_reports_failures():
    inbox = Inbox()
    threading.Timer(0.05, inbox.put, args=("hello",)).start()
    began = time.monotonic()
    inbox.wait(5.0)
    assert time.monotonic() - began < 2.0  # woken by the put, not the timeout
    assert inbox.drain() == ["hello"]
    inbox.fail(TransportError("link 0->1: receive failed: peer died"))
    with pytest.raises(TransportError, match="peer died"):
        inbox.wait(0.01)
    with pytest.raises(TransportError):
        inbox.drain()


def test_links_are_directed_and_deduplicated():
    assert pipeline_links([(0, 1), (1, 0), (0, 1), (2, 2)]) == [(0, 1), (1, 0)]
