"""Idempotent producers (KIP-98) against `compactlog serve`: real clients, and the raw
protocol for what clients only do on failures (resends, gaps, stale epochs, restarts)."""

from __future__ import annotations

import datetime
import io
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.record._crecords import DefaultRecordBatchBuilder
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from compactlog import LogStore
from compactlog.server.producer_ids import ID_BLOCK_SIZE
from compactlog.server.producers import (
    INT32_MAX,
    REBUILD_WINDOW_MS,
    ProducerStateError,
    ProducerStates,
)
from compactlog.server.protocol.messages import build
from compactlog.storage.records import BatchHeader, parse_header
from support.kafka_server import running_server

PRODUCE, INIT_PRODUCER_ID = 0, 22


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def server(data: Path) -> Iterator[str]:
    with running_server(data) as bootstrap:
        yield bootstrap


def create_topic(bootstrap: str, name: str, partitions: int,
                 config: dict[str, str] | None = None) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs=config or {})])
    finally:
        admin.close()


def consume_values(bootstrap: str, topic: str, partitions: int,
                   expected: int) -> list[tuple[int, int, bytes]]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=3000)
    assigned = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(assigned)
    consumer.seek_to_beginning(*assigned)
    seen = []
    for message in consumer:
        seen.append((message.partition, message.offset, message.value))
        if len(seen) >= expected:
            break  # callers compare contents, so a record stored twice shows
    consumer.close()
    return seen


def stored_batches(data: Path, topic: str, partition: int) -> list[BatchHeader]:
    """The batch headers in the partition's log segments (the server must be down)."""
    with LogStore.open(data, read_only=True) as store:
        return [header for segment in store.topic(topic).partition(partition).logs
                for header in segment.iter_headers()]


def stored_values(data: Path, topic: str, partition: int) -> list[tuple[int, bytes | None]]:
    with LogStore.open(data, read_only=True) as store:
        part = store.topic(topic).partition(partition)
        records = part.read(0, max_records=100_000, max_bytes=1 << 30)
        return [(r.offset, r.value) for r in records]


def assert_one_producer_in_sequence(headers: list[BatchHeader]) -> None:
    """Every batch from one producer id, sequences dense from 0: nothing sent twice."""
    assert headers
    assert {h.producer_id for h in headers} == {headers[0].producer_id}
    assert headers[0].producer_id >= 0
    expected = 0
    for header in headers:
        assert header.base_sequence == expected, headers
        expected += header.record_count


# -- real clients -------------------------------------------------------------------------


def test_kafka_python_idempotent_producer_writes_each_record_once(
    server: str, data: Path
) -> None:
    create_topic(server, "events", 4)
    producer = KafkaProducer(bootstrap_servers=server, enable_idempotence=True,
                             linger_ms=2, batch_size=2048, acks="all")
    count = 3000
    futures = [producer.send("events", key=b"k%d" % (i % 97), value=b"%d" % i)
               for i in range(count)]
    producer.flush()
    metadata = [future.get(timeout=30) for future in futures]
    producer_id = producer._transaction_manager.producer_id_and_epoch.producer_id
    producer.close()
    assert producer_id >= 0
    assert {m.partition for m in metadata} == {0, 1, 2, 3}
    seen = consume_values(server, "events", 4, count)
    assert len(seen) == count
    assert sorted(int(v) for _, _, v in seen) == list(range(count))
    for partition in range(4):
        offsets = [o for p, o, _ in seen if p == partition]
        assert offsets == list(range(len(offsets)))
    # Each record's reported offset is where it is.
    where = {(p, o): v for p, o, v in seen}
    assert all(where[(m.partition, m.offset)] == b"%d" % i for i, m in enumerate(metadata))


def test_kafka_python_batches_keep_their_producer_fields(data: Path) -> None:
    with running_server(data) as bootstrap:
        create_topic(bootstrap, "stamped", 2)
        producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True,
                                 linger_ms=2, batch_size=1024)
        for i in range(800):
            producer.send("stamped", key=b"k%d" % i, value=b"x" * 40)
        producer.flush()
        producer.close()
    for partition in range(2):
        headers = stored_batches(data, "stamped", partition)
        assert len(headers) > 1
        assert_one_producer_in_sequence(headers)


