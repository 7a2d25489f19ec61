"""Message-driven point-to-point transport between pipeline ranks: the :class:`Transport` of one rank, which
composes the pieces below in one place.

All communication of the pipeline goes through this package, under one rule:

[Note: transport ordering rule]
    Every *directed link* ``src -> dst`` between two ranks that exchange
    pipeline data is a FIFO with its own process group (so a send and a
    receive on the same pair of ranks never block each other, and NCCL,
    which ignores tags, still sees one ordered stream per communicator) and,
    under gloo, its own TCP connection for the frames. Messages of a link go
    on the wire in the order they were posted, by one sender at a time
    ([Note: sending without a hand-off] in :mod:`runtime.comm.links` says
    which); the receiving rank reads them in that order (under gloo the
    dispatcher itself, [Note: dispatcher reads the sockets] in
    :mod:`runtime.comm.sockets`; under NCCL a receiver thread per incoming
    link, :mod:`runtime.comm.nccl`).
    Each message carries a sequence number, checked on arrival. That is the
    only ordering there is: the receiver never needs to know in advance
    which message comes next, because every message says what it is.

The pieces, one job each (each imports only the ones above it):

* :mod:`runtime.comm.errors`: :class:`TransportError`.
* :mod:`runtime.comm.frames`: the wire format: a message's header words, what each means for each
  :class:`~runtime.comm.frames.MessageKind`, where its payload travels ([Note: trimmed frames],
  [Note: bodies]).
* :mod:`runtime.comm.inbox`: the :class:`~runtime.comm.inbox.Inbox` the dispatcher sleeps on and what it
  holds (arrivals, notices, decisions, posted receives).
* :mod:`runtime.comm.links`: a :class:`~runtime.comm.links.Link` per directed pair, the
  :class:`~runtime.comm.links.Wire` (what the backend moves, and how), and a
  :class:`~runtime.comm.links.Sender` per outgoing link ([Note: sending without a hand-off],
  [Note: CUDA streams]).
* :mod:`runtime.comm.sockets`: under gloo, each incoming link's socket, read by the dispatcher itself
  ([Note: dispatcher reads the sockets], [Note: pre-posted receives]).
* :mod:`runtime.comm.nccl`: under NCCL, a receiver thread per incoming link.
* :mod:`runtime.comm.bootstrap`: every link's process group and, under gloo, its TCP connection, set up at
  construction (on the transport's group only: [Note: links inside a pipeline group]).

Outside the order: :mod:`runtime.comm.clock` (every rank's times on rank 0's clock) and
:mod:`runtime.comm.grid` (what "rank" means with TP and DP).
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Callable, Sequence

import torch

from hints.tasks import Task
from runtime.comm.bootstrap import LinkGroups, connect_links
from runtime.comm.errors import TransportError
from runtime.comm.frames import BODY_BYTES, DATA, DECISION, HELLO, NOTICE, POSTED, DecisionFields, NoticeFields
from runtime.comm.inbox import Inbox
from runtime.comm.links import Link, Message, Sender, Sent, Wire
from runtime.comm.nccl import NcclReceiver
from runtime.comm.sockets import SocketReader


class Transport:
    """The links of one rank: a sender per outgoing link; under gloo a socket per incoming link that the
    dispatcher reads, under NCCL a receiver thread per incoming link.

    Build it collectively (every rank of ``group`` constructs it with the same
    ``links``), then :meth:`start`; :meth:`send` posts a message; arrivals land in
    ``inbox``; :meth:`close` ends the threads after every posted message went out.
    ``group`` is a ``torch.distributed`` process group whose members are the
    transport's ranks (``rank`` and ``links`` are ranks in it); None is the whole
    world. Nothing here is collective over more than ``group`` ([Note: links
    inside a pipeline group] in :mod:`runtime.comm.bootstrap`).
    """

    def __init__(
        self,
        rank: int,
        links: Sequence[tuple[int, int]],
        device: torch.device,
        timeout: float,
        latency: Callable[[int, Task], float] | None = None,
        body_bytes: int = BODY_BYTES,
        group=None,
    ) -> None:
        self.rank = rank
        self.device = device
        self.inbox = Inbox()
        self.latency = latency  # injected per-message delay (variability models), slept on the link's thread
        self.sent: list[Sent] = []
        self._sent_lock = threading.Lock()
        group_timeout = timedelta(seconds=max(30.0, 2 * timeout))
        self._wire = Wire(device, body_bytes, group)
        self._link_groups = LinkGroups(rank, links, group, not self._wire.sockets, group_timeout)
        self.out_links: dict[int, Link] = {}
        self.in_links: dict[int, Link] = {}
        for (src, dst), (link_group, peer) in self._link_groups.of.items():
            if src == rank:
                self.out_links[dst] = Link(src, dst, link_group, peer)
            else:
                self.in_links[src] = Link(src, dst, link_group, peer)
        self._readers: list[SocketReader] = []
        if self._wire.sockets:
            connect_links(rank, self.out_links, self.in_links, group_timeout.total_seconds(), group)
            self._readers = [SocketReader(link, self._hello) for link in self.in_links.values()]
            self.inbox.attach(self._readers)
        self._senders = {dst: Sender(link, self._wire, self._on_sent, self._on_send_failure, self.inbox.wake)
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
                receiver = NcclReceiver(link, self._wire, self.inbox, self._hello)
                self._spawn(f"rrfp-recv-{src}->{self.rank}", receiver.run)
        for dst, sender in self._senders.items():
            self._spawn(f"rrfp-send-{self.rank}->{dst}", sender.run)
            sender.post(Message(HELLO))
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

    def release(self) -> None:
        """Shut down the links' own backends, those built for a transport on a group ([Note: links inside a
        pipeline group]); the whole world's link groups stay torch's. Call it once every member closed (after
        a barrier on the group): a backend shut down while its peer still reads could cut the peer's last bytes."""
        self._link_groups.close()

    # -- sending ---------------------------------------------------------
    def send(self, dst: int, iteration: int, producer: Task, tensors: Sequence[torch.Tensor]) -> None:
        """Post ``tensors`` (the output of ``producer``) for rank ``dst``; never waits for the wire."""
        tensors = tuple(t.detach() for t in tensors)
        delay = self.latency(dst, producer) if self.latency is not None else 0.0
        self._senders[dst].post(Message(DATA, iteration, producer, tensors, None, delay,
                                        self._wire.computed(tensors), time.monotonic_ns()))

    def notify(self, dst: int, iteration: int, producer: Task, remaining: float, firm: bool) -> None:
        """Post a NOTICE for rank ``dst``: ``producer``'s output should leave here in ``remaining`` seconds."""
        self._senders[dst].post(Message(NOTICE, iteration, producer,
                                        fields=NoticeFields(max(0, int(remaining * 1e9)), firm),
                                        queued_ns=time.monotonic_ns()))

    def decide(self, dst: int, iteration: int, index: int, task: Task, decided_ns: int) -> None:
        """Post a DECISION for follower ``dst``: its ``index``-th task of ``iteration`` is ``task``."""
        self._senders[dst].post(Message(DECISION, iteration, task, fields=DecisionFields(index, decided_ns),
                                        queued_ns=time.monotonic_ns()))

    def posted(self, dst: int, iteration: int, producer: Task) -> None:
        """Post a POSTED for rank ``dst``: this rank has posted its receive for ``producer``'s output."""
        self._senders[dst].post(Message(POSTED, iteration, producer, queued_ns=time.monotonic_ns()))

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

    def _on_sent(self, dst: int, message: Message, sequence: int, started_ns: int, finished_ns: int) -> None:
        if message.kind_of_message != DATA:
            return
        with self._sent_lock:
            nbytes = sum(t.nbytes for t in message.tensors)
            self.sent.append(Sent(dst, sequence, message.iteration, message.producer, nbytes, message.queued_ns,
                                  started_ns, finished_ns))

    def _on_send_failure(self, failure: TransportError) -> None:
        if self._send_failure is None:
            self._send_failure = failure
        self.inbox.fail(failure)
