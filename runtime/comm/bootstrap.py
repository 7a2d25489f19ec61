"""Setting up the links' TCP connections under gloo, once, before anything is sent.

Each rank listens on the address other ranks reach it at (:func:`check_socket_address` says before any rank
starts whether it can), the addresses are all-gathered over the default group, and each link's source
connects to its destination and says who it is; a connection from anything else is closed, not fatal. Every
link is connected at construction, never lazily ([Note: transport ordering rule] in
:mod:`runtime.comm.transport`); what the connections carry is in [Note: dispatcher reads the sockets]
(:mod:`runtime.comm.sockets`).
"""

from __future__ import annotations

import os
import socket
import struct
import time

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


def connect_links(rank: int, out_links: dict[int, Link], in_links: dict[int, Link], timeout: float) -> None:
    """Give every link a TCP connection, src connecting to dst (collective: every rank calls it)."""
    listener = _listener()
    host = listener.getsockname()[0]
    try:
        listener.listen(max(8, len(in_links)))
        addresses = _gather_addresses(host, listener.getsockname()[1])
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


def _gather_addresses(host: str, port: int) -> list[tuple[str, int]]:
    """Every rank's ``(host, port)``: a collective over the default group (host tensors, no pickling)."""
    text = host.encode()
    if len(text) > _ADDRESS_BYTES:
        raise TransportError(f"address {host!r} is longer than {_ADDRESS_BYTES} bytes")
    mine = torch.zeros(_ADDRESS_BYTES + 2, dtype=torch.int64)
    mine[:len(text)] = torch.tensor(list(text), dtype=torch.int64)
    mine[-2:] = torch.tensor([len(text), port])
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return [(bytes(row[:int(row[-2])].tolist()).decode(), int(row[-1])) for row in everyone]


def _receive_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        data += chunk
    return data
