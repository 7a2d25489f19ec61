"""The wire format: what one message's bytes are, and what each word of them means for each kind of message.

Wire format of one message: a byte *frame*, an int64 header of
``HEADER_WORDS`` words, followed under gloo by up to ``INLINE_BYTES`` of
payload::

    [magic, sequence, type, iteration, stage, kind, microbatch, n_tensors, inline, field_0, field_1,
     (dtype, ndim, d0..d5) x MAX_TENSORS] [payload bytes, tensors back to back]

``type`` is the message's :class:`MessageKind`. ``stage``, ``kind`` and
``microbatch`` are the *producer fields*: for a message about a task they name
it, ``kind`` being the Unicode code point of the task's letter (``ord("F")``),
so the header names the producing task ``<stage><kind><microbatch>``
directly. ``inline`` is a :class:`Payload`: where the payload travels.

The two *field words* mean what the message's kind says they mean, and
nothing elsewhere; :data:`KIND_FIELDS` is the one table of them, and the code
reads and writes them only through its named tuples
(:attr:`FrameHeader.fields`)::

    type       named by          field_0         field_1
    NOTICE     NoticeFields      remaining_ns    firm (0 or 1)
    DECISION   DecisionFields    index           decided_ns
    the rest   (nothing)         0               0

(Before the table the two words were named after a NOTICE's meanings, which
a DECISION borrowed; the bytes are the same, so the wire version is too.)

The magic word is versioned: its low 32 bits spell ``RRFP``, its high 32 bits
are :data:`WIRE_VERSION` (0 before versions existed). A frame of another
version is a :class:`TransportError` naming both versions, never a silent
misreading of a layout or a message type one side does not know.

Payloads that fit travel inside the frame, so a typical message costs one
write and one read; under gloo larger ones up to ``BODY_BYTES`` follow the
frame on the socket as its body ([Note: bodies]), and larger still
(``inline == 0``, and every tensor under NCCL) take the link's process group
as one send per tensor (zero-size tensors are never sent; the header has
their shape), under gloo into receives posted before they were sent ([Note:
pre-posted receives] in :mod:`runtime.comm.sockets`; :func:`follow_tag` is its
rule, which both ends apply). Frames are built and read on the host with
``struct`` and ``memmove``: a handful of microseconds, no per-word tensor
operations.

[Note: bodies]
    A payload over ``INLINE_BYTES`` and at most ``BODY_BYTES`` (the header's
    ``inline`` word is 2) is written right after its frame, the tensors'
    own bytes with one ``sendmsg`` (no copy into the frame). The reader
    takes what it read with the frame, then reads the rest straight into
    the tensors it hands over (allocated from
    :class:`runtime.comm.sockets.Spares`, so their pages are not faulted in
    anew each time), without waiting: a body still arriving is finished by
    later reads, and its message is listed only once complete. Its arrival
    time is the kernel's receive time of its last bytes. A 1 MiB message
    then costs less than gloo's own send and receive
    (docs/benchmarks/transport-latency.md). Up to ``BODY_BYTES`` the kernel's socket
    buffers hold a body while the receiving rank computes; beyond it a
    message goes on gloo, whose own thread receives it meanwhile.

[Note: trimmed frames]
    Under gloo a frame is the header and the inline payload, nothing more,
    written to the link's socket back to back with the frames before it;
    the reader learns each frame's length from its header (the inline
    payload is the tensors it describes). A NOTICE is then a few hundred
    bytes, and a small activation costs what it weighs. NCCL needs matching
    sizes, so under NCCL every frame is exactly the header
    (``HEADER_BYTES``) and every tensor follows it: no payload is copied on
    the device to build a frame.

The kinds of message (:class:`MessageKind`): HELLO (sent once per link at
start, so every link is set up and exercised before training), DATA, NOTICE,
DECISION, POSTED or CLOSE (end of run).

A NOTICE carries no tensors: it tells the receiver that the producing task's
output is on its way, for the lookahead rule ([Note: lookahead admission] in
:mod:`runtime.sched.arbiter`). Its fields (:class:`NoticeFields`):
``remaining_ns`` is the sender's estimate of how long until the output leaves
it (its duration estimate for a task it just started: ``firm`` = 1; or,
relayed, its own predicted wait plus its duration estimate for the next task:
``firm`` = 0). Times are relative, so no clock needs to be shared. Notices
travel in the link's one FIFO, so a notice always arrives before the data it
announces.

A DECISION carries no tensors either: a TP group's leader tells a follower
which task to run next, on the leader's decision link to it ([Note: TP
coordination] in :mod:`runtime.exec.tp_follow`). The producer fields name the task;
its fields (:class:`DecisionFields`) are the decision's ``index`` in the
iteration and the leader's clock at the decision, ``decided_ns`` (rank 0's
clock domain), from which the follower's trace gets the follow latency.

A POSTED carries no tensors either: under ``--p2p blocking`` the consumer's
rank tells the producer's rank that it has posted its receive for the
message the producer fields name ([Note: blocking p2p in the runtime] in
:mod:`runtime.exec.executor`). It travels on the link opposite to the data's.
"""

