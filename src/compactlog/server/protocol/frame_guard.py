"""The guard in front of kio: a request frame's layout is checked, and repaired where
Kafka would read it, before kio decodes it.

Invariant: kio is handed only a frame whose every length and count fits in the bytes
that follow it, so that no hostile frame makes it reserve memory it cannot fill, and
which holds only what kio takes. kio reserves memory for an array's declared count
before reading its elements, so an array length of 2**31 (or 2**35, compact) would
abort the process. As in Kafka's own parser ("Tried to allocate a collection of size N,
but there are only M bytes remaining"), an array longer than the bytes left is
malformed. The same walk finds what Kafka reads and kio refuses, and edits the frame
before kio reads it: tagged fields this schema does not know (the protocol says to
skip them) are cut out, a boolean byte other than 0 or 1 becomes 1 (Kafka:
`readByte() != 0`), and a string that is not valid UTF-8 gets U+FFFD for each bad
sequence (Kafka decodes with `new String(bytes, UTF_8)`, which replaces them; a client
id is not worth a closed connection).

Bytes after the body's last field are cut off, as Kafka ignores them: its broker
parses a request with `AbstractRequest.parseRequest(apiKey, version, buffer)`, which
reads the generated `*RequestData` fields from a ByteBufferAccessor and then counts
`buffer.remaining()` taken before the read as the request's size, never checking
that the read used it all (apache/kafka clients/.../requests/AbstractRequest.java,
RequestContext.parseRequest, core/.../network/RequestChannel.scala). Real clients
depend on it: librdkafka writes a Metadata topic count as a four-byte placeholder
(rdkafka_buf.h `rd_kafka_buf_write_arraycnt_pos`) that
`rd_kafka_buf_finalize_arraycnt` shrinks to a compact varint, except for "all
topics" at v9+, where rd_kafka_MetadataRequest0 (rdkafka_request.c) keeps the zeros
as they are: a null compact array, then three zero bytes that Kafka reads as the
next fields, leaving the real ones unread at the end (librdkafka#5049, open).
Truncated frames, hostile lengths and counts stay refused.

Each request schema compiles once into a layout: its fields in wire order, as fixed
sizes (runs of fixed-size fields merged, and a non-flexible struct of fixed-size fields
is one size), string kinds, nested structs or arrays of those. The frame is then walked
without building any value.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from compactlog.server.protocol.kio_types import entity_type, fields, is_optional, is_tuple

# A request frame as read: bytes, or a read-only view of a frame read in chunks.
FrameBytes = bytes | memoryview
_INT32 = struct.Struct(">i")


class MalformedFrame(Exception):
    """A frame whose layout is not whole; the message says what and at which byte."""


_Cuts = list[tuple[int, int, bytes]]  # (start, stop, replacement) edits of a frame


def guard(schema: type, frame: FrameBytes) -> FrameBytes:
    """`frame` (a request: header, then body) as kio may read it: cut after the body's
    last field, with the repairs above. MalformedFrame if it is not whole."""
    header_schema = schema.__header_schema__  # type: ignore[attr-defined]
    cuts: _Cuts = []
    used = _skip(_header_layout(header_schema), frame, 0, len(frame), cuts)
    end = _skip(_layout(schema), frame, used, len(frame), cuts)
    frame = frame[:end]  # what follows the body is ignored (see above)
    return _cut(frame, cuts) if cuts else frame


_FIXED_SIZES = {
    "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "error_code": 2,
    "int32": 4, "uint32": 4, "timedelta_i32": 4, "int64": 8, "uint64": 8, "float64": 8,
    "timedelta_i64": 8, "datetime_i64": 8, "uuid": 16,
}


@dataclass(frozen=True)
class _Sized:
    """A string or bytes value: a compact length (unsigned varint of length + 1, 0 for
    null) in flexible versions, else a big-endian int16 (strings) or int32 (bytes)
    length, -1 for null."""

    width: int  # 0: compact
    nullable: bool
    text: bool = False  # a string, decoded as UTF-8


@dataclass(frozen=True)
class _Bool:
    """One byte, true unless 0 (kept apart from fixed-size runs: kio takes only 0 or 1)."""


@dataclass(frozen=True)
class _Array:
    item: _Layout
    compact: bool
    nullable: bool = True


@dataclass(frozen=True)
class _Struct:
    nullable: bool
    flexible: bool
    fields: tuple[_Layout, ...]
    tagged: Mapping[int, _Layout]


_Layout = int | _Sized | _Bool | _Array | _Struct
_BOOL = _Bool()


@cache
def _layout(cls: type, nullable: bool = False) -> _Layout:
    """The wire layout of kio entity `cls`, as kio's own reader sees it."""
    flexible = bool(cls.__flexible__)  # type: ignore[attr-defined]
    in_order: list[_Layout] = []
    tagged: dict[int, _Layout] = {}
    for field, hint in fields(cls):
        tag = field.metadata.get("tag")
        layout = _field_layout(field, hint, flexible, tagged=tag is not None)
        if tag is not None:
            tagged[int(tag)] = layout
        elif isinstance(layout, int) and in_order and isinstance(in_order[-1], int):
            in_order[-1] += layout
        else:
            in_order.append(layout)
    if not flexible and not nullable and all(isinstance(f, int) for f in in_order):
        return sum(f for f in in_order if isinstance(f, int))
    return _Struct(nullable, flexible, tuple(in_order), tagged)


