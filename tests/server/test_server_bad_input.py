"""Bad input on the wire, against a real `compactlog serve`.

Each test sends one kind of bad request over a raw socket and checks what Kafka's own
broker would do: a frame that cannot be read (garbage, cut short, a negative or oversized
length, an unknown API or version) closes that connection after a log line naming the
peer and the problem; a request that can be read but is wrong (a record batch with a bad
CRC or trailing bytes, a fetch of an unknown topic) gets an error code in its response
and the connection stays open; an ApiVersions request of a version the server does not
know gets the v0 answer of KIP-511. After each, `check_healthy` proves that a kafka-python
producer and consumer, connected before the bad input and kept open throughout, still
work, and that everything stored (records written before the server started and every
record acknowledged since) reads back unchanged, with no traceback in the server's log.

The server runs as a subprocess with its log in a file, so that tests can read it while
the server runs, and `max_request_bytes = 1000` from a --config file.
"""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kio.schema.errors import ErrorCode

from compactlog.server.protocol.frame_guard import encode_uvarint
from compactlog.storage.records import ProducerRecord, encode_batch
from compactlog.storage.store import LogStore
from support.kafka_server import LoggedServer, logged_server
from support.wire import (
    API_VERSIONS,
    CLIENT_ID,
    FETCH,
    METADATA,
    PRODUCE,
    Wire,
    request_frame,
    with_length,
)

MAX_REQUEST_BYTES = 1000
PLAIN, PRICES, SCRATCH = "plain", "prices", "scratch"


# -- requests and responses over a raw socket -----------------------------------------


def closing_line(port: int) -> str:
    """The start of the server's log line for closing the connection from `port`."""
    return rf"closing connection from \('127\.0\.0\.1', {port}\): "


def assert_closed_and_logged(server: LoggedServer, wire: Wire, mark: int,
                             message: str) -> str:
    assert wire.is_closed_by_server(), "the server answered instead of closing"
    return server.wait_for_log(closing_line(wire.port) + message, mark)


# -- what is stored, and the clients that keep working ---------------------------------

class Clients:
    """A kafka-python producer and consumer, connected before any bad input and kept
    open throughout, and every record the topics should hold."""

    def __init__(self, server: LoggedServer, expected: dict[TopicPartition, list[Any]]):
        self.server = server
        self.expected = expected
        self.producer = KafkaProducer(bootstrap_servers=server.bootstrap, acks="all",
                                      enable_idempotence=False, retries=0, linger_ms=0)
        self.consumer = KafkaConsumer(bootstrap_servers=server.bootstrap,
                                      enable_auto_commit=False, fetch_max_wait_ms=100)
        self.consumer.assign(list(expected))
        self.sent = 0

    def close(self) -> None:
        self.producer.close(timeout=10)
        self.consumer.close()

    def produce_one(self) -> None:
        self.sent += 1
        key, value = b"k%d" % (self.sent % 3), b"healthy %d" % self.sent
        meta = self.producer.send(PLAIN, key=key, value=value).get(timeout=15)
        self.expected[TopicPartition(PLAIN, meta.partition)].append(
            (meta.offset, key, value))

    def consume_all(self) -> dict[TopicPartition, list[Any]]:
        consumer = self.consumer
        consumer.seek_to_beginning(*self.expected)
        wanted = {tp: len(records) for tp, records in self.expected.items()}
        seen: dict[TopicPartition, list[Any]] = {tp: [] for tp in self.expected}
        deadline = time.monotonic() + 20
        while any(len(seen[tp]) < wanted[tp] for tp in seen):
            assert time.monotonic() < deadline, f"consumed only {seen}"
            for tp, messages in consumer.poll(timeout_ms=200).items():
                seen[tp] += [(m.offset, m.key, m.value) for m in messages]
        return seen