from __future__ import annotations

import ctypes
import enum
import math
import struct
from typing import NamedTuple, Sequence

import torch

from hints.tasks import Kind, Task
from runtime.comm.errors import TransportError

MAGIC = 0x52524650  # "RRFP": the low half of a frame's first word
WIRE_VERSION = 2  # its high half; 1 added POSTED, 2 bodies (0: the frames before versions existed)
MAX_TENSORS = 4
MAX_DIMS = 6
FIXED_WORDS = 11
HEADER_WORDS = FIXED_WORDS + MAX_TENSORS * (2 + MAX_DIMS)
HEADER_BYTES = HEADER_WORDS * 8
INLINE_BYTES = 32 * 1024
BODY_BYTES = 4 << 20  # under gloo, a larger payload follows its frame on the socket up to this ([Note: bodies])
FRAME_BYTES = HEADER_BYTES + INLINE_BYTES
PREPOSTED_TAG = 1  # + the tensor's slot in its message: a receive posted before the message (sockets.py's note)
LATE_TAG = PREPOSTED_TAG + MAX_TENSORS  # a tensor whose receive is posted after its frame was read
PREPOSTED_DEPTH = 2  # receives a sized slot keeps posted ([Note: pre-posted receives] in runtime.comm.sockets)


class MessageKind(enum.IntEnum):
    """What a message is: the header's ``type`` word (the values are the wire's)."""

    HELLO = 1  # once per link at start: every link is set up and exercised before training
    DATA = 2  # a task's output: its tensors
    CLOSE = 3  # the end of the link
    NOTICE = 4  # a task's output is on its way (NoticeFields)
    DECISION = 5  # a TP leader's next task, for a follower (DecisionFields)
    POSTED = 6  # under --p2p blocking: the consumer posted its receive for a task's output


# The members under names of their own, as socket.AF_INET is socket.AddressFamily.AF_INET: every message's kind
# is compared on its way, and a module name is read about 5x faster than an enum's attribute (Python 3.11).
HELLO = MessageKind.HELLO
DATA = MessageKind.DATA
CLOSE = MessageKind.CLOSE
NOTICE = MessageKind.NOTICE
DECISION = MessageKind.DECISION
POSTED = MessageKind.POSTED
ABOUT_A_TASK = frozenset((DATA, NOTICE, DECISION, POSTED))  # the kinds whose producer fields name a task


class Payload(enum.IntEnum):
    """Where a message's payload travels: the header's ``inline`` word."""

    ON_GROUP = 0  # one send per tensor on the link's process group (every tensor under NCCL)
    IN_FRAME = 1  # inside the frame, after the header ([Note: trimmed frames])
    IN_BODY = 2  # right after the frame on the link's socket, under gloo ([Note: bodies])


ON_GROUP, IN_FRAME, IN_BODY = Payload.ON_GROUP, Payload.IN_FRAME, Payload.IN_BODY  # read per message, as above


class NoticeFields(NamedTuple):
    """A NOTICE's two field words: its producer's output should leave the sender in ``remaining_ns``."""

    remaining_ns: int  # from when the notice was sent
    firm: bool  # the producer has started (else: a relayed prediction)


class DecisionFields(NamedTuple):
    """A DECISION's two field words: the producer fields' task is the follower's ``index``-th of the iteration."""

    index: int
    decided_ns: int  # the leader's clock at the decision, in rank 0's clock domain


KIND_FIELDS: dict[MessageKind, type] = {NOTICE: NoticeFields, DECISION: DecisionFields}  # the other kinds: (0, 0)

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool,
          torch.uint8)
_DTYPE_CODE = {dtype: code for code, dtype in enumerate(DTYPES)}
_FIXED = struct.Struct(f"={FIXED_WORDS}q")  # native order: frames never leave one kind of machine
_SPEC = struct.Struct(f"={2 + MAX_DIMS}q")  # dtype, ndim, d0..d5
_MAGIC_WORD = MAGIC | WIRE_VERSION << 32
_KIND_CODE = {kind: ord(kind.value) for kind in Kind}  # a task's kind on the wire
_CODE_KIND = {code: kind for kind, code in _KIND_CODE.items()}
_MESSAGE_KIND = {int(kind): kind for kind in MessageKind}  # a type word to its kind (a dict: cheaper than a call)
_NO_FIELDS = (0, 0)
_NO_DIMS = [(0,) * (MAX_DIMS - n) for n in range(MAX_DIMS + 1)]


