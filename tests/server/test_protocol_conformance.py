"""Requests are decoded as Kafka's own broker decodes them (server/protocol/messages.py).

- Every (API, version) the server advertises round-trips: kio builds the request with
  null, empty and full values of every nullable, array and string field (generated
  from the dataclass fields, nested ones included), frames it with a request header as
  a client does, and `parse_request` gives back the same header and body, also with
  bytes after the body (ignored, as Kafka ignores them). Versions advertised but not
  served (Produce 0-2, advertised for old librdkafka, KAFKA-18659) come back as
  UnsupportedVersion.
- What Kafka reads and kio would refuse: librdkafka's all-topics Metadata frame (a
  four-byte placeholder for the topic count, librdkafka#5049), unknown tagged fields
  next to known ones, a boolean byte of 2, strings that are not UTF-8.
- Hostile frames stay refused: every truncation of every served request, negative and
  oversized lengths and counts.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import typing
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kio.index import UnknownEntity, load_request_schema
from kio.schema.errors import ErrorCode

from compactlog.server.protocol.frame_guard import encode_uvarint
from compactlog.server.protocol.messages import (
    ProtocolError,
    Request,
    UnsupportedVersion,
    parse_request,
)
from support.versions import ADVERTISED, SERVED
from support.wire import encode_request

METADATA, FETCH = 3, 1


ADVERTISED_VERSIONS = [(key, version) for key, (low, high) in sorted(ADVERTISED.items())
                       for version in range(low, high + 1)]
SERVED_VERSIONS = [(key, version) for key, version in ADVERTISED_VERSIONS
                   if SERVED[key][0] <= version <= SERVED[key][1]]


def is_served(api_key: int, version: int) -> bool:
    low, high = SERVED[api_key]
    return low <= version <= high


def parsed(frame: bytes) -> Request:
    request = parse_request(frame, SERVED)
    assert isinstance(request, Request)
    return request


# -- generated bodies: full, and each nullable/array/string field null or empty ---------

# Non-ASCII but valid UTF-8, so that the decoder's UTF-8 path is taken.
_FULL: dict[str, Any] = {
    "int8": 7, "int16": -7, "int32": 70_000, "int64": 2**40, "bool": True,
    "string": "tópic-ü", "bytes": b"\x00\xffbytes", "records": b"\x00records",
    "uuid": uuid.UUID(int=2**100 + 5),
    "timedelta_i32": datetime.timedelta(milliseconds=1500),
    "timedelta_i64": datetime.timedelta(milliseconds=2**33),
}
_EMPTY = {"string": "", "bytes": b"", "records": b""}
Path_ = tuple[str | int, ...]


def _hint_parts(hint: Any) -> tuple[bool, bool, Any]:
    """(nullable, array, the element or value type)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    nullable = type(None) in typing.get_args(hint) and len(args) == 1
    base = args[0] if nullable else hint
    if typing.get_origin(base) is tuple:
        return nullable, True, typing.get_args(base)[0]
    return nullable, False, base


def _is_entity(kind: Any) -> bool:
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def full(cls: type) -> Any:
    """`cls` with every field set, every tagged field off its default, and every array
    holding two elements."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        _, array, kind = _hint_parts(hints[field.name])
        value = full(kind) if _is_entity(kind) else _FULL[field.metadata["kafka_type"]]
        values[field.name] = (value, value) if array else value
    return cls(**values)


def variable_fields(cls: type, path: Path_ = ()) -> Iterator[tuple[Path_, bool, bool, str]]:
    """(path, nullable, array, kafka type or "") of every field whose length varies, nested
    ones included (through the first element of an array of structs)."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        nullable, array, kind = _hint_parts(hints[field.name])
        kafka_type = field.metadata.get("kafka_type", "")
        here = (*path, field.name)
        if nullable or array or kafka_type in _EMPTY:
            yield here, nullable, array, kafka_type
        if _is_entity(kind):
            yield from variable_fields(kind, (*here, 0) if array else here)


