"""A server on an object store under a low open-file limit: `compactlog serve` on
s3:// under `ulimit -n 128` serves a topic of 400 sealed segments from offset 0 to a
confluent-kafka consumer and to 40 connections at once. Every segment is downloaded
into the read cache; the open-file cache keeps at most a quarter of the limit open
(and upkeep's merges of the small segments one more), and the S3 client's connection
pool stays bounded (a socket per pooled connection), so the process never runs out of
descriptors."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from support.kafka_server import logged_server
from support.s3_support import (
    S3Server,
)
from support.server_files import consume_from_zero, open_parquet_files

SEGMENTS = 400
OPEN_FILES = 128
CONNECTIONS = 40


def open_sockets(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:
            continue
    return count


@pytest.mark.slow
def test_a_server_on_s3_with_128_open_files_serves_400_segments(
        s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    where = str(s3.location("files"))
    with LogStore.open(where, local_dir=tmp_path / "builder") as store:
        store.create_topic("raw", 1, {"retention.ms": "-1"})
        partition = store.topic("raw").partition(0)
        for offset in range(SEGMENTS):
            store.append("raw", [ProducerRecord(b"k%d" % offset, b"value-%d" % offset)])
            partition.roll()  # one sealed segment per record
        assert len(partition.manifest.segments) == SEGMENTS
    env = {**s3.env, "COMPACTLOG_LOCAL_DIR": str(tmp_path / "server")}
    with logged_server(where, tmp_path / "server.log", env=env,
                       open_files=OPEN_FILES) as server:
        # Many clients at once: each a socket of the server's, within the same limit.
        clients = [socket.create_connection((server.host, server.port))
                   for _ in range(CONNECTIONS)]
        try:
            offsets = consume_from_zero(server.bootstrap, "raw", SEGMENTS)
            assert offsets == list(range(SEGMENTS))
            pid = server.process.pid
            # The open-file cache's share, and a merge's output and input beside it.
            assert len(open_parquet_files(pid)) <= OPEN_FILES // 4 + 2
            # The clients' sockets, the listener, and a bounded pool to the S3 endpoint.
            assert open_sockets(pid) <= CONNECTIONS + 30
            again = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "again",
                              "enable.auto.commit": False})
            again.assign([TopicPartition("raw", 0, SEGMENTS - 5)])
            got = [again.poll(10.0) for _ in range(5)]
            again.close()
            assert [m.offset() for m in got if m is not None and not m.error()] == \
                list(range(SEGMENTS - 5, SEGMENTS))
        finally:
            for client in clients:
                client.close()
        log = server.log()
        for trouble in ("Too many open files", "EMFILE", "Traceback", "ERROR"):
            assert trouble not in log, log[-3000:]
