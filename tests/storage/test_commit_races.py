"""The writer's commits racing a compaction's, deterministically, in both orders.

Each test lands a real compaction (the in-process engine, on a second handle of the
store as a compaction process has) between a writer operation's read of the manifest
and its compare-and-swap, or the other way round, and checks what the operation's
protocol says it tolerates (storage/sealing.py, retention.py; compaction's side is in
compaction/runner.py): the writer re-applies its change to the compaction's manifest,
both changes stand, and the compacted view is the fold of the raw log up to the
horizon, plus the tail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from compactlog.compaction import load_factory
from compactlog.storage.partition import Partition
from compactlog.storage.records import ProducerRecord, Record
from compactlog.storage.store import LogStore
from support.fakes import FakeClock

TOPIC = "t"
EVERYTHING = 1 << 30


@pytest.fixture
def writer(tmp_path: Path, clock: FakeClock) -> Iterator[LogStore]:
    with LogStore.open(tmp_path / "data", clock=clock) as store:
        store.create_topic(TOPIC, 1, {"cleanup.policy": "compact", "segment.bytes": "100000",
                                      "min.cleanable.dirty.ratio": "0"})
        yield store


def compact(tmp_path: Path, clock: FakeClock) -> Any:
    """A compaction from another handle of the store, as `compactlog compact` runs."""
    with LogStore.open(tmp_path / "data", read_only=True, clock=clock) as other:
        factory = load_factory("local_engine:LocalCompactionServiceFactory")
        return factory.new_service(other, TOPIC, {"clock": clock, "engine": "local"}).compact()


def seal(partition: Partition, pairs: list[tuple[bytes, bytes | None]]) -> None:
    partition.append([ProducerRecord(key, value) for key, value in pairs])
    partition.roll()


def fold(records: list[Record], horizon: int | None) -> list[Record]:
    """The compacted view by definition: the latest record per key up to the horizon
    (tombstones kept: delete.retention.ms has not passed), in offset order, then the
    tail."""
    if horizon is None:
        return records
    latest: dict[bytes | None, Record] = {}
    for record in records:
        if record.offset <= horizon:
            latest[record.key] = record
    kept = sorted(latest.values(), key=lambda record: record.offset)
    return kept + [record for record in records if record.offset > horizon]


def check_view(partition: Partition, raw: list[Record]) -> None:
    partition.refresh()
    got = partition.read_compacted(0, EVERYTHING, EVERYTHING)
    assert got == fold(raw, partition.manifest.horizon)


def commit_lands_after(partition: Partition, other: Callable[[], object]) -> list[int]:
    """Make `partition`'s next manifest commit find `other`'s commit landed after it
    read the manifest: `other` runs just before the compare-and-swap. The versions each
    commit attempt was based on, for the test to check that a conflict happened."""
    document = partition.document
    commit = document.commit
    based_on: list[int] = []

    def racing(expected_version: int, body: dict[str, Any]) -> Any:
        based_on.append(expected_version)
        if len(based_on) == 1:
            other()
        return commit(expected_version, body)

    document.commit = racing  # type: ignore[method-assign]
    return based_on


def test_a_seal_re_applies_itself_over_a_compaction_that_landed_first(
        writer: LogStore, tmp_path: Path, clock: FakeClock) -> None:
    """sealing.py step 3 against a compaction: the compaction moved the horizon and
    ledger while the seal wrote its file; the seal's commit conflicts, is applied again
    to the compaction's manifest, and both stand."""
    partition = writer.topic(TOPIC).partitions[0]
    seal(partition, [(b"a", b"1"), (b"b", b"1"), (b"a", b"2")])
    raw_before = partition.read(0, EVERYTHING, EVERYTHING)
    based_on = commit_lands_after(partition, lambda: compact(tmp_path, clock))
    seal(partition, [(b"a", b"3"), (b"c", b"1")])
    assert len(based_on) == 2 and based_on[1] > based_on[0]  # it conflicted once
    assert partition.manifest.horizon == 2
    assert [info.base_offset for info in partition.manifest.segments] == [0, 3]
    raw = partition.read(0, EVERYTHING, EVERYTHING)
    assert raw[:3] == raw_before
    check_view(partition, raw)