class FrameHeader(NamedTuple):
    """A decoded header."""

    kind_of_message: MessageKind | int  # an int only for a type this rank does not know (refused where it is read)
    sequence: int
    iteration: int
    producer: Task | None  # the task the producer fields name (None for HELLO and CLOSE)
    specs: list[tuple[torch.dtype, tuple[int, ...]]]
    inline: bool  # the payload is in the frame ([Note: trimmed frames])
    fields: NoticeFields | DecisionFields | None = None  # the kind's field words, named (KIND_FIELDS)
    body: bool = False  # the payload follows the frame on the socket ([Note: bodies])


# -- encoding -------------------------------------------------------------------------------------------------------
def encode_frame(kind_of_message: MessageKind, sequence: int, iteration: int = 0, producer: Task | None = None,
                 tensors: Sequence[torch.Tensor] = (), fields: NoticeFields | DecisionFields | None = None,
                 inline: bool = True, body: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The frame of one message (a host byte tensor), and the tensors that must follow it.

    With ``inline`` a payload of at most ``INLINE_BYTES`` of host tensors travels in the frame, which
    ends right after it ([Note: trimmed frames]); a larger one of at most ``body`` bytes follows the frame
    as its *body* ([Note: bodies]); otherwise the frame is the header and every tensor follows it (NCCL,
    or a large payload).
    """
    frame, follow, _ = pack_frame(kind_of_message, sequence, iteration, producer, tensors, fields, inline, body)
    return torch.frombuffer(frame, dtype=torch.uint8), follow


def pack_frame(kind_of_message: MessageKind, sequence: int, iteration: int, producer: Task | None,
               tensors: Sequence[torch.Tensor], fields: NoticeFields | DecisionFields | None, inline: bool,
               body: int = 0) -> tuple[bytearray, list, Payload]:
    """:func:`encode_frame`'s frame as the bytes a socket sends, the tensors that follow it, and where the
    payload goes."""
    count = len(tensors)
    if count > MAX_TENSORS:
        raise TransportError(f"a message carries at most {MAX_TENSORS} tensors, got {count}")
    if fields is None:
        fields = _NO_FIELDS
    elif type(fields) is not KIND_FIELDS.get(kind_of_message):
        raise TransportError(f"a {MessageKind(kind_of_message).name} message has no {type(fields).__name__}")
    where, payload = IN_FRAME if inline else ON_GROUP, 0
    if count:
        tensors = [t.contiguous() for t in tensors]
        payload = sum(t.nbytes for t in tensors)
        host = all(t.is_cpu for t in tensors)
        if not (inline and payload <= INLINE_BYTES and host):
            where = IN_BODY if payload <= body and host else ON_GROUP
    frame = bytearray(HEADER_BYTES + (payload if where == IN_FRAME else 0))
    stage, kind, microbatch = (-1, 0, -1) if producer is None else \
        (producer.stage, _KIND_CODE[producer.kind], producer.microbatch)
    _FIXED.pack_into(frame, 0, _MAGIC_WORD, sequence, kind_of_message, iteration, stage, kind, microbatch, count,
                     where, fields[0], fields[1])
    if not count:
        return frame, [], where
    for i, tensor in enumerate(tensors):
        _SPEC.pack_into(frame, _FIXED.size + i * _SPEC.size, *_spec(tensor))
    if where != IN_FRAME:
        return frame, tensors, where
    view, offset = memoryview(frame), HEADER_BYTES
    for tensor in tensors:
        if tensor.nbytes:
            view[offset:offset + tensor.nbytes] = host_bytes(tensor)
            offset += tensor.nbytes
    return frame, [], where


def _spec(tensor: torch.Tensor) -> tuple[int, ...]:
    """The header words of one tensor: dtype code, number of dims, the dims padded with zeros."""
    code = _DTYPE_CODE.get(tensor.dtype)
    if code is None:
        raise TransportError(f"dtype {tensor.dtype} cannot be sent")
    if tensor.dim() > MAX_DIMS:
        raise TransportError(f"tensors of at most {MAX_DIMS} dims, got shape {tuple(tensor.shape)}")
    return code, tensor.dim(), *tensor.shape, *_NO_DIMS[tensor.dim()]


# -- decoding -------------------------------------------------------------------------------------------------------
def decode_frame(frame: torch.Tensor) -> FrameHeader:
    """The header of a received frame (a contiguous byte tensor, on the host or a device)."""
    if frame.dtype != torch.uint8 or frame.numel() < HEADER_BYTES:
        raise TransportError(f"a frame is at least {HEADER_BYTES} bytes, got {frame.numel()} of {frame.dtype}")
    if frame.device.type != "cpu":
        frame = frame[:HEADER_BYTES].cpu()
    return decode_header(host_bytes(frame), 0)


def decode_header(buffer, offset: int) -> FrameHeader:
    """The header of the frame that starts at ``offset`` of ``buffer`` (bytes on the host)."""
    magic, sequence, type_word, iteration, stage, kind, microbatch, count, inline, field_0, field_1 = \
        _FIXED.unpack_from(buffer, offset)
    if magic != _MAGIC_WORD:
        if magic & 0xFFFFFFFF != MAGIC:
            raise TransportError(f"bad message header (magic {magic:#x})")
        raise TransportError(f"the peer speaks wire version {magic >> 32}, this rank {WIRE_VERSION}: run one rrfp "
                             f"version on every rank")
    kind_of_message = _MESSAGE_KIND.get(type_word, type_word)
    producer = None
    if kind_of_message in ABOUT_A_TASK:
        if kind not in _CODE_KIND:
            raise TransportError(f"bad message header (task kind {kind})")
        producer = Task(stage, _CODE_KIND[kind], microbatch)
    if not 0 <= count <= MAX_TENSORS:
        raise TransportError(f"bad message header ({count} tensors)")
    specs = []
    offset += _FIXED.size
    for i in range(count):
        dtype, ndim, *dims = _SPEC.unpack_from(buffer, offset + i * _SPEC.size)
        if not (0 <= dtype < len(DTYPES) and 0 <= ndim <= MAX_DIMS and min(dims) >= 0):
            raise TransportError(f"bad message header (tensor {i}: dtype {dtype}, {ndim} dims)")
        specs.append((DTYPES[dtype], tuple(dims[:ndim])))
    if inline not in (ON_GROUP, IN_FRAME, IN_BODY):
        raise TransportError(f"bad message header (inline word {inline})")
    fields = None
    if kind_of_message == NOTICE:
        fields = NoticeFields(field_0, bool(field_1))
    elif kind_of_message == DECISION:
        fields = DecisionFields(field_0, field_1)
    return FrameHeader(kind_of_message, sequence, iteration, producer, specs, inline == IN_FRAME, fields,
                       inline == IN_BODY)


# -- payloads -------------------------------------------------------------------------------------------------------
def inline_tensors(frame: torch.Tensor, specs) -> list[torch.Tensor]:
    """The payload tensors packed into a host ``frame`` (each copied out to its own storage)."""
    return tensors_at(frame.data_ptr() + HEADER_BYTES, specs)


def tensors_at(address: int, specs) -> list[torch.Tensor]:
    """The tensors ``specs`` describe, packed back to back from ``address`` on the host (copied out)."""
    tensors = []
    for dtype, shape in specs:
        tensor = torch.empty(shape, dtype=dtype)
        ctypes.memmove(tensor.data_ptr(), address, tensor.nbytes)
        tensors.append(tensor)
        address += tensor.nbytes
    return tensors


def payload_bytes(specs) -> int:
    """The bytes of the tensors ``specs`` describe."""
    return sum(spec_bytes(dtype, shape) for dtype, shape in specs)


def spec_bytes(dtype: torch.dtype, shape) -> int:
    """The bytes of one tensor a header describes."""
    return math.prod(shape) * dtype.itemsize


def host_bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous host tensor, in place (valid while the tensor lives)."""
    return memoryview((ctypes.c_char * tensor.nbytes).from_address(tensor.data_ptr())).cast("B")


def follow_tag(posted: list[int], slot: int, nbytes: int) -> int:
    """The tag a tensor of ``nbytes`` (> 0) in ``slot`` follows its frame on, under gloo; updates ``posted``.

    ``posted[slot]`` is the size of the receive the link keeps pre-posted for the slot (0: none yet).
    Both ends call this for the same tensors in the same order ([Note: pre-posted receives] in
    :mod:`runtime.comm.sockets`).
    """
    capacity = posted[slot]
    if capacity >= nbytes:
        return PREPOSTED_TAG + slot
    if capacity == 0:
        posted[slot] = nbytes  # from the next message on, a receive of this size waits for the slot
    return LATE_TAG
