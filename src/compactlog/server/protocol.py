"""The Kafka wire protocol: frames, request and response headers, message bodies.

Message schemas come from kio, which generates one frozen dataclass per API version
from Kafka's own JSON message definitions and (de)serializes them natively, flexible
versions and tagged fields included. Handlers do not deal with versions: they return
plain dicts with every field of the newest version they know, and `build` fills the
dataclass of the version the client asked for, dropping fields that version lacks.

Header rules that bite (shared/notes/kafka-protocol.md §3): the request header is v2
when the API version is flexible, else v1; the response header likewise v1 or v0,
except ApiVersions, whose response header is always v0; and an ApiVersions request of a
version we do not know is answered in the v0 body format with UNSUPPORTED_VERSION and
our range (KIP-511), so that the client retries with a version we share.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

# API key -> (min, max) version served: the server's handler table supplies it, so that
# only what is implemented is advertised.
VersionTable = Mapping[int, tuple[int, int]]

API_NAMES = {
    29: "DescribeAcls", 30: "CreateAcls", 31: "DeleteAcls",
    0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit",
    9: "OffsetFetch", 10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat",
    13: "LeaveGroup", 14: "SyncGroup", 15: "DescribeGroups", 16: "ListGroups",
    18: "ApiVersions", 19: "CreateTopics", 20: "DeleteTopics", 21: "DeleteRecords",
    22: "InitProducerId", 32: "DescribeConfigs", 33: "AlterConfigs", 35: "DescribeLogDirs",
    37: "CreatePartitions", 42: "DeleteGroups", 43: "ElectLeaders",
    44: "IncrementalAlterConfigs", 45: "AlterPartitionReassignments",
    46: "ListPartitionReassignments", 47: "OffsetDelete", 60: "DescribeCluster",
    61: "DescribeProducers", 17: "SaslHandshake", 36: "SaslAuthenticate",
    50: "DescribeUserScramCredentials", 51: "AlterUserScramCredentials",
}
API_VERSIONS_KEY = 18
# A request frame as read: bytes, or a read-only view of a frame read in chunks.
FrameBytes = bytes | memoryview
_FIXED_HEADER = struct.Struct(">hhi")  # api_key, api_version, correlation_id
_LENGTH = struct.Struct(">i")


class ProtocolError(Exception):
    """A request that cannot be parsed; the connection is closed after logging it."""


@dataclass(frozen=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # the kio dataclass of this API version's request
    client_host: str = ""
    principal: str = "User:ANONYMOUS"  # Kafka's KafkaPrincipal, set by the connection after SASL or mTLS

    @property
    def name(self) -> str:
        return API_NAMES.get(self.api_key, f"api {self.api_key}")


@dataclass(frozen=True)
class UnsupportedVersion:
    """A request whose API key or version is not served; only ApiVersions gets an answer."""

    api_key: int
    api_version: int
    correlation_id: int


def peek_header(frame: FrameBytes) -> tuple[int, int, int]:
    if len(frame) < _FIXED_HEADER.size:
        raise ProtocolError(f"a request of {len(frame)} bytes is shorter than its header")
    api_key, api_version, correlation_id = _FIXED_HEADER.unpack_from(frame)
    return int(api_key), int(api_version), int(correlation_id)


def parse_request(frame: FrameBytes, versions: VersionTable) -> Request | UnsupportedVersion:
    """Decode one request frame (without its length prefix), as Kafka's broker would.

    The frame's layout is checked before kio decodes it (see `_skip`): kio reserves
    memory for an array's declared count before reading its elements, so an array
    length of 2**31 (or 2**35, compact) in a hostile frame would abort the process. As
    in Kafka's own parser ("Tried to allocate a collection of size N, but there are only
    M bytes remaining"), an array longer than the bytes left is malformed. The same walk
    finds what Kafka reads and kio refuses, and edits the frame before kio reads it:
    tagged fields this schema does not know (the protocol says to skip them) are cut
    out, a boolean byte other than 0 or 1 becomes 1 (Kafka: `readByte() != 0`), and a
    string that is not valid UTF-8 gets U+FFFD for each bad sequence (Kafka decodes with
    `new String(bytes, UTF_8)`, which replaces them; a client id is not worth a closed
    connection).

    Bytes after the body's last field are ignored, as Kafka ignores them: its broker
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
    """
    api_key, api_version, correlation_id = peek_header(frame)
    served = versions.get(api_key)
    if served is None or not served[0] <= api_version <= served[1]:
        return UnsupportedVersion(api_key, api_version, correlation_id)
    schema = _request_schema(api_key, api_version)
    what = f"{API_NAMES.get(api_key, api_key)} v{api_version} request"
    cuts: _Cuts = []
    try:
        used = _skip(_header_layout(schema.__header_schema__), frame, 0, len(frame), cuts)
        end = _skip(_layout(schema), frame, used, len(frame), cuts)
    except _Malformed as error:
        raise ProtocolError(
            f"malformed {what} (correlation id {correlation_id}): {error}") from None
    frame = frame[:end]  # what follows the body is ignored (see above)
    if cuts:
        frame = _cut(frame, cuts)
    try:
        header, used = _reader(schema.__header_schema__)(frame, 0)
        body, body_size = _reader(schema)(frame, used)
    except Exception as error:  # kio raises a variety of errors for malformed input
        raise ProtocolError(
            f"malformed {what} (correlation id {correlation_id}): {error}") from None
    if used + body_size != len(frame):  # kio and the layout check disagree
        raise ProtocolError(f"{what}: {len(frame) - used - body_size} bytes were not read")
    return Request(api_key, api_version, correlation_id, header.client_id, body)


def encode_response(api_key: int, api_version: int, correlation_id: int,
                    data: Mapping[str, Any]) -> bytes:
    """A whole response frame, length prefix included, from a version-neutral dict."""
    schema = _response_schema(api_key, api_version)
    body = build(schema, data)
    header_schema = schema.__header_schema__
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    _writer(header_schema)(out, header_schema(correlation_id=correlation_id))
    _writer(schema)(out, body)
    frame = out.getbuffer()
    _LENGTH.pack_into(frame, 0, len(frame) - 4)
    return bytes(frame)


def response_entries(data: Mapping[str, Any]) -> int:
    """Array entries of a version-neutral response, two levels deep (topics and their
    partitions, groups and their members): what encoding it costs grows with, about 25
    microseconds each, and what a client can multiply by naming many entries."""
    count = 0
    for value in data.values():
        if isinstance(value, list | tuple):
            count += len(value)
            for item in value:
                if isinstance(item, Mapping):
                    count += sum(len(inner) for inner in item.values()
                                 if isinstance(inner, list | tuple))
    return count


def unsupported_api_versions_response(correlation_id: int, versions: VersionTable) -> bytes:
    """KIP-511: an ApiVersions request of an unknown version gets a v0 body."""
    return encode_response(API_VERSIONS_KEY, 0, correlation_id, {
        "error_code": ErrorCode.unsupported_version,
        "api_keys": api_version_entries(versions),
    })


def api_version_entries(versions: VersionTable) -> list[dict[str, int]]:
    return [{"api_key": key, "min_version": low, "max_version": high}
            for key, (low, high) in sorted(versions.items())]


def build(cls: type, data: Mapping[str, Any]) -> Any:
    """Fill kio dataclass `cls` from `data`: keys the version lacks are dropped, nested
    entities are built recursively, and fields missing from `data` take their schema
    default (tagged fields) or a neutral value (0, empty, null, none-error)."""
    values: dict[str, Any] = {}
    for field, hint in _fields(cls):
        if field.name in data:
            values[field.name] = _convert(hint, data[field.name])
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            values[field.name] = _neutral(hint)
    return cls(**values)


def _convert(hint: Any, value: Any) -> Any:
    entity = _entity_type(hint)
    if entity is not None:
        if value is None:
            return None
        if _is_tuple(hint):
            return tuple(v if isinstance(v, entity) else build(entity, v) for v in value)
        return value if isinstance(value, entity) else build(entity, value)
    if _is_tuple(hint):
        return None if value is None else tuple(value)
    return value


def _neutral(hint: Any) -> Any:
    if _is_optional(hint):
        return None
    base = _strip_optional(hint)
    if _is_tuple(base):
        return ()
    if base is ErrorCode:
        return ErrorCode.none
    if isinstance(base, type):
        if issubclass(base, datetime.timedelta):
            return datetime.timedelta(0)
        if issubclass(base, bool):
            return False
        if issubclass(base, int):
            return 0
        if issubclass(base, str):
            return ""
        if issubclass(base, bytes):
            return b""
    origin = typing.get_origin(base)
    if origin is None and hasattr(base, "__supertype__"):  # typing.NewType over int/str
        return _neutral(base.__supertype__)
    raise TypeError(f"no neutral value for a field of type {hint!r}")


def _is_optional(hint: Any) -> bool:
    return type(None) in typing.get_args(hint) and typing.get_origin(hint) in (
        typing.Union, getattr(__import__("types"), "UnionType", None))


def _strip_optional(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if _is_optional(hint) and len(args) == 1:
        return args[0]
    return hint


def _is_tuple(hint: Any) -> bool:
    return typing.get_origin(_strip_optional(hint)) is tuple


def _entity_type(hint: Any) -> type | None:
    base = _strip_optional(hint)
    if typing.get_origin(base) is tuple:
        base = typing.get_args(base)[0]
    if isinstance(base, type) and getattr(base, "__type__", None) is EntityType.nested:
        return base
    return None


@cache
def _fields(cls: type) -> list[tuple[dataclasses.Field[Any], Any]]:
    hints = typing.get_type_hints(cls)
    return [(field, hints[field.name]) for field in dataclasses.fields(cls)]


@cache
def _request_schema(api_key: int, api_version: int) -> Any:
    return load_request_schema(api_key, api_version)


@cache
def _response_schema(api_key: int, api_version: int) -> Any:
    return load_response_schema(api_key, api_version)


@cache
def _reader(schema: type) -> Any:
    return entity_reader(schema)


@cache
def _writer(schema: type) -> Any:
    return entity_writer(schema)


# The layout check. Each request schema compiles once into a layout: its fields in wire
# order, as fixed sizes (runs of fixed-size fields merged, and a non-flexible struct of
# fixed-size fields is one size), string kinds, nested structs or arrays of those. The
# frame is then walked without building any value.

class _Malformed(Exception):
    pass


_Cuts = list[tuple[int, int, bytes]]  # (start, stop, replacement) edits of a frame


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
    fields: list[_Layout] = []
    tagged: dict[int, _Layout] = {}
    for field, hint in _fields(cls):
        tag = field.metadata.get("tag")
        layout = _field_layout(field, hint, flexible, tagged=tag is not None)
        if tag is not None:
            tagged[int(tag)] = layout
        elif isinstance(layout, int) and fields and isinstance(fields[-1], int):
            fields[-1] += layout
        else:
            fields.append(layout)
    if not flexible and not nullable and all(isinstance(f, int) for f in fields):
        return sum(f for f in fields if isinstance(f, int))
    return _Struct(nullable, flexible, tuple(fields), tagged)


def _field_layout(field: dataclasses.Field[Any], hint: Any, flexible: bool,
                  tagged: bool) -> _Layout:
    entity = _entity_type(hint)
    if _is_tuple(hint):
        item = (_layout(entity) if entity is not None
                else _primitive(field.metadata["kafka_type"], flexible, False))
        return _Array(item, flexible, _is_optional(hint))
    if entity is not None:
        return _layout(entity, _is_optional(hint))
    # A tagged field is present or absent by its tag, never null (as in kio).
    return _primitive(field.metadata["kafka_type"], flexible,
                      _is_optional(hint) and not tagged)


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
            raise _Malformed(f"truncated varint at byte {pos}")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos
    raise _Malformed(f"varint at byte {pos - 5} is longer than 5 bytes")


def _skip(layout: _Layout, data: FrameBytes, pos: int, end: int, cuts: _Cuts) -> int:
    """The position after the value of `layout` at `pos`; _Malformed if it is not whole.
    Unknown tagged fields go to `cuts` as (start, stop, replacement)."""
    if isinstance(layout, int):
        if layout > end - pos:
            raise _Malformed(f"{layout} bytes needed at byte {pos}, {end - pos} remain")
        return pos + layout
    if isinstance(layout, _Struct):
        return _skip_struct(layout, data, pos, end, cuts)
    if isinstance(layout, _Array):
        return _skip_array(layout, data, pos, end, cuts)
    if isinstance(layout, _Bool):
        if pos >= end:
            raise _Malformed(f"1 byte needed at byte {pos}, 0 remain")
        if data[pos] > 1:
            cuts.append((pos, pos + 1, b"\x01"))
        return pos + 1
    length_at = pos
    if layout.width == 0:
        size, pos = _uvarint(data, pos, end)
        size -= 1
    else:
        if layout.width > end - pos:
            raise _Malformed(f"truncated length at byte {pos}")
        size = int.from_bytes(data[pos:pos + layout.width], "big", signed=True)
        pos += layout.width
    if size == -1 and layout.nullable:
        return pos
    if size < 0:
        raise _Malformed(f"bad string or bytes length {size} at byte {pos}")
    if size > end - pos:
        raise _Malformed(f"a value of {size} bytes at byte {pos}, {end - pos} remain")
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
            raise _Malformed(f"truncated array length at byte {pos}")
        (count,) = _LENGTH.unpack_from(data, pos)
        pos += 4
    if count == -1 and layout.nullable:
        return pos
    if count == -1:  # Kafka: "non-nullable field ... was serialized as null"
        raise _Malformed(f"a null array at byte {pos}, where the schema allows none")
    if count < 0:
        raise _Malformed(f"negative array length {count} at byte {pos}")
    # As Kafka's parser: no element takes less than a byte.
    if count > end - pos:
        raise _Malformed(
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
            raise _Malformed(f"truncated struct at byte {pos}")
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
            raise _Malformed(f"tagged field {tag} of {size} bytes at byte {pos}, "
                             f"{end - pos} remain")
        known = layout.tagged.get(tag)
        if known is None:
            unknown.append((tag_at, pos + size, b""))
        else:
            size_at, edits = _uvarint(data, tag_at, end)[1], len(cuts)
            if _skip(known, data, pos, pos + size, cuts) != pos + size:
                raise _Malformed(f"tagged field {tag} does not fill its {size} bytes")
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