def check_healthy(server: LoggedServer, clients: Clients, mark: int) -> None:
    """The server runs, answers the clients connected before the bad input, and holds
    exactly what it held plus what was acknowledged since; nothing it logged since
    `mark` is a traceback."""
    server.assert_running()
    clients.produce_one()
    assert clients.consume_all() == clients.expected
    with Wire(server.address) as wire:
        body = wire.call(METADATA, 12, {"topics": None})
        assert sorted(t.name for t in body.topics) == [PLAIN, PRICES, SCRATCH]
    since = server.log_since(mark)
    assert "Traceback" not in since and "internal error" not in since, since


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoggedServer]:
    root = tmp_path_factory.mktemp("bad-input")
    data = root / "data"
    with LogStore.open(data) as store:
        store.create_topic(PLAIN, 2)
        store.create_topic(PRICES, 1, {"cleanup.policy": "compact"})
        store.create_topic(SCRATCH, 1)
        store.append(PLAIN, [ProducerRecord(b"k%d" % i, b"before %d" % i)
                             for i in range(20)])
        store.append(PRICES, [ProducerRecord(b"AAPL", b"189.5"),
                              ProducerRecord(b"MSFT", b"402.1"),
                              ProducerRecord(b"AAPL", None)])
    config = root / "server.toml"
    config.write_text(f"max_request_bytes = {MAX_REQUEST_BYTES}\n")
    with logged_server(data, root / "server.log", "--config", str(config)) as running:
        yield running


@pytest.fixture(scope="module")
def clients(server: LoggedServer) -> Iterator[Clients]:
    with LogStore.open(server.log_path.parent / "data", read_only=True) as store:
        expected = {
            TopicPartition(name, index): [(r.offset, r.key, r.value)
                                          for r in store.topic(name).partition(index).read(0)]
            for name in (PLAIN, PRICES) for index in range(len(store.topic(name).partitions))
        }
    assert sum(map(len, expected.values())) == 23
    opened = Clients(server, expected)
    opened.produce_one()
    yield opened
    opened.close()


@pytest.fixture
def mark(server: LoggedServer, clients: Clients) -> Iterator[int]:
    """The log position when the test began; checks the server's health afterwards."""
    position = server.mark()
    yield position
    check_healthy(server, clients, position)


# -- frames that cannot be read close the connection -----------------------------------

GARBAGE = random.Random(4).randbytes(64)


@pytest.mark.parametrize(("frame", "logged"), [
    pytest.param(GARBAGE, r"unsupported API key|malformed", id="random-bytes"),
    # A Metadata v1 header, then a topic count of 3 and garbage for the topics.
    pytest.param(struct.pack(">hhih", 3, 1, 5, 3) + b"bad" + struct.pack(">i", 3) + GARBAGE,
                 r"malformed Metadata v1 request \(correlation id 5\)", id="metadata-body"),
    # A Produce v9 header (flexible) with its tagged-field section cut off.
    pytest.param(struct.pack(">hhih", 0, 9, 6, -1), r"malformed Produce v9 request",
                 id="produce-header-only"),
    pytest.param(b"\x00\x12", r"a request of 2 bytes is shorter than its header",
                 id="shorter-than-a-header"),
    pytest.param(b"", r"a request of 0 bytes is shorter than its header", id="empty"),
])
def test_garbage_after_a_valid_length(server: LoggedServer, mark: int, frame: bytes,
                                      logged: str) -> None:
    with Wire(server.address) as wire:
        wire.send(with_length(frame))
        assert_closed_and_logged(server, wire, mark, logged)


@pytest.mark.parametrize(("sent", "logged"), [
    (struct.pack(">i", 100) + b"\x00\x03\x00\x01" + b"\x00" * 6,
     r"the client closed the connection after 10 of the 100 bytes of a request"),
    (b"\x00\x00", r"the client closed the connection after 2 of the 4 bytes"),
])
def test_truncated_frame_then_close(server: LoggedServer, mark: int, sent: bytes,
                                    logged: str) -> None:
    with Wire(server.address) as wire:
        wire.send(sent)
        port = wire.port
    server.wait_for_log(closing_line(port) + logged, mark)


