"""End-to-end scenarios with real, unmodified clients against `compactlog serve`.

For each of aiokafka, confluent-kafka (librdkafka) and kcat: create a compacted topic,
produce keyed records and tombstones with every compression codec, compact the data
directory from this process while the server keeps running (it picks up the new
(horizon, ledger) pair on its upkeep tick), read from offset 0 without and with a
consumer group, commit, restart the server and resume from the committed offsets.

Then the gaps that compaction leaves, read by kafka-python, librdkafka (with default and
one-batch-per-fetch sizes), aiokafka and kcat: a gap inside a batch, at a batch's tail,
whole missing batches, and a compacted view that ends in a gap; from every start offset
a consumer must see exactly the surviving offsets and reach the high watermark.
(kafka-python's own compacted-topic and group scenarios are in test_server_clients.py.)
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewTopic as AioNewTopic
from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin import NewTopic as CkNewTopic
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition

from compactlog import LogStore, ProducerRecord
from compactlog.compaction import load_factory
from support.kafka_server import create_topic as kafka_python_create_topic
from support.kafka_server import running_server

# (partition, offset, key, value); a value of None is a tombstone.
Rec = tuple[int, int, bytes, bytes | None]
# (key, value) to produce, in order.
Item = tuple[bytes, bytes | None]

LOCAL_ENGINE = "local_engine:LocalCompactionServiceFactory"
UPKEEP_S = 0.2
# The server must serve a compaction committed by another process within this time.
PICKUP_TIMEOUT_S = 10.0
TIMEOUT_S = 30.0  # any single client step
# Consumers long-poll this long at the high watermark (the clients' default is 500 ms;
# librdkafka reports end of partition only after such a poll).
FETCH_WAIT_MS = 100
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
CODEC_ID = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
PARTITIONS = 2
KEYS = 12
KCAT = shutil.which("kcat")


def server_args(tmp_path: Path) -> list[str]:
    path = tmp_path / "server.toml"
    path.write_text(f"upkeep_interval_s = {UPKEEP_S}\ngroup_initial_rebalance_delay_s = 0.2\n")
    return ["--config", str(path)]


def compacted_config(keep_tombstones: bool) -> dict[str, str]:
    return {
        "cleanup.policy": "compact",
        "min.compaction.lag.ms": "0",
        # Small segments: all but the active one are sealed, so they can be compacted.
        "segment.bytes": "1024",
        # 0: a tombstone leaves the view in the run that compacts it (Pulsar's rule);
        # else it stays in the view as a tombstone for a day (Kafka's default).
        "delete.retention.ms": "86400000" if keep_tombstones else "0",
    }


def workload(codec: str) -> list[Item]:
    """36 updates over 12 keys, then tombstones for two keys (a different two per codec,
    so earlier deletions are undone by later rounds and the last ones stay). Values are
    compressible so that every codec really compresses."""
    pad = "x" * 80
    items: list[Item] = [
        (b"k%02d" % (i % KEYS), f"{codec}-{i}-{pad}".encode()) for i in range(36)
    ]
    j = CODECS.index(codec)
    items += [(b"k%02d" % (2 * j % KEYS), None), (b"k%02d" % ((2 * j + 1) % KEYS), None)]
    return items


def live_items(tag: str) -> list[Item]:
    """Updates after the horizon: some keys again, one new key and one tombstone."""
    return [(b"k00", f"{tag}-0".encode()), (b"k05", f"{tag}-5".encode()),
            (b"new-" + tag.encode(), b"fresh"), (b"k07", None), (b"k01", f"{tag}-1".encode())]


def by_position(records: Sequence[Rec]) -> list[Rec]:
    return sorted(records, key=lambda r: (r[0], r[1]))


def as_items(records: Sequence[Rec] | Sequence[Item]) -> list[tuple[bytes, bool, bytes]]:
    """The (key, value) pairs as a sorted multiset, tombstones told apart."""
    pairs = [(r[-2], r[-1]) for r in records]
    return sorted((k, v is None, v or b"") for k, v in pairs)


def expected_view(history: Sequence[Rec], horizons: dict[int, int | None],
                  keep_tombstones: bool) -> list[Rec]:
    """What a consumer from offset 0 must see: per partition, the latest record of each
    key up to the horizon (tombstones only when kept), then every record after it."""
    view: list[Rec] = []
    for partition, horizon in horizons.items():
        records = [r for r in by_position(history) if r[0] == partition]
        if horizon is None:
            view += records
            continue
        latest: dict[bytes, Rec] = {}
        for record in records:
            if record[1] <= horizon:
                latest[record[2]] = record
        view += [r for r in latest.values() if keep_tombstones or r[3] is not None]
        view += [r for r in records if r[1] > horizon]
    return by_position(view)


def check_same_history(seen: Sequence[Rec], produced: Sequence[Item]) -> None:
    """`seen` (read back, offsets included) holds exactly the produced records, each
    key's in production order (a key always goes to one partition), at dense offsets."""
    per_key: dict[bytes, list[bytes | None]] = {}
    for _, _, key, value in by_position(seen):
        per_key.setdefault(key, []).append(value)
    wanted: dict[bytes, list[bytes | None]] = {}
    for key, value in produced:
        wanted.setdefault(key, []).append(value)
    assert per_key == wanted
    for partition in {r[0] for r in seen}:
        offsets = [r[1] for r in by_position(seen) if r[0] == partition]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), "dense offsets"


