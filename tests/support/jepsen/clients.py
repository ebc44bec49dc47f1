"""The clients of a run: producers and consumer groups pinned to one node each, admin
operations (DeleteRecords, config changes) and `compactlog compact` from outside.

Pinning: bootstrap.servers names one node only; with a single broker the metadata
names only that node, so every request of the client goes there and the history knows
which node answered. A node that stands by does not listen: its clients' requests fail
or wait, and are recorded as such.
"""

from __future__ import annotations

import contextlib
import random
import subprocess
import threading
import time
from pathlib import Path

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from support.jepsen.cluster import COMPACTLOG, Take, child_env, takes_in
from support.jepsen.history import FAILED, OK, UNKNOWN, Commit, History, Op, Read, Send

KV = "kv"  # compact,delete: compaction, DeleteRecords, tombstones
LOG = "log"  # delete with retention.bytes: retention
KEYS = 16
RID = "rid"  # the header that names a record in the history
QUIET = {"log_level": 0, "error_cb": lambda error: None}
# Errors after which an admin operation certainly did not take effect.
REFUSED = {KafkaError.OFFSET_OUT_OF_RANGE, KafkaError.POLICY_VIOLATION,
           KafkaError.INVALID_REQUEST, KafkaError.INVALID_CONFIG,
           KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TRANSPORT,
           KafkaError._ALL_BROKERS_DOWN}


def close_soon(consumer: Consumer, timeout_s: float = 10.0) -> None:
    """Close a consumer, giving up after `timeout_s`: librdkafka's close waits for its
    coordinator, which may have just stepped down."""
    def close() -> None:
        with contextlib.suppress(KafkaException, RuntimeError):
            consumer.close()

    closing = threading.Thread(target=close, daemon=True)
    closing.start()
    closing.join(timeout_s)


def rid_of(headers: list[tuple[str, bytes]] | None) -> str | None:
    for name, value in headers or ():
        if name == RID and value is not None:
            return value.decode()
    return None


class ProducerWorker(threading.Thread):
    """Sends keyed records (some tombstones) to one node at about `rate` per second, and
    records each send and its outcome. acks=all producers are idempotent (a retry is
    never appended twice); acks=1 ones are not (librdkafka needs acks=all for it)."""

    def __init__(self, name: str, node: str, bootstrap: str, acks: str, history: History,
                 seed: str, rate: float, stop: threading.Event,
                 message_timeout_s: float) -> None:
        super().__init__(name=f"producer-{name}", daemon=True)
        self.producer_name = name
        self.node = node
        self.bootstrap = bootstrap
        self.acks = acks
        self.history = history
        self.rng = random.Random(seed)
        self.rate = rate
        self.stop = stop
        self.timeout_s = message_timeout_s
        self.fatal = False
        self.sequence = 0

    def _new(self) -> Producer:
        return Producer({
            **QUIET, "bootstrap.servers": self.bootstrap, "acks": self.acks,
            "enable.idempotence": self.acks == "all", "partitioner": "murmur2_random",
            "linger.ms": 5, "message.timeout.ms": int(self.timeout_s * 1000),
            "request.timeout.ms": 4000, "retry.backoff.ms": 100,
            "retry.backoff.max.ms": 500, "reconnect.backoff.ms": 100,
            "reconnect.backoff.max.ms": 500, "socket.connection.setup.timeout.ms": 3000,
            "client.id": self.producer_name})

    def _report(self, send: Send, error: KafkaError | None, message: Message) -> None:
        send.ack_time = time.time()
        if error is not None:
            send.error = error.str()
            if error.fatal():
                self.fatal = True
            return
        send.partition = message.partition()
        send.offset = message.offset()

    def _send(self, producer: Producer) -> None:
        topic = LOG if self.rng.random() < 0.15 else KV
        key = f"k{self.rng.randrange(KEYS)}".encode()
        rid = f"{self.producer_name}-{self.sequence}"
        self.sequence += 1
        tombstone = topic == KV and self.rng.random() < 0.1
        value = None if tombstone else f"{rid}:{self.rng.randrange(1 << 30)}".encode()
        send = Send(self.producer_name, self.node, self.acks, topic, key, value, rid,
                    time.time())
        self.history.add(send)
        try:
            producer.produce(topic, value=value, key=key, headers=[(RID, rid.encode())],
                             on_delivery=lambda e, m: self._report(send, e, m))
        except (BufferError, KafkaException) as error:
            send.ack_time = time.time()
            send.error = f"not sent: {error}"

    def run(self) -> None:
        producer = self._new()
        while not self.stop.is_set():
            self._send(producer)
            producer.poll(0)  # serves the delivery reports; returns at once
            self.stop.wait(self.rng.uniform(0.5, 1.5) / self.rate)
            if self.fatal:  # an idempotent producer's fatal error: start a new one
                self.history.note(f"{self.producer_name}: fatal error, producer recreated")
                producer.purge()
                producer.flush(1)
                producer = self._new()
                self.fatal = False
        producer.flush(self.timeout_s + 5)
        producer.purge()
        producer.flush(1)


