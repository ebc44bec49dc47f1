"""Produce latency during a full compaction, with and without the compaction I/O cap
(`[compaction] io_max_bytes_per_s`, Kafka's log.cleaner.io.max.bytes.per.second).

For each case (no cap, then each `--cap`): a topic of N records of V incompressible
bytes over K keys is written with the store API and sealed (never compacted, so the run
is a full one), `compactlog serve` starts on 127.0.0.1 (automatic compaction off, a warm
compaction worker, Spark local[2]) and its worker is warmed by compacting a small topic.
Then a confluent-kafka producer (acks=all, linger.ms=0, one record of `--load-bytes`
every 1/`--rate` s, to a topic of its own with the default flush.messages=1, so every
produce waits for an fsync) runs for `--baseline` seconds alone, and then while a full
compaction of the big topic, asked for over the admin API, runs. A record's latency is
from produce() to its delivery report. The compaction's rate is taken from its own
report: (bytes read + bytes written) / the run's duration. Latencies are compared over
the same window in every case: from the run's start until `--window` seconds later or
the run's end, whichever is later, so that a fast run's writes that the kernel flushes
after it count too.

The big topic's files are dropped from the page cache once written (fadvise
DONTNEED, after an fsync), so the compaction reads them from the disk, as a full
compaction of old data does; what it writes (the ledger, fsynced) goes to the disk, as
do the producer's fsyncs.

    .venv/bin/python bench/compaction_throttle.py
    .venv/bin/python bench/compaction_throttle.py --records 20000 --cap 5e6   # quick
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Producer

from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_info import commit, machine_info
from warm_compaction import Server

TOPIC = "t"  # the topic compacted
WARM_TOPIC = "warm"  # compacted first, to start the worker's JVM and Python workers
LOAD_TOPIC = "load"  # the producer's


def generate(data: Path, records: int, keys: int, value_bytes: int, partitions: int) -> None:
    rng = random.Random(1)
    with LogStore.open(data) as store:
        config = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
                  "segment.bytes": str(16 << 20)}
        store.create_topic(TOPIC, partitions=partitions, config=config)
        store.create_topic(WARM_TOPIC, partitions=partitions, config=config)
        store.create_topic(LOAD_TOPIC, partitions=1, config={"cleanup.policy": "delete"})
        for start in range(0, records, 1000):
            store.append(TOPIC, [ProducerRecord(b"k%08d" % ((start + i) % keys),
                                                rng.randbytes(value_bytes))
                                 for i in range(min(1000, records - start))])
        store.append(WARM_TOPIC, [ProducerRecord(b"k%d" % i, b"v") for i in range(1000)])
        for name in (TOPIC, WARM_TOPIC):
            for partition in store.topic(name).partitions:
                partition.roll()
    for path in (data / "topics" / TOPIC).rglob("*.parquet"):
        evict(path)


def evict(path: Path) -> None:
    """Drop `path`'s pages from the page cache (no root needed for a file of one's own)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@dataclass
class Load:
    """A steady acks=all producer; latencies (s) per window, by name."""

    bootstrap: str
    rate: float
    value: bytes
    window: str = "baseline"
    latencies: dict[str, list[float]] = field(default_factory=dict)
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all",
                             "linger.ms": 0, "enable.idempotence": False})
        interval = 1.0 / self.rate
        due = time.monotonic()
        while not self._stop.is_set():
            sent, window = time.monotonic(), self.window
            producer.produce(LOAD_TOPIC, self.value, b"k",
                             on_delivery=partial(self._delivered, sent, window))
            producer.poll(0)
            due += interval
            time.sleep(max(0.0, due - time.monotonic()))
        if producer.flush(60):
            raise SystemExit("records left unacknowledged")

    def _delivered(self, sent: float, window: str, error: KafkaError | None,
                   _message: object) -> None:
        if error is not None:
            self.errors += 1
            return
        self.latencies.setdefault(window, []).append(time.monotonic() - sent)

    def stop(self) -> None:
        self._stop.set()


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 1000) - 1] if len(values) > 1 else 0.0


def run_case(base: Path, args: argparse.Namespace, cap: float) -> dict[str, Any]:
    data = base / f"data-{cap:g}"
    generate(data, args.records, args.keys, args.value_bytes, args.partitions)
    server = Server(data, 300.0, f"io_max_bytes_per_s = {cap}\nspark_master = \"local[2]\"\n")
    try:
        server.compact(WARM_TOPIC)
        load = Load(server.kafka, args.rate, b"x" * args.load_bytes)
        thread = threading.Thread(target=load.run, name="load")
        thread.start()
        try:
            time.sleep(args.baseline)
            load.window = "compaction"
            began = time.monotonic()
            wall_s, report = server.compact(TOPIC)
            time.sleep(max(0.0, began + args.window - time.monotonic()))
            load.window = "after"
        finally:
            load.stop()
            thread.join()
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)
    if load.errors:
        raise SystemExit(f"{load.errors} produce errors")
    moved = report.get("io_read_bytes", 0) + report.get("io_written_bytes", 0)
    return {"cap": cap, "wall_s": wall_s, "duration_s": report["duration_s"],
            "moved": moved, "rate": moved / report["duration_s"],
            "throttled_s": report.get("throttled_s", 0.0), "engine": report["engine"],
            "baseline": load.latencies.get("baseline", []),
            "compaction": load.latencies.get("compaction", [])}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--value-bytes", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--cap", type=float, action="append", default=None,
                        help="io_max_bytes_per_s of a capped case (repeatable; 20e6 if none)")
    parser.add_argument("--rate", type=float, default=200.0, help="records per second produced")
    parser.add_argument("--load-bytes", type=int, default=1000)
    parser.add_argument("--baseline", type=float, default=10.0,
                        help="seconds of producing before the compaction starts")
    parser.add_argument("--window", type=float, default=25.0,
                        help="seconds from the run's start over which latencies are compared "
                             "(the run's whole length if longer)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the cases this many times, interleaved (a row per run)")
    args = parser.parse_args()
    caps = [0.0, *(args.cap or [20e6])] * args.repeat
    info = machine_info()
    print(f"compaction throttle bench, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} "
          f"UTC, commit {commit()}; {info['cpu']}, {info['cores']} cores, {info['memory']}; "
          f"{args.records:,} records of {args.value_bytes} B over {args.keys:,} keys, "
          f"{args.partitions} partitions; load {args.rate:g} records/s of {args.load_bytes} B, "
          f"acks=all; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
          flush=True)
    base = Path(tempfile.mkdtemp(prefix="throttle-bench-"))
    rows = []
    try:
        for cap in caps:
            rows.append(run_case(base, args, cap))
            print(f"  done: cap {cap:g}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("\n| cap (MB/s) | run s | run's I/O (MB) | run's rate (MB/s) | throttled s (sum "
          "over tasks) | produce p50 / p99 ms, alone | from the run's start | records |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        alone, during = row["baseline"], row["compaction"]
        cap = f"{row['cap'] / 1e6:g}" if row["cap"] else "none"
        print(f"| {cap} | {row['duration_s']:.2f} | {row['moved'] / 1e6:.1f} | "
              f"{row['rate'] / 1e6:.1f} | {row['throttled_s']:.1f} | "
              f"{percentile(alone, 0.5) * 1e3:.1f} / {percentile(alone, 0.99) * 1e3:.1f} | "
              f"{percentile(during, 0.5) * 1e3:.1f} / {percentile(during, 0.99) * 1e3:.1f} | "
              f"{len(during):,} |")
    print(f"\nengine: {rows[0]['engine']}; load average at the end "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
