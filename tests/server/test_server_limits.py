"""The server's resource limits, against a real `compactlog serve` and real clients.

Connections over `max_connections` or `max_connections_per_ip` are accepted and closed
at once (as Kafka closes connections over max.connections.per.ip), with a rate-limited
warning; clients from elsewhere carry on. A connection that sends nothing for
`connections_max_idle_s` is closed, but not while a request of it is being handled (a
long-polling Fetch). Request bytes are counted against `queued_max_request_bytes` as
they arrive; when the budget is spent the server stops reading, and the connection that
has been receiving its frame the longest goes on, so that nothing deadlocks. Bad
settings stop `compactlog serve` with one line naming them.

Connections from other clients come from other loopback addresses (127.0.0.2, ...), as
any 127.x address reaches a server on 127.0.0.1.
"""

from __future__ import annotations

import os
import re
import resource
import socket
import struct
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kio.schema.errors import ErrorCode

from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from support.admin import metrics, sample, wait_until
from support.cli import run
from support.hostile_support import produce_frame
from support.kafka_server import LoggedServer, logged_server
from support.wire import API_VERSIONS, FETCH, PRODUCE, Wire, request_frame

TOPIC = "t"
MIB = 1 << 20


def start(tmp_path: Path, settings: dict[str, Any], *extra: str,
          name: str = "server", open_files: int | None = None) -> Any:
    """The logged_server context for a fresh data directory holding topic `t`, with
    `settings` in a --config file and the admin listener on (and the server's
    RLIMIT_NOFILE set to `open_files`)."""
    data = tmp_path / "data"
    if not data.exists():
        with LogStore.open(data) as store:
            store.create_topic(TOPIC, 1)
    config = tmp_path / f"{name}.toml"
    config.write_text("".join(f"{key} = {value!r}\n" for key, value in settings.items()))
    return logged_server(data, tmp_path / f"{name}.log", "--config", str(config),
                         "--admin-listen", "127.0.0.1:0", *extra, open_files=open_files)


def served(wire: Wire) -> bool:
    """True if the connection answers an ApiVersions request."""
    body = wire.call(API_VERSIONS, 3, {"client_software_name": "t",
                                       "client_software_version": "1"})
    return bool(body.error_code is ErrorCode.none)


def closed_at_once(wire: Wire) -> bool:
    """True if the server closes the connection without being asked anything."""
    wire.sock.settimeout(10)
    return wire.is_closed_by_server()


def produce_and_consume(server: LoggedServer, count: int = 5) -> None:
    """A kafka-python producer and consumer on 127.0.0.1 still work."""
    producer = KafkaProducer(bootstrap_servers=server.bootstrap, acks="all",
                             enable_idempotence=False, linger_ms=0)
    try:
        offsets = [producer.send(TOPIC, key=b"k", value=b"v%d" % i).get(timeout=20).offset
                   for i in range(count)]
    finally:
        producer.close(timeout=10)
    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, enable_auto_commit=False,
                             fetch_max_wait_ms=100)
    try:
        consumer.assign([TopicPartition(TOPIC, 0)])
        consumer.seek(TopicPartition(TOPIC, 0), offsets[0])
        seen: list[int] = []
        deadline = time.monotonic() + 30
        while len(seen) < count:
            assert time.monotonic() < deadline, seen
            for messages in consumer.poll(timeout_ms=200).values():
                seen += [m.offset for m in messages]
        assert seen[:count] == offsets
    finally:
        consumer.close()


def warnings_about(server: LoggedServer, mark: int, pattern: str) -> list[str]:
    return [line for line in server.log_since(mark).splitlines()
            if "WARNING" in line and re.search(pattern, line)]


# -- connection limits -----------------------------------------------------------------