def test_confluent_kafka_idempotent_producer(data: Path) -> None:
    from confluent_kafka import Producer

    with running_server(data) as bootstrap:
        create_topic(bootstrap, "orders", 3)
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                             "linger.ms": 5, "batch.size": 4096})
        delivered: list[tuple[int, int]] = []
        failed: list[str] = []

        def report(error: Any, message: Any) -> None:
            if error is not None:
                failed.append(str(error))
            else:
                delivered.append((message.partition(), message.offset()))

        count = 2000
        for i in range(count):
            producer.produce("orders", key=b"k%d" % i, value=b"%d" % i, on_delivery=report)
            if i % 500 == 0:
                producer.poll(0)
        assert producer.flush(30) == 0
        assert not failed, failed
        assert len(delivered) == len(set(delivered)) == count
        seen = consume_values(bootstrap, "orders", 3, count)
        assert sorted(int(v) for _, _, v in seen) == list(range(count))
        assert sorted((p, o) for p, o, _ in seen) == sorted(delivered)
    for partition in range(3):
        assert_one_producer_in_sequence(stored_batches(data, "orders", partition))


# -- the raw protocol ---------------------------------------------------------------------


class RawClient:
    """One connection; requests built and responses read with kio, framed by hand."""

    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def call(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        self.correlation_id += 1
        schema = load_request_schema(api_key, version)
        header_schema = schema.__header_schema__  # v2 for flexible versions, else v1
        out = io.BytesIO()
        entity_writer(header_schema)(out, build(header_schema, {
            "request_api_key": api_key, "request_api_version": version,
            "correlation_id": self.correlation_id, "client_id": "raw-test"}))
        entity_writer(schema)(out, build(schema, body))
        payload = out.getvalue()
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        (size,) = struct.unpack(">i", self._read(4))
        frame = self._read(size)
        response_schema = load_response_schema(api_key, version)
        header, used = entity_reader(response_schema.__header_schema__)(frame, 0)
        assert header.correlation_id == self.correlation_id
        response, size_read = entity_reader(response_schema)(frame, used)
        assert used + size_read == len(frame)
        return response

    def _read(self, size: int) -> bytes:
        chunks = []
        while size:
            chunk = self.sock.recv(size)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def init_producer_id(self, producer_id: int = -1, epoch: int = -1,
                         transactional_id: str | None = None,
                         version: int = 4) -> tuple[ErrorCode, int, int]:
        response = self.call(INIT_PRODUCER_ID, version, {
            "transactional_id": transactional_id,
            "transaction_timeout": datetime.timedelta(seconds=60),
            "producer_id": producer_id, "producer_epoch": epoch})
        return response.error_code, response.producer_id, response.producer_epoch

    def produce(self, topic: str, partition: int, records: bytes) -> tuple[ErrorCode, int]:
        response = self.call(PRODUCE, 9, {
            "transactional_id": None, "acks": -1,
            "timeout": datetime.timedelta(seconds=10),
            "topic_data": [{"name": topic, "partition_data": [
                {"index": partition, "records": records}]}]})
        (topic_response,) = response.responses
        (part,) = topic_response.partition_responses
        return part.error_code, part.base_offset


def batch(producer_id: int, epoch: int, sequence: int, values: list[bytes],
          transactional: bool = False) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, int(transactional), producer_id, epoch,
                                        sequence, 2**31 - 1)
    # Now: records from long ago would be rolled by segment.ms and removed by retention.
    now_ms = int(time.time() * 1000)
    for delta, value in enumerate(values):
        builder.append(delta, now_ms, b"key", value, [])
    return bytes(builder.build())


@pytest.fixture
def raw(server: str) -> Iterator[RawClient]:
    create_topic(server, "raw", 2)
    client = RawClient(server)
    yield client
    client.close()