# -- the store, from this process ---------------------------------------------------------


def stored_codecs(data: Path, topic: str) -> set[int]:
    """The compression codec of every stored batch, sealed or in log segments."""
    codecs: set[int] = set()
    with LogStore.open(data, read_only=True) as store:
        for partition in store.topic(topic).partitions:
            partition.refresh()
            for info in partition.manifest.segments:
                table = pq.read_table(partition.segment_dir / info.file,
                                      columns=["batch_attributes"])
                codecs |= {a & 7 for a in table.column(0).to_pylist()}
            for segment in partition.logs:
                codecs |= {header.codec for header, _ in segment.iter_batches()}
    return codecs


def compact_while_serving(data: Path, topic: str) -> dict[int, int | None]:
    """Compact the sealed segments as another process would, while the server runs, with
    the plain-Python engine; returns each partition's new horizon."""
    with LogStore.open(data, read_only=True) as store:
        partitions = store.topic(topic).partitions
        # The server seals rolled segments in its upkeep, in the background.
        deadline = time.monotonic() + 10
        while True:
            for partition in partitions:
                partition.refresh()
            sealed = {p.index: p.stats()["sealed_segments"] for p in partitions}
            if all(sealed.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert all(sealed.values()), f"every partition should have sealed segments: {sealed}"
        service = load_factory(LOCAL_ENGINE).new_service(store, topic, {})
        report = service.compact()
        assert report.total("records_out") < report.total("records_in"), report
        horizons: dict[int, int | None] = {}
        for partition in partitions:
            partition.refresh()
            stats = partition.stats()
            horizons[partition.index] = stats["horizon"]
            assert stats["horizon"] is not None
            # The active segment is never compacted: live records follow the horizon.
            assert stats["horizon"] < stats["log_end_offset"] - 1, stats
    return horizons


def wait_for_pickup(bootstrap: str, topic: str, view: Sequence[Rec]) -> float:
    """Wait until the server serves the compacted view: from offset 0, each partition's
    first record is the view's first (offset 0 itself is compacted away). Returns how
    long it took; the server refreshes manifests every upkeep interval."""
    first: dict[int, int] = {}
    for partition, offset, _, _ in by_position(view):
        first.setdefault(partition, offset)
    assert all(first.values()), f"offset 0 must be gone for the probe to tell: {first}"
    began = time.monotonic()
    while True:
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                 fetch_max_wait_ms=FETCH_WAIT_MS)
        try:
            tps = [KpTopicPartition(topic, p) for p in first]
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, 0)
            seen: dict[int, int] = {}
            deadline = time.monotonic() + TIMEOUT_S
            while len(seen) < len(first):
                assert time.monotonic() < deadline, f"no records from offset 0: {seen}"
                for tp, messages in consumer.poll(timeout_ms=200).items():
                    seen.setdefault(tp.partition, messages[0].offset)
        finally:
            consumer.close()
        waited = time.monotonic() - began
        if seen == first:
            return waited
        assert waited < PICKUP_TIMEOUT_S, (
            f"{waited:.1f} s after the compaction the server still serves {seen} first, "
            f"not the compacted view's {first}")
        time.sleep(UPKEEP_S)