class GroupWorker(threading.Thread):
    """One consumer group pinned to one node: a member subscribes to KV, records what it
    reads, commits what it processed (synchronously, every few records or second), and
    leaves after a while without committing what it read since, so that the next
    member resumes from the committed offsets."""

    def __init__(self, group: str, node: str, bootstrap: str, history: History, seed: str,
                 stop: threading.Event) -> None:
        super().__init__(name=f"group-{group}", daemon=True)
        self.group = group
        self.node = node
        self.bootstrap = bootstrap
        self.history = history
        self.rng = random.Random(seed)
        self.stop = stop
        self.members = 0

    def run(self) -> None:
        while not self.stop.is_set():
            self.members += 1
            member = f"{self.group}-{self.members}"
            consume(self.group, member, self.node, self.bootstrap, self.history,
                    until=time.monotonic() + self.rng.uniform(8, 30), stop=self.stop)


def group_consumer(group: str, member: str, bootstrap: str, eof: bool = False) -> Consumer:
    return Consumer({
        **QUIET, "bootstrap.servers": bootstrap, "group.id": group, "client.id": member,
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
        "enable.partition.eof": eof, "reconnect.backoff.ms": 100,
        "reconnect.backoff.max.ms": 500, "topic.metadata.refresh.interval.ms": 2000,
        "socket.connection.setup.timeout.ms": 3000})


def commit(consumer: Consumer, history: History, group: str, member: str, node: str,
           pending: dict[tuple[str, int], int]) -> bool:
    if not pending:
        return True
    offsets = {f"{t}/{p}": o for (t, p), o in pending.items()}
    entry = Commit(group, member, node, time.time(), offsets)
    history.add(entry)
    try:
        answer = consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in
                                          pending.items()], asynchronous=False)
        errors = [str(tp.error) for tp in answer or () if tp.error is not None]
        if errors:
            entry.error = "; ".join(errors)
            return False
    except KafkaException as error:
        entry.error = str(error)
        return False
    pending.clear()
    return True


def consume(group: str, member: str, node: str, bootstrap: str, history: History,
            until: float, stop: threading.Event | None = None,
            partitions: int | None = None) -> bool:
    """One member's life: read and commit until `until` (or `stop`). With `partitions`
    (the catch-up at the end of a run), until it has read every partition to its end
    and committed that; returns whether it got there."""
    consumer = group_consumer(group, member, bootstrap, eof=partitions is not None)
    pending: dict[tuple[str, int], int] = {}
    at_end: set[int] = set()
    last_commit = time.monotonic()
    try:
        consumer.subscribe([KV])
        while time.monotonic() < until and not (stop is not None and stop.is_set()):
            message = consumer.poll(0.3)
            if message is not None and message.error() is None:
                history.add(Read(group, member, node, message.topic(), message.partition(),
                                 message.offset(), message.key(), message.value(),
                                 rid_of(message.headers()), time.time()))
                pending[(message.topic(), message.partition())] = message.offset() + 1
                at_end.discard(message.partition())
            elif message is not None and message.error().code() == KafkaError._PARTITION_EOF:
                at_end.add(message.partition())
            if pending and (time.monotonic() - last_commit > 1.0 or partitions is not None):
                commit(consumer, history, group, member, node, pending)
                last_commit = time.monotonic()
            if partitions is not None and not pending and len(at_end) == partitions:
                return True
    except KafkaException as error:
        history.note(f"{member}: {error}")
    finally:
        close_soon(consumer)
    return False