def test_a_client_that_closes_between_requests_is_not_logged(
        server: LoggedServer, mark: int) -> None:
    with Wire(server.address) as wire:
        assert wire.call(API_VERSIONS, 3, {}).error_code is ErrorCode.none
        port = wire.port
    with Wire(server.address) as other:  # the server has handled the close by now
        other.call(API_VERSIONS, 0, {})
    assert f"'127.0.0.1', {port})" not in server.log_since(mark)


@pytest.mark.parametrize("length", [-1, -5, -(2**31)])
def test_negative_length(server: LoggedServer, mark: int, length: int) -> None:
    with Wire(server.address) as wire:
        wire.send(struct.pack(">i", length) + b"\x00\x12\x00\x00")
        assert_closed_and_logged(server, wire, mark, f"negative request length {length}")


@pytest.mark.parametrize("length", [MAX_REQUEST_BYTES + 1, 2**31 - 1])
def test_oversized_length(server: LoggedServer, mark: int, length: int) -> None:
    with Wire(server.address) as wire:
        # Only the start of the frame: the server must not wait for (or buffer) the rest.
        wire.send(struct.pack(">i", length) + b"\x00\x03\x00\x01" + b"\x00" * 100)
        assert_closed_and_logged(
            server, wire, mark,
            f"request of {length} bytes is over the limit of {MAX_REQUEST_BYTES} "
            r"\(max_request_bytes\)")


def test_a_request_of_exactly_max_request_bytes_is_served(
        server: LoggedServer, mark: int) -> None:
    base = len(request_frame(METADATA, 1, {"topics": [{"name": PLAIN}]}, client_id=""))
    padding = "x" * (MAX_REQUEST_BYTES + 4 - base)
    frame = request_frame(METADATA, 1, {"topics": [{"name": PLAIN}]}, correlation_id=9,
                          client_id=padding)
    assert len(frame) == MAX_REQUEST_BYTES + 4
    with Wire(server.address) as wire:
        wire.send(frame)
        correlation_id, body = wire.response(METADATA, 1)
    assert correlation_id == 9
    assert [(t.name, t.error_code) for t in body.topics] == [(PLAIN, ErrorCode.none)]


@pytest.mark.parametrize(("api_key", "version", "logged"), [
    (9999, 0, r"unsupported API key 9999 version 0 \(correlation id 3\)"),
    (57, 1, r"unsupported API key 57 version 1"),  # UpdateFeatures: a broker API
    (-1, 0, r"unsupported API key -1 version 0"),
])
def test_unknown_api_key(server: LoggedServer, mark: int, api_key: int, version: int,
                         logged: str) -> None:
    with Wire(server.address) as wire:
        wire.send(with_length(struct.pack(">hhih", api_key, version, 3, -1)))
        assert_closed_and_logged(server, wire, mark, logged)


@pytest.mark.parametrize(("api_key", "version"), [
    (PRODUCE, 2),  # below the floor of Kafka 4 (KIP-896)
    (PRODUCE, 13),  # topic ids only
    (FETCH, 13),
    (METADATA, 14),
    (METADATA, -1),
])
def test_unsupported_version_of_a_known_api(server: LoggedServer, mark: int, api_key: int,
                                            version: int) -> None:
    with Wire(server.address) as wire:
        # A plausible header and an empty body: the version alone decides.
        wire.send(with_length(struct.pack(">hhih", api_key, version, 4, -1) + b"\x00"))
        assert_closed_and_logged(
            server, wire, mark,
            rf"unsupported API key {api_key} version {version} \(correlation id 4\)")


def served_api_keys(wire: Wire) -> list[tuple[int, int, int]]:
    body = wire.call(API_VERSIONS, 3, {"client_software_name": "t",
                                       "client_software_version": "1"})
    assert body.error_code is ErrorCode.none
    return [(k.api_key, k.min_version, k.max_version) for k in body.api_keys]


