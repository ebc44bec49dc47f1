"""Idle connections and slow senders do not starve real clients or the server's memory.

1,000 connections that never send a byte (from 127.0.0.2) and 50 slow senders (from
127.0.0.3), each declaring a 50 MiB request and then sending one byte a second, hold
2.5 GB of declared request bytes. Request memory is counted as it arrives, so they hold
a few hundred bytes of the budget, and a confluent-kafka producer and consumer on
127.0.0.1 produce and read back every record meanwhile. The server's resident memory
(VmRSS) stays under RSS_BOUND throughout: the server's own footprint (about 150 MiB
here, mostly pyarrow, kio and the Python runtime) plus room for the clients' batches.
Were the declared sizes allocated or counted, 2.5 GB would be.
"""

from __future__ import annotations

import resource
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from compactlog.storage.store import LogStore
from support.admin import metrics, sample, wait_until
from support.kafka_server import LoggedServer, logged_server

TOPIC = "t"
IDLE, SLOW = 1000, 50
DECLARED = 50 * 1024 * 1024
RECORDS, RECORD_SIZE = 5000, 1000
RSS_BOUND = 256 * 1024 * 1024


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def connect_from(source: str, address: tuple[str, int]) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.settimeout(30)
    sock.connect(address)
    return sock


class Sampler(threading.Thread):
    """The server's peak VmRSS, sampled every 50 ms."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.05):
            self.peak = max(self.peak, rss(self.pid))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LoggedServer]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard >= 2 * (IDLE + SLOW) + 512, f"the hard open-file limit {hard} is too low"
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the server inherits it
    try:
        with LogStore.open(tmp_path / "data") as store:
            store.create_topic(TOPIC, 2)
        with logged_server(tmp_path / "data", tmp_path / "server.log",
                           "--admin-listen", "127.0.0.1:0") as running:
            yield running
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_idle_connections_and_slow_senders_do_not_stop_clients(server: LoggedServer) -> None:
    sampler = Sampler(server.process.pid)
    sampler.start()
    baseline = rss(server.process.pid)
    idle = [connect_from("127.0.0.2", server.address) for _ in range(IDLE)]
    slow = [connect_from("127.0.0.3", server.address) for _ in range(SLOW)]
    for sock in slow:
        sock.sendall(struct.pack(">i", DECLARED))
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(1.0):
            for sock in slow:
                sock.sendall(b"\x00")

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        wait_until(lambda: sample(metrics(server), "compactlog_server_connections")
                   >= IDLE + SLOW, "the server to take every connection", 30)
        producer = Producer({"bootstrap.servers": server.bootstrap, "linger.ms": 5,
                             "acks": "all"})
        acked: list[int] = []
        for number in range(RECORDS):
            producer.produce(TOPIC, b"v" * RECORD_SIZE, b"k%d" % number,
                             on_delivery=lambda error, _: acked.append(error is None))
            producer.poll(0)
        assert producer.flush(60) == 0
        assert len(acked) == RECORDS and all(acked)
        consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "load",
                             "enable.auto.commit": False, "fetch.wait.max.ms": 100})
        try:
            consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(2)])
            seen = 0
            deadline = time.monotonic() + 60
            while seen < RECORDS:
                assert time.monotonic() < deadline, f"read {seen} of {RECORDS}"
                for message in consumer.consume(1000, 0.5):
                    assert message.error() is None, message.error()
                    seen += 1
        finally:
            consumer.close()
        scraped = metrics(server)
        # The slow senders hold what they sent (a byte a second each), not 50 MiB each.
        in_flight = sample(scraped, "compactlog_server_request_bytes_in_flight")
        assert in_flight < 64 * 1024, in_flight
        assert sample(scraped, "compactlog_server_connections") >= IDLE + SLOW
        server.assert_running()
    finally:
        stop.set()
        trickler.join(10)
        sampler.done.set()
        sampler.join(10)
        for sock in idle + slow:
            sock.close()
    print(f"server VmRSS: {baseline / 2**20:.0f} MiB at start, peak "
          f"{sampler.peak / 2**20:.0f} MiB with {IDLE} idle connections, {SLOW} slow "
          f"senders and {RECORDS} records of {RECORD_SIZE} bytes produced and read")
    assert sampler.peak < RSS_BOUND, sampler.peak
    assert "Traceback" not in server.log()
