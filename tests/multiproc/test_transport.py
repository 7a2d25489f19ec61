"""Transport between two real ranks on gloo: the link FIFO rule, a full socket, late receives, buffer reuse,
a dead peer (the pipeline runs in test_runtime.py; the wire format, the reader and the sender alone are in
tests/unit and tests/inproc).

Every case but one runs on one pair of spawned ranks shared by the module (:class:`RankPair`): spawning
two processes and importing torch costs seconds, a case milliseconds to a couple of seconds. Each case is
a function ``case(rank) -> result`` both ranks run, building its own :class:`Transport` on the pair's
default group and closing it; the test asserts on what each rank returned. A rank that raises, dies or
overruns the case's timeout fails that test at once (no hang), and the pair is torn down and spawned
afresh for the next case, so one failure does not spill into the others.
"""

from __future__ import annotations

import functools
import os
import socket
import time
import traceback

import pytest
import torch

from hints.tasks import F, Task
from runtime.comm.errors import TransportError
from runtime.comm.frames import INLINE_BYTES, PREPOSTED_DEPTH
from runtime.comm.inbox import Decided, Notice, Posted

START_TIMEOUT = 120.0  # spawning two interpreters and importing torch on a loaded 2-core machine


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _init(rank: int, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)


# -- the shared pair --------------------------------------------------------------------------------------------------
def _serve(rank: int, port: int, conn) -> None:
    """One rank of the pair: join the group, say so, then run each case it is sent until it is sent None."""
    import torch.distributed as dist

    _init(rank, port)
    conn.send(("ok", None))
    while (case := conn.recv()) is not None:
        function, kwargs = case
        try:
            outcome = ("ok", function(rank, **kwargs))
        except BaseException:  # the test shows the rank's own traceback
            outcome = ("error", traceback.format_exc())
        conn.send(outcome)
    dist.destroy_process_group()


class RankPair:
    """Two spawned ranks (a gloo group on a free port), started at the first case and reused by the next."""

    def __init__(self) -> None:
        self._processes: list = []
        self._conns: list = []

    def run(self, case, timeout: float = 90.0, **kwargs) -> list:
        """Run ``case(rank, **kwargs)`` on both ranks; ``[(0, result of rank 0), (1, result of rank 1)]``.

        Fails the calling test if a rank raises, dies or has not answered within ``timeout`` seconds; the
        pair is then torn down (the other rank may be waiting in a collective) and the next case gets a new
        one.
        """
        try:
            if not self._processes:
                self._start()
            for conn in self._conns:
                conn.send((case, kwargs))
            return list(enumerate(self._answers(timeout, case)))
        except BaseException:
            self.stop(kill=True)
            raise

    def stop(self, kill: bool = False) -> None:
        """End both ranks: ask them to leave the group (or, after a failure, kill them)."""
        for conn, process in zip(self._conns, self._processes):
            if not kill and process.is_alive():
                try:
                    conn.send(None)
                except OSError:
                    pass
        for process in self._processes:
            if kill:
                process.kill()
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        for conn in self._conns:
            conn.close()
        self._processes, self._conns = [], []

    def _start(self) -> None:
        import torch.multiprocessing as mp

        context = mp.get_context("spawn")
        port = _free_port()
        for rank in range(2):
            mine, theirs = context.Pipe()
            process = context.Process(target=_serve, args=(rank, port, theirs), name=f"transport-rank{rank}",
                                      daemon=True)
            process.start()
            theirs.close()
            self._processes.append(process)
            self._conns.append(mine)
        self._answers(START_TIMEOUT, "joining the group")

    def _answers(self, timeout: float, what) -> list:
        """Each rank's answer to the last request, in rank order, or a failure naming the rank and why."""
        what = getattr(what, "__name__", None) or getattr(getattr(what, "func", None), "__name__", None) or what
        answers, pending = [None, None], {0, 1}
        deadline = time.monotonic() + timeout
        while pending:
            for rank in sorted(pending):
                conn, process = self._conns[rank], self._processes[rank]
                if conn.poll(0.05):
                    try:
                        status, value = conn.recv()
                    except EOFError:  # its end of the pipe closed: it is exiting
                        process.join(timeout=5)
                        pytest.fail(f"rank {rank} died in {what} (exit code {process.exitcode})")
                    if status != "ok":
                        pytest.fail(f"rank {rank} raised in {what}:\n{value}")
                    answers[rank] = value
                    pending.discard(rank)
                elif not process.is_alive():
                    pytest.fail(f"rank {rank} died in {what} (exit code {process.exitcode})")
            if pending and time.monotonic() > deadline:
                pytest.fail(f"rank(s) {sorted(pending)} did not finish {what} within {timeout:.0f} s")
        return answers


