"""The operations that the fault tests break at every step (tests/support/faultkit.py), each
with the data directory it starts from and what its oracle expects.

Shared by tests/faults/test_fault_steps.py (faults raised or stalls, in process) and
tests/support/fault_child.py (SIGKILL, in a child process that reports its acknowledgements).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from compactlog.errors import CompactlogError
from compactlog.storage.merging import merge_small_segments
from compactlog.storage.partition import Partition
from compactlog.storage.records import ProducerRecord, Record
from compactlog.storage.retention import expired_segments
from compactlog.storage.store import LogStore
from support.fakes import FakeClock
from support.faultkit import TOPIC, Oracle, compact

COMPACTED = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
             "segment.bytes": "2048", "parquet.row.group.bytes": "65536"}
Report = Callable[[int, Record], None]  # an acknowledged record: (partition, record)


@dataclass(frozen=True)
class Scenario:
    name: str
    # Fills a freshly opened store (local or on S3: the caller opens it).
    prepare: Callable[[LogStore, FakeClock], None]
    operation: Callable[[LogStore, Oracle, FakeClock, Report], None]
    # Extends the oracle with what the operation may legitimately have changed.
    expect: Callable[[LogStore, Oracle], None] = lambda store, oracle: None
    server_mode: bool = False  # the store seals in upkeep, not in the append
    # What else must hold after a fault and a reopen.
    verify: Callable[[LogStore, str], None] = lambda store, where: None

    def open(self, data: Path, clock: FakeClock, read_only: bool = False) -> LogStore:
        store = LogStore.open(data, read_only=read_only, clock=clock)
        store.auto_seal = not self.server_mode
        return store


def records(keys: int, tag: str, size: int = 120) -> list[ProducerRecord]:
    return [ProducerRecord(b"k%02d" % k, f"{tag}-{k}-".encode().ljust(size, b"x"))
            for k in range(keys)]


def fill(store: LogStore, rounds: int, keys: int, tag: str) -> None:
    for round_ in range(rounds):
        store.append(TOPIC, records(keys, f"{tag}{round_}"))
    for partition in store.topic(TOPIC).partitions:
        partition.roll()


# -- appends: a batch written, fsynced, indexed; rolls and seals inside the append ------

def prepare_append(store: LogStore, clock: FakeClock) -> None:
    store.create_topic(TOPIC, 1, {"segment.bytes": "1024"})
    store.append(TOPIC, [ProducerRecord(b"a", b"first".ljust(300, b"."))])


def appended_record(partition: Partition, offset: int) -> Record:
    """The record just appended at `offset`, from the log itself: on an object store it
    is below the high watermark (readable through the view) only once uploaded."""
    return next(found for segment in partition.logs
                for found in segment.read(offset, 1, 1 << 20))


def append_three(store: LogStore, oracle: Oracle, clock: FakeClock, report: Report) -> None:
    partition = store.topic(TOPIC).partition(0)
    for i in range(3):
        value = f"append-{i}".encode().ljust(400, b".")
        try:
            result = partition.append([ProducerRecord(b"k%d" % i, value)])
        except (OSError, CompactlogError):
            oracle.refused_values.add(value)
            continue
        report(0, appended_record(partition, result.base_offset))


# -- sealing in the server's way: upkeep seals rolled segments ----------------------------

def prepare_seal(store: LogStore, clock: FakeClock) -> None:
    store.auto_seal = False
    store.create_topic(TOPIC, 1, {"segment.bytes": "1024"})
    for i in range(6):
        store.append(TOPIC, [ProducerRecord(b"k%d" % i, b"v%d" % i + b"." * 300)])


def seal(store: LogStore, oracle: Oracle, clock: FakeClock, report: Report) -> None:
    # A seal that fails leaves the log files, read as before.
    with contextlib.suppress(OSError, CompactlogError):
        store.topic(TOPIC).partition(0).seal_rolled()


# -- merging small sealed segments (storage/merging.py), across a compaction horizon ----

def prepare_merge(store: LogStore, clock: FakeClock) -> None:
    store.create_topic(TOPIC, 1, COMPACTED)
    for round_ in range(3):
        fill(store, 1, 3, f"a{round_}")  # one small sealed segment each
    compact(store, clock)
    for round_ in range(3):
        fill(store, 1, 3, f"b{round_}")


def merge(store: LogStore, oracle: Oracle, clock: FakeClock, report: Report) -> None:
    # Parquet files of a few records are a few KiB: a larger bound calls them small.
    with contextlib.suppress(OSError, CompactlogError):
        while merge_small_segments(store.topic(TOPIC).partition(0), 2, 1 << 20):
            pass


# -- compaction of one and of two partitions (a second run: a previous ledger exists) ----

def prepare_compaction(partitions: int) -> Callable[[Path, FakeClock], None]:
    def prepare(store: LogStore, clock: FakeClock) -> None:
        store.create_topic(TOPIC, partitions, COMPACTED)
        fill(store, 3, 12, "a")
        compact(store, clock)
        fill(store, 2, 12, "b")
        store.append(TOPIC, [ProducerRecord(b"k%02d" % k, None) for k in (3, 7)])
        for partition in store.topic(TOPIC).partitions:
            partition.roll()
    return prepare


def compaction(store: LogStore, oracle: Oracle, clock: FakeClock, report: Report) -> None:
    with contextlib.suppress(OSError, CompactlogError):
        compact(store, clock)


# Incremental runs with deletion vectors (the Arrow tasks, in process), never a rewrite:
# the second run writes a DV for each previous ledger file and a ledger file for the new
# survivors, and commits them in one manifest version.
WITH_DVS = {**COMPACTED, "compaction.deletion.vectors": "true",
            "compaction.ledger.rewrite.live.fraction": "0"}


def prepare_dv_compaction(partitions: int) -> Callable[[Path, FakeClock], None]:
    def prepare(store: LogStore, clock: FakeClock) -> None:
        store.create_topic(TOPIC, partitions, WITH_DVS)
        fill(store, 3, 12, "a")
        compact(store, clock, engine="arrow")
        fill(store, 2, 5, "b")  # keys k00..k04 again: their old records leave by DV
        store.append(TOPIC, [ProducerRecord(b"k%02d" % k, None) for k in (3, 7)])
        for partition in store.topic(TOPIC).partitions:
            partition.roll()
    return prepare


def dv_compaction(store: LogStore, oracle: Oracle, clock: FakeClock, report: Report) -> None:
    with contextlib.suppress(OSError, CompactlogError):
        compact(store, clock, engine="arrow")


def verify_dv_compaction(store: LogStore, where: str) -> None:
    """Whichever pair is in force, every DV it lists is whole (the reads checked the
    view against the oracle)."""
    for partition in store.topic(TOPIC).partitions:
        for info in partition.manifest.ledger:
            if info.dv_file:
                assert partition.data_path(f"ledger/{info.dv_file}").exists(), where


# The same with the second run's dirty segments adopted into the ledger as they are
# (compaction/adoption.py): its steps link each segment into ledger/ and write its DV.
WITH_ADOPTION = {**WITH_DVS, "compaction.segment.adopt.min.bytes": "0",
                 "compaction.segment.adopt.live.fraction": "0"}


def prepare_adopting_compaction(store: LogStore, clock: FakeClock) -> None:
    store.create_topic(TOPIC, 1, WITH_ADOPTION)
    fill(store, 3, 12, "a")
    compact(store, clock, engine="arrow")
    fill(store, 2, 5, "b")
    store.append(TOPIC, [ProducerRecord(b"k%02d" % k, None) for k in (3, 7)])
    store.topic(TOPIC).partition(0).roll()


def verify_adopting_compaction(store: LogStore, where: str) -> None:
    """Whichever pair is in force, each adopted file it lists is whole and its DV too."""
    verify_dv_compaction(store, where)
    for info in store.topic(TOPIC).partition(0).manifest.ledger:
        if info.adopted_at_ms is not None:
            path = store.topic(TOPIC).partition(0).ledger_dir / info.file
            assert path.stat().st_size == info.size_bytes, where


# Small ledger files merged (compaction/incremental.py small_runs): two runs leave two
# small ledger files, and the third rewrites both with its new survivors (into two
# files: phase 2 rolls at the scenario's tiny segment.bytes), retiring them and their
# DVs in the same manifest version.
WITH_MERGE = {**WITH_DVS, "compaction.ledger.merge.min.files": "2"}


def prepare_merging_compaction(store: LogStore, clock: FakeClock) -> None:
    store.create_topic(TOPIC, 1, WITH_MERGE)
    fill(store, 3, 12, "a")
    compact(store, clock, engine="arrow")
    fill(store, 1, 8, "b")  # k00..k07 again: the first file keeps k08..k11
    compact(store, clock, engine="arrow")
    assert len(store.topic(TOPIC).partition(0).manifest.ledger) == 2, "two small files"
    fill(store, 2, 5, "c")
    store.append(TOPIC, [ProducerRecord(b"k%02d" % k, None) for k in (3, 9)])
    store.topic(TOPIC).partition(0).roll()


def verify_merging_compaction(store: LogStore, where: str) -> None:
    """Whichever pair is in force, every file and DV it lists is whole (the two small
    files or what they merged into), on a local disk or fetched from the bucket."""
    verify_dv_compaction(store, where)
    partition = store.topic(TOPIC).partition(0)
    for info in partition.manifest.ledger:
        size = partition.data_path(f"ledger/{info.file}").stat().st_size
        assert size == info.size_bytes, where


def expect_compaction(store: LogStore, oracle: Oracle) -> None:
    for index, partition in enumerate(store.topic(TOPIC).partitions):
        oracle.horizons[index].add(partition.manifest.sealed_end_offset - 1)


# -- retention: segments leave the log, their files are retired, then swept --------------

def prepare_retention(store: LogStore, clock: FakeClock) -> None:
    store.create_topic(TOPIC, 1, {"segment.bytes": "1024", "retention.ms": "-1"})
    for i in range(12):
        store.append(TOPIC, [ProducerRecord(b"k%d" % i, b"v%d" % i + b"." * 300)])
    store.alter_topic(TOPIC, {"retention.bytes": "3000"})


def retention(store: LogStore, oracle: Oracle, clock: FakeClock, report: Report) -> None:
    partition = store.topic(TOPIC).partition(0)
    with contextlib.suppress(OSError, CompactlogError):
        partition.apply_retention()
        clock.advance_ms(partition.config["file.delete.delay.ms"])
        partition.sweep()


def expect_retention(store: LogStore, oracle: Oracle) -> None:
    partition = store.topic(TOPIC).partition(0)
    log_bytes = sum(segment.size for segment in partition.logs)
    doomed = expired_segments(partition.manifest, partition.config, partition.now_ms(),
                              log_bytes)
    assert doomed, "the retention scenario must remove something"
    oracle.log_starts[0].add(doomed[-1].last_offset + 1)


# -- a topic config change ------------------------------------------------------------

def prepare_alter(store: LogStore, clock: FakeClock) -> None:
    store.create_topic(TOPIC, 2, {"segment.bytes": "4096"})
    store.append(TOPIC, records(6, "a"))


def alter(store: LogStore, oracle: Oracle, clock: FakeClock, report: Report) -> None:
    with contextlib.suppress(OSError, CompactlogError):
        store.alter_topic(TOPIC, {"segment.bytes": "8192", "retention.ms": "1000"})


def verify_alter(store: LogStore, where: str) -> None:
    config = store.topic(TOPIC).config
    pair = (config["segment.bytes"], config["retention.ms"])
    assert pair in ((4096, 7 * 24 * 3600 * 1000), (8192, 1000)), f"{where}: config {pair}"


SCENARIOS = {scenario.name: scenario for scenario in (
    Scenario("append", prepare_append, append_three),
    Scenario("seal", prepare_seal, seal, server_mode=True),
    Scenario("compact-1", prepare_compaction(1), compaction, expect_compaction),
    Scenario("compact-2", prepare_compaction(2), compaction, expect_compaction),
    Scenario("compact-dv-1", prepare_dv_compaction(1), dv_compaction, expect_compaction,
             verify=verify_dv_compaction),
    Scenario("compact-dv-2", prepare_dv_compaction(2), dv_compaction, expect_compaction,
             verify=verify_dv_compaction),
    Scenario("compact-adopt", prepare_adopting_compaction, dv_compaction, expect_compaction,
             verify=verify_adopting_compaction),
    Scenario("compact-merge", prepare_merging_compaction, dv_compaction, expect_compaction,
             verify=verify_merging_compaction),
    Scenario("retention", prepare_retention, retention, expect_retention),
    Scenario("alter", prepare_alter, alter, verify=verify_alter),
    Scenario("merge", prepare_merge, merge),
)}


def ack_line(partition: int, record: Record) -> str:
    key, value = (record.key or b"").hex(), (record.value or b"").hex()
    return f"ACK {partition} {record.offset} {record.timestamp} {key} {value}\n"


def parse_ack(line: str) -> tuple[int, Record]:
    _, partition, offset, timestamp, key, value = line.split(" ")
    return int(partition), Record(int(offset), int(timestamp), bytes.fromhex(key),
                                  bytes.fromhex(value), ())


def print_ack(partition: int, record: Record) -> None:
    sys.stdout.write(ack_line(partition, record))
    sys.stdout.flush()
