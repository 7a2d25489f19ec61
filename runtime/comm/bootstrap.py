"""Setting up every link once, before anything is sent: its process group and, under gloo, its TCP connection.

Ranks here are the ranks of the transport's *group*: the whole world by default, or the members of a
pipeline sub-group, each by its rank in that group ([Note: links inside a pipeline group]).

:class:`LinkGroups` gives each link its own process group. Under gloo, each rank also listens on the address
other ranks reach it at (:func:`check_socket_address` says before any rank starts whether it can), the
addresses are all-gathered over the group, and each link's source connects to its destination and says who
it is; a connection from anything else is closed, not fatal. Every link is connected at construction, never
lazily ([Note: transport ordering rule] in :mod:`runtime.comm.transport`); what the connections carry is in
[Note: dispatcher reads the sockets] (:mod:`runtime.comm.sockets`).

[Note: links inside a pipeline group]
    A pipeline may be one of several in a job (one per data-parallel
    replica, beside FSDP or TP groups of the job's own): then everything
    its transport does collectively runs on its group only, so pipelines
    set up side by side never wait for one another, and a rank outside the
    group need not take part at all. ``dist.new_group`` cannot make the
    links' groups there: it is collective over the whole world, and its
    variant that only the members call (``use_local_synchronization``)
    names a group by its ranks and how many groups the calling process
    already belongs to (torch 2.13), which differs between the two ends of a link as soon as a rank has
    more links than its neighbour (the middle of a chain), so the two ends
    would meet under different names and wait forever. Instead, the
    group's rank 0 serves a ``TCPStore`` of its own (a fresh namespace per
    transport, so neither another pipeline's nor an earlier transport's
    keys can collide), its address is all-gathered over the group, and
    each link's two ends build a two-rank backend (``ProcessGroupGloo``, or
    ``ProcessGroupNCCL`` under NCCL) under the link's own key prefix,
    ``link/{src}->{dst}/``. Links are built in one sorted order on every
    member, so the first link not yet built has both its ends waiting on
    it: no cycle. The backends are not registered with torch.distributed
    (nothing but the link uses them), so ``destroy_process_group`` does not
    end them: the transport shuts them down when its owner says every
    member has closed (:meth:`runtime.comm.transport.Transport.release`,
    after a barrier on the group). Over the whole world (no group given)
    the links keep ``dist.new_group``, which every rank of the world calls
    for every link in one order.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from datetime import timedelta
from typing import Any, Sequence

import torch
import torch.distributed as dist

from runtime.comm.errors import TransportError
from runtime.comm.links import Link


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


class LinkGroups:
    """The process group of each of this rank's links, and this rank's peer in it ([Note: links inside a
    pipeline group]).

    Collective over ``group`` (None: the whole world): every member builds it with the same ``links``, as
    ``(src, dst)`` pairs of ranks in ``group``. ``of[(src, dst)]`` is ``(process group, peer's rank in it)``
    for each link this rank is an end of. ``nccl``: the links carry CUDA tensors over NCCL, else gloo.
    """

    def __init__(self, rank: int, links: Sequence[tuple[int, int]], group: Any, nccl: bool,
                 timeout: timedelta) -> None:
        self.of: dict[tuple[int, int], tuple[Any, int]] = {}
        self._store = None
        self._backends: list = []  # built here, not registered with torch.distributed: shut down at close
        if group is None:
            for src, dst in sorted(set(links)):  # new_group is collective over the world: every link, in one order
                process_group = dist.new_group(sorted({src, dst}), timeout=timeout)
                if rank in (src, dst):
                    other = dst if rank == src else src
                    self.of[src, dst] = (process_group, dist.get_group_rank(process_group, other))
            return
        if not links:  # the same on every member: a pipeline of one rank needs no store
            return
        self._store = _group_store(rank, group, timeout)  # every member, links of its own or not: a collective
        for src, dst in sorted({(src, dst) for src, dst in links if rank in (src, dst)}):
            members = sorted((src, dst))  # the link's own ranks: the lower end is 0
            other = dst if rank == src else src
            backend = _two_rank_backend(dist.PrefixStore(f"link/{src}->{dst}/", self._store), members.index(rank),
                                        nccl, timeout)
            self._backends.append(backend)
            self.of[src, dst] = (backend, members.index(other))

    def close(self) -> None:
        """Shut down the backends built here, once both ends of every link are done
        (:meth:`runtime.comm.transport.Transport.release`); the world's groups stay torch's."""
        for backend in self._backends:
            backend.shutdown()
        self._backends, self._store = [], None


def _group_store(rank: int, group: Any, timeout: timedelta):
    """A store every member of ``group`` reaches, served by its rank 0 (collective over ``group``)."""
    if rank == 0:
        _, host = _local_address()
        store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timeout)
        _gather_addresses(host, store.port, group)
        return store
    host, port = _gather_addresses("", 0, group)[0]
    try:
        return dist.TCPStore(host, port, is_master=False, timeout=timeout)
    except (RuntimeError, OSError) as err:  # torch raises DistNetworkError, a RuntimeError
        raise TransportError(f"rank {rank}: cannot reach the pipeline group's store at {host}:{port}: {err}") \
            from err


def _two_rank_backend(store, rank: int, nccl: bool, timeout: timedelta):
    """One link's own process group: a backend of two ranks over ``store``."""
    if nccl:
        from torch.distributed import ProcessGroupNCCL

        options = ProcessGroupNCCL.Options()
        options._timeout = timeout
        return ProcessGroupNCCL(store, rank, 2, options)
    return dist.ProcessGroupGloo(store, rank, 2, timeout)


def connect_links(rank: int, out_links: dict[int, Link], in_links: dict[int, Link], timeout: float,
                  group: Any = None) -> None:
    """Give every link a TCP connection, src connecting to dst (collective over ``group``, None: the world;
    ranks are ranks in it)."""
    listener = _listener()
    host = listener.getsockname()[0]
    try:
        listener.listen(max(8, len(in_links)))
        addresses = _gather_addresses(host, listener.getsockname()[1], group)
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


def _gather_addresses(host: str, port: int, group: Any = None) -> list[tuple[str, int]]:
    """Every rank's ``(host, port)``, by rank in ``group``: a collective over it (None: the default group;
    host tensors, no pickling)."""
    text = host.encode()
    if len(text) > _ADDRESS_BYTES:
        raise TransportError(f"address {host!r} is longer than {_ADDRESS_BYTES} bytes")
    mine = torch.zeros(_ADDRESS_BYTES + 2, dtype=torch.int64)
    mine[:len(text)] = torch.tensor(list(text), dtype=torch.int64)
    mine[-2:] = torch.tensor([len(text), port])
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, mine, group=group)
    return [(bytes(row[:int(row[-2])].tolist()).decode(), int(row[-1])) for row in everyone]


def _receive_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        data += chunk
    return data
