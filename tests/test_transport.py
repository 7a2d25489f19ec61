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
    HEADER_BYTES,
    HELLO,
    NOTICE,
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


def test_trimmed_frame_of_a_large_payload_still_has_it_follow():
    big = torch.randn(INLINE_BYTES // 4 + 1)
    frame, follow = encode_frame(DATA, 0, 0, Task.parse("0F1"), (big,), trim=True)
    assert frame.numel() == HEADER_BYTES and not decode_frame(frame).inline
    assert len(follow) == 1 and torch.equal(follow[0], big)


def test_trimmed_frames_and_notices_round_trip():
    tensors = (torch.randn(2, 3), torch.arange(4))
    frame, _ = encode_frame(DATA, 5, 1, Task.parse("1F2"), tensors, trim=True)
    assert frame.numel() == HEADER_BYTES + 2 * 3 * 4 + 4 * 8  # header and payload, nothing more
    received = torch.zeros(FRAME_BYTES, dtype=torch.uint8)
    received[:frame.numel()] = frame  # what a full-size receive holds after a short message
    header = decode_frame(received)
    for got, want in zip(inline_tensors(received, header.specs), tensors):
        assert torch.equal(got, want)
    notice, _ = encode_frame(NOTICE, 6, 1, Task.parse("1F3"), notice=(2_500_000, True), trim=True)
    assert notice.numel() == HEADER_BYTES
    header = decode_frame(notice)
    assert (header.kind_of_message, header.producer, header.remaining_ns, header.firm) == \
        (NOTICE, Task.parse("1F3"), 2_500_000, True)


def _short_receive(rank: int, port: int, out) -> None:
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    if rank == 0:
        dist.send(torch.arange(10, dtype=torch.uint8), 1)
    else:
        buffer = torch.zeros(100, dtype=torch.uint8)
        dist.recv(buffer, 0)
        out.put(buffer[:10].tolist())
    dist.destroy_process_group()


def test_gloo_receives_a_short_message_into_a_full_size_buffer():
    # [Note: trimmed frames] rests on this behaviour of gloo; if a torch upgrade changes it, this fails.
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    out = context.Queue()
    processes = [context.Process(target=_short_receive, args=(rank, port, out)) for rank in range(2)]
    for process in processes:
        process.start()
    try:
        assert out.get(timeout=60) == list(range(10))
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    assert all(process.exitcode == 0 for process in processes)