# -- the clients ----------------------------------------------------------------------------


@dataclass
class GroupRead:
    records: list[Rec]
    committed: dict[int, int]  # partition -> committed offset


class Client:
    """One Kafka client, driven the same way by the scenario."""

    name: str

    def create_topic(self, bootstrap: str, topic: str, partitions: int,
                     config: dict[str, str]) -> None:
        raise NotImplementedError

    def produce(self, bootstrap: str, topic: str, codec: str,
                items: Sequence[Item]) -> list[Rec] | None:
        """Produce `items`; the records with their offsets when the client reports them."""
        raise NotImplementedError

    def read(self, bootstrap: str, topic: str, partitions: int, start: int = 0) -> list[Rec]:
        """Read every partition from `start` without a group, up to the high watermark,
        and check that the consumer's position got there."""
        raise NotImplementedError

    def group_read(self, bootstrap: str, topic: str, partitions: int, group: str) -> GroupRead:
        """Subscribe in `group` (from the earliest offset when nothing is committed), read
        to the high watermark of every partition, commit, leave."""
        raise NotImplementedError


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """High watermarks, asked with kafka-python (a neutral referee)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    try:
        tps = [KpTopicPartition(topic, p) for p in range(partitions)]
        return {tp.partition: offset for tp, offset in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def committed_offsets(bootstrap: str, group: str) -> dict[int, int]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    try:
        offsets = admin.list_group_offsets(group)[group]
    finally:
        admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items()}


class AioKafkaClient(Client):
    name = "aiokafka"

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run(asyncio.wait_for(coroutine, TIMEOUT_S))

    def create_topic(self, bootstrap: str, topic: str, partitions: int,
                     config: dict[str, str]) -> None:
        async def run() -> None:
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
            await admin.start()
            try:
                response = await admin.create_topics(
                    [AioNewTopic(topic, partitions, 1, topic_configs=config)])
            finally:
                await admin.close()
            assert [error[1] for error in response.topic_errors] == [0], response

        self._run(run())

    def produce(self, bootstrap: str, topic: str, codec: str,
                items: Sequence[Item]) -> list[Rec]:
        async def run() -> list[Rec]:
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap, acks="all", linger_ms=20,
                compression_type=None if codec == "none" else codec)
            await producer.start()
            try:
                futures = [await producer.send(topic, key=k, value=v) for k, v in items]
                metadata = await asyncio.gather(*futures)
            finally:
                await producer.stop()
            return [(m.partition, m.offset, k, v)
                    for m, (k, v) in zip(metadata, items, strict=True)]

        result: list[Rec] = self._run(run())
        return result

    async def _drain(self, consumer: AIOKafkaConsumer, tps: list[AioTopicPartition],
                     out: list[Rec]) -> None:
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            positions = {tp.partition: await consumer.position(tp) for tp in tps}
            if all(positions[tp.partition] >= ends[tp] for tp in tps):
                break
            assert time.monotonic() < deadline, f"stalled at {positions}, ends {ends}"
            for messages in (await consumer.getmany(timeout_ms=200)).values():
                out += [(m.partition, m.offset, m.key, m.value) for m in messages]
        assert positions == {tp.partition: ends[tp] for tp in tps}

    def read(self, bootstrap: str, topic: str, partitions: int, start: int = 0) -> list[Rec]:
        async def run() -> list[Rec]:
            consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                        auto_offset_reset="none",
                                        fetch_max_wait_ms=FETCH_WAIT_MS)
            await consumer.start()
            out: list[Rec] = []
            try:
                tps = [AioTopicPartition(topic, p) for p in range(partitions)]
                consumer.assign(tps)
                for tp in tps:
                    consumer.seek(tp, start)
                await self._drain(consumer, tps, out)
            finally:
                await consumer.stop()
            return out

        result: list[Rec] = self._run(run())
        return result

    def group_read(self, bootstrap: str, topic: str, partitions: int, group: str) -> GroupRead:
        async def run() -> GroupRead:
            consumer = AIOKafkaConsumer(
                topic, bootstrap_servers=bootstrap, group_id=group,
                auto_offset_reset="earliest", enable_auto_commit=False,
                fetch_max_wait_ms=FETCH_WAIT_MS)
            await consumer.start()
            out: list[Rec] = []
            try:
                while len(consumer.assignment()) < partitions:
                    for messages in (await consumer.getmany(timeout_ms=100)).values():
                        out += [(m.partition, m.offset, m.key, m.value) for m in messages]
                tps = sorted(consumer.assignment())
                await self._drain(consumer, tps, out)
                await consumer.commit()
                committed = {tp.partition: await consumer.committed(tp) for tp in tps}
            finally:
                await consumer.stop()
            return GroupRead(out, committed)

        result: GroupRead = self._run(run())
        return result


def _ck_poll_to_eof(consumer: Consumer, partitions: int) -> tuple[list[Rec], dict[int, int]]:
    """Poll until every partition reported end of partition (at the high watermark) with
    no message after; returns the records and where each partition's EOF was."""
    out: list[Rec] = []
    eof: dict[int, int] = {}
    deadline = time.monotonic() + TIMEOUT_S
    while len(eof) < partitions:
        assert time.monotonic() < deadline, f"stalled: EOF at {eof} after {len(out)} records"
        message = consumer.poll(0.2)
        if message is None:
            continue
        error = message.error()
        if error is not None:
            assert error.code() == KafkaError._PARTITION_EOF, error
            eof[message.partition()] = message.offset()
            continue
        eof.pop(message.partition(), None)
        out.append((message.partition(), message.offset(), message.key(), message.value()))
    return out, eof


