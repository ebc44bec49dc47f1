"""librdkafka's all-topics Metadata request, against `compactlog serve` and on the wire.

librdkafka 2.x writes a Metadata topic count as a four-byte placeholder and, for "all
topics" at v9+, leaves the placeholder as it is: a null compact array in its first
byte, then three zero bytes that a broker reads as the next fields, and then the real
fields, which Kafka's parser leaves unread after the body (librdkafka#5049,
rdkafka_request.c rd_kafka_MetadataRequest0). Kafka accepts the frame; compactlog used
to close the connection ("Metadata v13 request has 3 trailing bytes"), which broke
confluent-kafka's list_topics(), every regex subscription and every metadata refresh.

- A recording listener, answering as a one-node broker with no topics, captures the
  frames a real librdkafka sends, so that the frame the parser is tested on is the one
  the installed client writes, byte for byte.
- Real clients against a real server: an AdminClient lists the topics; a producer and a
  regex-subscribed consumer refreshing metadata every second run for a few seconds
  without a single connection closed by the server.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from compactlog.server.protocol.messages import (
    Request,
    api_version_entries,
    encode_response,
    parse_request,
    peek_header,
)
from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from support.kafka_server import LoggedServer, logged_server
from support.versions import ADVERTISED, SERVED

API_VERSIONS, METADATA = 18, 3
TOPICS = ["lt-plain", "lt-prices", "other"]




# -- a listener that records what librdkafka sends --------------------------------------

class RecordingBroker:
    """Answers ApiVersions with the server's advertised table and Metadata with itself as
    the only broker and no topics, and records every request frame (without its length
    prefix). Runs on a thread; one thread per connection."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)  # so that close() need not wait on accept()
        self.port = self.listener.getsockname()[1]
        self.frames: list[bytes] = []
        self._lock = threading.Lock()
        self._stopping = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def metadata_frames(self) -> list[bytes]:
        with self._lock:
            return [f for f in self.frames if peek_header(f)[0] == METADATA]

    def close(self) -> None:
        self._stopping = True
        self.listener.close()
        self._thread.join(10)

    def _accept(self) -> None:
        while not self._stopping:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                while True:
                    frame = self._read(conn)
                    if frame is None:
                        return
                    with self._lock:
                        self.frames.append(frame)
                    response = self._answer(frame)
                    if response is None:
                        return
                    conn.sendall(response)
            except OSError:
                return

    @staticmethod
    def _read(conn: socket.socket) -> bytes | None:
        def exactly(size: int) -> bytes | None:
            data = b""
            while len(data) < size:
                chunk = conn.recv(size - len(data))
                if not chunk:
                    return None
                data += chunk
            return data

        prefix = exactly(4)
        return None if prefix is None else exactly(struct.unpack(">i", prefix)[0])

    def _answer(self, frame: bytes) -> bytes | None:
        api_key, version, correlation_id = peek_header(frame)
        if api_key == API_VERSIONS and version <= 4:
            return encode_response(API_VERSIONS, version, correlation_id, {
                "error_code": ErrorCode.none, "api_keys": api_version_entries(ADVERTISED)})
        if api_key == METADATA:
            return encode_response(METADATA, version, correlation_id, {
                "brokers": [{"node_id": 0, "host": "127.0.0.1", "port": self.port}],
                "cluster_id": "recording", "controller_id": 0, "topics": [],
                "cluster_authorized_operations": -2147483648})
        return None  # nothing else is asked for by list_topics()


@pytest.fixture
def recorder() -> Iterator[RecordingBroker]:
    listener = RecordingBroker()
    try:
        yield listener
    finally:
        listener.close()


def body_of(frame: bytes) -> bytes:
    """A flexible request's body: after api key, version, correlation id, the client id
    (a classic int16-length string) and the header's tag section (here empty)."""
    (length,) = struct.unpack_from(">h", frame, 8)
    after_client_id = 10 + max(length, 0)
    assert frame[after_client_id] == 0, "the header has tagged fields"
    return frame[after_client_id + 1:]