def set_path(value: Any, path: Path_, new: Any) -> Any:
    """`value` with the part at `path` replaced; unchanged if the path has gone (a parent
    made null or empty)."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(head, int):
        if not value:
            return value
        return (set_path(value[0], rest, new), *value[1:])
    if value is None:
        return value
    return dataclasses.replace(value, **{head: set_path(getattr(value, head), rest, new)})


def variants(schema: type) -> list[tuple[str, Any]]:
    """The full body; for each variable field, the body with that field null (when
    nullable), empty (arrays, strings, bytes); all of them null at once; all empty."""
    base = full(schema)
    out = [("full", base)]
    all_null, all_empty = base, base
    for path, nullable, array, kafka_type in variable_fields(schema):
        name = ".".join(map(str, path))
        empty = () if array else _EMPTY.get(kafka_type)
        if nullable:
            out.append((f"{name}=null", set_path(base, path, None)))
            all_null = set_path(all_null, path, None)
        if empty is not None:
            out.append((f"{name}=empty", set_path(base, path, empty)))
            all_empty = set_path(all_empty, path, empty)
    return [*out, ("all-null", all_null), ("all-empty", all_empty)]


@pytest.mark.parametrize(("api_key", "version"), ADVERTISED_VERSIONS)
def test_every_advertised_version_round_trips(api_key: int, version: int) -> None:
    if not is_served(api_key, version):
        # Below kio's floor (Kafka 4 removed it, KIP-896): advertised, never parsed.
        with pytest.raises(UnknownEntity):
            load_request_schema(api_key, version)
        frame = struct.pack(">hhih", api_key, version, 9, -1) + b"\x00" * 8
        assert parse_request(frame, SERVED) == UnsupportedVersion(api_key, version, 9)
        return
    schema = load_request_schema(api_key, version)
    bodies = variants(schema)
    assert len(bodies) > 3 or not list(variable_fields(schema))
    for label, body in bodies:
        for client_id in ("clïent", "", None):
            request = parsed(encode_request(body, 1234, client_id))
            assert (request.api_key, request.api_version, request.correlation_id,
                    request.client_id) == (api_key, version, 1234, client_id), label
            assert request.body == body, label
        # Bytes after the body's last field are ignored, as Kafka's broker does.
        for tail in (b"\x00", b"\x00\x01\x00", b"\xff" * 9):
            assert parsed(encode_request(body) + tail).body == body, (label, tail)


@pytest.mark.parametrize(("api_key", "version"), SERVED_VERSIONS)
def test_every_truncation_is_refused(api_key: int, version: int) -> None:
    """Every proper prefix of a full request (past the fixed header) lacks a field."""
    frame = encode_request(full(load_request_schema(api_key, version)))
    for end in range(8, len(frame)):
        with pytest.raises(ProtocolError):
            parse_request(frame[:end], SERVED)


# -- librdkafka's all-topics Metadata request --------------------------------------------

def librdkafka_all_topics(version: int, allow_auto_create: bool,
                          include_cluster_ops: bool = False,
                          include_topic_ops: bool = False) -> bytes:
    """The Metadata request for all topics as librdkafka 2.x writes it at v9+
    (rd_kafka_MetadataRequest0 in src/rdkafka_request.c): the four-byte topic count
    placeholder of rd_kafka_buf_write_arraycnt_pos kept as zeros, then the fields."""
    client_id = b"rdkafka"
    body = b"\x00\x00\x00\x00" + bytes([allow_auto_create])
    if 8 <= version <= 10:
        body += bytes([include_cluster_ops])
    body += bytes([include_topic_ops]) + b"\x00"  # the fields; the body's empty tags
    return (struct.pack(">hhih", METADATA, version, 77, len(client_id)) + client_id
            + b"\x00" + body)


@pytest.mark.parametrize("version", range(9, 14))
@pytest.mark.parametrize("allow_auto_create", [False, True])
@pytest.mark.parametrize("include_ops", [False, True])
def test_librdkafka_all_topics_request(version: int, allow_auto_create: bool,
                                       include_ops: bool) -> None:
    frame = librdkafka_all_topics(version, allow_auto_create, include_ops, include_ops)
    request = parsed(frame)
    assert (request.correlation_id, request.client_id) == (77, "rdkafka")
    body = request.body
    assert body.topics is None  # all topics, as Kafka reads it
    # Kafka reads the placeholder's three zero bytes as the flags (and, at v11+, the
    # tag count); the real flags go unread, or (v9, v10) are read as a tag section
    # whose count is AllowAutoTopicCreation.
    assert body.allow_auto_topic_creation is False
    assert body.include_topic_authorized_operations is False
    if version <= 10:
        assert body.include_cluster_authorized_operations is False


def test_librdkafka_frame_as_captured() -> None:
    """The bytes of an all-topics Metadata v13 request from confluent-kafka 2.16's
    AdminClient.list_topics(), as recorded by test_server_librdkafka_metadata.py."""
    frame = bytes.fromhex("0003000d00000003000763617074757265" "00" "00000000" "01" "00" "00")
    request = parsed(frame)
    assert (request.api_version, request.client_id, request.body.topics) == (13, "capture",
                                                                             None)


# -- tagged fields, booleans, strings ----------------------------------------------------

def header(api_key: int, version: int, client_id: bytes = b"t") -> bytes:
    return struct.pack(">hhih", api_key, version, 5, len(client_id)) + client_id


def tags(*fields: tuple[int, bytes]) -> bytes:
    return encode_uvarint(len(fields)) + b"".join(
        encode_uvarint(tag) + encode_uvarint(len(data)) + data for tag, data in fields)


def compact(text: bytes) -> bytes:
    return encode_uvarint(len(text) + 1) + text


def metadata_v12(name: bytes, topic_tags: bytes = b"\x00", body_tags: bytes = b"\x00",
                 allow: bytes = b"\x00") -> bytes:
    """Metadata v12: one topic by name (null id)."""
    return (header(METADATA, 12) + b"\x00" + encode_uvarint(2) + bytes(16) + compact(name)
            + topic_tags + allow + b"\x00" + body_tags)


def test_unknown_tagged_fields_everywhere_are_skipped() -> None:
    frame = (header(METADATA, 12) + tags((9, b"hdr"), (200, b""))
             + encode_uvarint(2) + bytes(16) + compact(b"plain") + tags((3, b"x" * 300))
             + b"\x01\x00" + tags((2**20, b"body")))
    body = parsed(frame).body
    assert [t.name for t in body.topics] == ["plain"]
    assert body.allow_auto_topic_creation is True


def fetch_v12(body_tags: bytes) -> bytes:
    """Fetch v12 with no topics, and the given tag section."""
    return (header(FETCH, 12) + b"\x00" + struct.pack(">iiiib", -1, 500, 1, 1 << 20, 0)
            + struct.pack(">ii", 0, -1) + encode_uvarint(1) + encode_uvarint(1)
            + compact(b"") + body_tags)


def test_a_known_tagged_field_beside_unknown_ones() -> None:
    # Fetch v12's cluster id is tag 0.
    body = parsed(fetch_v12(tags((0, compact(b"cluster")), (7, b"?"), (8, b"")))).body
    assert body.cluster_id == "cluster"
    assert body.topics == ()


def test_a_known_tagged_string_that_is_not_utf8() -> None:
    """The repaired string is longer: the tagged field's size is rewritten with it."""
    body = parsed(fetch_v12(tags((0, compact(b"caf\xe9!")), (7, b"?")))).body
    assert body.cluster_id == "caf\ufffd!"


