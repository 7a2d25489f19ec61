"""Transport: wire format, inbox, the link FIFO rule, and two real ranks on gloo (the pipeline runs in test_runtime.py)."""

from __future__ import annotations

import functools
import os
import socket
import threading
import time

import pytest
import torch

from hints.tasks import F, Task
from runtime.comm.errors import TransportError
from runtime.comm.frames import (
    CLOSE,
    DATA,
    FRAME_BYTES,
    HEADER_BYTES,
    HELLO,
    INLINE_BYTES,
    LATE_TAG,
    MAX_TENSORS,
    NOTICE,
    POSTED,
    PREPOSTED_TAG,
    WIRE_VERSION,
    NoticeFields,
    decode_frame,
    encode_frame,
    follow_tag,
    inline_tensors,
)
from runtime.comm.inbox import Arrival, Inbox, Notice
from runtime.comm.links import Link, Message, Sender, pipeline_links


@pytest.mark.parametrize("tensors", [
    (torch.randn(2, 32, 64),),
    (torch.randn(0, 4, 64),),  # a microbatch without images
    (torch.arange(6, dtype=torch.int64).reshape(2, 3), torch.tensor([True, False]), torch.randn(3).half()),
    (torch.randn(4, 6).t(),),  # not contiguous
    (),
])
def test_inline_round_trip(tensors):
    frame, follow = encode_frame(DATA, 7, 3, Task.parse("2F5"), tensors)
    assert frame.numel() == HEADER_BYTES + sum(t.numel() * t.element_size() for t in tensors) and follow == []
    header = decode_frame(frame)
    assert (header.kind_of_message, header.sequence, header.iteration) == (DATA, 7, 3)
    assert header.producer == Task.parse("2F5") and header.inline
    got = inline_tensors(frame, header.specs)
    assert len(got) == len(tensors)
    for got_tensor, want in zip(got, tensors):
        assert got_tensor.dtype == want.dtype and torch.equal(got_tensor, want)


