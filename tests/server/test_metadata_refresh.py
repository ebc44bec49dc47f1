"""librdkafka's periodic metadata refresh against `compactlog serve`: a confluent-kafka
producer and a consumer group member run until each has refreshed its metadata at least
three times (topic.metadata.refresh.interval.ms set to 1 s), producing and consuming all
along; the server must close no connection, the clients must report no error, and every
record produced must be consumed.

librdkafka refreshes the topics it uses; a consumer subscribed to a pattern (`^tic.*`)
refreshes all topics (a Metadata request with topics=null, as AdminClient.list_topics()
sends), to find new topics that match.

The clients run in a child process (run_isolated), where a crash of librdkafka fails
only this test.
"""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer

from support.apps_support import create_topic, run_isolated, server_config
from support.kafka_server import logged_server

REFRESH_MS = 1000
REFRESHES = 3  # each client refreshes at least this often before the run ends
TIMEOUT_S = 90.0
PERIODIC = "periodic topic and broker list refresh"

class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def produce_and_consume(bootstrap: str, topic: str, pattern: bool) -> dict[str, Any]:
    """Produce a record every 20 ms and consume them in a group until both clients have
    refreshed their metadata REFRESHES times; then drain. Returns what happened."""
    logs = {name: Lines() for name in ("producer", "consumer")}
    loggers = {}
    for name, handler in logs.items():
        logger = logging.getLogger(f"rdkafka.{name}.{uuid.uuid4().hex[:6]}")
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        logger.addHandler(handler)
        loggers[name] = logger
    errors: list[str] = []
    common = {"bootstrap.servers": bootstrap, "debug": "metadata",
              "topic.metadata.refresh.interval.ms": REFRESH_MS,
              "error_cb": lambda error: errors.append(str(error))}
    producer = Producer({**common, "logger": loggers["producer"], "linger.ms": 5})
    consumer = Consumer({**common, "logger": loggers["consumer"], "group.id": "refresher",
                         "group.protocol": "classic", "auto.offset.reset": "earliest",
                         "fetch.wait.max.ms": 100})
    failed: list[str] = []
    sent: list[str] = []
    received: list[str] = []

    def delivered(error: KafkaError | None, _message: Any) -> None:
        if error is not None:
            failed.append(str(error))

    def refreshes(name: str) -> int:
        return sum(PERIODIC in line and "Received metadata" in line
                   for line in logs[name].lines)

    try:
        consumer.subscribe([f"^{topic[:3]}.*" if pattern else topic])
        deadline = time.monotonic() + TIMEOUT_S
        next_send = 0.0
        while min(refreshes("producer"), refreshes("consumer")) < REFRESHES:
            if errors:  # such as _TRANSPORT or _ALL_BROKERS_DOWN: the test fails on them
                break
            assert time.monotonic() < deadline, (
                f"no {REFRESHES} periodic refreshes: producer {refreshes('producer')}, "
                f"consumer {refreshes('consumer')}; errors {errors}")
            if time.monotonic() >= next_send:
                value = str(len(sent))
                producer.produce(topic, key=b"k%d" % (len(sent) % 7), value=value.encode(),
                                 on_delivery=delivered)
                sent.append(value)
                next_send = time.monotonic() + 0.02
            producer.poll(0)
            message = consumer.poll(0.01)
            if message is not None and message.error() is None:
                received.append(message.value().decode())
        assert producer.flush(TIMEOUT_S) == 0, "undelivered records"
        while len(received) < len(sent) and not errors:
            assert time.monotonic() < deadline, f"consumed {len(received)} of {len(sent)}"
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                received.append(message.value().decode())
    finally:
        consumer.close()
    return {"sent": sent, "received": received, "failed": failed, "errors": errors,
            "refreshes": {name: refreshes(name) for name in logs},
            "disconnects": [line for handler in logs.values() for line in handler.lines
                            if "Disconnected" in line or "disconnect" in line.lower()]}


@pytest.mark.parametrize("pattern", [
    pytest.param(False, id="topic", marks=pytest.mark.compat(
        "confluent-kafka", "metadata-refresh-topic")),
    pytest.param(True, id="pattern", marks=pytest.mark.compat(
        "confluent-kafka", "metadata-refresh-pattern")),
])
def test_periodic_metadata_refresh_keeps_connections(tmp_path: Path, pattern: bool) -> None:
    with logged_server(tmp_path / "data", tmp_path / "server.log",
                       *server_config(tmp_path)) as server:
        create_topic(server.bootstrap, "ticks", 2)
        outcome = run_isolated(produce_and_consume, server.bootstrap, "ticks", pattern,
                               timeout=2 * TIMEOUT_S)
        closed = [line for line in server.log().splitlines() if "closing connection" in line]
    assert closed == [], closed
    assert outcome["errors"] == [], outcome["errors"]
    assert outcome["failed"] == []
    assert outcome["disconnects"] == []
    assert sorted(outcome["received"], key=int) == outcome["sent"]
    assert min(outcome["refreshes"].values()) >= REFRESHES