def test_a_compaction_that_landed_after_a_seal_keeps_the_new_segment(
        writer: LogStore, tmp_path: Path, clock: FakeClock) -> None:
    """The other order: the compaction planned over s1 and commits after the writer
    sealed s2; its swap keeps s2 listed and its horizon at s1's end."""
    partition = writer.topic(TOPIC).partitions[0]
    seal(partition, [(b"a", b"1"), (b"a", b"2")])
    with LogStore.open(tmp_path / "data", read_only=True, clock=clock) as other:
        racing = other.topic(TOPIC).partitions[0]
        commit_lands_after(racing, lambda: seal(partition, [(b"a", b"3")]))
        factory = load_factory("local_engine:LocalCompactionServiceFactory")
        factory.new_service(other, TOPIC, {"clock": clock, "engine": "local"}).compact()
    partition.refresh()
    assert partition.manifest.horizon == 1
    assert [info.base_offset for info in partition.manifest.segments] == [0, 2]
    check_view(partition, partition.read(0, EVERYTHING, EVERYTHING))


def test_retention_re_applies_itself_over_a_compaction_and_keeps_the_view(
        tmp_path: Path, clock: FakeClock) -> None:
    """retention.py step 2 against a compaction: retention chose the segments wholly at
    or below the horizon it read; a compaction moved the horizon on before retention's
    commit, which re-applies to the new manifest. Retention never changes the compacted
    view: the ledger holds what it removed."""
    with LogStore.open(tmp_path / "data", clock=clock) as store:
        store.create_topic(TOPIC, 1, {"cleanup.policy": "compact", "retention.ms": "1000",
                                      "segment.bytes": "100000"})
        partition = store.topic(TOPIC).partitions[0]
        seal(partition, [(b"a", b"1"), (b"b", b"1")])
        seal(partition, [(b"a", b"2")])
        compact(tmp_path, clock)  # horizon 2: both segments are at or below it
        partition.refresh()
        view_before = partition.read_compacted(0, EVERYTHING, EVERYTHING)
        seal(partition, [(b"b", b"2")])
        clock.advance(5)
        based_on = commit_lands_after(partition, lambda: compact(tmp_path, clock))
        removed = partition.apply_retention()
        assert len(based_on) == 2
        assert [info.base_offset for info in removed] == [0, 2]
        assert partition.manifest.horizon == 3
        assert partition.log_start_offset == 3
        got = partition.read_compacted(0, EVERYTHING, EVERYTHING)
        assert [(r.key, r.value) for r in got] == [(b"a", b"2"), (b"b", b"2")]
        assert got[0] == view_before[-1]


def test_delete_records_re_applies_itself_over_a_compaction(
        writer: LogStore, tmp_path: Path, clock: FakeClock) -> None:
    """DeleteRecords (retention.py) against a compaction that landed first: the new log
    start and deleted_below are applied to the compaction's manifest, and no view serves
    an offset below them."""
    store = writer
    store.alter_topic(TOPIC, {"cleanup.policy": "compact,delete"})
    partition = store.topic(TOPIC).partitions[0]
    seal(partition, [(b"a", b"1"), (b"b", b"1"), (b"c", b"1")])
    seal(partition, [(b"a", b"2")])
    based_on = commit_lands_after(partition, lambda: compact(tmp_path, clock))
    partition.delete_records(2)
    assert len(based_on) == 2
    assert partition.manifest.horizon == 3 and partition.manifest.deleted_below == 2
    got = partition.read_compacted(0, EVERYTHING, EVERYTHING)
    assert [(r.offset, r.key) for r in got] == [(2, b"c"), (3, b"a")]
    assert [r.offset for r in partition.read(0, EVERYTHING, EVERYTHING)] == [2, 3]
