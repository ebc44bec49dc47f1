"""The Kafka wire protocol, through kio: frames, request and response headers, message
bodies.

Invariant: a request reaches kio only through the frame guard (server/protocol/frame_guard.py),
and a response is encoded from a handler's dict only if every key of it is a field of
some version of that response: a key of another version is dropped, a key of none (a
typo) is refused, so it never becomes a valid-looking wrong answer.

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
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from compactlog.server.protocol.frame_guard import FrameBytes, MalformedFrame, guard
from compactlog.server.protocol.kio_types import (
    entity_type,
    fields,
    is_optional,
    is_tuple,
    strip_optional,
)

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
    """Decode one request frame (without its length prefix), as Kafka's broker would:
    its layout is checked and repaired first (server/protocol/frame_guard.py), so kio never sees
    a hostile length or count, and bytes after the body are ignored, as Kafka ignores
    them. Truncated frames, hostile lengths and counts are refused."""
    api_key, api_version, correlation_id = peek_header(frame)
    served = versions.get(api_key)
    if served is None or not served[0] <= api_version <= served[1]:
        return UnsupportedVersion(api_key, api_version, correlation_id)
    schema = _request_schema(api_key, api_version)
    what = f"{API_NAMES.get(api_key, api_key)} v{api_version} request"
    try:
        frame = guard(schema, frame)
    except MalformedFrame as error:
        raise ProtocolError(
            f"malformed {what} (correlation id {correlation_id}): {error}") from None
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


class UnknownFieldError(TypeError):
    """A message dict holds a key that no version of its message has: a typo in a
    handler's answer, which `build` would otherwise drop as a field of another version
    and so encode a valid-looking wrong response."""


def build(cls: type, data: Mapping[str, Any]) -> Any:
    """Fill kio dataclass `cls` from `data`: keys the version lacks are dropped, nested
    entities are built recursively, and fields missing from `data` take their schema
    default (tagged fields) or a neutral value (0, empty, null, none-error). A key that
    no version of a response has is refused (UnknownFieldError, naming the API, the
    version and the key)."""
    return _build(cls, data, cls, ())


def _build(cls: type, data: Mapping[str, Any], root: type, path: tuple[str, ...]) -> Any:
    values: dict[str, Any] = {}
    taken = 0
    for field, hint in fields(cls):
        if field.name in data:
            taken += 1
            values[field.name] = _convert(hint, data[field.name], root, path, field.name)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            values[field.name] = _neutral(hint)
    if taken < len(data):  # keys of other versions, or typos: only then is it worth a look
        _refuse_unknown_keys(root, path, data)
    return cls(**values)


def _convert(hint: Any, value: Any, root: type, path: tuple[str, ...], name: str) -> Any:
    entity = entity_type(hint)
    if entity is not None:
        if value is None:
            return None
        inner = (*path, name)
        if is_tuple(hint):
            return tuple(v if isinstance(v, entity) else _build(entity, v, root, inner)
                         for v in value)
        return value if isinstance(value, entity) else _build(entity, value, root, inner)
    if is_tuple(hint):
        return None if value is None else tuple(value)
    return value


def _refuse_unknown_keys(root: type, path: tuple[str, ...], data: Mapping[str, Any]) -> None:
    api_key = getattr(root, "__api_key__", None)
    kind = getattr(root, "__type__", None)
    if api_key is None or kind is not EntityType.response:
        # Requests are built by tests only, some from one dict for two APIs; a header
        # or a nested entity built on its own has no versions to look at.
        return
    unknown = sorted(set(data) - _names_in_any_version(int(api_key), kind).get(path, set()))
    if unknown:
        where = f" (in {'.'.join(path)})" if path else ""
        raise UnknownFieldError(
            f"{API_NAMES.get(api_key, f'api {api_key}')} v{getattr(root, '__version__', '?')} "
            f"{kind.name}: {', '.join(map(repr, unknown))} is a field of no version{where}")


@cache
def _names_in_any_version(api_key: int, kind: EntityType) -> dict[tuple[str, ...], set[str]]:
    """Field names by path from the message's root (nested entities by the field that
    holds them), over every version kio knows of the API's messages of this kind."""
    names: dict[tuple[str, ...], set[str]] = {}
    for version, entities in schema_name_map[api_key_map[api_key]].items():
        if kind in entities:
            load = load_request_schema if kind is EntityType.request else load_response_schema
            _collect_names(load(api_key, version), (), names)
    return names


def _collect_names(cls: type, path: tuple[str, ...],
                   names: dict[tuple[str, ...], set[str]]) -> None:
    here = names.setdefault(path, set())
    for field, hint in fields(cls):
        here.add(field.name)
        entity = entity_type(hint)
        if entity is not None:
            _collect_names(entity, (*path, field.name), names)


def _neutral(hint: Any) -> Any:
    if is_optional(hint):
        return None
    base = strip_optional(hint)
    if is_tuple(base):
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