@pytest.mark.parametrize("version", [5, 127, 32767])
def test_api_versions_of_a_too_new_version_gets_the_kip_511_answer(
        server: LoggedServer, mark: int, version: int) -> None:
    with Wire(server.address) as wire:
        served = served_api_keys(wire)
        assert (API_VERSIONS, 0, 4) in served
        # What a newer client sends: a flexible header (v2) and a body the server does
        # not know; only the API key, version and correlation id may be relied on.
        client_id = CLIENT_ID.encode()
        wire.send(with_length(
            struct.pack(">hhih", API_VERSIONS, version, 77, len(client_id)) + client_id
            + b"\x00" + b"\x05newer\x021" + b"\x03\x00\x01z"))
        # Response header v0 and an ApiVersions v0 body, whatever was asked.
        correlation_id, body = wire.response(API_VERSIONS, 0)
        assert correlation_id == 77
        assert body.error_code is ErrorCode.unsupported_version
        assert [(k.api_key, k.min_version, k.max_version) for k in body.api_keys] == served
        # The connection stays open: the client retries with a version both know.
        assert served_api_keys(wire) == served
    assert "Traceback" not in server.log_since(mark)


# -- hostile lengths inside a frame ------------------------------------------------------


@pytest.mark.parametrize(("frame", "logged"), [
    # Metadata v1: a topics array of 2**31 - 1 elements in a 14-byte frame.
    pytest.param(struct.pack(">hhihi", 3, 1, 8, -1, 2**31 - 1),
                 r"malformed Metadata v1 request \(correlation id 8\): an array of "
                 r"2147483647 elements", id="legacy-array"),
    # Metadata v9: a compact topics array whose count is the largest 5-byte varint.
    pytest.param(struct.pack(">hhih", 3, 9, 8, -1) + b"\x00" + encode_uvarint(2**35 - 1),
                 r"malformed Metadata v9 request \(correlation id 8\): an array of "
                 r"34359738366 elements", id="compact-array"),
    # Produce v9: one topic, then a partition array of 2**32 in the topic.
    pytest.param(struct.pack(">hhih", 0, 9, 8, -1) + b"\x00" + b"\x00" + b"\xff\xff"
                 + b"\x00\x00\x75\x30" + b"\x02" + b"\x02t" + encode_uvarint(2**32),
                 r"malformed Produce v9 request \(correlation id 8\): an array of "
                 r"4294967295 elements", id="nested-compact-array"),
    # Metadata v1: one topic whose name is 100 bytes long, and no bytes for it.
    pytest.param(struct.pack(">hhihih", 3, 1, 8, -1, 1, 100),
                 r"malformed Metadata v1 request \(correlation id 8\): a value of 100 "
                 r"bytes at byte 16, 0 remain", id="truncated-string"),
    pytest.param(struct.pack(">hhih", 3, 9, 8, -1) + b"\x00" + b"\xff" * 6,
                 r"malformed Metadata v9 request \(correlation id 8\): varint at byte 11 "
                 r"is longer than 5 bytes", id="varint-too-long"),
])
def test_hostile_lengths_inside_a_frame(server: LoggedServer, mark: int, frame: bytes,
                                        logged: str) -> None:
    """kio reserves memory for an array's declared count before reading it: these
    frames used to abort the whole server process (a failed allocation of 16 to 256 GiB
    in Rust is not an exception). protocol.parse_request now checks every count against
    the bytes left, as Kafka does."""
    with Wire(server.address) as wire:
        wire.send(with_length(frame))
        assert_closed_and_logged(server, wire, mark, logged)
    server.assert_running()