class ConfluentClient(Client):
    name = "confluent-kafka"

    def __init__(self, **consumer_settings: Any) -> None:
        self.consumer_settings = consumer_settings

    def create_topic(self, bootstrap: str, topic: str, partitions: int,
                     config: dict[str, str]) -> None:
        admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000,
                             "socket.connection.setup.timeout.ms": 10000})
        futures = admin.create_topics(
            [CkNewTopic(topic, num_partitions=partitions, replication_factor=1, config=config)],
            operation_timeout=10, request_timeout=15)
        futures[topic].result(timeout=TIMEOUT_S)

    def produce(self, bootstrap: str, topic: str, codec: str,
                items: Sequence[Item]) -> list[Rec]:
        producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec,
                             "linger.ms": 20, "acks": "all", "enable.idempotence": False,
                             "message.timeout.ms": int(TIMEOUT_S * 1000)})
        reports: list[tuple[Any, Any]] = []
        for key, value in items:
            producer.produce(topic, key=key, value=value,
                             on_delivery=lambda err, msg: reports.append((err, msg)))
        assert producer.flush(TIMEOUT_S) == 0, "undelivered messages"
        assert [err for err, _ in reports if err is not None] == []
        # Delivery reports come in produce order per partition, not across partitions.
        out = [(m.partition(), m.offset(), m.key(), m.value()) for _, m in reports]
        assert as_items(out) == as_items(items)
        return out

    def _consumer(self, bootstrap: str, group: str | None, **extra: Any) -> Consumer:
        return Consumer({
            "bootstrap.servers": bootstrap,
            # librdkafka wants a group id even for assign(); nothing is committed to it.
            "group.id": group or f"unused-{uuid.uuid4().hex[:8]}",
            "group.protocol": "classic",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "socket.timeout.ms": 10000,
            "fetch.wait.max.ms": FETCH_WAIT_MS,
            **self.consumer_settings,
            **extra,
        })

    def read(self, bootstrap: str, topic: str, partitions: int, start: int = 0) -> list[Rec]:
        consumer = self._consumer(bootstrap, None, **{"auto.offset.reset": "error"})
        try:
            consumer.assign([CkTopicPartition(topic, p, start) for p in range(partitions)])
            out, eof = _ck_poll_to_eof(consumer, partitions)
            positions = consumer.position([CkTopicPartition(topic, p)
                                           for p in range(partitions)])
        finally:
            consumer.close()
        ends = end_offsets(bootstrap, topic, partitions)
        assert eof == ends, "end of partition is reported at the high watermark"
        # librdkafka's position is the application's: after the last message delivered,
        # not after an empty batch or a gap it fetched past (those show in the EOF).
        last = {p: max((r[1] + 1 for r in out if r[0] == p), default=OFFSET_INVALID)
                for p in range(partitions)}
        assert {tp.partition: tp.offset for tp in positions} == last
        return out

    def group_read(self, bootstrap: str, topic: str, partitions: int, group: str) -> GroupRead:
        consumer = self._consumer(bootstrap, group, **{"auto.offset.reset": "earliest"})
        try:
            consumer.subscribe([topic])
            out, eof = _ck_poll_to_eof(consumer, partitions)
            consumer.commit(asynchronous=False)
            committed = consumer.committed(
                [CkTopicPartition(topic, p) for p in range(partitions)], timeout=10)
        finally:
            consumer.close()
        assert eof == end_offsets(bootstrap, topic, partitions)
        return GroupRead(out, {tp.partition: tp.offset for tp in committed})


