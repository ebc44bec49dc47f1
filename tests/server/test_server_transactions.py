"""Transactions are refused at once and clearly; read_committed consumers read normally.

compactlog has no transaction coordinator. A transactional producer asks for one with
FindCoordinator(key_type=1) and then InitProducerId(transactional_id): both get
TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53), the one code that librdkafka
(rd_kafka_txn_handle_FindCoordinator, rd_kafka_idemp_check_error), kafka-python and
aiokafka all treat as fatal at once; with anything else librdkafka retries until
init_transactions() times out. FindCoordinator's error message says why, and the server
logs which client asked (once a minute per client).

A read_committed consumer (confluent-kafka's default) gets what a Kafka broker with no
transactional data sends: everything up to the high watermark, last_stable_offset equal
to it, and no aborted transactions.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import TransactionalIdAuthorizationFailed
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import TransactionalIdAuthorizationFailedError
from kio.schema.errors import ErrorCode

from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from support.kafka_server import LoggedServer, logged_server
from support.wire import Wire, request_frame

PRODUCE, FETCH, LIST_OFFSETS, FIND_COORDINATOR, INIT_PRODUCER_ID = 0, 1, 2, 10, 22
GROUP, TRANSACTION, SHARE = 0, 1, 2
TOPIC = "txn-plain"
# "Fails fast": far below every client's own timeout (librdkafka's init_transactions
# waits for transaction.timeout.ms, 60 s by default), with room for a slow machine.
FAST_S = 10.0
NOT_SUPPORTED = "transactions are not supported by compactlog yet"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LoggedServer]:
    data = tmp_path / "data"
    with LogStore.open(data) as store:
        store.create_topic(TOPIC, 2)
        store.append(TOPIC, [ProducerRecord(b"k%d" % i, b"v%d" % i) for i in range(10)])
    with logged_server(data, tmp_path / "server.log") as running:
        yield running


def refusal_line(server: LoggedServer, mark: int, client_id: str) -> str:
    return server.wait_for_log(
        rf"INFO .*transactions refused .*client id '{client_id}' at 127\.0\.0\.1", mark)


# -- real producers -------------------------------------------------------------------

def test_confluent_init_transactions_fails_at_once(server: LoggedServer) -> None:
    mark = server.mark()
    client_id = f"ck-{uuid.uuid4().hex[:6]}"
    producer = Producer({"bootstrap.servers": server.bootstrap, "client.id": client_id,
                         "transactional.id": "ck-txn"})
    started = time.monotonic()
    with pytest.raises(KafkaException) as raised:
        producer.init_transactions(60)
    assert time.monotonic() - started < FAST_S
    error: KafkaError = raised.value.args[0]
    assert error.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert error.fatal() and not error.retriable()
    assert NOT_SUPPORTED in error.str()
    refusal_line(server, mark, client_id)
    # Idempotent producing without a transactional id works on the same server.
    plain = Producer({"bootstrap.servers": server.bootstrap, "enable.idempotence": True})
    reports: list[Any] = []
    plain.produce(TOPIC, key=b"after", value=b"txn", on_delivery=lambda e, m: reports.append(e))
    assert plain.flush(30) == 0
    assert reports == [None]


def test_kafka_python_init_transactions_fails_at_once(server: LoggedServer) -> None:
    mark = server.mark()
    producer = KafkaProducer(bootstrap_servers=server.bootstrap, client_id="kp-txn",
                             transactional_id="kp-txn")
    try:
        started = time.monotonic()
        with pytest.raises(TransactionalIdAuthorizationFailedError):
            producer.init_transactions()
        assert time.monotonic() - started < FAST_S
    finally:
        producer.close(timeout=5)
    refusal_line(server, mark, "kp-txn")


def test_aiokafka_start_fails_at_once(server: LoggedServer) -> None:
    mark = server.mark()

    async def start() -> float:
        producer = AIOKafkaProducer(bootstrap_servers=server.bootstrap,
                                    client_id="aio-txn", transactional_id="aio-txn")
        started = time.monotonic()
        try:
            # aiokafka finds the transaction coordinator while starting.
            with pytest.raises(TransactionalIdAuthorizationFailed):
                await producer.start()
            return time.monotonic() - started
        finally:
            await producer.stop()

    assert asyncio.run(start()) < FAST_S
    refusal_line(server, mark, "aio-txn")


# -- on the wire ------------------------------------------------------------------------

def call(wire: Wire, api_key: int, version: int, fields: dict[str, Any],
         client_id: str) -> Any:
    wire.send(request_frame(api_key, version, fields, correlation_id=31, client_id=client_id))
    correlation_id, body = wire.response(api_key, version)
    assert correlation_id == 31
    return body


@pytest.mark.parametrize("version", range(1, 7))
def test_find_coordinator_for_a_transactional_id(server: LoggedServer, version: int) -> None:
    with Wire(server.address) as wire:
        body = call(wire, FIND_COORDINATOR, version, {
            "key": "t", "key_type": TRANSACTION, "coordinator_keys": ["t", "u"]}, "wire")
        answers = body.coordinators if version >= 4 else [body]
        assert [a.error_code for a in answers] == (
            [ErrorCode.transactional_id_authorization_failed] * (2 if version >= 4 else 1))
        for answer in answers:
            assert answer.node_id == -1
            assert NOT_SUPPORTED in answer.error_message
        # Group coordinators are still found on the same connection.
        body = call(wire, FIND_COORDINATOR, version, {
            "key": "g", "key_type": GROUP, "coordinator_keys": ["g"]}, "wire")
        answer = body.coordinators[0] if version >= 4 else body
        assert (answer.error_code, answer.node_id) == (ErrorCode.none, 0)


def test_find_coordinator_for_a_share_group_is_an_invalid_request(
        server: LoggedServer) -> None:
    # As Kafka without share groups (KafkaApis.getCoordinator).
    with Wire(server.address) as wire:
        body = call(wire, FIND_COORDINATOR, 6,
                    {"key_type": SHARE, "coordinator_keys": ["s:t:0"]}, "wire")
    assert body.coordinators[0].error_code is ErrorCode.invalid_request


@pytest.mark.parametrize("version", range(0, 6))
def test_init_producer_id_with_a_transactional_id(server: LoggedServer, version: int) -> None:
    with Wire(server.address) as wire:
        body = call(wire, INIT_PRODUCER_ID, version, {
            "transactional_id": "t", "transaction_timeout": timedelta(seconds=60),
            "producer_id": -1, "producer_epoch": -1}, "wire")
    assert (body.error_code, body.producer_id) == (
        ErrorCode.transactional_id_authorization_failed, -1)


def test_one_log_line_per_client(server: LoggedServer) -> None:
    mark = server.mark()
    ask = {"key": "t", "key_type": TRANSACTION, "coordinator_keys": ["t"]}
    with Wire(server.address) as wire:
        for _ in range(5):
            call(wire, FIND_COORDINATOR, 3, ask, "chatty")
        call(wire, INIT_PRODUCER_ID, 4, {"transactional_id": "t", "producer_id": -1,
                                         "producer_epoch": -1}, "chatty")
        call(wire, FIND_COORDINATOR, 3, ask, "other")
    refusal_line(server, mark, "other")
    lines = [line for line in server.log_since(mark).splitlines()
             if "transactions refused" in line]
    assert len(lines) == 2, lines
    assert "'chatty'" in lines[0] and "transactional id 't'" in lines[0]


# -- read_committed consumers -----------------------------------------------------------

def fetch_partition(wire: Wire, version: int, isolation_level: int) -> Any:
    body = call(wire, FETCH, version, {
        "replica_id": -1, "max_wait": timedelta(milliseconds=10), "min_bytes": 1,
        "max_bytes": 1 << 20, "isolation_level": isolation_level, "session_epoch": -1,
        "topics": [{"topic": TOPIC, "partitions": [
            {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]},
        "wire")
    return body.responses[0].partitions[0]


@pytest.mark.parametrize("version", [4, 7, 11, 12])
def test_fetch_read_committed_answers_as_kafka_without_transactions(
        server: LoggedServer, version: int) -> None:
    with Wire(server.address) as wire:
        committed = fetch_partition(wire, version, 1)
        uncommitted = fetch_partition(wire, version, 0)
        latest = call(wire, LIST_OFFSETS, 5, {"replica_id": -1, "isolation_level": 1,
                                             "topics": [{"name": TOPIC, "partitions": [
                                                 {"partition_index": 0, "timestamp": -1}]}]},
                      "wire").topics[0].partitions[0]
    assert committed.error_code is ErrorCode.none
    assert committed.high_watermark > 0
    assert committed.last_stable_offset == committed.high_watermark == latest.offset
    assert committed.records == uncommitted.records
    # Kafka lists aborted transactions only for read_committed (none here), else null.
    assert committed.aborted_transactions == ()
    assert uncommitted.aborted_transactions is None


def records_in_store(server: LoggedServer) -> list[tuple[int, bytes | None, bytes | None]]:
    with LogStore.open(server.log_path.parent / "data", read_only=True) as store:
        topic = store.topic(TOPIC)
        return sorted((p, r.key, r.value) for p in range(2)
                      for r in topic.partition(p).read(0))


@pytest.mark.parametrize("isolation", [None, "read_committed"])
def test_confluent_read_committed_consumer_reads_everything(
        server: LoggedServer, isolation: str | None) -> None:
    settings = {"bootstrap.servers": server.bootstrap, "group.id": "rc",
                "enable.partition.eof": True, "enable.auto.commit": False}
    if isolation is not None:  # None: librdkafka's default, which is read_committed
        settings["isolation.level"] = isolation
    consumer = Consumer(settings)
    seen: list[tuple[int, bytes | None, bytes | None]] = []
    eof: set[int] = set()
    try:
        consumer.assign([CkTopicPartition(TOPIC, p, 0) for p in range(2)])
        deadline = time.monotonic() + 30
        while len(eof) < 2:
            assert time.monotonic() < deadline, seen
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error() is not None:
                assert message.error().code() == KafkaError._PARTITION_EOF
                eof.add(message.partition())
                continue
            seen.append((message.partition(), message.key(), message.value()))
    finally:
        consumer.close()
    assert sorted(seen) == records_in_store(server) and len(seen) == 10


def test_kafka_python_read_committed_consumer_reads_everything(server: LoggedServer) -> None:
    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap,
                             isolation_level="read_committed", enable_auto_commit=False,
                             consumer_timeout_ms=3000)
    partitions = [TopicPartition(TOPIC, p) for p in range(2)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    seen = [(m.partition, m.key, m.value) for m in consumer]
    assert consumer.end_offsets(partitions) == {
        tp: sum(1 for p, _, _ in seen if p == tp.partition) for tp in partitions}
    consumer.close()
    assert sorted(seen) == records_in_store(server) and len(seen) == 10