def test_connections_over_the_per_ip_limit_are_closed_at_once(tmp_path: Path) -> None:
    with start(tmp_path, {"max_connections_per_ip": 3}) as server:
        mark = server.mark()
        admitted = [Wire(server.address, source="127.0.0.2") for _ in range(3)]
        assert all(served(wire) for wire in admitted)
        refused = [Wire(server.address, source="127.0.0.2") for _ in range(40)]
        assert all(closed_at_once(wire) for wire in refused)
        # Other addresses are not held back by 127.0.0.2's limit.
        produce_and_consume(server)
        with Wire(server.address, source="127.0.0.3") as other:
            assert served(other)
        lines = warnings_about(server, mark, r"127\.0\.0\.2")
        # One line names the address and the limit; not one per refused connection.
        assert 1 <= len(lines) <= 2, lines
        assert "max_connections_per_ip" in lines[0] and "3" in lines[0], lines
        scraped = metrics(server)
        assert sample(scraped, "compactlog_server_connections_refused_total",
                      reason="per_ip") == 40
        assert sample(scraped, "compactlog_server_connections_refused_total",
                      reason="total") == 0
        # A slot freed is a slot free again.
        admitted.pop().sock.close()
        wait_until(lambda: sample(metrics(server), "compactlog_server_connections") <= 2,
                   "the server to see the close", 10)
        with Wire(server.address, source="127.0.0.2") as again:
            assert served(again)
        for wire in admitted + refused:
            wire.sock.close()
        server.assert_running()
        assert "Traceback" not in server.log_since(mark)


def test_connections_over_the_total_limit_are_closed_at_once(tmp_path: Path) -> None:
    with start(tmp_path, {"max_connections": 4}) as server:
        mark = server.mark()
        admitted = [Wire(server.address, source=f"127.0.0.{2 + i}") for i in range(4)]
        assert all(served(wire) for wire in admitted)
        for source in ("127.0.0.9", "127.0.0.1"):
            with Wire(server.address, source=source) as refused:
                assert closed_at_once(refused)
        lines = warnings_about(server, mark, r"max_connections\b")
        assert len(lines) == 1 and "4" in lines[0], lines
        assert sample(metrics(server), "compactlog_server_connections_refused_total",
                      reason="total") == 2
        for wire in admitted:
            wire.sock.close()
        wait_until(lambda: sample(metrics(server), "compactlog_server_connections") == 0,
                   "the server to see the closes", 10)
        produce_and_consume(server)


def test_max_connections_is_capped_by_the_open_file_limit(tmp_path: Path) -> None:
    """With a soft RLIMIT_NOFILE of 200, 100 files are kept for data files and the
    rest may be connections; the cap is logged once at INFO with its reason."""
    # The limit is the server process' own: lowering this process' (which, in a whole
    # test run, holds many clients' sockets) could fail it before the server starts.
    with start(tmp_path, {}, open_files=200) as server:
        line = server.wait_for_log(r"max_connections", 0)
        assert "INFO" in line and "100" in line and "4096" in line and "RLIMIT_NOFILE" in line
        assert sample(metrics(server), "compactlog_server_max_connections") == 100


def test_too_many_open_files_on_accept_does_not_stop_the_server(tmp_path: Path) -> None:
    """EMFILE on accept(): asyncio retries a second later; the server logs one warning
    line, not a traceback per attempt, and serves again once files are free."""
    with start(tmp_path, {}) as server:
        mark = server.mark()
        pid = server.process.pid
        in_use = len(os.listdir(f"/proc/{pid}/fd"))
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (in_use + 3, hard))
        opened = [socket.create_connection(server.address, timeout=10) for _ in range(10)]
        try:
            server.wait_for_log(r"WARNING.*(Too many open files|EMFILE)", mark)
            time.sleep(2.5)  # a few of asyncio's retries, one second apart
            server.assert_running()
        finally:
            for sock in opened:
                sock.close()
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        # The connections waiting in the listen backlog are taken and served.
        produce_and_consume(server)
        since = server.log_since(mark)
        assert "Traceback" not in since, since
        # One line from each part that met EMFILE (accept, upkeep, the ACL reload), not
        # one per attempt.
        lines = [line.split(" ", 3)[3] for line in since.splitlines()
                 if "Too many open files" in line]
        assert len(lines) == len(set(lines)) <= 3, since


# -- idle connections -------------------------------------------------------------------


def test_idle_connections_are_closed(tmp_path: Path) -> None:
    with start(tmp_path, {"connections_max_idle_s": 1.0}) as server:
        silent = Wire(server.address)
        after_a_request = Wire(server.address)
        assert served(after_a_request)
        half_a_frame = Wire(server.address)
        half_a_frame.send(struct.pack(">i", 100) + b"\x00\x12")
        for wire in (silent, after_a_request, half_a_frame):
            assert closed_at_once(wire)  # within 10 s; the limit is 1 s
            wire.sock.close()
        assert sample(metrics(server),
                      "compactlog_server_connections_closed_idle_total") >= 3
        assert "Traceback" not in server.log()