@pytest.fixture(scope="module")
def pair():
    ranks = RankPair()
    yield ranks
    ranks.stop()


def _finish(transport, result):
    """A rank's end of a case: wait for the peer, close the transport (reading its CLOSE), return ``result``."""
    import torch.distributed as dist

    dist.barrier()
    transport.close()
    return result


def _pair_transport(rank: int, **kwargs):
    """A started Transport with links both ways between the pair's two ranks."""
    from runtime.comm.transport import Transport

    transport = Transport(rank, [(0, 1), (1, 0)], torch.device("cpu"), **{"timeout": 30, **kwargs})
    transport.start(timeout=30)
    return transport


# -- cases on the shared pair ------------------------------------------------------------------------------------------
def _short_receive(rank: int):
    import torch.distributed as dist

    if rank == 0:
        dist.send(torch.arange(10, dtype=torch.uint8), 1)
        return None
    buffer = torch.zeros(100, dtype=torch.uint8)
    dist.recv(buffer, 0)
    return buffer[:10].tolist()


def test_gloo_receives_a_short_message_into_a_full_size_buffer(pair):
    # [Note: trimmed frames] rests on this behaviour of gloo; if a torch upgrade changes it, this fails.
    assert pair.run(_short_receive)[1][1] == list(range(10))


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


def _ordered_exchange(rank: int, body_bytes: int):
    # Every third message waits 20 ms on the link's thread: direct and deferred sends mix on one link.
    transport = _pair_transport(rank, latency=lambda dst, producer: 0.02 if producer.microbatch % 3 == 1 else 0.0,
                                body_bytes=body_bytes)
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
    return _finish(transport, result)


@pytest.mark.parametrize("body_bytes", [0, 1 << 20], ids=["large-on-gloo", "large-in-bodies"])
def test_two_ranks_keep_each_link_in_order_with_notices_first_and_close_cleanly(pair, body_bytes):
    # [Note: bodies]: with bodies the large payloads follow their frames on the socket, without on gloo
    sender, receiver = pair.run(functools.partial(_ordered_exchange, body_bytes=body_bytes))
    # HELLO is sequence 0; then a notice and a data message per microbatch.
    assert sender[1] == [(2 + 2 * mb, mb, True) for mb in range(MESSAGES)]
    assert receiver[1] == [(kind, mb, True) for mb in range(MESSAGES) for kind in "ND"]


# -- what reading the sockets on the dispatcher must not break --------------------------------------------------------
FLOOD = 400  # messages of a full inline payload: 13 MB, more than the kernel holds for an unread socket


def _flood(rank: int):
    transport = _pair_transport(rank)
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
    return _finish(transport, result)


def test_a_full_socket_never_blocks_the_poster_and_arrivals_keep_the_kernels_receive_time(pair):
    # The poster writes what the socket takes and leaves the rest to the link's thread; the receiver reads
    # 2 s later, and the first message's frame time is when the kernel received it, not when it was read.
    sender, receiver = pair.run(_flood)
    assert sender[1] < 1.5, f"posting {FLOOD} messages took {sender[1]:.2f} s: the poster waited for the reader"
    in_order, read_late_by = receiver[1]
    assert in_order
    assert read_late_by > 1.0, f"the first frame's time is {read_late_by:.3f} s before it was read, not ~2 s"


def _late_tensors_at_iteration_end(rank: int):
    transport = _pair_transport(rank, body_bytes=0)
    # The first tensor of a slot follows its frame into a receive posted only once the frame is read, and both
    # ranks go straight to wait_sent: it must read the sockets meanwhile, or each waits for the other.
    transport.send(1 - rank, 0, Task(rank, F, 0), (torch.full((BIG,), float(rank)),))
    transport.wait_sent(timeout=20)
    got = transport.inbox.drain()
    while not got:
        transport.inbox.wait(5.0)
        got += transport.inbox.drain()
    return _finish(transport, float(got[0].tensors[0][0]))


