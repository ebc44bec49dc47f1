"""A partition under failure and concurrency: reopening after a failed fsync, a failed
reopen, a seal and a reopen at once, readers racing the writer at the log's tail, and
the sweep's schedule. (Found in review of issue 11's storage layer.)"""

from __future__ import annotations

import errno
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from compactlog import faults
from compactlog.errors import CompactlogError, PartitionFailedError
from compactlog.storage import recovery
from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from support.fakes import FakeClock
from support.faultkit import read_all


def eio(path: str = "") -> OSError:
    return OSError(errno.EIO, os.strerror(errno.EIO), path)


def test_an_fsync_and_a_cut_that_both_fail_leave_nothing_visible_after_reopen(
    store: LogStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create_topic("t")
    partition = store.topic("t").partition(0)
    partition.append([ProducerRecord(b"a", b"kept")])

    def fail_fsync(point: str, path: str) -> None:
        if point == "fsync" and path.endswith(".log"):
            raise eio(path)

    def no_truncate(fd: int, size: int) -> None:
        raise eio()

    monkeypatch.setattr(os, "ftruncate", no_truncate)
    with faults.injected(fail_fsync), pytest.raises(PartitionFailedError):
        partition.append([ProducerRecord(b"b", b"refused")])
    monkeypatch.undo()
    assert [r.value for r in read_all(partition)] == [b"kept"]
    partition.reopen()  # cuts what the failed append left, then recovers
    assert partition.failed is None
    assert [r.value for r in read_all(partition)] == [b"kept"]
    partition.append([ProducerRecord(b"c", b"after")])
    assert [r.value for r in read_all(partition)] == [b"kept", b"after"]


def test_a_failed_reopen_keeps_what_was_readable(
    store: LogStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create_topic("t")
    partition = store.topic("t").partition(0)
    for i in range(5):
        partition.append([ProducerRecord(b"k", b"v%d" % i)])
    partition.fail(eio())
    before = read_all(partition)

    def out_of_files(partition_: object) -> None:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(recovery, "_open_logs", out_of_files)
    partition.reopen()
    assert isinstance(partition.failed, OSError)
    assert partition.log_end_offset == 5
    assert read_all(partition) == before
    monkeypatch.undo()
    partition.reopen()
    assert partition.failed is None
    assert read_all(partition) == before


def test_a_readers_reopen_follows_the_writers_files_afresh(
    store: LogStore, tmp_path: Path, clock: FakeClock
) -> None:
    """A read-only partition that reopens repairs nothing: it opens the writer's log
    files again (none of the segments it held) and reads what it read before, and
    what the writer appended since."""
    store.create_topic("t")
    writer = store.topic("t").partition(0)
    for i in range(3):
        writer.append([ProducerRecord(b"k", b"v%d" % i)])
    with LogStore.open(tmp_path / "data", read_only=True, clock=clock) as reader_store:
        reader = reader_store.topic("t").partition(0)
        before = read_all(reader)
        held = list(reader.logs)
        writer.append([ProducerRecord(b"k", b"v3")])
        reader.reopen()
        assert reader.failed is None
        assert not set(map(id, reader.logs)) & set(map(id, held))
        assert read_all(reader) == [*before, *read_all(writer)[3:]]
        assert reader.recovery.clean


def test_a_reopen_while_a_seal_writes_does_not_deadlock(
    tmp_path: Path, clock: FakeClock
) -> None:
    store = LogStore.open(tmp_path / "data", clock=clock)
    store.auto_seal = False
    store.create_topic("t", 1, {"segment.bytes": "1024"})
    partition = store.topic("t").partition(0)
    for i in range(4):
        partition.append([ProducerRecord(b"k%d" % i, b"v" * 400)])
    sealing = threading.Event()
    release = threading.Event()

    def hold_the_seal(point: str, path: str) -> None:
        if point == "rename" and Path(path).parent.name == "segments":
            sealing.set()
            release.wait(10)

    errors: list[BaseException] = []

    def seal() -> None:
        try:
            partition.seal_rolled()
        except BaseException as error:  # surfaced below
            errors.append(error)

    with faults.injected(hold_the_seal):
        sealer = threading.Thread(target=seal)
        sealer.start()
        assert sealing.wait(10)
        reopener = threading.Thread(target=partition.reopen)
        reopener.start()
        time.sleep(0.2)
        release.set()
        sealer.join(timeout=30)
        reopener.join(timeout=30)
    assert not sealer.is_alive() and not reopener.is_alive(), "deadlock"
    assert not errors
    assert [r.offset for r in read_all(partition)] == [0, 1, 2, 3]
    store.close()


def test_readers_at_the_tail_never_see_a_half_indexed_batch(store: LogStore) -> None:
    store.create_topic("t", 1, {"flush.messages": str(2**62)})
    partition = store.topic("t").partition(0)
    stop = threading.Event()
    errors: list[BaseException] = []

    def read_the_tail() -> None:
        while not stop.is_set():
            try:
                segment = partition.logs[-1]
                end = segment.next_offset
                segment.read(max(end - 1, 0), 10, 1 << 20)
                segment.read_raw(max(end - 1, 0), 1 << 20)
                segment.offset_for_timestamp(0)
            except CompactlogError:
                continue
            except BaseException as error:  # surfaced below
                errors.append(error)
                return

    readers = [threading.Thread(target=read_the_tail) for _ in range(2)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the race is short
    try:
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline and not errors:
            partition.append([ProducerRecord(b"k", b"v")])
    finally:
        stop.set()
        sys.setswitchinterval(interval)
    for reader in readers:
        reader.join(timeout=10)
    assert not errors, errors[0]


def test_a_swept_retired_file_does_not_keep_the_sweep_due(
    store: LogStore, clock: FakeClock
) -> None:
    store.create_topic("t", 1, {"segment.bytes": "1024", "retention.bytes": "0",
                                "retention.ms": "-1"})
    partition = store.topic("t").partition(0)
    for i in range(3):
        partition.append([ProducerRecord(b"k%d" % i, b"v" * 600)])
    assert partition.apply_retention()
    assert partition.manifest.retired and not partition.sweeps.due
    clock.advance_ms(partition.config["file.delete.delay.ms"])
    assert partition.sweeps.due
    assert partition.sweep()
    assert partition.manifest.retired, "forgotten by the next commit, not by the sweep"
    assert not partition.sweeps.due, "an idle partition would be swept every round"