class KcatClient(Client):
    """kcat (librdkafka as packaged by the OS; Debian 12 ships 2.0.2): no admin API."""

    name = "kcat"
    FORMAT = "%p|%o|%k|%S|%s\\n"
    EOF = re.compile(r"Reached end of topic (\S+) \[(\d+)\] at offset (\d+)")

    def _kcat(self, args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        assert KCAT is not None
        try:
            done = subprocess.run([KCAT, *args], input=stdin, capture_output=True, text=True,
                                  timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired as error:
            raise AssertionError(f"kcat {args} did not finish (stalled?): {error.stderr!r}"
                                 ) from None
        assert done.returncode == 0, (args, done.stderr)
        return done

    def create_topic(self, bootstrap: str, topic: str, partitions: int,
                     config: dict[str, str]) -> None:
        kafka_python_create_topic(bootstrap, topic, partitions, config)

    def produce(self, bootstrap: str, topic: str, codec: str,
                items: Sequence[Item]) -> None:
        lines = "".join(f"{k.decode()}:{(v or b'').decode()}\n" for k, v in items)
        assert all(v != b"" for _, v in items), "-Z turns empty values into tombstones"
        # -Z: an empty value is sent as NULL, a tombstone.
        done = self._kcat(["-b", bootstrap, "-t", topic, "-P", "-K:", "-Z", "-z", codec,
                           "-X", "linger.ms=20"], stdin=lines)
        assert "failed" not in done.stderr.lower(), done.stderr
        return None

    def _parse(self, stdout: str) -> list[Rec]:
        out: list[Rec] = []
        for line in stdout.splitlines():
            partition, offset, key, size, value = line.split("|", 4)
            out.append((int(partition), int(offset), key.encode(),
                        None if size == "-1" else value.encode()))
        return out

    def _eofs(self, stderr: str, topic: str) -> dict[int, int]:
        return {int(p): int(o) for t, p, o in self.EOF.findall(stderr) if t == topic}

    def read(self, bootstrap: str, topic: str, partitions: int, start: int = 0) -> list[Rec]:
        # -e: exit once every partition is at its end, which a stalled consumer never is.
        done = self._kcat(["-b", bootstrap, "-C", "-t", topic, "-o", str(start), "-e",
                           "-f", self.FORMAT, "-X", f"fetch.wait.max.ms={FETCH_WAIT_MS}"])
        assert self._eofs(done.stderr, topic) == end_offsets(bootstrap, topic, partitions)
        return self._parse(done.stdout)

    def group_read(self, bootstrap: str, topic: str, partitions: int, group: str) -> GroupRead:
        # No -o: in -G mode kcat applies it to every assignment, committed offsets or
        # not. auto.offset.reset applies only without one. The offsets are committed when
        # kcat closes the consumer (auto commit).
        done = self._kcat(["-b", bootstrap, "-G", group, topic, "-e", "-f", self.FORMAT,
                           "-X", "auto.offset.reset=earliest",
                           "-X", f"fetch.wait.max.ms={FETCH_WAIT_MS}",
                           "-X", "auto.commit.interval.ms=100"])
        assert self._eofs(done.stderr, topic) == end_offsets(bootstrap, topic, partitions)
        return GroupRead(self._parse(done.stdout), committed_offsets(bootstrap, group))


class KafkaPythonClient(Client):
    name = "kafka-python"

    def __init__(self, **consumer_settings: Any) -> None:
        self.consumer_settings = consumer_settings

    def create_topic(self, bootstrap: str, topic: str, partitions: int,
                     config: dict[str, str]) -> None:
        kafka_python_create_topic(bootstrap, topic, partitions, config)

    def produce(self, bootstrap: str, topic: str, codec: str,
                items: Sequence[Item]) -> list[Rec]:
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20,
                                 enable_idempotence=False,
                                 compression_type=None if codec == "none" else codec)
        try:
            futures = [producer.send(topic, key=k, value=v) for k, v in items]
            producer.flush(timeout=TIMEOUT_S)
            metadata = [future.get(timeout=TIMEOUT_S) for future in futures]
        finally:
            producer.close(timeout=TIMEOUT_S)
        return [(m.partition, m.offset, k, v) for m, (k, v) in zip(metadata, items, strict=True)]

    def read(self, bootstrap: str, topic: str, partitions: int, start: int = 0) -> list[Rec]:
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                 fetch_max_wait_ms=FETCH_WAIT_MS, **self.consumer_settings)
        try:
            tps = [KpTopicPartition(topic, p) for p in range(partitions)]
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, start)
            ends = consumer.end_offsets(tps)
            out: list[Rec] = []
            deadline = time.monotonic() + TIMEOUT_S
            while True:
                positions = {tp: consumer.position(tp) for tp in tps}
                if all(positions[tp] >= ends[tp] for tp in tps):
                    break
                assert time.monotonic() < deadline, f"stalled at {positions}, ends {ends}"
                for messages in consumer.poll(timeout_ms=200).values():
                    out += [(m.partition, m.offset, m.key, m.value) for m in messages]
            assert positions == ends
            return out
        finally:
            consumer.close()

    def group_read(self, bootstrap: str, topic: str, partitions: int, group: str) -> GroupRead:
        consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                 auto_offset_reset="earliest", enable_auto_commit=False,
                                 fetch_max_wait_ms=FETCH_WAIT_MS)
        out: list[Rec] = []
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while len(consumer.assignment()) < partitions:
                assert time.monotonic() < deadline, "the group never assigned every partition"
                for messages in consumer.poll(timeout_ms=100).values():
                    out += [(m.partition, m.offset, m.key, m.value) for m in messages]
            tps = sorted(consumer.assignment(), key=lambda tp: tp.partition)
            ends = consumer.end_offsets(tps)
            while any(consumer.position(tp) < ends[tp] for tp in tps):
                assert time.monotonic() < deadline, "the group read stalled"
                for messages in consumer.poll(timeout_ms=200).values():
                    out += [(m.partition, m.offset, m.key, m.value) for m in messages]
            consumer.commit()
            committed = {tp.partition: consumer.committed(tp) for tp in tps}
        finally:
            consumer.close()
        return GroupRead(out, committed)


