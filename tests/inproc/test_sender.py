"""An outgoing link's sender (runtime.comm.links.Sender): the FIFO rule with direct and deferred sends. One
process: the poster and the link's thread, on a wire that only records."""

from __future__ import annotations

import threading

from hints.tasks import F, Task
from runtime.comm.frames import DATA
from runtime.comm.links import Link, Message, Sender


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
