"""Produce and consume throughput of `compactlog serve`, with confluent-kafka on loopback.

For each flush policy of the topic it starts a fresh server on a fresh data directory
(`compactlog --data-dir TMP serve --listen 127.0.0.1:0`, a subprocess, stopped with
SIGTERM), warms it up (1,000 records produced and consumed on another topic: the server
loads each request version's schema on first use), creates the topic with
confluent-kafka's AdminClient and measures:

- produce: a confluent_kafka.Producer tuned for throughput (linger.ms, batch.size, a
  queue as big as the run, Kafka's murmur2 partitioner as compactlog's own `append`
  uses) sends N keyed records, timed from the first produce() to the end of flush().
  Delivery reports go to one callback that counts errors; by default librdkafka reports
  only failures (`delivery.report.only.error`), since a per-record Python callback costs
  the client a third of its throughput here; flush() returning 0 then proves that every
  record was acknowledged. `--delivery-reports all` reports every record. Any error
  fails the bench.
- consume: a confluent_kafka.Consumer assigned every partition from the beginning
  (assign(), so no group membership, rebalance or commit; the Python client insists on
  a group.id all the same) reads until it has N records, timed from assign() to the
  N-th record. The loop only checks each message for an error and counts.
- consume + checksum (the verification pass, timed too): a second consumer reads
  everything again and checks each partition's count against its high watermark, the
  total, and an order-independent checksum of every (key, value) pair against the
  produced ones. A checksum in the timed loop would cost the client about 30%, so the
  timed consume stays lean and this pass carries the check.

The flush policies: the topic default `flush.messages=1` (an fsync per batch before
the produce response) and `flush.messages` at its maximum (fsync left to the OS). The
topic is compacted (`--cleanup-policy`) with the default segment.bytes of 128 MiB, so up
to about 4 M records per partition nothing is sealed: Produce only appends to the log,
and Fetch serves the producer's batches as stored. `--segment-bytes 4194304` measures
the other paths: sealing into Parquet (inline, in the produce path) and Fetch rebuilding
batches from Parquet.

Baselines, in the same run, on the same data, in this process with no server running:
- store API: `LogStore.append` of the same ProducerRecords, in calls of as many
  records as the server received per batch times the partitions (so the same number
  of batches, and of fsyncs), then `Partition.read_table` of every partition: the
  Python API a server is built on (issue 4's ceiling);
- server paths in-process: `Partition.append_batch` of the very record batches the
  producer sent (read back from the server's log segments, replayed into a new data
  directory), and `server.wire.read_batches` of the server's data with the consumer's
  per-partition fetch size: what Produce and Fetch do per partition, without the
  network, the Kafka protocol and the event loop.

Also measured: the server's CPU time per record (psutil: user + system of the server
process, all threads) and this client process's; the server's RSS and CPU% sampled
every 100 ms (mean CPU% is CPU time over wall time; 100% is one core); how the server
stored the records (batches, records per batch, sealed or in log segments).

`--py-spy DIR` records the server with py-spy during the timed produce and consume
(raw collapsed stacks of the thread holding the GIL) and prints its hottest functions
and how busy the GIL was; sampling slows the server, so timings of such a run are not
comparable. py-spy is not a dependency: `.venv/bin/pip install py-spy`.

    .venv/bin/python bench/server.py                       # 2 M records, 4 partitions
    .venv/bin/python bench/server.py --records 200000      # a quick check
    .venv/bin/python bench/server.py --flush os --py-spy /tmp/prof --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
import numpy as np
import psutil  # type: ignore[import-untyped]  # psutil ships no type information
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # defined there; admin re-exports it untyped

from compactlog import LogStore, ProducerRecord
from compactlog.server.protocol.record_batches import read_batches
from machine_info import machine_info

TOPIC = "bench"
WARM_UP_TOPIC = "bench-warm-up"
WARM_UP_RECORDS = 1000
NO_FSYNC = str(2**63 - 1)  # flush.messages: fsync left to the OS
KEY_PREFIX = b"key-"
KEY_DIGITS = 8  # keys are b"key-%08d"
DEFAULT_MAX_MESSAGE_BYTES = 1048588  # the topic default of max.message.bytes
PRODUCE_CHUNK = 10_000  # records between producer.poll(0) calls
CONSUME_BATCH = 10_000  # messages per consumer.consume() call
STALL_S = 30.0  # no progress for this long fails the bench
READ_RECORDS = 100_000  # max_records per Partition.read_table call
MASK64 = 2**64 - 1
PY_SPY_RATE = 250  # samples per second
# Frames every sample of a thread passes through: left out of the inclusive top list.
FRAMEWORK_FRAMES = ("click/", "threading.py", "asyncio/runners.py", "compactlog/cli/",
                    "(compactlog)", "concurrent/futures/thread.py", "asyncio/events.py",
                    "asyncio/base_events.py")
COMPACTLOG = shutil.which("compactlog", path=str(Path(sys.executable).parent)) or "compactlog"
PY_SPY = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")

# (name, flush.messages)
FLUSH_CASES = {
    "per-batch": ("fsync per batch (default)", "1"),
    "os": ("fsync left to the OS", NO_FSYNC),
}


class BenchError(Exception):
    """A delivery error, a wrong count or checksum, or a server that misbehaved."""


# -- the workload -------------------------------------------------------------------------


@dataclass
class Workload:
    keys: list[bytes]
    values: list[bytes]
    digest: int  # order-independent checksum of every (key, value) pair

    @property
    def records(self) -> int:
        return len(self.values)

    @property
    def record_bytes(self) -> int:
        return sum(map(len, self.keys)) + sum(map(len, self.values))


def digest_of(pairs: Iterator[tuple[bytes | None, bytes | None]]) -> int:
    """Sum of the pairs' hashes: equal for the same multiset of pairs in any order (bytes
    hashes are salted per process, so this only compares within one run)."""
    return sum(map(hash, pairs)) & MASK64


def make_workload(records: int, keys: int, value_bytes: int, seed: int) -> Workload:
    """Keys uniform over `keys` distinct ones, random (incompressible) values."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, keys, records, dtype=np.int64)
    powers = 10 ** np.arange(KEY_DIGITS - 1, -1, -1, dtype=np.int64)
    matrix = np.empty((records, len(KEY_PREFIX) + KEY_DIGITS), dtype=np.uint8)
    matrix[:, :len(KEY_PREFIX)] = np.frombuffer(KEY_PREFIX, dtype=np.uint8)
    matrix[:, len(KEY_PREFIX):] = (ids[:, None] // powers) % 10 + ord("0")
    key_list: list[bytes] = matrix.view(f"S{matrix.shape[1]}").ravel().tolist()
    raw = rng.integers(0, 256, (records, value_bytes), dtype=np.uint8)
    values: list[bytes] = raw.view(f"V{value_bytes}").ravel().tolist()  # keeps zero bytes
    return Workload(key_list, values, digest_of(zip(key_list, values, strict=True)))


# -- the server and its sampling ----------------------------------------------------------


class Server:
    """`compactlog serve` on 127.0.0.1 and a free port, as a subprocess."""

    def __init__(self, data_dir: Path, log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115  # closed in stop()
        self.process = subprocess.Popen(
            [COMPACTLOG, "--data-dir", str(data_dir), "serve", "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=self._log, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        match = re.search(r"serving on (\S+):(\d+)", line)
        if not match:
            self.process.kill()
            self.process.wait()
            raise BenchError(f"the server did not start: {line!r}\n{self.log_tail()}")
        self.address = f"{match.group(1)}:{match.group(2)}"
        self.ps = psutil.Process(self.process.pid)

    def cpu_s(self) -> float:
        times = self.ps.cpu_times()
        return float(times.user + times.system)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise BenchError("the server did not stop within 120 s of SIGTERM") from None
        self._log.close()
        if self.process.returncode != 0:
            raise BenchError(f"the server exited with status {self.process.returncode}\n"
                             f"{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class Usage:
    """What one timed phase cost the server and this client process."""

    seconds: float = 0.0
    server_cpu_s: float | None = None
    client_cpu_s: float | None = None
    server_peak_rss: int | None = None
    server_peak_cpu_pct: float | None = None

    @property
    def server_mean_cpu_pct(self) -> float | None:
        if self.server_cpu_s is None or not self.seconds:
            return None
        return 100 * self.server_cpu_s / self.seconds


class Sampler:
    """The server's RSS and CPU% every `interval_s`, as peaks over the current window."""

    def __init__(self, process: Any, interval_s: float = 0.1) -> None:
        self.process = process
        self.interval_s = interval_s
        self.peak_rss = 0
        self.peak_cpu = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="server-sampler", daemon=True)
        self.process.cpu_percent(None)  # the first call only sets the reference point
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                rss = int(self.process.memory_info().rss)
                cpu = float(self.process.cpu_percent(None))
            except psutil.NoSuchProcess:
                return
            with self._lock:
                self.peak_rss = max(self.peak_rss, rss)
                self.peak_cpu = max(self.peak_cpu, cpu)

    def reset(self) -> None:
        rss = int(self.process.memory_info().rss)
        with self._lock:
            self.peak_rss, self.peak_cpu = rss, 0.0
        self.process.cpu_percent(None)

    def peaks(self) -> tuple[int, float]:
        rss = int(self.process.memory_info().rss)
        with self._lock:
            return max(self.peak_rss, rss), self.peak_cpu

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def client_cpu_s() -> float:
    times = os.times()
    return times.user + times.system  # every thread of this process, librdkafka's too


@contextmanager
def measured(usage: Usage, server: Server | None = None,
             sampler: Sampler | None = None) -> Iterator[None]:
    if sampler is not None:
        sampler.reset()
    server_before = server.cpu_s() if server else 0.0
    client_before = client_cpu_s()
    started = time.perf_counter()
    yield
    usage.seconds = time.perf_counter() - started
    usage.client_cpu_s = client_cpu_s() - client_before
    if server is not None:
        usage.server_cpu_s = server.cpu_s() - server_before
    if sampler is not None:
        usage.server_peak_rss, usage.server_peak_cpu_pct = sampler.peaks()


class PySpy:
    """py-spy recording the server during one phase (raw collapsed stacks)."""

    def __init__(self, pid: int, output: Path) -> None:
        assert PY_SPY is not None
        self.output = output
        self.process = subprocess.Popen(
            # --gil: only the thread holding the GIL, which is what bounds a Python
            # server; py-spy's idle detection misses threads parked in queue.get() or
            # epoll, so without it those show as busy.
            [PY_SPY, "record", "--pid", str(pid), "--rate", str(PY_SPY_RATE), "--gil",
             "--format", "raw", "--output", str(output)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        time.sleep(1.0)  # attaching takes a moment; samples before it would be lost
        self.started = time.perf_counter()
        self.seconds = 0.0

    def stop(self) -> None:
        self.seconds = time.perf_counter() - self.started
        self.process.send_signal(signal.SIGINT)
        try:
            _, err = self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
            err = "py-spy did not stop"
        if not self.output.exists():
            print(f"py-spy wrote nothing to {self.output}: {err.strip()[-500:]}", flush=True)


@contextmanager
def maybe_profiled(profile_dir: Path | None, server: Server, name: str) -> Iterator[None]:
    if profile_dir is None:
        yield
        return
    spy = PySpy(server.process.pid, profile_dir / f"{name}.txt")
    try:
        yield
    finally:
        spy.stop()
        if spy.output.exists():
            print_profile(spy.output, spy.seconds)


def print_profile(path: Path, seconds: float, top: int = 15) -> None:
    """The hottest functions of a py-spy raw profile, by own and by inclusive samples;
    `seconds` recorded (the GIL's busy share is samples over rate x seconds)."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        # "function (path/to/file.py:123)": the line numbers go, so functions add up.
        frames = [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")]
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    if not total:
        return
    for frame in [f for f in inclusive if any(part in f for part in FRAMEWORK_FRAMES)]:
        del inclusive[frame]
    busy = total / (PY_SPY_RATE * seconds) if seconds else 0.0
    print(f"\npy-spy {path.name}: {total:,} samples of the thread holding the GIL at "
          f"{PY_SPY_RATE} Hz over {seconds:.1f} s: the GIL was held {busy:.0%} of the time")
    for title, counter in (("own", own), ("inclusive (framework frames left out)", inclusive)):
        print(f"  top {top} by {title} samples:")
        for frame, count in counter.most_common(top):
            print(f"    {100 * count / total:5.1f}%  {count:6,}  {frame[:110]}")
    print(flush=True)


# -- the Kafka clients --------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    records: int
    partitions: int
    value_bytes: int
    keys: int
    acks: str
    compression: str
    linger_ms: float
    batch_size: int
    fetch_bytes: int
    cleanup_policy: str
    segment_bytes: int | None
    delivery_reports: str
    seed: int

    def topic_config(self, flush_messages: str) -> dict[str, str]:
        config = {"cleanup.policy": self.cleanup_policy, "flush.messages": flush_messages}
        if self.segment_bytes is not None:
            config["segment.bytes"] = str(self.segment_bytes)
        if self.batch_size + 65536 > DEFAULT_MAX_MESSAGE_BYTES:
            config["max.message.bytes"] = str(self.batch_size + 65536)
        return config

    def producer_config(self, bootstrap: str) -> dict[str, Any]:
        return {
            "bootstrap.servers": bootstrap,
            "acks": self.acks,
            "compression.type": self.compression,
            "linger.ms": self.linger_ms,
            "batch.size": self.batch_size,
            "batch.num.messages": 1_000_000,  # batch.size is the limit
            "message.max.bytes": max(1_000_000, self.batch_size + 65536),
            # The whole run fits the queue, so produce() never waits for the broker.
            "queue.buffering.max.messages": max(100_000, min(self.records, 2_147_483_647)),
            "queue.buffering.max.kbytes": 2_097_151,
            "partitioner": "murmur2_random",  # Kafka's (and compactlog's) partitioner
            "enable.idempotence": False,
            "delivery.report.only.error": self.delivery_reports == "errors",
        }

    def consumer_config(self, bootstrap: str) -> dict[str, Any]:
        return {
            "bootstrap.servers": bootstrap,
            "group.id": "compactlog-bench",  # required by the client; assign() joins no group
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            "max.partition.fetch.bytes": self.fetch_bytes,
            "fetch.max.bytes": max(52_428_800, self.fetch_bytes * self.partitions),
            # librdkafka stops fetching a partition once its local queue holds
            # queued.min.messages, and then waits fetch.queue.backoff.ms (1 s by default)
            # before it looks again: with big fetches the consumer would sit idle for a
            # second at a time (seen in its fetch debug log).
            "queued.min.messages": 1_000_000,
            "queued.max.messages.kbytes": 262_144,
            "fetch.queue.backoff.ms": 10,
        }


def create_topic(bootstrap: str, settings: Settings, flush_messages: str,
                 name: str = TOPIC, partitions: int | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(
        name, partitions or settings.partitions, 1,
        config=settings.topic_config(flush_messages))], request_timeout=30)
    for future in futures.values():
        future.result(timeout=60)


def warm_up(bootstrap: str, settings: Settings, flush_messages: str) -> None:
    """Produce and consume a few records on another topic with the same client settings:
    the server imports each request version's schema module on its first use."""
    create_topic(bootstrap, settings, flush_messages, WARM_UP_TOPIC, 1)
    deliveries = Deliveries()
    producer = Producer({**settings.producer_config(bootstrap), "on_delivery": deliveries})
    for index in range(WARM_UP_RECORDS):
        producer.produce(WARM_UP_TOPIC, b"%d" % index, b"%d" % index)
    if producer.flush(60) or deliveries.errors:
        raise BenchError(f"warm-up produce failed: {deliveries.first_error}")
    consumer = Consumer(settings.consumer_config(bootstrap))
    try:
        consumer.assign([TopicPartition(WARM_UP_TOPIC, 0, OFFSET_BEGINNING)])
        count, deadline = 0, time.monotonic() + STALL_S
        while count < WARM_UP_RECORDS and time.monotonic() < deadline:
            count += sum(1 for m in consumer.consume(CONSUME_BATCH, 1.0) if m.error() is None)
        if count != WARM_UP_RECORDS:
            raise BenchError(f"warm-up consume read {count} of {WARM_UP_RECORDS} records")
    finally:
        consumer.close()


class Deliveries:
    """The producer's delivery callback: errors, and (with every report) counts."""

    def __init__(self) -> None:
        self.errors = 0
        self.first_error: str | None = None
        self.delivered = 0

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.errors += 1
            if self.first_error is None:
                self.first_error = f"{error} (partition {message.partition()})"
        else:
            self.delivered += 1


def produce(bootstrap: str, settings: Settings, workload: Workload, usage: Usage,
            server: Server, sampler: Sampler) -> None:
    deliveries = Deliveries()
    producer = Producer({**settings.producer_config(bootstrap), "on_delivery": deliveries})
    producer.list_topics(TOPIC, timeout=30)  # connected, with metadata, before the clock
    send, poll = producer.produce, producer.poll
    keys, values = workload.keys, workload.values
    left = -1
    with measured(usage, server, sampler):
        for low in range(0, workload.records, PRODUCE_CHUNK):
            high = low + PRODUCE_CHUNK
            for key, value in zip(keys[low:high], values[low:high], strict=True):
                try:
                    send(TOPIC, value, key)
                except BufferError:  # the queue is full: let deliveries drain it
                    while True:
                        poll(0.01)
                        try:
                            send(TOPIC, value, key)
                            break
                        except BufferError:
                            continue
            poll(0)
        left = producer.flush(300)
    if left:
        raise BenchError(f"produce: {left:,} records still undelivered after flush()")
    if deliveries.errors:
        raise BenchError(f"produce: {deliveries.errors:,} delivery errors, the first: "
                         f"{deliveries.first_error}")
    if settings.delivery_reports == "all" and deliveries.delivered != workload.records:
        raise BenchError(f"produce: {deliveries.delivered:,} delivery reports for "
                         f"{workload.records:,} records")


def assignment(partitions: int) -> list[TopicPartition]:
    return [TopicPartition(TOPIC, index, OFFSET_BEGINNING) for index in range(partitions)]


def consume(bootstrap: str, settings: Settings, records: int, usage: Usage,
            server: Server, sampler: Sampler) -> None:
    """Read `records` records as fast as the client goes: error check and count only."""
    consumer = Consumer(settings.consumer_config(bootstrap))
    try:
        consumer.list_topics(TOPIC, timeout=30)  # connected before the clock
        take = consumer.consume
        count = 0
        with measured(usage, server, sampler):
            consumer.assign(assignment(settings.partitions))
            last_progress = time.monotonic()
            while count < records:
                messages = take(CONSUME_BATCH, 1.0)
                if not messages:
                    if time.monotonic() - last_progress > STALL_S:
                        raise BenchError(f"consume: stalled at {count:,} of {records:,} records")
                    continue
                for message in messages:
                    if message.error() is not None:
                        raise BenchError(f"consume: {message.error()}")
                count += len(messages)
                last_progress = time.monotonic()
        if count != records:
            raise BenchError(f"consume: {count:,} records, expected {records:,}")
    finally:
        consumer.close()


def verify(bootstrap: str, settings: Settings, workload: Workload, usage: Usage,
           server: Server, sampler: Sampler) -> list[int]:
    """Read everything again, checking the count per partition against its high watermark,
    the total and the (key, value) checksum; returns the per-partition counts."""
    consumer = Consumer(settings.consumer_config(bootstrap))
    try:
        consumer.list_topics(TOPIC, timeout=30)
        ends = [consumer.get_watermark_offsets(TopicPartition(TOPIC, index), timeout=30)[1]
                for index in range(settings.partitions)]
        if sum(ends) != workload.records:
            raise BenchError(f"the partitions' high watermarks {ends} add up to {sum(ends):,}, "
                             f"not {workload.records:,}")
        counts = [0] * settings.partitions
        positions = [0] * settings.partitions  # next offset expected, per partition
        digest = 0
        pending = sum(1 for end in ends if end > 0)
        with measured(usage, server, sampler):
            consumer.assign(assignment(settings.partitions))
            last_progress = time.monotonic()
            while pending:
                messages = consumer.consume(CONSUME_BATCH, 1.0)
                if not messages:
                    if time.monotonic() - last_progress > STALL_S:
                        raise BenchError(f"verify: stalled at {positions}, ends {ends}")
                    continue
                last_progress = time.monotonic()
                for message in messages:
                    if message.error() is not None:
                        raise BenchError(f"verify: {message.error()}")
                    index, offset = message.partition(), message.offset()
                    assert index is not None and offset is not None
                    if offset != positions[index]:
                        raise BenchError(f"verify: partition {index} gave offset {offset}, "
                                         f"expected {positions[index]}")
                    positions[index] = offset + 1
                    counts[index] += 1
                    digest += hash((message.key(), message.value()))
                    if positions[index] == ends[index]:
                        pending -= 1
        if sum(counts) != workload.records:
            raise BenchError(f"verify: {sum(counts):,} records, expected {workload.records:,}")
        if digest & MASK64 != workload.digest:
            raise BenchError("verify: the (key, value) checksum differs from the produced one")
        return counts
    finally:
        consumer.close()


# -- what the server stored, and the in-process baselines ---------------------------------


@dataclass
class Stored:
    batches: int = 0
    records: int = 0
    sealed_records: int = 0
    log_bytes: int = 0
    raw: list[tuple[int, bytes]] = field(default_factory=list, repr=False)  # log batches

    @property
    def records_per_batch(self) -> float:
        return self.records / max(self.batches, 1)


def stored_batches(data_dir: Path) -> Stored:
    """The server's batches as stored (the server is stopped): counts, and the raw bytes
    of those still in log segments, for the replay baseline."""
    stored = Stored()
    with LogStore.open(data_dir, read_only=True) as store:
        for partition in store.topic(TOPIC).partitions:
            for info in partition.manifest.segments:
                bases = pq.read_table(partition.segment_dir / info.file,
                                      columns=["batch_base_offset"]).column(0)
                stored.batches += len(pc.unique(bases))
                stored.records += info.record_count
                stored.sealed_records += info.record_count
            for segment in partition.logs:
                for header, raw in segment.iter_batches():
                    stored.batches += 1
                    stored.records += header.record_count
                    stored.log_bytes += len(raw)
                    stored.raw.append((partition.index, raw))
    return stored


def bench_store_append(data_dir: Path, settings: Settings, config: dict[str, str],
                       records: list[ProducerRecord], per_call: int, usage: Usage) -> LogStore:
    store = LogStore.open(data_dir)
    store.create_topic(TOPIC, settings.partitions, config)
    append = store.append
    with measured(usage):
        for low in range(0, len(records), per_call):
            append(TOPIC, records[low:low + per_call])
        store.flush()
    return store


def bench_store_read(store: LogStore, workload: Workload, usage: Usage) -> None:
    """Partition.read_table of every partition; the check (count, checksum) is untimed."""
    count, digest, seconds = 0, 0, 0.0
    client_before = client_cpu_s()
    for partition in store.topic(TOPIC).partitions:
        offset = 0
        while True:
            began = time.perf_counter()
            table = partition.read_table(offset, max_records=READ_RECORDS, max_bytes=64 << 20)
            seconds += time.perf_counter() - began
            if not table.num_rows:
                break
            count += table.num_rows
            offset = table.column("offset")[-1].as_py() + 1
            digest += digest_of(zip(table.column("key").to_pylist(),
                                    table.column("value").to_pylist(), strict=True))
    usage.seconds = seconds
    usage.client_cpu_s = client_cpu_s() - client_before  # includes the check
    if count != workload.records or digest & MASK64 != workload.digest:
        raise BenchError(f"read_table: {count:,} records, or a different checksum")


def bench_replay(data_dir: Path, settings: Settings, config: dict[str, str],
                 stored: Stored, usage: Usage) -> None:
    """Partition.append_batch of the producer's own batches: Produce without the server.
    Each batch is copied into a bytearray first, as the Produce handler does."""
    with LogStore.open(data_dir) as store:
        partitions = store.create_topic(TOPIC, settings.partitions, config).partitions
        with measured(usage):
            for index, raw in stored.raw:
                partitions[index].append_batch(bytearray(raw))
            store.flush()


def bench_wire_read(data_dir: Path, settings: Settings, records: int, usage: Usage) -> None:
    """server.wire.read_batches over the server's data: Fetch without the server."""
    with LogStore.open(data_dir, read_only=True) as store:
        partitions = store.topic(TOPIC).partitions
        total = 0
        with measured(usage):
            for partition in partitions:
                offset, end = 0, partition.log_end_offset
                compacted = partition.config.compacted
                while offset < end:
                    read = read_batches(partition, offset, settings.fetch_bytes, compacted)
                    if read.next_offset <= offset:
                        raise BenchError(f"read_batches: stuck at {partition.name} {offset}")
                    offset = read.next_offset
                total += offset
    if total != records:
        raise BenchError(f"read_batches: read up to {total:,} offsets, expected {records:,}")


# -- the run ------------------------------------------------------------------------------


@dataclass
class Row:
    case: str
    what: str
    records: int
    record_bytes: int
    usage: Usage
    vs_store: float | None = None  # records/s over the store API's
    vs_inproc: float | None = None  # records/s over the in-process server path's

    @property
    def records_per_s(self) -> float:
        return self.records / self.usage.seconds

    @property
    def mb_per_s(self) -> float:
        return self.record_bytes / 1e6 / self.usage.seconds

    def per_record_us(self, cpu_s: float | None) -> float | None:
        return None if cpu_s is None else 1e6 * cpu_s / self.records

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case, "what": self.what, "records": self.records,
            "seconds": self.usage.seconds, "records_per_s": self.records_per_s,
            "mb_per_s": self.mb_per_s, **asdict(self.usage),
            "server_mean_cpu_pct": self.usage.server_mean_cpu_pct,
            "server_cpu_us_per_record": self.per_record_us(self.usage.server_cpu_s),
            "client_cpu_us_per_record": self.per_record_us(self.usage.client_cpu_s),
            "vs_store_api": self.vs_store, "vs_in_process_path": self.vs_inproc,
        }


def run_case(name: str, flush_messages: str, settings: Settings, workload: Workload,
             records: list[ProducerRecord], scratch: Path,
             profile_dir: Path | None) -> tuple[list[Row], dict[str, Any]]:
    print(f"\n== {name}: flush.messages={flush_messages}", flush=True)
    data_dir = scratch / "server-data"
    config = settings.topic_config(flush_messages)
    size = workload.record_bytes
    n = workload.records
    produced, consumed, checked = Usage(), Usage(), Usage()
    server = Server(data_dir, scratch / "server.log")
    sampler = Sampler(server.ps)
    try:
        warm_up(server.address, settings, flush_messages)
        create_topic(server.address, settings, flush_messages)
        tag = "fsync-per-batch" if flush_messages == "1" else "fsync-os"
        with maybe_profiled(profile_dir, server, f"{tag}-produce"):
            produce(server.address, settings, workload, produced, server, sampler)
        print(f"produce: {n / produced.seconds:,.0f} records/s", flush=True)
        with maybe_profiled(profile_dir, server, f"{tag}-consume"):
            consume(server.address, settings, n, consumed, server, sampler)
        print(f"consume: {n / consumed.seconds:,.0f} records/s", flush=True)
        counts = verify(server.address, settings, workload, checked, server, sampler)
        print(f"verified: {n:,} records, per partition {counts}, every (key, value) pair as "
              "produced (checksum), offsets dense up to each high watermark", flush=True)
    except BaseException:
        sampler.stop()
        with contextlib.suppress(BenchError):  # the first error is the one to report
            server.stop()
        raise
    sampler.stop()
    server.stop()

    stored = stored_batches(data_dir)
    if stored.records != n:
        raise BenchError(f"the server stored {stored.records:,} records, not {n:,}")
    where = ("all in log segments" if not stored.sealed_records else
             f"{stored.sealed_records:,} sealed into Parquet, the rest in log segments")
    print(f"stored: {stored.batches:,} batches, {stored.records_per_batch:,.0f} records per "
          f"batch on average; {where}", flush=True)

    per_call = max(1, round(stored.records_per_batch * settings.partitions))
    appended, read, replayed, wire = Usage(), Usage(), Usage(), Usage()
    store = bench_store_append(scratch / "store-api", settings, config, records, per_call,
                               appended)
    try:
        bench_store_read(store, workload, read)
    finally:
        store.close()
    shutil.rmtree(scratch / "store-api")
    replay_note = ""
    if stored.sealed_records:
        replay_note = "some batches were sealed (and rebuilt): no replay baseline"
    else:
        bench_replay(scratch / "replay", settings, config, stored, replayed)
        shutil.rmtree(scratch / "replay")
    stored.raw.clear()
    bench_wire_read(data_dir, settings, n, wire)
    shutil.rmtree(data_dir)

    rows = [
        Row(name, "server: produce (confluent-kafka)", n, size, produced),
        Row(name, "server: consume (confluent-kafka)", n, size, consumed),
        Row(name, "server: consume + checksum (verify)", n, size, checked),
        Row(name, f"store API: LogStore.append ({per_call:,}/call)", n, size, appended),
        Row(name, "store API: Partition.read_table", n, size, read),
    ]
    if not replay_note:
        rows.append(Row(name, "in-process: Partition.append_batch", n, size, replayed))
    rows.append(Row(name, "in-process: wire.read_batches", n, size, wire))
    by_what = {row.what.split(" (")[0]: row for row in rows}
    for server_row, store_key, inproc_key in (
        (rows[0], "store API: LogStore.append", "in-process: Partition.append_batch"),
        (rows[1], "store API: Partition.read_table", "in-process: wire.read_batches"),
        (rows[2], "store API: Partition.read_table", "in-process: wire.read_batches"),
    ):
        server_row.vs_store = server_row.records_per_s / by_what[store_key].records_per_s
        if inproc_key in by_what:
            server_row.vs_inproc = server_row.records_per_s / by_what[inproc_key].records_per_s
    info = {"flush.messages": flush_messages, "topic_config": config,
            "stored_batches": stored.batches, "records_per_batch": stored.records_per_batch,
            "sealed_records": stored.sealed_records, "store_append_records_per_call": per_call,
            "partition_counts": counts, "note": replay_note}
    if replay_note:
        print(f"note: {replay_note}", flush=True)
    return rows, info


def fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def print_table(rows: list[Row]) -> None:
    width = max(len(row.what) for row in rows)
    print(f"\n{'case':26} {'measured':{width}} {'seconds':>8} {'records/s':>11} {'MB/s':>7} "
          f"{'srv CPU':>8} {'srv CPU%':>9} {'srv RSS':>8} {'client':>7} {'÷ store':>8} "
          f"{'÷ in-proc':>9}")
    print(f"{'':26} {'':{width}} {'':>8} {'':>11} {'':>7} {'µs/rec':>8} {'mean/peak':>9} "
          f"{'MiB':>8} {'µs/rec':>7} {'API':>8} {'path':>9}")
    for row in rows:
        usage = row.usage
        cpu_pct = ("" if usage.server_mean_cpu_pct is None else
                   f"{usage.server_mean_cpu_pct:.0f}/{usage.server_peak_cpu_pct or 0:.0f}")
        rss = None if usage.server_peak_rss is None else usage.server_peak_rss / 2**20
        print(f"{row.case:26} {row.what:{width}} {usage.seconds:8.2f} "
              f"{row.records_per_s:11,.0f} {row.mb_per_s:7.1f} "
              f"{fmt(row.per_record_us(usage.server_cpu_s), '8.2f'):>8} {cpu_pct:>9} "
              f"{fmt(rss, '8.0f'):>8} {fmt(row.per_record_us(usage.client_cpu_s), '7.2f'):>7} "
              f"{fmt(row.vs_store, '8.2f'):>8} {fmt(row.vs_inproc, '9.2f'):>9}")
    print("(MB/s: keys + values. srv: the server process, all threads; CPU% 100 = one core. "
          "client: this process, librdkafka's threads included; for read_table it includes the "
          "untimed checksum. ÷: records/s of the server row over the store API's "
          "(append, read_table) and over the in-process server path's (append_batch, "
          "read_batches).)", flush=True)


def print_targets(rows: list[Row]) -> None:
    print("\ntargets of issue 4 (100-byte values): produce >= 250,000 records/s, consume >= "
          "350,000 records/s")
    for row in rows:
        target = {"server: produce (confluent-kafka)": 250_000,
                  "server: consume (confluent-kafka)": 350_000}.get(row.what)
        if target is not None:
            verdict = "meets" if row.records_per_s >= target else "misses"
            print(f"  {row.case:26} {row.what:36} {row.records_per_s:11,.0f}  {verdict}")


def load_average() -> str:
    return " ".join(f"{load:.2f}" for load in os.getloadavg())


def machine() -> dict[str, Any]:
    return {
        **machine_info(),
        "confluent_kafka": confluent_kafka.version()[0],
        "librdkafka": confluent_kafka.libversion()[0],
        "pyarrow": pa.__version__,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--keys", type=int, default=None,
                        help="distinct keys, drawn uniformly (default: records / 10)")
    parser.add_argument("--acks", choices=("0", "1", "-1", "all"), default="1")
    parser.add_argument("--compression", choices=("none", "gzip", "snappy", "lz4", "zstd"),
                        default="none")
    parser.add_argument("--linger-ms", type=float, default=20.0, help="producer linger.ms")
    parser.add_argument("--batch-size", type=int, default=1_000_000,
                        help="producer batch.size, bytes")
    parser.add_argument("--fetch-bytes", type=int, default=4 << 20,
                        help="consumer max.partition.fetch.bytes (and the in-process "
                        "read_batches size)")
    parser.add_argument("--cleanup-policy", choices=("compact", "delete"), default="compact")
    parser.add_argument("--segment-bytes", type=int, default=None,
                        help="topic segment.bytes (default: the topic default, 128 MiB, so "
                        "nothing is sealed below about 4 M records per partition)")
    parser.add_argument("--flush", choices=("both", *FLUSH_CASES), default="both",
                        help="which flush policies to measure")
    parser.add_argument("--delivery-reports", choices=("errors", "all"), default="errors",
                        help="librdkafka delivery reports: failures only, or every record")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--py-spy", type=Path, default=None, metavar="DIR",
                        help="record the server with py-spy into DIR during each server phase "
                        "(slows the server: timings are not comparable)")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory")
    parser.add_argument("--json", type=Path, default=None, help="write all results here")
    args = parser.parse_args()
    if min(args.records, args.partitions, args.value_bytes, args.batch_size,
           args.fetch_bytes) < 1:
        parser.error("--records, --partitions, --value-bytes, --batch-size and --fetch-bytes "
                     "must be >= 1")
    if args.keys is not None and not 1 <= args.keys < 10**KEY_DIGITS:
        parser.error(f"--keys must be in [1, {10**KEY_DIGITS - 1}]")
    if args.py_spy is not None and PY_SPY is None:
        parser.error("--py-spy: py-spy is not installed (.venv/bin/pip install py-spy)")
    return args


def main() -> None:
    args = parse_args()
    keys = args.keys or min(max(1, args.records // 10), 10**KEY_DIGITS - 1)
    settings = Settings(args.records, args.partitions, args.value_bytes, keys, args.acks,
                        args.compression, args.linger_ms, args.batch_size, args.fetch_bytes,
                        args.cleanup_policy, args.segment_bytes, args.delivery_reports,
                        args.seed)
    info = machine()
    started = datetime.datetime.now(datetime.UTC)
    command = shlex.join([sys.executable, *sys.argv])
    print(f"server bench, {started:%Y-%m-%d %H:%M:%S} UTC\ncommand: {command}")
    print(f"machine: {info['cpu']}, {info['cores']} cores, {info['memory']}, {info['os']}; "
          f"load average {load_average()}")
    print(f"software: Python {info['python']}, confluent-kafka {info['confluent_kafka']} "
          f"(librdkafka {info['librdkafka']}), pyarrow {info['pyarrow']}")
    print(f"workload: {settings.records:,} records, {keys:,} keys (uniform), "
          f"{settings.value_bytes}-byte random values, {settings.partitions} partitions, "
          f"cleanup.policy={settings.cleanup_policy}; producer acks={settings.acks}, "
          f"compression {settings.compression}, linger.ms {settings.linger_ms:g}, batch.size "
          f"{settings.batch_size:,}, delivery reports: {settings.delivery_reports}; consumer "
          f"max.partition.fetch.bytes {settings.fetch_bytes:,}", flush=True)
    began = time.perf_counter()
    workload = make_workload(settings.records, keys, settings.value_bytes, settings.seed)
    records = list(map(ProducerRecord, workload.keys, workload.values))
    print(f"generated in {time.perf_counter() - began:.1f} s (not measured)", flush=True)
    if args.py_spy is not None:
        args.py_spy.mkdir(parents=True, exist_ok=True)

    scratch = Path(tempfile.mkdtemp(prefix="server-bench-", dir=args.dir))
    rows: list[Row] = []
    cases: dict[str, Any] = {}
    try:
        for key, (name, flush_messages) in FLUSH_CASES.items():
            if args.flush in ("both", key):
                case_rows, cases[name] = run_case(name, flush_messages, settings, workload,
                                                  records, scratch, args.py_spy)
                rows += case_rows
    except BenchError as error:
        print(f"\nBENCH FAILED: {error}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print_table(rows)
    print_targets(rows)
    print(f"load average at the end: {load_average()} (1, 5, 15 min)")
    if args.py_spy is not None:
        print("(run with --py-spy: the server was sampled, so its timings are slowed)")
    if args.json:
        args.json.write_text(json.dumps({
            "date": started.isoformat(), "command": command, "machine": info,
            "settings": asdict(settings), "cases": cases,
            "rows": [row.to_json() for row in rows],
        }, indent=2, default=str))
        print(f"results written to {args.json}")


if __name__ == "__main__":
    main()
