"""Merging small sealed segments (storage/merging.py), each protocol step, locally and on
S3 (moto on loopback): a merge regroups records into one file and changes nothing a
reader sees, raw or compacted; it never makes a file straddle the compaction horizon; a
damaged input or a race with retention or DeleteRecords changes nothing. A merge and a
compaction of one partition interleave in both orders (issue 21, item 3): whichever
commits second conflicts when the merged file would straddle the new horizon, and the
compacted view holds each key once. The store's model test (tests/storage/test_model.py)
interleaves merges with everything else."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from compactlog.compaction.runner import run_compaction
from compactlog.errors import ConflictError, CorruptionError
from compactlog.storage import merging
from compactlog.storage.manifest import SEGMENT_DIR, SegmentInfo
from compactlog.storage.merging import choose_run, merge_small_segments
from compactlog.storage.partition import Partition
from compactlog.storage.records import ProducerRecord, Record
from compactlog.storage.store import LogStore
from compactlog.tables import view_dataset
from support.engines import CommitHookEngine, Engine
from support.fakes import FakeClock
from support.faultkit import compact
from support.s3_support import open_local_or_s3

TOPIC = "t"
CONFIG = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
          "segment.bytes": str(1 << 20), "file.delete.delay.ms": "0"}


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[LogStore]:
    opened = open_local_or_s3(request.param, request, tmp_path, monkeypatch, FakeClock(),
                              "merge")
    opened.create_topic(TOPIC, 1, CONFIG)
    try:
        yield opened
    finally:
        opened.close()


def seal_each(store: LogStore, keys: range, tag: str) -> None:
    """One sealed segment per record, with a header and a tombstone among them."""
    partition = store.topic(TOPIC).partition(0)
    for key in keys:
        value = None if key % 7 == 6 else f"{tag}-{key}".encode()
        store.append(TOPIC, [ProducerRecord(b"k%d" % (key % 5), value,
                                            headers=(("h", b"%d" % key),))])
        partition.roll()
        store.clock.advance(1)  # type: ignore[attr-defined]


def everything(partition: Partition, compacted: bool = False) -> list[Record]:
    read = partition.read_compacted if compacted else partition.read
    return list(read(0, 10_000, 1 << 30))


def test_small_segments_are_merged_and_reads_are_unchanged(store: LogStore) -> None:
    """Steps 1-4."""
    seal_each(store, range(20), "a")
    partition = store.topic(TOPIC).partition(0)
    before = everything(partition)
    inputs = [info.file for info in partition.manifest.segments]
    merged = merge_small_segments(partition)
    assert merged is not None
    assert [s.file for s in partition.manifest.segments] == [merged.file]
    assert (merged.base_offset, merged.last_offset, merged.record_count) == (0, 19, 20)
    assert everything(partition) == before
    assert partition.offset_for_timestamp(before[10].timestamp) == 10
    assert merge_small_segments(partition) is None  # one file: nothing left to merge
    # The inputs are retired, then deleted by the next commit (file.delete.delay.ms 0).
    seal_each(store, range(20, 21), "b")
    listing = {item.name for item in partition.volume.listing(SEGMENT_DIR)}
    assert not listing & set(inputs)
    store.close()
    with LogStore.open(store.target, read_only=True, local_dir=store.data_dir) as again:
        assert everything(again.topic(TOPIC).partition(0))[:20] == before


def test_a_run_is_not_merged_across_the_horizon(store: LogStore) -> None:
    """Steps 1 and 4: a merged file would feed records the ledger holds back in."""
    clock = store.clock  # type: ignore[attr-defined]
    partition = store.topic(TOPIC).partition(0)
    seal_each(store, range(10), "a")
    compact(store, clock)
    horizon = partition.manifest.compaction.horizon  # type: ignore[union-attr]
    assert horizon == 9
    seal_each(store, range(10, 30), "b")
    run = choose_run(partition.manifest, 1 << 20)
    assert run and run[0].base_offset == 0 and run[-1].last_offset == 9
    merge_small_segments(partition)
    second = merge_small_segments(partition)
    assert second is not None and second.base_offset == 10
    for info in partition.manifest.segments:
        assert not info.base_offset <= horizon < info.last_offset
    compact(store, clock)
    latest: dict[bytes, bytes | None] = {}
    for record in everything(partition):
        latest[record.key] = record.value  # type: ignore[index]
    view = {r.key: r.value for r in everything(partition, compacted=True)}
    assert view == latest  # tombstones stay for delete.retention.ms


def test_a_damaged_input_stops_the_merge_and_changes_nothing(tmp_path: Path) -> None:
    """Step 2."""
    with LogStore.open(tmp_path / "data", clock=FakeClock()) as store:
        store.create_topic(TOPIC, 1, CONFIG)
        seal_each(store, range(10), "a")
        partition = store.topic(TOPIC).partition(0)
        victim = partition.segment_dir / partition.manifest.segments[4].file
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
        segments = partition.manifest.segments
        files = sorted(p.name for p in partition.segment_dir.iterdir())
        with pytest.raises(CorruptionError, match="CRC32C mismatch"):
            merge_small_segments(partition)
        assert partition.manifest.segments == segments
        assert sorted(p.name for p in partition.segment_dir.iterdir()) == files


def test_a_merge_that_loses_a_race_changes_nothing(store: LogStore,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 4: DeleteRecords removes the run's first segments between the merged file's
    upload and its commit; the merge gives up and its file goes."""
    seal_each(store, range(12), "a")
    partition = store.topic(TOPIC).partition(0)
    publish = partition.volume.publish

    def publish_then_race(temp: Path, relative: str) -> None:
        publish(temp, relative)
        partition.delete_records(3)

    monkeypatch.setattr(partition.volume, "publish", publish_then_race)
    with pytest.raises(ConflictError, match="merge given up"):
        merge_small_segments(partition)
    monkeypatch.undo()
    listed = {info.file for info in partition.manifest.segments}
    assert len(listed) == 9 and partition.manifest.segments[0].base_offset == 3
    retired = {Path(item.path).name for item in partition.manifest.retired}
    assert len(retired) == 3  # what DeleteRecords retired, deleted after the delay
    stray = {item.name for item in partition.volume.listing(SEGMENT_DIR)} - listed - retired
    assert not stray, stray
    assert [r.offset for r in everything(partition)] == list(range(3, 12))