def test_unknown_tagged_fields_are_skipped(server: LoggedServer, mark: int) -> None:
    """The protocol says to skip tags a schema does not know (a newer client may send
    them); kio refuses them, so parse_request cuts them out first."""
    client_id = CLIENT_ID.encode()
    frame = (struct.pack(">hhih", 3, 9, 12, len(client_id)) + client_id
             + b"\x02" + b"\x07\x01x" + b"\x7f\x03abc"  # header: two unknown tags
             + encode_uvarint(1 + 1) + encode_uvarint(len(PLAIN) + 1) + PLAIN.encode()
             + b"\x01\x09\x00"  # a topic entry with an unknown (empty) tag
             + b"\x00\x00\x00"  # allow_auto_topic_creation and the two include_ flags
             + b"\x01\x2a\x02hi")  # the body's own tags: one unknown
    with Wire(server.address) as wire:
        wire.send(with_length(frame))
        correlation_id, body = wire.response(METADATA, 9)
    assert correlation_id == 12
    assert [(t.name, t.error_code, len(t.partitions)) for t in body.topics] == [
        (PLAIN, ErrorCode.none, 2)]


def test_bytes_after_the_body_are_ignored(server: LoggedServer, mark: int) -> None:
    """As Kafka's broker does (see protocol.parse_request): librdkafka's all-topics
    Metadata request relies on it."""
    frame = request_frame(API_VERSIONS, 3, {"client_software_name": "x",
                                            "client_software_version": "1"}, 43)
    with Wire(server.address) as wire:
        wire.send(with_length(frame[4:] + b"\x00junk"))
        correlation_id, body = wire.response(API_VERSIONS, 3)
        assert (correlation_id, body.error_code) == (43, ErrorCode.none)
        assert served_api_keys(wire)  # the connection stays open
    assert "closing connection" not in server.log_since(mark)


def test_a_good_request_then_garbage_on_the_same_connection(
        server: LoggedServer, mark: int) -> None:
    with Wire(server.address) as wire:
        wire.send(request_frame(API_VERSIONS, 3, {}, correlation_id=41)
                  + with_length(GARBAGE))
        correlation_id, body = wire.response(API_VERSIONS, 3)
        assert (correlation_id, body.error_code) == (41, ErrorCode.none)
        assert_closed_and_logged(server, wire, mark, r"unsupported API key|malformed")


# -- requests that can be read but are wrong get an error code -------------------------

def batch(*values: bytes) -> bytearray:
    return encode_batch([ProducerRecord(b"key", value) for value in values], 0)


def produce(wire: Wire, topic: str, records: bytes, version: int = 9) -> Any:
    body = wire.call(PRODUCE, version, {
        "acks": -1, "timeout": timedelta(seconds=10),
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": records}]}],
    })
    [topic_response] = body.responses
    assert topic_response.name == topic
    [partition] = topic_response.partition_responses
    return partition


def log_end_offset(wire: Wire, topic: str, partition: int = 0) -> int:
    body = wire.call(2, 7, {"replica_id": -1, "topics": [
        {"name": topic, "partitions": [{"partition_index": partition, "timestamp": -1}]}]})
    offset: int = body.topics[0].partitions[0].offset
    return offset


@pytest.mark.parametrize("version", [3, 7, 9, 12])
def test_produce_with_a_bad_crc(server: LoggedServer, mark: int, version: int) -> None:
    bad = batch(b"damaged on the way")
    bad[-1] ^= 0x01  # the CRC32C covers the records
    with Wire(server.address) as wire:
        end = log_end_offset(wire, PLAIN)
        result = produce(wire, PLAIN, bytes(bad), version)
        # Kafka: CorruptRecordException, CORRUPT_MESSAGE (retriable), for this partition.
        assert result.error_code is ErrorCode.corrupt_message
        assert result.base_offset == -1
        if version >= 8:
            assert "CRC32C mismatch" in result.error_message
        # Nothing was appended, and the connection still serves.
        assert log_end_offset(wire, PLAIN) == end
    server.wait_for_log(r"produce to plain/0 refused: .*CRC32C mismatch", mark)


@pytest.mark.parametrize("trailing", [b"\x00junk", bytes(batch(b"x"))[:70], GARBAGE * 2],
                         ids=["short", "half-a-batch", "long"])
