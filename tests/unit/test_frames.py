"""The wire format (runtime.comm.frames): frames built and read back, what each header word means per kind,
and the tag rule both ends of a link apply. No processes, threads or sockets."""

from __future__ import annotations

import struct

import pytest
import torch

from hints.tasks import Task
from runtime.comm.errors import TransportError
from runtime.comm.frames import (
    CLOSE,
    DATA,
    DECISION,
    FIXED_WORDS,
    FRAME_BYTES,
    HEADER_BYTES,
    HELLO,
    INLINE_BYTES,
    KIND_FIELDS,
    LATE_TAG,
    MAGIC,
    MAX_TENSORS,
    NOTICE,
    POSTED,
    PREPOSTED_TAG,
    WIRE_VERSION,
    DecisionFields,
    MessageKind,
    NoticeFields,
    Payload,
    decode_frame,
    encode_frame,
    follow_tag,
    inline_tensors,
)


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


def test_follow_tag_sizes_a_slot_once_and_sends_what_fits_into_it():
    posted = [0] * MAX_TENSORS
    assert follow_tag(posted, 0, 100) == LATE_TAG and posted[0] == 100  # the first: late, and sizes the slot
    assert follow_tag(posted, 0, 100) == PREPOSTED_TAG  # fits
    assert follow_tag(posted, 0, 60) == PREPOSTED_TAG  # fits, shorter
    assert follow_tag(posted, 0, 101) == LATE_TAG and posted[0] == 100  # too large: late, the size stays
    assert follow_tag(posted, 2, 8) == LATE_TAG and follow_tag(posted, 2, 8) == PREPOSTED_TAG + 2
    assert posted == [100, 0, 8, 0]


# -- the kinds and their words: the bytes on the wire stay what they were -------------------------------------------
def _fixed_words(frame: torch.Tensor) -> list[int]:
    return list(struct.unpack_from(f"={FIXED_WORDS}q", bytes(frame[:FIXED_WORDS * 8].tolist())))


def test_message_kinds_and_payload_places_keep_their_wire_values():
    assert {kind.name: kind.value for kind in MessageKind} == \
        {"HELLO": 1, "DATA": 2, "CLOSE": 3, "NOTICE": 4, "DECISION": 5, "POSTED": 6}
    assert (HELLO, DATA, CLOSE, NOTICE, DECISION, POSTED) == tuple(MessageKind)  # the module names are the members
    assert {place.name: place.value for place in Payload} == {"ON_GROUP": 0, "IN_FRAME": 1, "IN_BODY": 2}
    assert WIRE_VERSION == 2
    assert KIND_FIELDS == {NOTICE: NoticeFields, DECISION: DecisionFields}


def test_each_kind_writes_its_fields_into_the_same_two_header_words():
    # [magic, sequence, type, iteration, stage, kind, microbatch, n_tensors, inline, field_0, field_1]
    magic = MAGIC | WIRE_VERSION << 32
    notice, _ = encode_frame(NOTICE, 6, 1, Task.parse("1F3"), fields=NoticeFields(2_500_000, True))
    assert _fixed_words(notice) == [magic, 6, 4, 1, 1, ord("F"), 3, 0, 1, 2_500_000, 1]
    decision, _ = encode_frame(DECISION, 9, 2, Task.parse("0B7"), fields=DecisionFields(11, 123_456_789_000))
    assert _fixed_words(decision) == [magic, 9, 5, 2, 0, ord("B"), 7, 0, 1, 11, 123_456_789_000]
    data, _ = encode_frame(DATA, 3, 0, Task.parse("2W1"), (torch.zeros(2),))
    assert _fixed_words(data) == [magic, 3, 2, 0, 2, ord("W"), 1, 1, 1, 0, 0]
    assert _fixed_words(encode_frame(HELLO, 0)[0]) == [magic, 0, 1, 0, -1, 0, -1, 0, 1, 0, 0]


def test_a_decision_reads_back_as_its_index_and_the_leaders_clock():
    frame, _ = encode_frame(DECISION, 9, 2, Task.parse("0B7"), fields=DecisionFields(11, -5_000))
    header = decode_frame(frame)
    assert header.kind_of_message is MessageKind.DECISION and header.producer == Task.parse("0B7")
    assert header.fields == DecisionFields(index=11, decided_ns=-5_000)
    assert isinstance(header.fields, DecisionFields)
    assert decode_frame(encode_frame(NOTICE, 0, 0, Task.parse("0F0"),
                                     fields=NoticeFields(7, False))[0]).fields == NoticeFields(7, False)
    for kind in (HELLO, CLOSE, POSTED, DATA):  # kinds without fields
        producer = None if kind in (HELLO, CLOSE) else Task.parse("0F0")
        assert decode_frame(encode_frame(kind, 0, 0, producer)[0]).fields is None


def test_fields_of_another_kind_are_refused():
    with pytest.raises(TransportError, match="a DATA message has no NoticeFields"):
        encode_frame(DATA, 0, 0, Task.parse("0F0"), fields=NoticeFields(1, True))
    with pytest.raises(TransportError, match="a NOTICE message has no DecisionFields"):
        encode_frame(NOTICE, 0, 0, Task.parse("0F0"), fields=DecisionFields(1, 2))