def test_large_payload_follows_the_frame():
    big = torch.randn(INLINE_BYTES // 4 + 1)
    frame, follow = encode_frame(DATA, 0, 0, Task.parse("0B1"), (big,))
    header = decode_frame(frame)
    assert frame.numel() == HEADER_BYTES and not header.inline
    assert header.specs == [(torch.float32, tuple(big.shape))]
    assert len(follow) == 1 and torch.equal(follow[0], big)


def test_without_inline_the_frame_is_the_header_and_every_tensor_follows():
    # [Note: trimmed frames]: under NCCL every frame is exactly HEADER_BYTES, whatever the payload.
    tensors = (torch.randn(2, 3), torch.arange(4))
    frame, follow = encode_frame(DATA, 1, 0, Task.parse("1F0"), tensors, inline=False)
    header = decode_frame(frame)
    assert frame.numel() == HEADER_BYTES and not header.inline
    assert header.specs == [(torch.float32, (2, 3)), (torch.int64, (4,))]
    assert all(torch.equal(a, b) for a, b in zip(follow, tensors))


def test_a_short_frame_read_into_a_full_size_buffer_round_trips():
    tensors = (torch.randn(2, 3), torch.arange(4))
    frame, _ = encode_frame(DATA, 5, 1, Task.parse("1F2"), tensors)
    received = torch.zeros(FRAME_BYTES, dtype=torch.uint8)
    received[:frame.numel()] = frame  # what a full-size receive holds after a short message
    header = decode_frame(received)
    for got, want in zip(inline_tensors(received, header.specs), tensors):
        assert torch.equal(got, want)


def test_notices_and_control_messages_are_header_only():
    notice, _ = encode_frame(NOTICE, 6, 1, Task.parse("1F3"), fields=NoticeFields(2_500_000, True))
    assert notice.numel() == HEADER_BYTES
    header = decode_frame(notice)
    assert (header.kind_of_message, header.producer, header.fields.remaining_ns, header.fields.firm) == \
        (NOTICE, Task.parse("1F3"), 2_500_000, True)
    for kind in (HELLO, CLOSE):
        header = decode_frame(encode_frame(kind, 1)[0])
        assert header.kind_of_message == kind and header.producer is None


def test_posted_is_a_header_naming_the_message_it_answers():
    frame, follow = encode_frame(POSTED, 4, 2, Task.parse("2B5"))
    assert frame.numel() == HEADER_BYTES and follow == []
    header = decode_frame(frame)
    assert (header.kind_of_message, header.sequence, header.iteration, header.producer) == \
        (POSTED, 4, 2, Task.parse("2B5"))


def test_a_frame_of_another_wire_version_is_refused():
    frame, _ = encode_frame(POSTED, 0, 0, Task.parse("0F0"))
    words = frame[:8].view(torch.int64)
    assert words[0].item() >> 32 == WIRE_VERSION
    words[0] = words[0].item() & 0xFFFFFFFF  # what a peer from before versioned frames sends
    with pytest.raises(TransportError, match=f"the peer speaks wire version 0, this rank {WIRE_VERSION}"):
        decode_frame(frame)


def test_bad_frames_and_messages_are_transport_errors():
    with pytest.raises(TransportError, match="bad message header"):
        decode_frame(torch.zeros(FRAME_BYTES, dtype=torch.uint8))
    with pytest.raises(TransportError, match="at least"):
        decode_frame(torch.zeros(HEADER_BYTES - 1, dtype=torch.uint8))
    with pytest.raises(TransportError, match="at most 4 tensors"):
        encode_frame(DATA, 0, 0, Task.parse("0F0"), [torch.zeros(1)] * 5)
    with pytest.raises(TransportError, match="cannot be sent"):
        encode_frame(DATA, 0, 0, Task.parse("0F0"), [torch.zeros(1, dtype=torch.complex64)])
    with pytest.raises(TransportError, match="at most 6 dims"):
        encode_frame(DATA, 0, 0, Task.parse("0F0"), [torch.zeros([1] * 7)])


def test_inbox_wakes_the_waiter_and_reports_failures():
    inbox = Inbox()
    threading.Timer(0.05, inbox.put, args=("hello",)).start()
    began = time.monotonic()
    inbox.wait(5.0)
    assert time.monotonic() - began < 2.0  # woken by the put, not the timeout
    inbox.put("again")
    assert inbox.drain() == ["hello", "again"]
    assert inbox.drain() == []
    began = time.monotonic()
    inbox.wait(0.05)
    assert time.monotonic() - began >= 0.04  # nothing came: the timeout
    threading.Timer(0.05, inbox.fail, args=(TransportError("link 0->1: receive failed: peer died"),)).start()
    with pytest.raises(TransportError, match="peer died"):
        inbox.wait(5.0)
    with pytest.raises(TransportError):
        inbox.drain()


def test_an_arrival_on_cpu_hands_over_its_tensors_as_they_are():
    # [Note: CUDA streams]: no event on CPU, so take() waits for nothing and records nothing.
    tensors = (torch.randn(3),)
    arrival = Arrival(1, 0, 0, Task.parse("0F0"), tensors, 1, 2)
    assert arrival.ready is None and arrival.take() is tensors


def test_links_are_directed_and_deduplicated():
    assert pipeline_links([(0, 1), (1, 0), (0, 1), (2, 2)]) == [(0, 1), (1, 0)]


class _RecordingWire:
    """A wire that records what is put on it, and by which thread: for the FIFO rule alone."""

    host = True

    def __init__(self) -> None:
        self.sent: list[tuple[int, int, str]] = []  # (sequence, microbatch, thread name)

    def stream(self):
        return None

    def direct(self, message) -> bool:
        return message.delay <= 0

    def prepare(self, message):
        return message

    def isend(self, link, sequence, message, wait=True):
        microbatch = -1 if message.producer is None else message.producer.microbatch
        self.sent.append((sequence, microbatch, threading.current_thread().name))
        return [], None


def test_a_link_keeps_posting_order_when_some_messages_must_wait():
    # [Note: sending without a hand-off]: a delayed message makes a backlog, and what is posted behind it
    # goes through the link's thread too, so the wire sees the posting order.
    wire, done, failures = _RecordingWire(), [], []
    sender = Sender(Link(0, 1, group=None, peer=1), wire, lambda *args: done.append(args[1]), failures.append)
    thread = threading.Thread(target=sender.run, name="link-thread")
    thread.start()
    delays = [0.0, 0.05, 0.0, 0.0, 0.02, 0.0]
    for microbatch, delay in enumerate(delays):
        sender.post(Message(DATA, 0, Task(0, F, microbatch), delay=delay))
    assert sender.collect().wait(10.0)
    sender.close()
    thread.join(10.0)
    assert not thread.is_alive() and failures == []
    assert [(s, mb) for s, mb, _ in wire.sent] == [(i, i) for i in range(len(delays))] + [(len(delays), -1)]
    by_thread = [name for _, _, name in wire.sent[:len(delays)]]
    assert by_thread[0] == threading.current_thread().name  # nothing to wait for: the poster sent it
    assert set(by_thread[1:]) == {"link-thread"}  # behind the first delay, the backlog never drained to zero
    assert [d.producer.microbatch for d in done if d.kind_of_message == DATA] == list(range(len(delays)))


# -- two real ranks on gloo ------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _two_ranks(target, timeout: float = 90.0) -> list:
    """Run ``target(rank, out)`` on two spawned processes; returns what they put in ``out``."""
    import torch.multiprocessing as mp

    port = _free_port()
    context = mp.get_context("spawn")
    out = context.Queue()
    processes = [context.Process(target=target, args=(rank, port, out)) for rank in range(2)]
    for process in processes:
        process.start()
    results = []
    try:
        deadline = time.monotonic() + timeout
        while len(results) < 2:
            results.append(out.get(timeout=max(1.0, deadline - time.monotonic())))
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    return sorted(results, key=lambda r: r[0])


def _finish(transport, rank: int, out, result) -> None:
    """A rank's end: wait for the peer, close the transport (reading its CLOSE), report ``result``."""
    import torch.distributed as dist

    dist.barrier()
    transport.close()
    out.put((rank, result))
    dist.destroy_process_group()


def _init(rank: int, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)


def _short_receive(rank: int, port: int, out) -> None:
    import torch.distributed as dist

    _init(rank, port)
    if rank == 0:
        dist.send(torch.arange(10, dtype=torch.uint8), 1)
        out.put((0, None))
    else:
        buffer = torch.zeros(100, dtype=torch.uint8)
        dist.recv(buffer, 0)
        out.put((1, buffer[:10].tolist()))
    dist.destroy_process_group()


def test_follow_tag_sizes_a_slot_once_and_sends_what_fits_into_it():
    posted = [0] * MAX_TENSORS
    assert follow_tag(posted, 0, 100) == LATE_TAG and posted[0] == 100  # the first: late, and sizes the slot
    assert follow_tag(posted, 0, 100) == PREPOSTED_TAG  # fits
    assert follow_tag(posted, 0, 60) == PREPOSTED_TAG  # fits, shorter
    assert follow_tag(posted, 0, 101) == LATE_TAG and posted[0] == 100  # too large: late, the size stays
    assert follow_tag(posted, 2, 8) == LATE_TAG and follow_tag(posted, 2, 8) == PREPOSTED_TAG + 2
    assert posted == [100, 0, 8, 0]


def test_gloo_receives_a_short_message_into_a_full_size_buffer():
    # [Note: trimmed frames] rests on this behaviour of gloo; if a torch upgrade changes it, this fails.
    assert _two_ranks(_short_receive)[1][1] == list(range(10))


MESSAGES = 12


BIG = INLINE_BYTES // 4 + 5  # floats: too many to travel inside a frame


def _payload(microbatch: int) -> tuple[torch.Tensor, ...]:
    # [Note: pre-posted receives]: every path of a tensor that follows its frame, in one link's sequence.
    if microbatch == 3:
        return (torch.full((BIG,), 3.0),)  # slot 0's first: after its frame; sizes slot 0's pre-posted receive
    if microbatch == 5:
        return (torch.zeros(0, 4), torch.arange(5))  # a zero-size tensor is described, never sent
    if microbatch == 6:
        return (torch.arange(BIG, dtype=torch.float32).reshape(BIG // 7, 7),)  # fills the pre-posted receive
    if microbatch == 8:
        return (torch.arange(BIG - 100, dtype=torch.float32), torch.full((BIG,), -8.0))  # shorter: copied; slot 1
    if microbatch == 9:
        return (torch.arange(3 * BIG, dtype=torch.float32), torch.full((BIG,), 9.0))  # too large: late; pre-posted
    if microbatch == 10:
        return (torch.ones(4 * BIG, dtype=torch.bool), torch.tensor([10]))  # fills slot 0's buffer with another dtype
    return (torch.full((2, 8), float(microbatch)), torch.tensor([microbatch]))


def _ordered_exchange(rank: int, port: int, out, body_bytes: int) -> None:
    from runtime.comm.transport import Transport

    _init(rank, port)
    # Every third message waits 20 ms on the link's thread: direct and deferred sends mix on one link.
    transport = Transport(rank, [(0, 1), (1, 0)], torch.device("cpu"), timeout=30,
                          latency=lambda dst, producer: 0.02 if producer.microbatch % 3 == 1 else 0.0,
                          body_bytes=body_bytes)
    transport.start(timeout=30)
    if rank == 0:
        for microbatch in range(MESSAGES):
            task = Task.parse(f"0F{microbatch}")
            transport.notify(1, 0, task, 0.001 * microbatch, True)
            transport.send(1, 0, task, _payload(microbatch))
        transport.wait_sent(timeout=30)
        sent = transport.take_sent()
        result = [(s.sequence, s.producer.microbatch, s.queued_ns <= s.started_ns <= s.finished_ns) for s in sent]
    else:
        got = []
        while len([m for m in got if not isinstance(m, Notice)]) < MESSAGES:
            transport.inbox.wait(5.0)
            got += transport.inbox.drain()
        result = [("N" if isinstance(m, Notice) else "D", m.producer.microbatch,
                   isinstance(m, Notice) or all(torch.equal(a, b) for a, b in zip(m.take(), _payload(m.producer.microbatch))))
                  for m in got]
    _finish(transport, rank, out, result)


@pytest.mark.parametrize("body_bytes", [0, 1 << 20], ids=["large-on-gloo", "large-in-bodies"])
def test_two_ranks_keep_each_link_in_order_with_notices_first_and_close_cleanly(body_bytes):
    # [Note: bodies]: with bodies the large payloads follow their frames on the socket, without on gloo
    sender, receiver = _two_ranks(functools.partial(_ordered_exchange, body_bytes=body_bytes))
    # HELLO is sequence 0; then a notice and a data message per microbatch.
    assert sender[1] == [(2 + 2 * mb, mb, True) for mb in range(MESSAGES)]
    assert receiver[1] == [(kind, mb, True) for mb in range(MESSAGES) for kind in "ND"]


def _peer_dies(rank: int, port: int, out) -> None:
    from runtime.comm.transport import Transport

    _init(rank, port)
    transport = Transport(rank, [(0, 1), (1, 0)], torch.device("cpu"), timeout=10)
    transport.start(timeout=30)
    if rank == 1:
        out.put((1, None))
        out.close()
        out.join_thread()
        os._exit(0)  # no CLOSE, sockets torn down by the kernel
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            transport.send(1, 0, Task.parse("0F0"), (torch.zeros(4),))
            transport.inbox.wait(0.05)
            transport.inbox.drain()
        out.put((0, "no error"))
    except TransportError as err:
        out.put((0, str(err)))
    out.close()
    out.join_thread()  # flushed before the hard exit (a group with a dead member cannot be torn down)
    os._exit(0)


def test_a_dead_peer_is_a_transport_error_naming_the_link():
    message = _two_ranks(_peer_dies)[0][1]
    assert "link 0->1" in message or "link 1->0" in message, message


# -- the socket reader ([Note: dispatcher reads the sockets]) ---------------------------------------------------------
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

    from runtime.comm.sockets import SocketReader

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
    from runtime.comm.sockets import SocketReader

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


def test_an_inbox_that_reads_sockets_is_woken_by_another_thread():
    inbox = Inbox()
    inbox.attach([])
    threading.Timer(0.05, inbox.wake).start()
    began = time.monotonic()
    inbox.wait(5.0)
    assert time.monotonic() - began < 2.0
    threading.Timer(0.05, inbox.fail, args=(TransportError("link 1->0: send failed: reset"),)).start()
    with pytest.raises(TransportError, match="reset"):
        inbox.wait(5.0)
    inbox.detach()


# -- two real ranks: what reading the sockets on the dispatcher must not break ----------------------------------------
FLOOD = 400  # messages of a full inline payload: 13 MB, more than the kernel holds for an unread socket


def _flood(rank: int, port: int, out) -> None:
    from runtime.comm.transport import Transport

    _init(rank, port)
    transport = Transport(rank, [(0, 1), (1, 0)], torch.device("cpu"), timeout=30)
    transport.start(timeout=30)
    if rank == 0:
        began = time.monotonic()
        for microbatch in range(FLOOD):
            transport.send(1, 0, Task(0, F, microbatch), (torch.full((INLINE_BYTES // 4,), float(microbatch)),))
        posting = time.monotonic() - began
        transport.wait_sent(timeout=60)
        result = posting
    else:
        time.sleep(2.0)  # the dispatcher is busy: nothing reads the socket, which fills up
        drained = time.monotonic_ns()
        got = transport.inbox.drain()
        while len(got) < FLOOD:
            transport.inbox.wait(5.0)
            got += transport.inbox.drain()
        first = got[0]
        result = ([m.producer.microbatch for m in got] == list(range(FLOOD))
                  and all(float(m.tensors[0][0]) == m.producer.microbatch for m in got),
                  (drained - first.frame_ns) * 1e-9)
    _finish(transport, rank, out, result)


def test_a_full_socket_never_blocks_the_poster_and_arrivals_keep_the_kernels_receive_time():
    # The poster writes what the socket takes and leaves the rest to the link's thread; the receiver reads
    # 2 s later, and the first message's frame time is when the kernel received it, not when it was read.
    sender, receiver = _two_ranks(_flood)
    assert sender[1] < 1.5, f"posting {FLOOD} messages took {sender[1]:.2f} s: the poster waited for the reader"
    in_order, read_late_by = receiver[1]
    assert in_order
    assert read_late_by > 1.0, f"the first frame's time is {read_late_by:.3f} s before it was read, not ~2 s"


def _late_tensors_at_iteration_end(rank: int, port: int, out) -> None:
    from runtime.comm.transport import Transport

    _init(rank, port)
    transport = Transport(rank, [(0, 1), (1, 0)], torch.device("cpu"), timeout=30, body_bytes=0)
    transport.start(timeout=30)
    # The first tensor of a slot follows its frame into a receive posted only once the frame is read, and both
    # ranks go straight to wait_sent: it must read the sockets meanwhile, or each waits for the other.
    transport.send(1 - rank, 0, Task(rank, F, 0), (torch.full((BIG,), float(rank)),))
    transport.wait_sent(timeout=20)
    got = transport.inbox.drain()
    while not got:
        transport.inbox.wait(5.0)
        got += transport.inbox.drain()
    _finish(transport, rank, out, float(got[0].tensors[0][0]))


def test_waiting_for_sends_reads_the_peers_frames_so_late_receives_get_posted():
    assert [value for _, value in _two_ranks(_late_tensors_at_iteration_end, timeout=60)] == [1.0, 0.0]


def test_a_spare_buffer_is_reused_only_once_nobody_else_holds_it():
    from runtime.comm.sockets import Spares

    spares = Spares()
    held = torch.full((64,), 1.0)
    spares.keep(held.untyped_storage())
    dropped = torch.full((64,), 2.0)
    spares.keep(dropped.untyped_storage())
    address = dropped.data_ptr()
    del dropped
    buffer = spares.take(256)
    assert buffer.data_ptr() == address and buffer.numel() == 256  # the free one, not the held one
    assert spares.take(256).data_ptr() not in (address, held.data_ptr())  # the held one stays the consumer's
    assert torch.equal(held, torch.full((64,), 1.0))


RECYCLED = 16


def _recycled(rank: int, port: int, out, body_bytes: int) -> None:
    from runtime.comm.transport import Transport

    _init(rank, port)
    transport = Transport(rank, [(0, 1), (1, 0)], torch.device("cpu"), timeout=30, body_bytes=body_bytes)
    transport.start(timeout=30)
    if rank == 0:
        for microbatch in range(RECYCLED):  # one slot, filled each time: each arrival is a handed-over buffer
            transport.send(1, 0, Task(0, F, microbatch), (torch.full((BIG,), float(microbatch)),))
            if microbatch >= RECYCLED // 2:  # the first half lands at once, more than the slot keeps posted
                time.sleep(0.01)  # the rest: the receiver drops what it drops before the next one lands
        transport.wait_sent(timeout=30)
        result = None
    else:
        time.sleep(0.5)  # the first half waits in the socket and in gloo: one read takes all their frames
        kept, right_on_arrival = [], True
        while len(kept) < RECYCLED // 2:
            transport.inbox.wait(5.0)
            for arrival in transport.inbox.drain():
                value = float(arrival.producer.microbatch)
                right_on_arrival &= bool((arrival.tensors[0] == value).all())
                if arrival.producer.microbatch % 2 == 0:
                    kept.append((value, arrival.tensors[0]))  # held: its buffer must never be received into
        reader = transport._readers[0]
        posted = len(reader._early[0]) + len(reader._owed[0])  # posted, or owed until the next settle()
        posted = posted if body_bytes == 0 else None  # bodies post nothing on gloo
        result = (right_on_arrival, all(bool((tensor == value).all()) for value, tensor in kept), posted)
    _finish(transport, rank, out, result)


@pytest.mark.parametrize("body_bytes", [0, 1 << 20], ids=["pre-posted", "bodies"])
def test_buffers_the_executor_still_holds_are_never_received_into_again(body_bytes):
    from runtime.comm.frames import PREPOSTED_DEPTH

    # and however many messages a read takes at once, the slot keeps PREPOSTED_DEPTH receives, as the sender
    # counts them (CLOSE fills each with one byte)
    expected = (True, True, PREPOSTED_DEPTH if body_bytes == 0 else None)
    assert _two_ranks(functools.partial(_recycled, body_bytes=body_bytes))[1][1] == expected


def test_link_set_up_ignores_a_stranger_and_names_a_rank_that_never_connects(monkeypatch):
    # A connection that is not one of this rank's links (a port scan, a stray process) is closed, not fatal;
    # a rank that never connects is named once the timeout is over.
    import struct

    import runtime.comm.bootstrap as bootstrap

    def connect(port: int, who: list[bytes]) -> None:
        for greeting in who:
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(greeting)
                time.sleep(0.05)

    def addresses(who):
        def gather(host, port):
            threading.Thread(target=connect, args=(port, who), daemon=True).start()
            return [(host, port)]
        return gather

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.delenv("RRFP_SOCKET_ADDR", raising=False)
    links = {1: Link(1, 0, None, 0)}
    monkeypatch.setattr(bootstrap, "_gather_addresses", addresses([b"GET / HTTP", struct.pack("=q", 7),
                                                            struct.pack("=q", 1)]))
    bootstrap.connect_links(0, {}, links, timeout=10)
    assert links[1].sock is not None
    links[1].sock.close()
    links = {1: Link(1, 0, None, 0), 2: Link(2, 0, None, 0)}
    monkeypatch.setattr(bootstrap, "_gather_addresses", addresses([struct.pack("=q", 2)]))
    with pytest.raises(TransportError, match=r"rank 0: no connection from rank\(s\) \[1\] within 1 s"):
        bootstrap.connect_links(0, {}, links, timeout=1)
    links[2].sock.close()