def test_produce_with_trailing_garbage_after_the_batch(
        server: LoggedServer, mark: int, trailing: bytes) -> None:
    with Wire(server.address) as wire:
        end = log_end_offset(wire, PLAIN)
        result = produce(wire, PLAIN, bytes(batch(b"fine")) + trailing)
        assert result.error_code is ErrorCode.invalid_record
        assert "form whole record batches" in result.error_message or (
            "rejected record batch" in result.error_message)
        assert log_end_offset(wire, PLAIN) == end


def test_produce_of_a_good_batch_then_a_corrupt_one_appends_nothing(
        server: LoggedServer, mark: int) -> None:
    bad = batch(b"second")
    bad[-1] ^= 0x01
    with Wire(server.address) as wire:
        end = log_end_offset(wire, SCRATCH)  # its own topic: the bug must not leak
        result = produce(wire, SCRATCH, bytes(batch(b"first")) + bytes(bad))
        assert result.error_code is not ErrorCode.none
        assert log_end_offset(wire, SCRATCH) == end


def produce_acks_zero(wire: Wire, topic: str, partition: int, records: bytes) -> None:
    wire.send(request_frame(PRODUCE, 9, {
        "acks": 0, "timeout": timedelta(seconds=10),
        "topic_data": [{"name": topic, "partition_data": [
            {"index": partition, "records": records}]}],
    }, 11))


def test_a_failed_produce_with_acks_zero_closes_the_connection(
        server: LoggedServer, mark: int) -> None:
    """acks=0 has no answer to carry an error, so Kafka closes the connection (the
    producer then refreshes its metadata); a good one leaves it open."""
    with Wire(server.address) as wire:
        end = log_end_offset(wire, SCRATCH)
        produce_acks_zero(wire, SCRATCH, 0, bytes(batch(b"fine")))
        assert log_end_offset(wire, SCRATCH) == end + 1  # no answer, and still open
    for topic, partition, records in [("no-such-topic", 0, bytes(batch(b"x"))),
                                      (SCRATCH, 99, bytes(batch(b"x"))),
                                      (SCRATCH, 0, bytes(batch(b"fine")) + b"junk")]:
        with Wire(server.address) as wire:
            produce_acks_zero(wire, topic, partition, records)
            assert_closed_and_logged(server, wire, mark, r"a Produce with acks=0 "
                                     r"\(correlation id 11\) failed for " + topic)


@pytest.mark.parametrize("version", [4, 11, 12])
def test_fetch_of_an_unknown_topic(server: LoggedServer, mark: int, version: int) -> None:
    with Wire(server.address) as wire:
        body = wire.call(FETCH, version, {
            "replica_id": -1, "max_wait": timedelta(milliseconds=100), "min_bytes": 1,
            "max_bytes": 1 << 20, "isolation_level": 0, "session_epoch": -1,
            "topics": [
                {"topic": "no-such-topic", "partitions": [
                    {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]},
                {"topic": PLAIN, "partitions": [
                    {"partition": 99, "fetch_offset": 0, "partition_max_bytes": 1 << 20},
                    {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]},
            ]})
        results = {(t.topic, p.partition_index): p for t in body.responses
                   for p in t.partitions}
        assert results["no-such-topic", 0].error_code is ErrorCode.unknown_topic_or_partition
        # An empty record set, as Kafka sends: librdkafka cannot parse a null one.
        assert results["no-such-topic", 0].records == b""
        assert results[PLAIN, 99].error_code is ErrorCode.unknown_topic_or_partition
        # The good partition in the same request is served as usual.
        assert results[PLAIN, 0].error_code is ErrorCode.none
        assert results[PLAIN, 0].records
        # The connection stays open.
        assert served_api_keys(wire)


@pytest.mark.parametrize("name", [".", ".."])
def test_metadata_for_dot_topic_names(server: LoggedServer, name: str) -> None:
    position = server.mark()
    with Wire(server.address) as wire:
        body = wire.call(METADATA, 12, {"topics": [{"name": name}]})
    assert body.topics[0].error_code is ErrorCode.unknown_topic_or_partition
    assert "Traceback" not in server.log_since(position)
