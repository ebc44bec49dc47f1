"""A real `compactlog serve` for the hostile-client tests (issue 25), and the requests
such a client sends.

`hostile_server` starts a server on a fresh data directory holding topic `t` (one
partition unless `partitions` says more, with `records` records of `value_size` bytes
written before it starts), with the settings given as TOML text, a PLAINTEXT listener
and, with `sasl`, a SASL_PLAINTEXT one with user alice (and, with `admin`, the admin
listener); `extra_topics` more one-partition topics t0000, t0001, ...; `open_files` the
server's RLIMIT_NOFILE. Requests go out as raw kio frames through
tests/server/test_server_bad_input.py's `Wire`; what they cost the server is read from /proc
(tests/support/process_usage.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from compactlog.storage.records import ProducerRecord, encode_batch
from compactlog.storage.store import LogStore
from support.kafka_server import LoggedServer, logged_server
from support.security_support import PASSWORD, _listeners, add_user
from support.wire import Wire, request_frame

TOPIC = "t"
PRODUCE, FETCH, METADATA, API_VERSIONS = 0, 1, 3, 18
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
JOIN_GROUP = 11


@dataclass
class Hostile:
    server: LoggedServer
    listeners: dict[str, str]  # name -> host:port
    data_dir: Path

    @property
    def pid(self) -> int:
        return self.server.process.pid

    def address(self, name: str = "PLAINTEXT") -> tuple[str, int]:
        host, port = self.listeners[name].rsplit(":", 1)
        return host, int(port)


@contextmanager
def hostile_server(tmp_path: Path, settings: str = "", sasl: bool = False,
                   records: int = 0, value_size: int = 100,
                   topic_config: dict[str, str] | None = None,
                   admin: bool = False, extra_topics: int = 0, partitions: int = 1,
                   open_files: int | None = None,
                   env: dict[str, str] | None = None) -> Iterator[Hostile]:
    data = tmp_path / "data"
    with LogStore.open(data) as store:
        store.create_topic(TOPIC, partitions, topic_config or {})
        for number in range(extra_topics):
            store.create_topic(f"{TOPIC}{number:04d}", 1, {})
        batch = 200
        for first in range(0, records, batch):
            store.append(TOPIC, [ProducerRecord(b"k%d" % i, b"v" * value_size)
                                 for i in range(first, min(first + batch, records))])
    config = tmp_path / "server.toml"
    config.write_text(settings)
    args = ["--config", str(config)]
    if sasl:
        args += ["--listener", "SASL_PLAINTEXT://127.0.0.1:0"]
        add_user(data, "alice")
    if admin:
        args += ["--admin-listen", "127.0.0.1:0"]
    log_path = tmp_path / f"server-{os.getpid()}-{time.monotonic_ns()}.log"
    with logged_server(data, log_path, "--listen", "127.0.0.1:0", *args,
                       open_files=open_files, env=env) as server:
        yield Hostile(server, _listeners(data), data)


def plain_login(wire: Wire, user: str = "alice", password: str = PASSWORD) -> None:
    """A SASL/PLAIN login on `wire`; fails the test unless it succeeds."""
    handshake = wire.call(SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
    assert handshake.error_code == 0, handshake
    answer = wire.call(SASL_AUTHENTICATE, 2,
                       {"auth_bytes": b"\0" + user.encode() + b"\0" + password.encode()})
    assert answer.error_code == 0, answer


def fetch_frame(partitions: list[tuple[str, int, int]], max_bytes: int = 2**31 - 1,
                partition_max_bytes: int = 2**31 - 1, version: int = 12,
                correlation_id: int = 7) -> bytes:
    """A Fetch of (topic, partition, offset)s, in request order, each topic entry
    holding one partition (so a topic or partition may repeat)."""
    return request_frame(FETCH, version, {
        "replica_id": -1, "max_wait": timedelta(milliseconds=10), "min_bytes": 1,
        "max_bytes": max_bytes, "isolation_level": 0, "session_id": 0,
        "session_epoch": -1,
        "topics": [{"topic": name, "partitions": [
            {"partition": index, "fetch_offset": offset, "current_leader_epoch": -1,
             "log_start_offset": -1, "partition_max_bytes": partition_max_bytes}]}
            for name, index, offset in partitions]}, correlation_id)


def read_response(wire: Wire, api_key: int, version: int) -> Any:
    return wire.response(api_key, version)[1]


AUTHORIZER_ON = "[authorization]\nenabled = true\n"


def produce_frame(value_size: int, correlation_id: int = 5) -> bytes:
    batch = encode_batch([ProducerRecord(b"big", b"x" * value_size)], 0)
    return request_frame(PRODUCE, 9, {
        "acks": -1, "timeout": timedelta(seconds=30),
        "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records":
                                                           bytes(batch)}]}],
    }, correlation_id)