def test_a_resent_batch_gets_its_original_offset_and_is_stored_once(
    raw: RawClient, server: str, data: Path
) -> None:
    code, pid, epoch = raw.init_producer_id()
    assert (code, epoch) == (ErrorCode.none, 0) and pid >= 0
    first = batch(pid, epoch, 0, [b"a0", b"a1", b"a2"])
    assert raw.produce("raw", 0, first) == (ErrorCode.none, 0)
    assert raw.produce("raw", 0, first) == (ErrorCode.none, 0)
    second = batch(pid, epoch, 3, [b"b0"])
    assert raw.produce("raw", 0, second) == (ErrorCode.none, 3)
    # Any of the last five batches is recognized, not only the last.
    assert raw.produce("raw", 0, first) == (ErrorCode.none, 0)
    assert raw.produce("raw", 0, second) == (ErrorCode.none, 3)
    # Sequences are per partition.
    assert raw.produce("raw", 1, batch(pid, epoch, 0, [b"c0"])) == (ErrorCode.none, 0)
    values = consume_values(server, "raw", 2, 5)
    assert sorted((p, o, v) for p, o, v in values) == [
        (0, 0, b"a0"), (0, 1, b"a1"), (0, 2, b"a2"), (0, 3, b"b0"), (1, 0, b"c0")]


def test_out_of_order_sequences_and_stale_epochs_are_refused(raw: RawClient) -> None:
    _, pid, epoch = raw.init_producer_id()
    assert raw.produce("raw", 0, batch(pid, epoch, 0, [b"a", b"b"]))[0] is ErrorCode.none
    # A gap, a repeat that is not a whole earlier batch, a sequence from the past.
    for sequence in (3, 1, 0):
        code, offset = raw.produce("raw", 0, batch(pid, epoch, sequence, [b"x"]))
        assert (code, offset) == (ErrorCode.out_of_order_sequence_number, -1), sequence
    assert raw.produce("raw", 0, batch(pid, epoch, 2, [b"c"])) == (ErrorCode.none, 2)

    # KIP-360: the same producer id at the next epoch, which fences the old one.
    code, bumped_pid, bumped = raw.init_producer_id(pid, epoch)
    assert (code, bumped_pid, bumped) == (ErrorCode.none, pid, epoch + 1)
    code, _ = raw.produce("raw", 0, batch(pid, bumped, 5, [b"x"]))
    assert code is ErrorCode.out_of_order_sequence_number  # a new epoch starts at 0
    assert raw.produce("raw", 0, batch(pid, bumped, 0, [b"d"])) == (ErrorCode.none, 3)
    code, _ = raw.produce("raw", 0, batch(pid, epoch, 3, [b"late"]))
    assert code is ErrorCode.invalid_producer_epoch
    # The old epoch's batches are no longer duplicates either.
    code, _ = raw.produce("raw", 0, batch(pid, epoch, 2, [b"c"]))
    assert code is ErrorCode.invalid_producer_epoch


def test_producer_ids_and_unsupported_requests(raw: RawClient) -> None:
    ids = [raw.init_producer_id(version=version)[1] for version in (0, 2, 3, 5)]
    assert ids == sorted(ids) and len(set(ids)) == 4
    # Transactions are not supported, and an empty transactional id is invalid.
    assert raw.init_producer_id(transactional_id="txn")[0] is (
        ErrorCode.transactional_id_authorization_failed)
    assert raw.init_producer_id(transactional_id="")[0] is ErrorCode.invalid_request
    # Half a producer id, an id never handed out, an exhausted epoch.
    assert raw.init_producer_id(ids[0], -1)[0] is ErrorCode.invalid_request
    code, new_id, epoch = raw.init_producer_id(10**12, 3)
    assert code is ErrorCode.none and new_id > ids[-1] and epoch == 0
    code, newer_id, epoch = raw.init_producer_id(ids[0], 32766)
    assert code is ErrorCode.none and newer_id > new_id and epoch == 0
    # Transactional batches, several batches in one idempotent produce, bad sequences.
    _, pid, _ = raw.init_producer_id()
    code, _ = raw.produce("raw", 0, batch(pid, 0, 0, [b"t"], transactional=True))
    assert code is ErrorCode.invalid_txn_state
    two = batch(pid, 0, 0, [b"a"]) + batch(pid, 0, 1, [b"b"])
    assert raw.produce("raw", 0, two)[0] is ErrorCode.invalid_record
    assert raw.produce("raw", 0, batch(pid, 0, -5, [b"a"]))[0] is ErrorCode.invalid_record
    # Nothing of that was stored; the producer still starts where it likes (it is
    # unknown to the partition: Kafka accepts any first sequence since KIP-360).
    accepted = batch(pid, 0, 7, [b"ok"])
    assert raw.produce("raw", 0, accepted) == (ErrorCode.none, 0)
    # A damaged copy of a stored batch is refused, not taken for its duplicate.
    damaged = bytearray(accepted)
    damaged[-1] ^= 0xFF
    code, offset = raw.produce("raw", 0, bytes(damaged))
    assert code in (ErrorCode.corrupt_message, ErrorCode.invalid_record) and offset == -1