needs_kcat = pytest.mark.skipif(KCAT is None,
                                reason="kcat is not installed (scripts/setup.sh --dev)")

CLIENTS: dict[str, tuple[Callable[[], Client], bool]] = {
    # name: (client, keep tombstones in the view)
    "kafka-python": (KafkaPythonClient, True),
    "aiokafka": (AioKafkaClient, False),
    "confluent-kafka": (ConfluentClient, True),
    "kcat": (KcatClient, False),
}


# -- the scenario ---------------------------------------------------------------------------


def end_to_end(name: str, *marks: pytest.MarkDecorator) -> Any:
    return pytest.param(name, marks=[pytest.mark.compat(name, "end-to-end"), *marks])


@pytest.mark.parametrize("name", [
    end_to_end("kafka-python"), end_to_end("aiokafka"), end_to_end("confluent-kafka"),
    end_to_end("kcat", needs_kcat)])
def test_compacted_topic_end_to_end(tmp_path: Path, name: str) -> None:
    make_client, keep_tombstones = CLIENTS[name]
    client = make_client()
    data, topic, group = tmp_path / "data", "prices", "scenario"
    args = server_args(tmp_path)
    produced: list[Item] = []
    with running_server(data, *args) as bootstrap:
        client.create_topic(bootstrap, topic, PARTITIONS, compacted_config(keep_tombstones))

        # Every codec, each from its own producer.
        reported: list[Rec] = []
        for codec in CODECS:
            items = workload(codec)
            produced += items
            got = client.produce(bootstrap, topic, codec, items)
            if got is not None:
                reported += got
        history = client.read(bootstrap, topic, PARTITIONS)
        check_same_history(history, produced)
        if reported:
            assert by_position(history) == by_position(reported)
        # Every codec is stored as sent (kcat too: see test_kcat_compresses_with_every_codec).
        assert stored_codecs(data, topic) >= set(CODEC_ID.values())

        # Compaction in this process while the server runs.
        horizons = compact_while_serving(data, topic)
        view = expected_view(history, horizons, keep_tombstones)
        assert len(view) < len(history)
        wait_for_pickup(bootstrap, topic, view)
        if keep_tombstones:
            assert any(r[3] is None and r[1] <= horizons[r[0]] for r in view), "tombstones kept"
        assert by_position(client.read(bootstrap, topic, PARTITIONS)) == view

        # Live records after the horizon, then a group reads the view and the live log.
        for codec in CODECS[:2]:
            items = live_items(f"live-{codec}")
            produced += items
            client.produce(bootstrap, topic, codec, items)
        after = client.read(bootstrap, topic, PARTITIONS)
        last_before = {p: max(r[1] for r in history if r[0] == p) for p in horizons}
        history += [r for r in after if r[1] > last_before[r[0]]]
        check_same_history(history, produced)
        view = expected_view(history, horizons, keep_tombstones)
        assert by_position(after) == view
        first = client.group_read(bootstrap, topic, PARTITIONS, group)
        assert by_position(first.records) == view
        ends = end_offsets(bootstrap, topic, PARTITIONS)
        assert first.committed == ends

    # Restart: the group resumes from its committed offsets, nothing re-read or lost.
    with running_server(data, *args) as bootstrap:
        assert committed_offsets(bootstrap, group) == ends
        assert by_position(client.read(bootstrap, topic, PARTITIONS)) == view
        items = live_items("after-restart")
        reported = client.produce(bootstrap, topic, "lz4", items) or []
        resumed = client.group_read(bootstrap, topic, PARTITIONS, group)
        assert as_items(resumed.records) == as_items(items)
        assert all(r[1] >= ends[r[0]] for r in resumed.records), "nothing re-read"
        if reported:
            assert by_position(resumed.records) == by_position(reported)
        assert resumed.committed == end_offsets(bootstrap, topic, PARTITIONS)


