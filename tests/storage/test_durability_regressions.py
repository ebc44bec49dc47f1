"""Regression tests for issue 11's storage breakages, one per breakage, written first.

Each reproduces what was broken on main (2026-11-24) through public calls and a fault
raised from a function that the old and the new code both call, so that the test fails
on the old code for the reason the issue gives and passes on the new.

1. a multi-partition compaction failing partway destroyed a committed ledger;
2. a stalled manifest commit "won" a version that pruning had removed;
3. file handles leaked: one per sealed segment read, and replaced ledger files stayed
   open, deleted, until restart;
4. records with old timestamps rolled a segment per append;
5. an append reported failure after it had succeeded (fsync or seal failing after the
   write), so a producer's retry stored the records twice;
6. one torn manifest version made a partition unreadable.
(7 and 8, the server's limits and its Fetch errors, are in test_server_limits.py and
test_server_files.py.)
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compactlog import fsutil
from compactlog.errors import CompactlogError
from compactlog.storage.partition import Partition
from compactlog.storage.records import ProducerRecord, Record
from compactlog.storage.store import LogStore
from support.engines import compact
from support.fakes import FakeClock

COMPACTED = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}
DAY_MS = 24 * 3600 * 1000


def view(partition: Partition) -> dict[bytes, bytes | None]:
    latest: dict[bytes, bytes | None] = {}
    offset = 0
    while batch := partition.read_compacted(offset, 1000):
        for record in batch:
            assert record.key is not None
            latest[record.key] = record.value
        offset = batch[-1].offset + 1
    return latest


def raw(partition: Partition) -> list[Record]:
    records: list[Record] = []
    offset = 0
    while batch := partition.read(offset, 1000):
        records += batch
        offset = batch[-1].offset + 1
    return records


def fill(store: LogStore, topic: str, rounds: int, keys: int, tag: str) -> dict[bytes, bytes]:
    expected: dict[bytes, bytes] = {}
    for i in range(rounds):
        records = [ProducerRecord(b"k%03d" % k, f"{tag}-{i}-{k}".encode()) for k in range(keys)]
        store.append(topic, records)
        expected.update((r.key, r.value) for r in records if r.key and r.value)
    for partition in store.topic(topic).partitions:
        partition.roll()
    return expected


def expected_per_partition(store: LogStore, topic: str,
                           expected: dict[bytes, bytes]) -> list[dict[bytes, bytes]]:
    result: list[dict[bytes, bytes]] = [{} for _ in store.topic(topic).partitions]
    for index, partition in enumerate(store.topic(topic).partitions):
        for record in raw(partition):
            assert record.key is not None and record.value is not None
            result[index][record.key] = expected[record.key]
    return result


def enospc(path: object = "") -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def fail_nth_call(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, nth: int,
                  error: Callable[[], BaseException],
                  when: Callable[..., bool] = lambda *a, **k: True) -> list[int]:
    """Make the nth matching call of module.name raise `error()`; returns a call counter."""
    original = getattr(module, name)
    calls = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if when(*args, **kwargs):
            calls[0] += 1
            if calls[0] == nth:
                raise error()
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def is_manifest_write(path: Path, *_: Any) -> bool:
    return Path(path).parent.name == "manifest"


# -- 1. a failed multi-partition run keeps every committed ledger ----------------------

def test_a_multi_partition_run_failing_partway_keeps_the_ledgers_it_committed(
    store: LogStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create_topic("t", partitions=2, config=COMPACTED)
    first = fill(store, "t", rounds=4, keys=40, tag="a")
    compact(store, "t", clock)  # both partitions now have a ledger
    second = {**first, **fill(store, "t", rounds=3, keys=40, tag="b")}
    wanted = expected_per_partition(store, "t", second)
    # Partition 0 commits its new pair; partition 1's manifest write runs out of space.
    fail_nth_call(monkeypatch, fsutil, "write_file_durably", 1, enospc,
                  when=lambda path, *_: Path(path).parent.match("t/1/manifest"))
    with pytest.raises((OSError, CompactlogError)):
        compact(store, "t", clock)
    monkeypatch.undo()
    for index, partition in enumerate(store.topic("t").partitions):
        assert view(partition) == wanted[index], f"partition {index}"
    # The next run succeeds and both views stay whole, also after a reopen.
    compact(store, "t", clock)
    for index, partition in enumerate(store.topic("t").partitions):
        assert view(partition) == wanted[index], f"partition {index}"
    data_dir = store.data_dir
    store.close()
    with LogStore.open(data_dir, clock=clock) as reopened:
        for index, partition in enumerate(reopened.topic("t").partitions):
            assert view(partition) == wanted[index], f"partition {index} after reopen"


# -- 2. a stalled commit cannot win a pruned version --------------------------------------

def test_a_stalled_manifest_commit_loses_to_the_commits_that_landed_meanwhile(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    writer_store = LogStore.open(data, clock=clock)
    writer_store.create_topic("t", partitions=1, config={"segment.bytes": "1024"})
    writer = writer_store.topic("t").partition(0)
    # A second committer on the same manifest: a compaction process opens the data
    # directory read-only and commits to the partition's manifest.
    other_store = LogStore.open(data, read_only=True, clock=clock)
    other = other_store.topic("t").partition(0)
    stalled = [True]
    original = fsutil.write_file_durably
    errors: list[BaseException] = []

    def nine_seals() -> None:
        try:
            for i in range(9):
                writer.append([ProducerRecord(b"k", b"v%04d" % i + b"x" * 600)])
                writer.roll()
        except BaseException as error:  # surfaced below
            errors.append(error)

    landing = threading.Thread(target=nine_seals)

    def stall_then_write(path: Path, data_bytes: bytes, *rest: Any, **named: Any) -> None:
        if stalled[0] and is_manifest_write(path):
            stalled[0] = False
            # While `other` is between comparing versions and publishing its commit,
            # nine seals try to land (more than the versions that pruning keeps). A
            # commit protocol may let them land meanwhile or make them wait; the stall
            # ends when they are done or after three seconds.
            landing.start()
            landing.join(timeout=3)
        original(path, data_bytes, *rest, **named)

    monkeypatch.setattr(fsutil, "write_file_durably", stall_then_write)
    with contextlib.suppress(CompactlogError):
        # Losing with a conflict is allowed; winning falsely is not.
        other.commit_manifest(lambda m: m.__class__(
            log_start_offset=m.log_start_offset, segments=m.segments,
            compaction=m.compaction, extra={**m.extra, "marker": "other"}))
    landing.join(timeout=60)
    assert not errors
    monkeypatch.undo()
    # Whatever `other` was told, the current manifest must have every seal, and if
    # `other` was told it succeeded, its change too.
    writer.refresh()
    fresh_store = LogStore.open(data, read_only=True, clock=clock)
    fresh = fresh_store.topic("t").partition(0)
    assert len(fresh.manifest.segments) == 9
    assert [r.value[:5] for r in raw(fresh)] == [b"v%04d" % i for i in range(9)]
    if other.manifest.extra.get("marker") == "other":
        assert fresh.manifest.extra.get("marker") == "other", (
            "the stalled commit reported success but its change is not in the manifest")
    for opened in (fresh_store, other_store, writer_store):
        opened.close()


# -- 3. file handles ---------------------------------------------------------------------

def open_files(suffix: str = ".parquet") -> list[str]:
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if suffix in target:
            targets.append(target)
    return targets


def test_a_scan_over_many_sealed_segments_keeps_few_files_open(store: LogStore) -> None:
    store.create_topic("t", partitions=1)
    partition = store.topic("t").partition(0)
    for i in range(300):
        partition.append([ProducerRecord(b"k%d" % i, b"v%d" % i)])
        partition.roll()
    assert len(partition.manifest.segments) == 300
    before = len(open_files())
    assert len(raw(partition)) == 300
    # The open-file cache's default bound is well under the common limit of 1,024.
    assert len(open_files()) - before <= 128


def test_replaced_ledger_files_are_closed_and_their_space_freed(
    store: LogStore, clock: FakeClock
) -> None:
    store.create_topic("t", partitions=1, config=COMPACTED)
    partition = store.topic("t").partition(0)
    for run in range(4):
        fill(store, "t", rounds=3, keys=30, tag=f"r{run}")
        compact(store, "t", clock)
        assert len(view(partition)) == 30
    deleted = [target for target in open_files() if target.endswith("(deleted)")]
    assert deleted == []


# -- 4. old timestamps do not roll a segment per append ------------------------------------

def test_a_backfill_of_old_records_does_not_roll_a_segment_per_append(
    store: LogStore, clock: FakeClock
) -> None:
    store.create_topic("t", partitions=1)
    partition = store.topic("t").partition(0)
    old = clock.ms - 8 * DAY_MS
    for i in range(100):
        partition.append([ProducerRecord(b"k%d" % i, b"v", timestamp=old + i)])
    assert len(partition.manifest.segments) + len(partition.logs) <= 2
    # The segment still rolls by segment.ms, counted from when it was opened.
    clock.advance_ms(DAY_MS + 1)
    partition.append([ProducerRecord(b"late", b"v", timestamp=old)])
    assert len(partition.manifest.segments) == 1
    assert len(raw(partition)) == 101


# -- 5. an append that reports failure never shows up -------------------------------------

def test_an_append_whose_fsync_fails_is_never_seen(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    store = LogStore.open(data, clock=clock)
    store.create_topic("t", partitions=1)  # flush.messages=1: fsync before the ack
    partition = store.topic("t").partition(0)
    partition.append([ProducerRecord(b"a", b"acknowledged")])
    fail_nth_call(monkeypatch, os, "fsync", 1,
                  lambda: OSError(errno.EIO, os.strerror(errno.EIO)))
    with pytest.raises((OSError, CompactlogError)):
        partition.append([ProducerRecord(b"b", b"refused")])
    monkeypatch.undo()
    assert [r.value for r in raw(partition)] == [b"acknowledged"]
    # After a failed fsync the partition takes no writes until it is reopened.
    with pytest.raises(CompactlogError):
        partition.append([ProducerRecord(b"c", b"after")])
    store.close()
    with LogStore.open(data, clock=clock) as reopened:
        partition = reopened.topic("t").partition(0)
        assert [r.value for r in raw(partition)] == [b"acknowledged"]
        partition.append([ProducerRecord(b"d", b"resumed")])
        assert [r.value for r in raw(partition)] == [b"acknowledged", b"resumed"]


def test_an_append_whose_seal_fails_still_succeeds_once(
    store: LogStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create_topic("t", partitions=1, config={"segment.bytes": "1024"})
    partition = store.topic("t").partition(0)
    partition.append([ProducerRecord(b"a", b"x" * 700)])
    # The next append rolls the segment and seals it; the seal's Parquet file cannot be
    # written (disk full). The append itself was written and must report success.
    from compactlog.storage import sealed

    fail_nth_call(monkeypatch, sealed, "open_writer", 1, enospc)
    result = partition.append([ProducerRecord(b"b", b"y" * 700)])
    monkeypatch.undo()
    assert result.base_offset == 1
    assert [r.offset for r in raw(partition)] == [0, 1]
    # The rolled segment is sealed later, by the next seal.
    partition.seal_rolled()
    assert len(partition.manifest.segments) == 1
    assert [r.offset for r in raw(partition)] == [0, 1]


# -- 6. a torn manifest falls back to the newest intact version ----------------------------

def manifest_files_of_latest(partition_dir: Path) -> list[Path]:
    """Every file in manifest/ that holds the latest committed version."""
    found: dict[int, list[Path]] = {}
    for path in (partition_dir / "manifest").iterdir():
        if path.name.startswith("."):
            continue
        try:
            version = int(json.loads(path.read_bytes())["version"])
        except (ValueError, KeyError, TypeError):
            continue
        found.setdefault(version, []).append(path)
    return found[max(found)]


def test_a_torn_latest_manifest_falls_back_to_the_newest_intact_version(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    with LogStore.open(data, clock=clock) as store:
        store.create_topic("t", partitions=1)
        partition = store.topic("t").partition(0)
        for i in range(3):
            partition.append([ProducerRecord(b"k", b"v%d" % i)])
            partition.roll()
        partition.append([ProducerRecord(b"k", b"unsealed")])
    partition_dir = data / "topics" / "t" / "0"
    torn = manifest_files_of_latest(partition_dir)
    # Tear one copy of the latest version (a current pointer, or the version file).
    target = sorted(torn, key=lambda p: p.name)[-1]
    target.write_bytes(target.read_bytes()[:40])
    caplog.set_level(logging.WARNING)
    with LogStore.open(data, clock=clock) as store:
        partition = store.topic("t").partition(0)
        assert [r.value for r in raw(partition)] == [b"v0", b"v1", b"v2", b"unsealed"]
        assert target.name in caplog.text
        # The next commit repairs it.
        partition.append([ProducerRecord(b"k", b"more")])
        partition.roll()
    with LogStore.open(data, clock=clock) as store:
        partition = store.topic("t").partition(0)
        assert [r.value for r in raw(partition)][-1] == b"more"
