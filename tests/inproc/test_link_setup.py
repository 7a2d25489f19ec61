"""Connecting the links' sockets at set-up (runtime.comm.bootstrap), with the address exchange replaced by
a local stand-in: one process, a listener and a few connecting threads."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

import runtime.comm.bootstrap as bootstrap
from runtime.comm.errors import TransportError
from runtime.comm.links import Link


def test_link_set_up_ignores_a_stranger_and_names_a_rank_that_never_connects(monkeypatch):
    # A connection that is not one of this rank's links (a port scan, a stray process) is closed, not fatal;
    # a rank that never connects is named once the timeout is over.
    def connect(port: int, who: list[bytes]) -> None:
        for greeting in who:
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(greeting)
                time.sleep(0.05)

    def addresses(who):
        def gather(host, port, group=None):  # group: the pipeline's (None: the world), unused here
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
