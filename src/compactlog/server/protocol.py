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
    0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit",
    9: "OffsetFetch", 10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat",
    13: "LeaveGroup", 14: "SyncGroup", 15: "DescribeGroups", 16: "ListGroups",
    18: "ApiVersions", 19: "CreateTopics", 20: "DeleteTopics", 22: "InitProducerId",
    32: "DescribeConfigs", 44: "IncrementalAlterConfigs",
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

    @property
    def name(self) -> str:
        return API_NAMES.get(self.api_key, f"api {self.api_key}")


@dataclass(frozen=True)
class UnsupportedVersion:
    """A request whose API key or version is not served; only ApiVersions gets an answer."""

    api_key: int
    api_version: int
    correlation_id: int


def peek_header(frame: bytes) -> tuple[int, int, int]:
    if len(frame) < _FIXED_HEADER.size:
        raise ProtocolError(f"a request of {len(frame)} bytes is shorter than its header")
    api_key, api_version, correlation_id = _FIXED_HEADER.unpack_from(frame)
    return int(api_key), int(api_version), int(correlation_id)


def parse_request(frame: bytes, versions: VersionTable) -> Request | UnsupportedVersion:
    """Decode one request frame (without its length prefix)."""
    api_key, api_version, correlation_id = peek_header(frame)
    served = versions.get(api_key)
    if served is None or not served[0] <= api_version <= served[1]:
        return UnsupportedVersion(api_key, api_version, correlation_id)
    schema = _request_schema(api_key, api_version)
    try:
        header, used = _reader(schema.__header_schema__)(frame, 0)
        body, body_size = _reader(schema)(frame, used)
    except Exception as error:  # kio raises a variety of errors for malformed input
        raise ProtocolError(
            f"malformed {API_NAMES.get(api_key, api_key)} v{api_version} request "
            f"(correlation id {correlation_id}): {error}"
        ) from None
    if used + body_size != len(frame):
        raise ProtocolError(
            f"{API_NAMES.get(api_key, api_key)} v{api_version} request has "
            f"{len(frame) - used - body_size} trailing bytes"
        )
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
