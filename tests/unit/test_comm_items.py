"""Pure pieces of runtime.comm besides the wire format: what a received header becomes in the inbox, the
links a job needs, and the reuse of receive buffers. No processes, threads or sockets."""

from __future__ import annotations

import pytest
import torch

from hints.tasks import Task
from runtime.comm.errors import TransportError
from runtime.comm.frames import DECISION, NOTICE, POSTED, DecisionFields, NoticeFields, decode_frame, encode_frame
from runtime.comm.inbox import Arrival, Decided, Notice, Posted, check_sequence, item_of
from runtime.comm.links import Link, pipeline_links
from runtime.comm.sockets import Spares


def test_an_arrival_on_cpu_hands_over_its_tensors_as_they_are():
    # [Note: CUDA streams]: no event on CPU, so take() waits for nothing and records nothing.
    tensors = (torch.randn(3),)
    arrival = Arrival(1, 0, 0, Task.parse("0F0"), tensors, 1, 2)
    assert arrival.ready is None and arrival.take() is tensors


def test_links_are_directed_and_deduplicated():
    assert pipeline_links([(0, 1), (1, 0), (0, 1), (2, 2)]) == [(0, 1), (1, 0)]


def test_a_spare_buffer_is_reused_only_once_nobody_else_holds_it():
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


def test_each_header_becomes_the_item_its_kind_names():
    link = Link(2, 0, None, 0)
    producer = Task.parse("1F4")
    notice = decode_frame(encode_frame(NOTICE, 5, 3, producer, fields=NoticeFields(1_500_000, True))[0])
    assert item_of(link, notice, 77) == Notice(2, 3, producer, 1_500_000 * 1e-9, True, 77)
    posted = decode_frame(encode_frame(POSTED, 6, 3, producer)[0])
    assert item_of(link, posted, 78) == Posted(2, 3, producer, 78)
    decision = decode_frame(encode_frame(DECISION, 7, 3, producer, fields=DecisionFields(12, 999))[0])
    assert item_of(link, decision, 79) == Decided(2, 3, 12, producer, 999, 79)
    stranger = notice._replace(kind_of_message=42)  # a type this rank does not know
    with pytest.raises(TransportError, match=r"link 2->0: message 5 has unknown type 42"):
        item_of(link, stranger, 80)
    check_sequence(link, notice, 5)
    with pytest.raises(TransportError, match=r"link 2->0: message 5 arrived, expected 4 \(FIFO order broken\)"):
        check_sequence(link, notice, 4)