def test_a_long_polling_fetch_is_not_idle(tmp_path: Path) -> None:
    """A Fetch waiting 3 s for data on a server that closes connections idle for 1 s is
    answered; the connection is idle from then on and closed."""
    with start(tmp_path, {"connections_max_idle_s": 1.0}) as server, \
            Wire(server.address) as wire:
        wire.sock.settimeout(30)
        body = wire.call(FETCH, 12, {
            "replica_id": -1, "max_wait": timedelta(seconds=3), "min_bytes": 1,
            "max_bytes": 1 << 20, "isolation_level": 0, "session_epoch": -1,
            "topics": [{"topic": TOPIC, "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]})
        [partition] = body.responses[0].partitions
        assert partition.error_code is ErrorCode.none and partition.records == b""
        assert closed_at_once(wire)


def fetch_all() -> bytes:
    return request_frame(FETCH, 12, {
        "replica_id": -1, "max_wait": timedelta(milliseconds=10), "min_bytes": 1,
        "max_bytes": 100 * MIB, "isolation_level": 0, "session_epoch": -1,
        "topics": [{"topic": TOPIC, "partitions": [
            {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 100 * MIB}]}]})


def test_a_client_that_does_not_read_its_response_is_closed(tmp_path: Path) -> None:
    """A response nobody takes would hold the connection, and its bytes, for ever."""
    data = tmp_path / "data"
    with LogStore.open(data) as store:
        store.create_topic(TOPIC, 1)
        for _ in range(40):  # 20 MB: more than the kernel's socket buffers hold
            store.append(TOPIC, [ProducerRecord(b"k", b"z" * 50_000) for _ in range(10)])
    with start(tmp_path, {"connections_max_idle_s": 1.0}) as server:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(server.address)
        sock.sendall(fetch_all())
        wait_until(lambda: sample(metrics(server),
                                  "compactlog_server_connections_closed_idle_total") == 1,
                   "the server to give up on the unread response", 30)
        sock.close()
        produce_and_consume(server)


def test_a_client_that_reads_nothing_does_not_stop_a_shutdown(tmp_path: Path) -> None:
    """Past shutdown_grace_s the server closes the connection without flushing."""
    data = tmp_path / "data"
    with LogStore.open(data) as store:
        store.create_topic(TOPIC, 1)
        for _ in range(40):
            store.append(TOPIC, [ProducerRecord(b"k", b"z" * 50_000) for _ in range(10)])
    with start(tmp_path, {"shutdown_grace_s": 1.0}) as server:
        unread = socket.socket()
        unread.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        unread.connect(server.address)
        unread.sendall(fetch_all())
        sent = ("compactlog_topic_bytes_out_total", (("topic", TOPIC),))
        wait_until(lambda: metrics(server).get(sent, 0) > 0, "the fetch to be answered", 30)
    # The context checked that the server exited 0, within its 60 s.
    unread.close()


# -- the request memory budget -------------------------------------------------------------


def test_reads_pause_when_the_request_budget_is_spent(tmp_path: Path) -> None:
    """A client holding most of the budget in a half-sent frame makes a producer wait,
    and the wait shows in the paused-time metric; once that frame is whole and answered,
    the producer completes."""
    settings = {"max_request_bytes": MIB, "queued_max_request_bytes": MIB}
    with start(tmp_path, settings) as server:
        frame = produce_frame(900_000)
        holder = Wire(server.address, source="127.0.0.2", timeout=60)
        holder.send(frame[:-1000])
        wait_until(lambda: sample(metrics(server),
                                  "compactlog_server_request_bytes_in_flight") > 800_000,
                   "the first frame's bytes to be counted", 10)
        producer = KafkaProducer(bootstrap_servers=server.bootstrap, acks="all",
                                 enable_idempotence=False, linger_ms=0,
                                 max_request_size=MIB - 10_000)
        try:
            sent = producer.send(TOPIC, key=b"k", value=b"y" * 300_000)
            wait_until(lambda: sample(metrics(server),
                                      "compactlog_server_read_paused_seconds_total") > 0,
                       "reads to pause for the budget", 20)
            holder.send(frame[-1000:])
            _, body = holder.response(PRODUCE, 9)
            assert body.responses[0].partition_responses[0].error_code is ErrorCode.none
            assert sent.get(timeout=30).offset >= 0
        finally:
            producer.close(timeout=10)
            holder.sock.close()
        wait_until(lambda: sample(metrics(server),
                                  "compactlog_server_request_bytes_in_flight") == 0,
                   "every byte to be given back", 10)


def test_concurrent_large_producers_all_complete_under_a_small_budget(
        tmp_path: Path) -> None:
    settings = {"max_request_bytes": MIB, "queued_max_request_bytes": MIB}
    producers, per_producer, size = 6, 25, 100_000
    with start(tmp_path, settings) as server:
        errors: list[BaseException] = []

        def produce(number: int) -> None:
            try:
                producer = KafkaProducer(
                    bootstrap_servers=server.bootstrap, acks="all", enable_idempotence=False,
                    linger_ms=20, batch_size=600_000, max_request_size=MIB - 10_000)
                futures = [producer.send(TOPIC, key=b"p%d" % number,
                                         value=bytes([number]) * size)
                           for _ in range(per_producer)]
                producer.flush(timeout=60)
                for future in futures:
                    future.get(timeout=60)
                producer.close(timeout=10)
            except BaseException as error:  # reported by the main thread
                errors.append(error)

        threads = [threading.Thread(target=produce, args=(n,)) for n in range(producers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads), "a producer hung"
        assert not errors, errors
        consumer = KafkaConsumer(bootstrap_servers=server.bootstrap,
                                 enable_auto_commit=False, fetch_max_wait_ms=100,
                                 max_partition_fetch_bytes=4 * MIB)
        consumer.assign([TopicPartition(TOPIC, 0)])
        consumer.seek_to_beginning()
        seen = 0
        deadline = time.monotonic() + 60
        while seen < producers * per_producer:
            assert time.monotonic() < deadline, seen
            seen += sum(len(m) for m in consumer.poll(timeout_ms=500).values())
        consumer.close()
        assert sample(metrics(server), "compactlog_server_request_bytes_in_flight") == 0


# -- settings ------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "message"), [
    ("max_request_bytes = 2000\nqueued_max_request_bytes = 1000\n",
     "queued_max_request_bytes (1000) must be at least max_request_bytes (2000)"),
    ("queued_max_request_bytes = 1000\n",
     "queued_max_request_bytes (1000) must be at least max_request_bytes (104857600)"),
    ("max_connections = -1\n", "max_connections must be at least 1, got -1"),
    ("max_connections_per_ip = 0\n", "max_connections_per_ip must be at least 1, got 0"),
    ("connections_max_idle_s = -5\n", "connections_max_idle_s must be above 0, got -5"),
    ("max_request_bytes = 0\n", "max_request_bytes must be at least 1, got 0"),
    ("max_connections = 1.5\n", "max_connections must be a int, got 1.5"),
    ("max_connections = 'many'\n", "max_connections must be a int, got 'many'"),
    ("connections_max_idle_s = true\n", "connections_max_idle_s must be a float, got True"),
    ("queued_max_unauthenticated_bytes = 0\n",
     "queued_max_unauthenticated_bytes must be at least 1, got 0"),
    ("max_uncompressed_batch_bytes = 0\n",
     "max_uncompressed_batch_bytes must be at least 1, got 0"),
    ("fetch_max_bytes = -1\n", "fetch_max_bytes must be at least 1, got -1"),
    ("group_min_session_timeout_s = 60.0\ngroup_max_session_timeout_s = 30.0\n",
     "group_max_session_timeout_s (30.0) must be at least group_min_session_timeout_s (60.0)"),
    ("max_groups = 0\n", "max_groups must be at least 1, got 0"),
])
def test_serve_refuses_bad_limit_settings(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "server.toml"
    path.write_text(text)
    result = run(tmp_path / "data", "serve", "--listen", "127.0.0.1:0", "--config", str(path),
                 timeout=30)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture(autouse=True)
def _enough_files() -> Iterator[None]:
    """Raise this process' open-file limit to the hard limit (the server inherits it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
