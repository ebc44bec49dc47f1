"""A server on S3 that acknowledges after upload (ack_after_upload) seals a small segment
for each round of acknowledgements; its upkeep merges runs of them (storage/merging.py)
while a producer goes on, and a consumer reads every acknowledged record from offset 0,
in order, before and after."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from compactlog import LogStore
from support.failover import free_port, serve
from support.s3_support import (
    S3Server,
)
from support.server_files import consume_from_zero

TOPIC = "events"
ROUNDS = 40


@pytest.mark.slow  # a server on S3 producing 40 rounds: ~17 s
def test_small_segments_of_acknowledgements_are_merged(s3_env: S3Server,
                                                       tmp_path: Path) -> None:
    s3 = s3_env
    where = str(s3.location("merging"))
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    config = tmp_path / "server.toml"
    config.write_text("ack_after_upload = true\nupload_interval_s = 0.05\n"
                      "upkeep_interval_s = 0.2\n")
    with serve(where, tmp_path / "local", port, config, tmp_path / "server.log",
               s3.env) as server:
        assert server.serving.wait(60), server.log()
        admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive
        admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                             "linger.ms": 0})
        for round_ in range(ROUNDS):
            for index in range(5):
                producer.produce(TOPIC, b"v%d-%d" % (round_, index), b"k%d" % index)
            assert producer.flush(30) == 0  # acknowledged: sealed in the bucket
        end = ROUNDS * 5
        deadline = time.monotonic() + 30
        while "merged" not in server.log() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "merged" in server.log(), server.log()[-3000:]
        assert consume_from_zero(bootstrap, TOPIC, end) == list(range(end))
    with LogStore.open(where, read_only=True, local_dir=tmp_path / "check") as reader:
        partition = reader.topic(TOPIC).partition(0)
        segments = partition.manifest.segments
        records = list(partition.read(0, 10_000, 1 << 30))
    assert [r.offset for r in records] == list(range(end))
    assert [r.value for r in records[:5]] == [b"v0-%d" % i for i in range(5)]
    # Each round sealed at least one segment; the merges left far fewer.
    assert len(segments) < ROUNDS // 2, [(s.base_offset, s.last_offset) for s in segments]
