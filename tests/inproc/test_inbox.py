"""The inbox the dispatcher sleeps on (runtime.comm.inbox): woken by other threads, failures raised. One
process, with threads and a socket pair."""

from __future__ import annotations

import threading
import time

import pytest

from runtime.comm.errors import TransportError
from runtime.comm.inbox import Inbox


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