# -- a merge and a compaction of one partition, interleaved (issue 21, item 3) ------------


def assert_each_key_once(store: LogStore, partition: Partition) -> None:
    """The compacted view holds each key's latest record once, read by the Reader's path
    (Partition.read_compacted) and by the table path (tables.view_dataset: the sealed
    part, which is all of it here)."""
    latest = {record.key: record for record in everything(partition)}
    view = everything(partition, compacted=True)
    assert view == sorted(latest.values(), key=lambda record: record.offset)
    table = view_dataset(store.target, TOPIC).to_table(columns=["offset", "key"])
    assert sorted(table.column("offset").to_pylist()) == [record.offset for record in view]


def test_a_merge_across_a_running_compactions_horizon_makes_its_commit_conflict(
        store: LogStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The merge commits first: a compaction plans s1..s4 (horizon 3); before its commit
    the writer seals s5..s8 and merges s1..s8 into one file, which the horizon would
    split. The compaction's commit conflicts (runner.py, step 5c), so the next run plans
    over the merged file. Had it committed, the next run would have taken the whole
    merged file as dirty input and the view would hold s1..s4's records twice (as
    today only plan.py's defence in depth prevents, tested on its own below)."""
    clock = store.clock  # type: ignore[attr-defined]
    partition = store.topic(TOPIC).partition(0)
    seal_each(store, range(4), "a")
    merged: list[SegmentInfo | None] = []
    # A compaction on another machine: the writer's merge cannot see its lock here.
    monkeypatch.setattr(merging.locks, "is_locked", lambda directory: False)

    def seal_and_merge() -> None:
        seal_each(store, range(4, 8), "b")
        merged.append(merge_small_segments(partition))

    outcome: BaseException | None = None
    try:
        run_compaction(store, TOPIC, CommitHookEngine(seal_and_merge), clock=clock)
    except ConflictError as error:
        outcome = error
    (merged_file,) = merged
    assert merged_file is not None and (merged_file.base_offset, merged_file.last_offset) == (0, 7)
    compact(store, clock)  # the next run, as the scheduler retries a conflicted one
    assert_each_key_once(store, partition)
    assert isinstance(outcome, ConflictError) and "straddles" in str(outcome), outcome
    assert partition.manifest.compaction is not None
    assert partition.manifest.compaction.horizon == 7


def test_a_merge_leaves_dirty_segments_alone_while_a_compaction_runs(
        store: LogStore) -> None:
    """While this machine runs a compaction of the partition (its compaction lock is
    held), the writer merges only segments wholly at or below the horizon: a merge of
    dirty ones could straddle the horizon the run is about to commit and make it
    conflict, and a busy partition on S3 merges every few seconds (merging.py, step 1).
    The merge-first race above is what a compaction on another machine still meets."""
    clock = store.clock  # type: ignore[attr-defined]
    partition = store.topic(TOPIC).partition(0)
    seal_each(store, range(8), "a")
    compact(store, clock)  # horizon 7: the eight segments are clean
    seal_each(store, range(8, 16), "b")  # eight dirty ones
    merged: list[SegmentInfo | None] = []

    def merge_twice() -> None:
        merged.append(merge_small_segments(partition))
        merged.append(merge_small_segments(partition))

    run_compaction(store, TOPIC, CommitHookEngine(merge_twice), clock=clock)
    clean, dirty = merged
    assert clean is not None and (clean.base_offset, clean.last_offset) == (0, 7)
    assert dirty is None  # the dirty run waits for the compaction to end
    assert partition.manifest.compaction is not None
    assert partition.manifest.compaction.horizon == 15
    assert_each_key_once(store, partition)
    assert merge_small_segments(partition) is not None  # now it may


def test_a_compaction_committed_under_a_merge_makes_the_merge_give_up(
        store: LogStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compaction commits first: the merge chose s1..s8 below any horizon; between
    its upload and its commit a compaction commits horizon 3 (s5..s8 are younger than
    min.compaction.lag.ms). The merge's commit sees the horizon inside its run and gives
    up (merging.py, step 4); its file goes, and no listed segment straddles the
    horizon."""
    clock = store.clock  # type: ignore[attr-defined]
    store.alter_topic(TOPIC, {"min.compaction.lag.ms": "60000"})
    partition = store.topic(TOPIC).partition(0)
    seal_each(store, range(4), "a")
    clock.advance(120)
    seal_each(store, range(4, 8), "b")
    publish = partition.volume.publish

    def publish_then_compact(temp: Path, relative: str) -> None:
        publish(temp, relative)
        if relative.startswith(SEGMENT_DIR):  # the merged file (not the run's ledger files)
            compact(store, clock)

    with monkeypatch.context() as patch, pytest.raises(ConflictError, match="merge given up"):
        patch.setattr(partition.volume, "publish", publish_then_compact)
        merge_small_segments(partition)
    assert partition.manifest.compaction is not None
    assert partition.manifest.compaction.horizon == 3
    assert len(partition.manifest.segments) == 8
    listed = {info.file for info in partition.manifest.segments}
    retired = {Path(item.path).name for item in partition.manifest.retired}
    assert not {item.name for item in partition.volume.listing(SEGMENT_DIR)} - listed - retired
    clock.advance(120)
    compact(store, clock)
    assert_each_key_once(store, partition)


def test_a_segment_across_the_horizon_feeds_only_its_rows_above_it(
        tmp_path: Path, clock: FakeClock, engine: Engine,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Defence in depth (compaction/plan.py): were a listed segment to straddle the
    horizon (no commit allows one now; forced here by a merge whose check is switched
    off), a run would read only its rows above the horizon as dirty input, on every
    engine, so the ledger's records never come back twice."""
    with LogStore.open(tmp_path / "data", clock=clock) as store:
        store.create_topic(TOPIC, 1, {**CONFIG, **engine.config})
        partition = store.topic(TOPIC).partition(0)
        seal_each(store, range(4), "a")
        engine.service(store, TOPIC).compact()
        seal_each(store, range(4, 8), "b")
        monkeypatch.setattr(merging, "_straddles", lambda *args: False)
        merged = merge_small_segments(partition)
        assert merged is not None and (merged.base_offset, merged.last_offset) == (0, 7)
        assert partition.manifest.horizon == 3
        engine.service(store, TOPIC).compact()
        assert partition.manifest.horizon == 7
        assert_each_key_once(store, partition)


def test_a_merge_below_a_running_compactions_horizon_lets_it_commit(
        store: LogStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A merge of segments the compaction planned over, wholly at or below its new
    horizon, regroups the same records: the compaction's commit goes through (runner.py,
    step 5c) and lists the merged file as clean. (The compaction runs on another
    machine: this one's merge does not see its lock.)"""
    clock = store.clock  # type: ignore[attr-defined]
    partition = store.topic(TOPIC).partition(0)
    monkeypatch.setattr(merging.locks, "is_locked", lambda directory: False)
    seal_each(store, range(8), "a")
    merged: list[SegmentInfo | None] = []
    run_compaction(store, TOPIC, CommitHookEngine(
        lambda: merged.append(merge_small_segments(partition))), clock=clock)
    (merged_file,) = merged
    assert merged_file is not None
    assert [info.file for info in partition.manifest.segments] == [merged_file.file]
    assert partition.manifest.horizon == merged_file.last_offset == 7
    assert_each_key_once(store, partition)


@pytest.mark.parametrize("distinct", [False, True])
def test_a_merged_segment_chooses_its_key_encoding_by_its_keys(tmp_path: Path,
                                                               distinct: bool) -> None:
    """As a seal does (sealed.keys_repeat): a dictionary for keys that repeat (five keys
    here), plain pages for distinct ones; every record reads back the same."""
    import pyarrow.parquet as pq

    with LogStore.open(tmp_path / "data", clock=FakeClock()) as store:
        store.create_topic(TOPIC, 1, CONFIG)
        partition = store.topic(TOPIC).partition(0)
        for key in range(30):
            store.append(TOPIC, [ProducerRecord(b"k%d" % (key if distinct else key % 5),
                                                b"v%d" % key)])
            partition.roll()
        before = everything(partition)
        merged = merge_small_segments(partition)
        assert merged is not None
        group = pq.ParquetFile(partition.segment_dir / merged.file).metadata.row_group(0)
        key = next(group.column(i) for i in range(group.num_columns)
                   if group.column(i).path_in_schema == "key")
        assert key.has_dictionary_page is not distinct
        assert everything(partition) == before