def test_waiting_for_sends_reads_the_peers_frames_so_late_receives_get_posted(pair):
    assert [value for _, value in pair.run(_late_tensors_at_iteration_end, timeout=60)] == [1.0, 0.0]


RECYCLED = 16


def _recycled(rank: int, body_bytes: int):
    transport = _pair_transport(rank, body_bytes=body_bytes)
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
    return _finish(transport, result)


@pytest.mark.parametrize("body_bytes", [0, 1 << 20], ids=["pre-posted", "bodies"])
def test_buffers_the_executor_still_holds_are_never_received_into_again(pair, body_bytes):
    # and however many messages a read takes at once, the slot keeps PREPOSTED_DEPTH receives, as the sender
    # counts them (CLOSE fills each with one byte)
    expected = (True, True, PREPOSTED_DEPTH if body_bytes == 0 else None)
    assert pair.run(functools.partial(_recycled, body_bytes=body_bytes))[1][1] == expected


def _describe(item) -> tuple:
    """What the receiving test compares of an inbox item."""
    if isinstance(item, Notice):
        return ("N", item.producer.microbatch, item.firm)
    if isinstance(item, Decided):
        return ("decided", str(item.task), item.index, item.decided_ns)
    if isinstance(item, Posted):
        return ("posted", str(item.producer))
    return ("D", item.producer.microbatch,
            all(torch.equal(a, b) for a, b in zip(item.take(), _payload(item.producer.microbatch))))


def _nccl_paths_on_gloo(rank: int):
    # The NCCL side (runtime.comm.nccl's receiver thread, header-only frames, every tensor on the link's group)
    # needs no GPU to run: a Transport whose Wire believes the backend is NCCL takes it on gloo, host tensors.
    import threading

    import torch.distributed as dist

    get_backend = dist.get_backend
    dist.get_backend = lambda group=None: "nccl"  # read once, when the transport builds its Wire
    try:
        transport = _pair_transport(rank)
    finally:
        dist.get_backend = get_backend
    threads = sorted(t.name for t in threading.enumerate() if t.name.startswith("rrfp-"))
    if rank == 0:
        for microbatch in range(MESSAGES):
            task = Task.parse(f"0F{microbatch}")
            transport.notify(1, 0, task, 0.001 * microbatch, True)
            transport.send(1, 0, task, _payload(microbatch))
        transport.decide(1, 0, 3, Task.parse("0B2"), 123_456)
        transport.posted(1, 0, Task.parse("0W1"))
        transport.wait_sent(timeout=30)
        result = (threads, [(s.sequence, s.producer.microbatch) for s in transport.take_sent()])
    else:
        got = []
        while len(got) < 2 * MESSAGES + 2:
            transport.inbox.wait(5.0)
            got += transport.inbox.drain()
        result = (threads, len(transport._readers), [_describe(item) for item in got])
    return _finish(transport, result)


def test_the_nccl_receiver_path_keeps_each_link_in_order_on_gloo(pair):
    (_, (sender_threads, sent)), (_, (receiver_threads, socket_readers, got)) = pair.run(_nccl_paths_on_gloo)
    assert sender_threads == ["rrfp-recv-1->0", "rrfp-send-0->1"]  # a receiver thread per incoming link
    assert receiver_threads == ["rrfp-recv-0->1", "rrfp-send-1->0"] and socket_readers == 0  # no socket read
    assert sent == [(2 + 2 * mb, mb) for mb in range(MESSAGES)]  # HELLO is 0; a notice, then the data
    assert got == [item for mb in range(MESSAGES) for item in (("N", mb, True), ("D", mb, True))] + \
        [("decided", "0B2", 3, 123_456), ("posted", "0W1")]


# -- a dead peer: a pair of its own ------------------------------------------------------------------------------------
# Not on the shared pair: rank 1 ends its process without a CLOSE (that is the case), and rank 0 then holds a
# group with a dead member, which cannot be torn down or used again. Sharing would cost a respawn anyway and
# would make the case's last step (hard exits) the pair's.
def _two_ranks(target, timeout: float = 90.0) -> list:
    """Run ``target(rank, port, out)`` on two processes of their own; returns what they put in ``out``."""
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