def _field_layout(field: dataclasses.Field[Any], hint: Any, flexible: bool,
                  tagged: bool) -> _Layout:
    entity = entity_type(hint)
    if is_tuple(hint):
        item = (_layout(entity) if entity is not None
                else _primitive(field.metadata["kafka_type"], flexible, False))
        return _Array(item, flexible, is_optional(hint))
    if entity is not None:
        return _layout(entity, is_optional(hint))
    # A tagged field is present or absent by its tag, never null (as in kio).
    return _primitive(field.metadata["kafka_type"], flexible,
                      is_optional(hint) and not tagged)


def _primitive(kafka_type: str, flexible: bool, nullable: bool) -> _Layout:
    if kafka_type in _FIXED_SIZES:
        return _FIXED_SIZES[kafka_type]
    if kafka_type == "bool":
        return _BOOL
    if kafka_type not in ("string", "bytes", "records"):
        raise TypeError(f"no layout for kafka type {kafka_type!r}")
    text = kafka_type == "string"
    return _Sized(0 if flexible else 2 if text else 4, nullable, text)


@cache
def _header_layout(cls: type) -> _Layout:
    # api_key, api_version, correlation_id; the client id is a classic nullable string
    # even in the flexible header v2 (see the module doc); v2 ends with tagged fields.
    return _Struct(False, bool(cls.__flexible__), (8, _Sized(2, True, True)), {})  # type: ignore[attr-defined]


def _cut(frame: FrameBytes, cuts: _Cuts) -> bytes:
    """`frame` with each range [start, stop) replaced; the ranges do not overlap."""
    parts, pos = [], 0
    for start, stop, replacement in sorted(cuts):
        parts += [frame[pos:start], replacement]
        pos = stop
    parts.append(frame[pos:])
    return b"".join(parts)