def test_sequence_numbers_wrap_around(raw: RawClient) -> None:
    _, pid, _ = raw.init_producer_id()
    last = batch(pid, 0, INT32_MAX - 1, [b"a", b"b", b"c"])  # sequences MAX-1, MAX, 0
    assert raw.produce("raw", 0, last) == (ErrorCode.none, 0)
    code, _ = raw.produce("raw", 0, batch(pid, 0, 0, [b"x"]))
    assert code is ErrorCode.out_of_order_sequence_number
    assert raw.produce("raw", 0, last) == (ErrorCode.none, 0)
    assert raw.produce("raw", 0, batch(pid, 0, 1, [b"d"])) == (ErrorCode.none, 3)


def test_concurrent_resends_append_each_batch_once(server: str, data: Path) -> None:
    create_topic(server, "race", 1)
    clients = [RawClient(server) for _ in range(4)]
    _, pid, epoch = clients[0].init_producer_id()
    rounds = 15
    barrier = threading.Barrier(len(clients))
    answers: list[list[tuple[ErrorCode, int]]] = [[] for _ in clients]

    def send(number: int) -> None:
        for sequence in range(rounds):
            records = batch(pid, epoch, sequence * 2, [b"%d" % sequence, b"."])
            barrier.wait(timeout=30)
            answers[number].append(clients[number].produce("race", 0, records))

    threads = [threading.Thread(target=send, args=(n,)) for n in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    for client in clients:
        client.close()
    expected = [(ErrorCode.none, 2 * sequence) for sequence in range(rounds)]
    assert all(got == expected for got in answers), answers
    seen = consume_values(server, "race", 1, 2 * rounds)
    assert [o for _, o, _ in seen] == list(range(2 * rounds))


def test_resends_across_a_restart_are_still_recognized(data: Path) -> None:
    # Tiny segments: every batch rolls the active segment, so the earlier ones are
    # sealed into Parquet and the state comes from the sealed batch columns as well.
    config = {"segment.bytes": "1024"}
    value = b"v" * 600
    batches: list[bytes] = []
    with running_server(data) as bootstrap:
        create_topic(bootstrap, "restart", 1, config)
        client = RawClient(bootstrap)
        _, pid, epoch = client.init_producer_id()
        for number in range(4):
            batches.append(batch(pid, epoch, 2 * number, [b"%d" % number, value]))
            assert client.produce("restart", 0, batches[-1]) == (ErrorCode.none, 2 * number)
        client.close()
    with LogStore.open(data, read_only=True) as store:
        assert store.topic("restart").partition(0).stats()["sealed_segments"] == 3

    with running_server(data) as bootstrap:
        client = RawClient(bootstrap)
        for number, records in enumerate(batches):
            assert client.produce("restart", 0, records) == (ErrorCode.none, 2 * number)
        code, _ = client.produce("restart", 0, batch(pid, epoch, 9, [b"gap"]))
        assert code is ErrorCode.out_of_order_sequence_number
        assert client.produce("restart", 0, batch(pid, epoch, 8, [b"next"])) == (
            ErrorCode.none, 8)
        # Producer ids are never reused: the next block is above every id handed out.
        _, next_pid, _ = client.init_producer_id()
        assert next_pid >= pid + ID_BLOCK_SIZE
        client.close()

    with running_server(data) as bootstrap:  # and once more, now from the log segment
        client = RawClient(bootstrap)
        assert client.produce("restart", 0, batch(pid, epoch, 8, [b"next"])) == (
            ErrorCode.none, 8)
        assert client.produce("restart", 0, batches[-1]) == (ErrorCode.none, 6)
        client.close()
    values = stored_values(data, "restart", 0)
    assert [offset for offset, _ in values] == list(range(9))
    assert [v for _, v in values][::2] == [b"0", b"1", b"2", b"3", b"next"]


# -- the state itself, without a server (a clock to move) ---------------------------------


def test_rebuild_bound_and_expiry(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    now = time.time()
    with LogStore.open(directory) as store:
        store.create_topic("t", 1, {"segment.bytes": "1024"})
        partition = store.topic("t").partition(0)
        states = ProducerStates(directory, clock=lambda: now)
        pid, epoch = states.init_producer_id(-1, -1)
        sent = [batch(pid, epoch, 2 * n, [b"%d" % n, b"v" * 600]) for n in range(4)]
        for number, records in enumerate(sent):
            appended = states.append(partition, bytearray(records), parse_header(records))
            assert appended[:3] == (2 * number, 2 * number + 1, False)
        assert partition.stats()["sealed_segments"] == 3

        def restarted(seconds_later: float) -> ProducerStates:
            return ProducerStates(directory, clock=lambda: now + seconds_later)

        # Within the window every recently sealed segment is read again.
        soon = restarted(60)
        assert soon.append(
            partition, bytearray(sent[0]), parse_header(sent[0]))[:3] == (0, 1, True)
        # Past it only the last sealed segment and the log segments are: batch 0 is no
        # longer known, so resending it is out of order (not appended twice).
        late = restarted(REBUILD_WINDOW_MS / 1000 + 60)
        with pytest.raises(ProducerStateError) as refused:
            late.append(partition, bytearray(sent[0]), parse_header(sent[0]))
        assert refused.value.code is ErrorCode.out_of_order_sequence_number
        assert late.append(
            partition, bytearray(sent[2]), parse_header(sent[2]))[:3] == (4, 5, True)
        # After producer.id.expiration.ms without a write the producer is unknown, and
        # any sequence is taken (Kafka's rule), even a resend.
        expired = restarted(0)
        assert expired.append(partition, bytearray(sent[3]), parse_header(sent[3])).duplicate
        expired.clock = lambda: now + 2 * 86_400
        assert expired.append(
            partition, bytearray(sent[3]), parse_header(sent[3]))[:3] == (8, 9, False)


def test_a_resend_is_recognised_however_many_small_segments_were_sealed_since(
        tmp_path: Path) -> None:
    """Found while reading acks=all duplicates of the Jepsen harness (tests/faults/test_jepsen.py,
    seed 2101): on an object store a segment is sealed every upload_interval_s, so after
    a take-over (or a restart) the state rebuilt from the last eight sealed segments
    covered well under a second; an idempotent producer that resent a batch stored
    before the take-over was unknown, and the batch was appended a second time under
    the same producer id, epoch and sequence. The rebuild is bounded by bytes now."""
    directory = tmp_path / "store"
    now = time.time()
    with LogStore.open(directory) as store:
        store.create_topic("t", 1, {"segment.bytes": "1024"})
        partition = store.topic("t").partition(0)
        states = ProducerStates(directory, clock=lambda: now)
        pid, epoch = states.init_producer_id(-1, -1)
        mine = batch(pid, epoch, 0, [b"mine", b"v" * 600])
        assert states.append(
            partition, bytearray(mine), parse_header(mine))[:3] == (0, 1, False)
        other, other_epoch = states.init_producer_id(-1, -1)
        for number in range(12):
            theirs = batch(other, other_epoch, number, [b"v" * 1100])
            states.append(partition, bytearray(theirs), parse_header(theirs))
        assert partition.stats()["sealed_segments"] >= 10
        taken_over = ProducerStates(directory, clock=lambda: now + 5)
        assert taken_over.append(
            partition, bytearray(mine), parse_header(mine))[:3] == (0, 1, True)