def read_view(bootstrap: str, topic: str, partitions: int,
              timeout_s: float = 60.0) -> dict[int, list[tuple[int, bytes | None,
                                                                bytes | None]]] | None:
    """The compacted view through Kafka Fetch: a consumer of `topic` from the earliest
    offset to the end of each partition; None when it did not get there in time."""
    # A group id is required, though an assigned consumer never joins its group.
    consumer = Consumer({**QUIET, "bootstrap.servers": bootstrap, "group.id": "view-check",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    found: dict[int, list[tuple[int, bytes | None, bytes | None]]] = {
        p: [] for p in range(partitions)}
    left = set(range(partitions))
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in left])
        deadline = time.monotonic() + timeout_s
        while left and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:
                    left.discard(message.partition())
                continue
            found[message.partition()].append((message.offset(), message.key(),
                                               message.value()))
    finally:
        close_soon(consumer)
    return None if left else found


def admin_client(bootstrap: str) -> AdminClient:
    return AdminClient({**QUIET, "bootstrap.servers": bootstrap,
                        "socket.connection.setup.timeout.ms": 3000})


def outcome_of(error: BaseException) -> str:
    if isinstance(error, KafkaException) and error.args:
        code = error.args[0].code() if isinstance(error.args[0], KafkaError) else None
        if code in REFUSED:
            return FAILED
    return UNKNOWN


def delete_records(bootstrap: str, node: str, partition: int, before: int,
                   history: History) -> None:
    op = Op("delete-records", node, time.time(), {"topic": KV, "partition": partition,
                                                 "before": before})
    history.add(op)
    try:
        admin = admin_client(bootstrap)  # kept until the answer: destroying it fails it
        futures = admin.delete_records([TopicPartition(KV, partition, before)],
                                       request_timeout=8)
        for future in futures.values():
            result = future.result(timeout=10)
            op.detail = f"low watermark {result.low_watermark}"
        op.outcome = OK
    except Exception as error:
        op.outcome = outcome_of(error)
        op.detail = str(error)
    op.end = time.time()


def alter_config(bootstrap: str, node: str, key: str, value: str, history: History) -> None:
    op = Op("alter-config", node, time.time(), {"topic": KV, "key": key, "value": value})
    history.add(op)
    try:
        resource = ConfigResource(ResourceType.TOPIC, KV, incremental_configs=[
            ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
        admin = admin_client(bootstrap)  # kept until the answer: destroying it fails it
        for future in admin.incremental_alter_configs([resource],
                                                      request_timeout=8).values():
            future.result(timeout=10)
        op.outcome = OK
    except Exception as error:
        op.outcome = outcome_of(error)
        op.detail = str(error)
    op.end = time.time()


class ExternalCompactions:
    """`compactlog compact KV` run as a subprocess now and then, one at a time, with the
    AWS settings pointing at the proxy and a fresh local directory each time; every run
    and its outcome recorded (a run may fail while the lease moves: that is recorded,
    not a failure of the test). Its log is kept: should it ever take the writer lease,
    that counts in the ownership intervals."""

    def __init__(self, where: str, env: dict[str, str], workdir: Path,
                 history: History) -> None:
        self.where = where
        self.env = env
        self.workdir = workdir
        self.history = history
        self.runs = 0
        self.logs: list[Path] = []
        self._thread: threading.Thread | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> bool:
        if self._thread is not None and self._thread.is_alive():
            return False
        self.runs += 1
        self._thread = threading.Thread(target=self._run, args=(self.runs,), daemon=True)
        self._thread.start()
        return True

    def _run(self, number: int) -> None:
        local = self.workdir / f"compact-{number}"
        log_path = self.workdir / f"compact-{number}.log"
        self.logs.append(log_path)
        op = Op("compact", "outside", time.time(), {"run": number})
        self.history.add(op)
        with log_path.open("wb") as handle:
            self._process = subprocess.Popen(
                [COMPACTLOG, "--data-dir", self.where, "--log-level", "info", "compact", KV,
                 "--json"], stdin=subprocess.DEVNULL, stdout=handle,
                stderr=subprocess.STDOUT,
                env=child_env({**self.env, "COMPACTLOG_LOCAL_DIR": str(local)}))
            try:
                code = self._process.wait(120)
            except subprocess.TimeoutExpired:
                self._process.kill()
                code = self._process.wait(30)
        op.end = time.time()
        op.outcome = OK if code == 0 else FAILED
        lines = log_path.read_text(errors="replace").strip().splitlines()
        op.detail = f"exit {code}: {lines[-1][:300] if lines else ''}"

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
        if self._thread is not None:
            self._thread.join(150)

    def takes(self) -> list[Take]:
        found = []
        for index, path in enumerate(self.logs, 1):
            if path.exists():
                found += takes_in(path.read_text(errors="replace"), f"compact-{index}")
        return found