@needs_kcat
def test_kcat_compresses_with_every_codec(tmp_path: Path) -> None:
    data = tmp_path / "data"
    client = KcatClient()
    with running_server(data) as bootstrap:
        client.create_topic(bootstrap, "z", 1, {})
        for codec in CODECS:
            client.produce(bootstrap, "z", codec, workload(codec))
        assert stored_codecs(data, "z") == set(CODEC_ID.values())


# -- gaps -----------------------------------------------------------------------------------

# One producer batch per line, offsets 0..36, on one partition; keys are letters.
GAP_BATCHES: list[list[tuple[str, str | None]]] = [
    [("A", "a0"), ("B", "b0"), ("C", "c0"), ("D", "d0"), ("E", "e0")],  # 0-4
    [("F", "f0"), ("G", "g0"), ("H", "h0"), ("I", "i0"), ("J", "j0")],  # 5-9
    [(k, k.lower() + "0") for k in "KLMNO"],  # 10-14
    [(k, k.lower() + "0") for k in "PQRST"],  # 15-19
    [("A", "a1"), ("C", "c1"), ("D", "d1"), ("I", "i1"), ("J", "j1")],  # 20-24
    [(k, k.lower() + "1") for k in "KLMNOPQRST"],  # 25-34
    [("K", None), ("L", None)],  # 35-36: tombstones, gone with delete.retention.ms=0
]
# 0 (A) goes: a gap at the head of a batch; 2-3 (C, D): inside it; 8-9 (I, J): at the
# tail of a batch; 10-19: two whole batches; 25-26 (K, L): head of a batch, deleted;
# 35-36: the whole last batch, so the compacted view ends in a gap at the horizon.
GAP_SURVIVORS = [1, 4, 5, 6, 7, *range(20, 25), *range(27, 35)]
GAP_END = 37


