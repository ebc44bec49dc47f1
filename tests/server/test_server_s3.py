"""`compactlog serve --data-dir s3://...`: the server keeps its active log segments in its
local directory and seals them into the bucket (tiering: the manifest commit comes after
the upload, and the local log goes after the commit). Produced through a Kafka client
with acks=all, compacted by `compactlog compact` from another local directory (another
machine: nothing shared but the bucket), consumed back compacted through Kafka; after
the server stops, everything it acknowledged is in the bucket."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from compactlog import LogStore
from compactlog.storage.store import REMOTE_REFRESH_S
from support.cli import ok, run
from support.kafka_server import logged_server
from support.s3_support import (
    SECRET_ACCESS_KEY,
    SESSION_TOKEN,
    S3Server,
)

TOPIC = "prices"
CONFIG = {"cleanup.policy": "compact", "segment.ms": "200", "delete.retention.ms": "0",
          "min.compaction.lag.ms": "0", "min.cleanable.dirty.ratio": "0"}


def produce(bootstrap: str, pairs: list[tuple[bytes, bytes | None]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": False, "linger.ms": 5})
    failures: list[object] = []
    for key, value in pairs:
        producer.produce(TOPIC, value, key,
                         on_delivery=lambda err, msg: failures.append(err) if err else None)
    assert producer.flush(30) == 0
    assert not failures, failures


def consume_all(bootstrap: str, expected: int) -> dict[bytes, bytes | None]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g{time.time_ns()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([TOPIC])
    seen: dict[bytes, bytes | None] = {}
    count = 0
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline and count < expected:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            seen[message.key()] = message.value()
            count += 1
        # a little longer: nothing more may come
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                seen[message.key()] = message.value()
                count += 1
    finally:
        consumer.close()
    assert count == expected, (count, expected)
    return seen


def test_a_server_on_s3_serves_compacts_and_keeps_what_it_acknowledged(
        s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    where = s3.location("served")
    server_env = {**s3.env, "COMPACTLOG_LOCAL_DIR": str(tmp_path / "server-local")}
    pairs = [(f"k{i % 20}".encode(), None if i % 9 == 0 else f"v{i}".encode())
             for i in range(300)]
    latest: dict[bytes, bytes | None] = {}
    for key, value in pairs:
        latest[key] = value
    live = {key: value for key, value in latest.items() if value is not None}
    with logged_server(str(where), tmp_path / "server.log", env=server_env) as server:
        admin = AdminClient({"bootstrap.servers": server.bootstrap})
        futures = admin.create_topics([NewTopic(TOPIC, 2, 1, config=CONFIG)])
        futures[TOPIC].result(30)
        produce(server.bootstrap, pairs)
        time.sleep(0.5)  # segment.ms passes: the server's upkeep rolls and seals
        produce(server.bootstrap, [(b"late", b"x")])  # a record after the roll
        live[b"late"] = b"x"
        # Compaction from another machine: its own local directory, only the bucket.
        other = {**s3.env, "COMPACTLOG_DATA_DIR": str(where),
                 "COMPACTLOG_LOCAL_DIR": str(tmp_path / "compactor")}
        report = json.loads(ok(run(tmp_path, "compact", TOPIC, "--local", "--json",
                                   env=other, timeout=300)))
        assert sum(p["records_in"] for p in report["partitions"]) >= 300
        # Consumed through Kafka: the compacted view (the ledger, then the raw tail),
        # once the server has picked up the commit (within REMOTE_REFRESH_S on S3).
        deadline = time.monotonic() + REMOTE_REFRESH_S + 10
        while True:
            try:
                seen = consume_all(server.bootstrap, len(live))
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
        assert seen == live
        log = server.log()
    for secret in (SECRET_ACCESS_KEY, SESSION_TOKEN):
        assert secret not in log
    # Stopped: every acknowledged record is in the bucket, read from elsewhere.
    with LogStore.open(where, read_only=True, local_dir=tmp_path / "after") as reader:
        got: dict[bytes, bytes | None] = {}
        for partition in reader.topic(TOPIC).partitions:
            assert not partition.logs  # nothing came from a local log
            offset = 0
            while batch := partition.read(offset, 1000):
                for record in batch:
                    assert record.key is not None
                    got[record.key] = record.value
                offset = batch[-1].offset + 1
        assert {k: v for k, v in got.items() if v is not None} == live
