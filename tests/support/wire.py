"""Kafka requests and responses over a raw socket: a request's frame, and `Wire`, a
connection that sends frames and reads answers."""

from __future__ import annotations

import io
import socket
import struct
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from compactlog.server.protocol.messages import build

API_VERSIONS, METADATA, PRODUCE, FETCH = 18, 3, 0, 1
CLIENT_ID = "bad-input"


def request_frame(api_key: int, version: int, fields: Mapping[str, Any] | object,
                  correlation_id: int = 1, client_id: str | None = CLIENT_ID) -> bytes:
    """A whole request frame, length prefix included; `fields` is a kio request entity
    or a dict that `build` completes (missing fields get neutral values)."""
    schema = load_request_schema(api_key, version)
    body = fields if isinstance(fields, schema) else build(schema, fields)  # type: ignore[arg-type]
    header_schema: Any = schema.__header_schema__
    out = io.BytesIO()
    entity_writer(header_schema)(out, header_schema(
        request_api_key=api_key, request_api_version=version,
        correlation_id=correlation_id, client_id=client_id))
    entity_writer(schema)(out, body)
    return with_length(out.getvalue())


def with_length(frame: bytes) -> bytes:
    return struct.pack(">i", len(frame)) + frame


class Wire:
    """One raw connection to the server."""

    def __init__(self, address: tuple[str, int], timeout: float = 10.0,
                 source: str | None = None) -> None:
        """`source`: the local address to connect from (any 127.x works on loopback)."""
        self.sock = socket.create_connection(
            address, timeout=timeout, source_address=None if source is None else (source, 0))
        self.port = self.sock.getsockname()[1]

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_exactly(self, size: int) -> bytes:
        chunks, got = [], 0
        while got < size:
            chunk = self.sock.recv(size - got)
            if not chunk:
                raise ConnectionError(f"closed after {got} of {size} bytes")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def response(self, api_key: int, version: int) -> tuple[int, Any]:
        """(correlation id, body) of the next response, read as `version` of `api_key`."""
        (size,) = struct.unpack(">i", self.read_exactly(4))
        frame = self.read_exactly(size)
        schema = load_response_schema(api_key, version)
        header, used = entity_reader(schema.__header_schema__)(frame, 0)
        body, body_size = entity_reader(schema)(frame, used)
        assert used + body_size == len(frame), "the response has trailing bytes"
        return header.correlation_id, body

    def call(self, api_key: int, version: int, fields: Mapping[str, Any] | object,
             correlation_id: int = 7) -> Any:
        self.send(request_frame(api_key, version, fields, correlation_id))
        got, body = self.response(api_key, version)
        assert got == correlation_id
        return body

    def is_closed_by_server(self) -> bool:
        """True once the server closes the connection; False if it sends anything."""
        try:
            data = self.sock.recv(1)
        except ConnectionResetError:
            return True
        return data == b""


def fetch(wire: Wire, version: int, parts: list[tuple[str, int, int]]) -> dict[Any, Any]:
    topics: dict[str, list[dict[str, Any]]] = {}
    for name, index, offset in parts:
        topics.setdefault(name, []).append(
            {"partition": index, "fetch_offset": offset, "partition_max_bytes": 1 << 20})
    body = wire.call(FETCH, version, {
        "replica_id": -1, "max_wait": timedelta(milliseconds=10), "min_bytes": 1,
        "max_bytes": 1 << 20, "isolation_level": 0, "session_epoch": -1,
        "topics": [{"topic": name, "partitions": p} for name, p in topics.items()]})
    return {(t.topic, p.partition_index): p for t in body.responses for p in t.partitions}


def encode_request(body: Any, correlation_id: int = 1, client_id: str | None = "fuzz") -> bytes:
    """A request frame without its length prefix, as a client writes it (kio)."""
    schema = type(body)
    header_schema: Any = schema.__header_schema__
    out = io.BytesIO()
    entity_writer(header_schema)(out, header_schema(
        request_api_key=schema.__api_key__, request_api_version=schema.__version__,
        correlation_id=correlation_id, client_id=client_id))
    entity_writer(schema)(out, body)
    return out.getvalue()