def gap_records() -> dict[int, tuple[bytes, bytes | None]]:
    flat = [(k.encode(), None if v is None else v.encode()) for b in GAP_BATCHES for k, v in b]
    return dict(enumerate(flat))


@pytest.fixture
def gap_data(tmp_path: Path) -> Path:
    return build_gap_data(tmp_path / "data")


def build_gap_data(data: Path) -> Path:
    """The topic `gaps`, one batch per GAP_BATCHES line, all sealed and compacted."""
    config = compacted_config(keep_tombstones=False)
    with LogStore.open(data) as store:
        store.create_topic("gaps", partitions=1, config={**config, "segment.bytes": "1048576"})
        for batch in GAP_BATCHES:
            store.append("gaps", [ProducerRecord(k.encode(), None if v is None else v.encode())
                                  for k, v in batch])
        partition = store.topic("gaps").partition(0)
        partition.roll()
    with LogStore.open(data, read_only=True) as store:
        load_factory(LOCAL_ENGINE).new_service(store, "gaps", {}).compact()
        partition = store.topic("gaps").partition(0)
        partition.refresh()
        stats = partition.stats()
        assert (stats["horizon"], stats["log_end_offset"]) == (GAP_END - 1, GAP_END), stats
        survivors = [r.offset for r in partition.read_compacted(0, 1000)]
        assert survivors == GAP_SURVIVORS, "the layout this test is about"
    return data


def check_gap_read(records: list[Rec], start: int, expected: dict[int, Any]) -> None:
    want = [(0, o, k, v) for o, (k, v) in sorted(expected.items()) if o >= start]
    assert records == want


GAP_STARTS = [0, 2, 8, 12, 35, GAP_END]
# One batch per fetch: every gap is crossed between two fetches.
GAP_READERS: dict[str, Callable[[], Client]] = {
    "kafka-python": KafkaPythonClient,
    "kafka-python-tiny-fetch": lambda: KafkaPythonClient(
        max_partition_fetch_bytes=1, fetch_max_bytes=1),
    "confluent-kafka": ConfluentClient,
    "confluent-kafka-tiny-fetch": lambda: ConfluentClient(**{
        "max.partition.fetch.bytes": 1, "fetch.max.bytes": 1000,
        "message.max.bytes": 1000, "receive.message.max.bytes": 1512}),
    "aiokafka": AioKafkaClient,
    "kcat": KcatClient,
}


@pytest.mark.parametrize("reader", [
    pytest.param(name, marks=needs_kcat) if name == "kcat" else name for name in GAP_READERS])
def test_consumers_cross_compaction_gaps(gap_data: Path, reader: str) -> None:
    """From any start offset, inside a gap or not, a consumer gets exactly the surviving
    records and reaches the high watermark, also when the view ends in a gap."""
    client = GAP_READERS[reader]()
    records = gap_records()
    survivors = {o: records[o] for o in GAP_SURVIVORS}
    with running_server(gap_data) as bootstrap:
        for start in GAP_STARTS:
            check_gap_read(client.read(bootstrap, "gaps", 1, start), start, survivors)
        live: list[Item] = [(b"K", b"k2"), (b"U", b"u0"), (b"B", None)]
        reported = client.produce(bootstrap, "gaps", "zstd", live)
        if reported is not None:
            assert [r[1] for r in reported] == [GAP_END, GAP_END + 1, GAP_END + 2]
        survivors.update({GAP_END + i: item for i, item in enumerate(live)})
        for start in (0, 35, GAP_END + 1):
            check_gap_read(client.read(bootstrap, "gaps", 1, start), start, survivors)