@pytest.mark.parametrize(("byte", "value"), [(b"\x00", False), (b"\x01", True),
                                             (b"\x02", True), (b"\xff", True)])
def test_a_boolean_is_true_unless_zero(byte: bytes, value: bool) -> None:
    assert parsed(metadata_v12(b"t", allow=byte)).body.allow_auto_topic_creation is value


@pytest.mark.parametrize(("raw", "text"), [
    (b"caf\xe9", "caf\ufffd"),  # Latin-1
    (b"\xff\xfe", "\ufffd\ufffd"),
    (b"ok \xe2\x82", "ok \ufffd"),  # a cut-off sequence
    ("tópic".encode(), "tópic"),
])
def test_strings_that_are_not_utf8_are_read_leniently(raw: bytes, text: str) -> None:
    """As Java's `new String(bytes, UTF_8)` in Kafka's Readable.readString."""
    request = parsed(header(METADATA, 1, client_id=raw) + struct.pack(">ih", 1, len(raw))
                     + raw)
    assert request.client_id == text
    assert [t.name for t in request.body.topics] == [text]
    assert [t.name for t in parsed(metadata_v12(raw)).body.topics] == [text]


def test_a_long_classic_string_of_bad_bytes_still_fits() -> None:
    raw = b"\xff" * 20_000  # its lenient decoding takes 60,000 bytes
    request = parsed(header(METADATA, 1) + struct.pack(">ih", 1, len(raw)) + raw)
    assert len(request.body.topics[0].name) <= 0x7FFF


# -- hostile frames stay refused ---------------------------------------------------------

@pytest.mark.parametrize(("frame", "reason"), [
    pytest.param(header(METADATA, 1) + struct.pack(">i", 2**31 - 1),
                 "an array of 2147483647 elements", id="array-count"),
    pytest.param(header(METADATA, 9) + b"\x00" + encode_uvarint(2**32),
                 "an array of 4294967295 elements", id="compact-array-count"),
    pytest.param(header(METADATA, 1) + struct.pack(">i", -2), "negative array length -2",
                 id="negative-array-count"),
    pytest.param(header(METADATA, 1) + struct.pack(">ih", 1, -2),
                 "bad string or bytes length -2", id="negative-string-length"),
    pytest.param(header(METADATA, 1) + struct.pack(">ih", 1, -1),
                 "bad string or bytes length -1", id="null-non-nullable-string"),
    # Metadata v0's topic list is not nullable (v1+ is: null means all topics).
    pytest.param(header(METADATA, 0) + struct.pack(">i", -1),
                 "a null array at byte 15, where the schema allows none",
                 id="null-non-nullable-array"),
    pytest.param(header(METADATA, 1) + struct.pack(">ih", 1, 300) + b"x",
                 "a value of 300 bytes", id="string-past-the-end"),
    pytest.param(metadata_v12(b"t", body_tags=tags((1, b"abc"))[:-1]),
                 "tagged field 1 of 3 bytes", id="tagged-field-past-the-end"),
    pytest.param(header(METADATA, 9) + b"\x00" + b"\xff" * 6, "longer than 5 bytes",
                 id="endless-varint"),
])
def test_hostile_frames_are_refused(frame: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason):
        parse_request(frame, SERVED)


def test_errors_name_the_request() -> None:
    with pytest.raises(ProtocolError, match=r"malformed Metadata v1 request \(correlation "
                                            r"id 5\)"):
        parse_request(header(METADATA, 1) + b"\x00\x00", SERVED)


def test_an_empty_body_where_one_is_allowed() -> None:
    # ApiVersions v0 has no fields; anything after its header is ignored.
    request = parsed(header(18, 0) + b"junk")
    assert request.body == load_request_schema(18, 0)()
    assert ErrorCode.none.value == 0