def test_librdkafka_all_topics_metadata_frame_is_accepted(recorder: RecordingBroker) -> None:
    """The frame librdkafka really sends for list_topics() parses as Kafka parses it: an
    all-topics request, the three bytes after its tag section ignored."""
    admin = AdminClient({"bootstrap.servers": recorder.bootstrap, "client.id": "capture"})
    metadata = admin.list_topics(timeout=10)
    assert metadata.topics == {}
    all_topics = [f for f in recorder.metadata_frames() if body_of(f)[:4] == bytes(4)]
    assert all_topics, [body_of(f).hex() for f in recorder.metadata_frames()]
    frame = all_topics[0]
    assert peek_header(frame)[:2] == (METADATA, 13)
    # Placeholder (null compact array + 3 zero bytes), AllowAutoTopicCreation,
    # IncludeTopicAuthorizedOperations, an empty tag section.
    body = body_of(frame)
    assert len(body) == 7 and body[-1] == 0, body.hex()
    request = parse_request(frame, SERVED)
    assert isinstance(request, Request)
    assert request.client_id == "capture"
    assert request.body.topics is None  # all topics
    # What Kafka reads from the placeholder's zero bytes; the real flags are ignored.
    assert request.body.allow_auto_topic_creation is False
    assert request.body.include_topic_authorized_operations is False


# -- real clients against the real server ----------------------------------------------

@pytest.fixture
def server(tmp_path: Path) -> Iterator[LoggedServer]:
    data = tmp_path / "data"
    with LogStore.open(data) as store:
        store.create_topic("lt-plain", 2)
        store.create_topic("lt-prices", 1, {"cleanup.policy": "compact"})
        store.create_topic("other", 1)
        store.append("lt-prices", [ProducerRecord(b"AAPL", b"189.5")])
    with logged_server(data, tmp_path / "server.log") as running:
        yield running


def assert_no_dropped_connections(log: str) -> None:
    for bad in ("trailing bytes", "closing connection", "Traceback"):
        assert bad not in log, f"{bad!r} in the server log:\n{log}"


def test_confluent_admin_list_topics(server: LoggedServer) -> None:
    mark = server.mark()
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    metadata = admin.list_topics(timeout=10)
    assert sorted(metadata.topics) == sorted(TOPICS)
    assert {name: len(t.partitions) for name, t in metadata.topics.items()} == {
        "lt-plain": 2, "lt-prices": 1, "other": 1}
    assert all(t.error is None for t in metadata.topics.values())
    # Asking again on the same connection: it stayed open.
    assert sorted(admin.list_topics(timeout=10).topics) == sorted(TOPICS)
    assert_no_dropped_connections(server.log_since(mark))


def test_clients_refreshing_metadata_every_second_stay_connected(
        server: LoggedServer) -> None:
    """A regex subscription makes librdkafka ask for all topics at every refresh."""
    mark = server.mark()
    refresh = {"topic.metadata.refresh.interval.ms": 1000}
    producer = Producer({"bootstrap.servers": server.bootstrap, **refresh})
    consumer = Consumer({"bootstrap.servers": server.bootstrap, **refresh,
                         "group.id": f"refresh-{uuid.uuid4().hex[:8]}",
                         "group.protocol": "classic", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    seen: list[tuple[str, bytes | None, bytes | None]] = []
    reports: list[Any] = []
    try:
        consumer.subscribe(["^lt-.*"])
        started = time.monotonic()
        sent = 0
        while time.monotonic() - started < 5 or len(seen) < 1 + sent:
            assert time.monotonic() - started < 30, f"only {seen} after 30 s"
            if sent < 4 and time.monotonic() - started > sent:
                producer.produce("lt-plain", key=b"k%d" % sent, value=b"v%d" % sent,
                                 on_delivery=lambda err, _msg: reports.append(err))
                sent += 1
            producer.poll(0)
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                seen.append((message.topic(), message.key(), message.value()))
        assert producer.flush(10) == 0
    finally:
        consumer.close()
    assert reports == [None] * 4
    assert sorted(seen, key=repr) == sorted(
        [("lt-prices", b"AAPL", b"189.5")]
        + [("lt-plain", b"k%d" % i, b"v%d" % i) for i in range(4)], key=repr)
    assert_no_dropped_connections(server.log_since(mark))