def encode_uvarint(value: int) -> bytes:
    """Kafka's unsigned varint (compact lengths, tag numbers)."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _uvarint(data: FrameBytes, pos: int, end: int) -> tuple[int, int]:
    if pos < end and data[pos] < 0x80:
        return data[pos], pos + 1
    value = shift = 0
    for _ in range(5):
        if pos >= end:
            raise MalformedFrame(f"truncated varint at byte {pos}")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos
    raise MalformedFrame(f"varint at byte {pos - 5} is longer than 5 bytes")


def _skip(layout: _Layout, data: FrameBytes, pos: int, end: int, cuts: _Cuts) -> int:
    """The position after the value of `layout` at `pos`; MalformedFrame if it is not whole.
    Unknown tagged fields go to `cuts` as (start, stop, replacement)."""
    if isinstance(layout, int):
        if layout > end - pos:
            raise MalformedFrame(f"{layout} bytes needed at byte {pos}, {end - pos} remain")
        return pos + layout
    if isinstance(layout, _Struct):
        return _skip_struct(layout, data, pos, end, cuts)
    if isinstance(layout, _Array):
        return _skip_array(layout, data, pos, end, cuts)
    if isinstance(layout, _Bool):
        if pos >= end:
            raise MalformedFrame(f"1 byte needed at byte {pos}, 0 remain")
        if data[pos] > 1:
            cuts.append((pos, pos + 1, b"\x01"))
        return pos + 1
    length_at = pos
    if layout.width == 0:
        size, pos = _uvarint(data, pos, end)
        size -= 1
    else:
        if layout.width > end - pos:
            raise MalformedFrame(f"truncated length at byte {pos}")
        size = int.from_bytes(data[pos:pos + layout.width], "big", signed=True)
        pos += layout.width
    if size == -1 and layout.nullable:
        return pos
    if size < 0:
        raise MalformedFrame(f"bad string or bytes length {size} at byte {pos}")
    if size > end - pos:
        raise MalformedFrame(f"a value of {size} bytes at byte {pos}, {end - pos} remain")
    if layout.text:
        _repair_text(layout, data, length_at, pos, size, cuts)
    return pos + size


def _repair_text(layout: _Sized, data: FrameBytes, length_at: int, pos: int, size: int,
                 cuts: _Cuts) -> None:
    """A cut that replaces a string that is not UTF-8 (length included) with its
    lenient decoding, as Kafka reads it."""
    raw = bytes(data[pos:pos + size])
    if raw.isascii():
        return
    try:
        raw.decode()
        return
    except UnicodeDecodeError:
        fixed = raw.decode(errors="replace").encode()
    if layout.width == 0:
        length = encode_uvarint(len(fixed) + 1)
    else:
        if len(fixed) > 0x7FFF:  # each bad byte may take three: keep what fits
            fixed = raw.decode(errors="ignore").encode()
        length = struct.pack(">h", len(fixed))
    cuts.append((length_at, pos + size, length + fixed))


def _skip_array(layout: _Array, data: FrameBytes, pos: int, end: int, cuts: _Cuts) -> int:
    if layout.compact:
        count, pos = _uvarint(data, pos, end)
        count -= 1
    else:
        if end - pos < 4:
            raise MalformedFrame(f"truncated array length at byte {pos}")
        (count,) = _INT32.unpack_from(data, pos)
        pos += 4
    if count == -1 and layout.nullable:
        return pos
    if count == -1:  # Kafka: "non-nullable field ... was serialized as null"
        raise MalformedFrame(f"a null array at byte {pos}, where the schema allows none")
    if count < 0:
        raise MalformedFrame(f"negative array length {count} at byte {pos}")
    # As Kafka's parser: no element takes less than a byte.
    if count > end - pos:
        raise MalformedFrame(
            f"an array of {count} elements at byte {pos}, {end - pos} bytes remain")
    item = layout.item
    if isinstance(item, int):
        return _skip(count * item, data, pos, end, cuts)
    for _ in range(count):
        pos = _skip(item, data, pos, end, cuts)
    return pos


def _skip_struct(layout: _Struct, data: FrameBytes, pos: int, end: int, cuts: _Cuts) -> int:
    if layout.nullable:
        if pos >= end:
            raise MalformedFrame(f"truncated struct at byte {pos}")
        pos += 1
        if data[pos - 1] == 0xFF:  # -1: null
            return pos
    for field in layout.fields:
        pos = _skip(field, data, pos, end, cuts)
    if not layout.flexible:
        return pos
    count_at = pos
    count, pos = _uvarint(data, pos, end)
    unknown: _Cuts = []
    for _ in range(count):
        tag_at = pos
        tag, pos = _uvarint(data, pos, end)
        size, pos = _uvarint(data, pos, end)
        if size > end - pos:
            raise MalformedFrame(f"tagged field {tag} of {size} bytes at byte {pos}, "
                             f"{end - pos} remain")
        known = layout.tagged.get(tag)
        if known is None:
            unknown.append((tag_at, pos + size, b""))
        else:
            size_at, edits = _uvarint(data, tag_at, end)[1], len(cuts)
            if _skip(known, data, pos, pos + size, cuts) != pos + size:
                raise MalformedFrame(f"tagged field {tag} does not fill its {size} bytes")
            # Edits inside a known field change its size, which kio checks.
            grown = sum(len(new) - (stop - start) for start, stop, new in cuts[edits:])
            if grown:
                cuts.append((size_at, pos, encode_uvarint(size + grown)))
        pos += size
    if unknown:  # the count drops by the fields cut
        count_end = _uvarint(data, count_at, end)[1]
        cuts.append((count_at, count_end, encode_uvarint(count - len(unknown))))
        cuts.extend(unknown)
    return pos
