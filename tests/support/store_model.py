"""The log store's stateful model (hypothesis): the store against a plain Python model of
each partition, on a local directory and on S3."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from compactlog.storage.manifest import SEGMENT_DIR
from compactlog.storage.merging import choose_run, merge_small_segments
from compactlog.storage.partition import Partition
from compactlog.storage.partitioner import partition_for_key
from compactlog.storage.records import Headers, ProducerRecord, Record
from compactlog.storage.store import LogStore

TOPIC = "model"


T0_MS = 1_700_000_000_000


DAY_MS = 24 * 3600 * 1000


EVERYTHING = 1 << 40


class FakeClock:
    """Seconds, as time.time() returns; only the test moves it."""

    def __init__(self) -> None:
        self.ms = T0_MS

    def __call__(self) -> float:
        return self.ms / 1000


@dataclass
class PartitionModel:
    records: list[Record] = field(default_factory=list)  # records[i].offset == i
    start: int = 0

    @property
    def end(self) -> int:
        return len(self.records)

    def visible(self, offset: int = 0, end: int | None = None) -> list[Record]:
        """The records a read from `offset` may see, below `end` (the high watermark)."""
        return self.records[max(offset, self.start) : end]


def approx_size(record: Record) -> int:
    return 16 + len(record.key or b"") + len(record.value or b"")


# Keys and values: None, empty, short binary, and large enough to roll 1 KiB segments.
payloads = st.one_of(
    st.none(),
    st.just(b""),
    st.binary(min_size=1, max_size=24),
    st.binary(min_size=100, max_size=600),
    st.binary(min_size=200, max_size=400),
)


header_lists: st.SearchStrategy[Headers] = st.lists(
    st.tuples(st.text(max_size=6), st.one_of(st.none(), st.just(b""), st.binary(max_size=12))),
    max_size=3,
).map(tuple)


# A producer timestamp as an offset from the clock at append time; None: the append time.
timestamp_specs = st.one_of(
    st.none(),
    st.none(),
    st.integers(min_value=-30 * DAY_MS, max_value=DAY_MS),
)


record_specs = st.tuples(payloads, payloads, header_lists, timestamp_specs)


class LogStoreModel(RuleBasedStateMachine):
    # A store on S3 seals its active segments when it closes (store.py).
    seals_on_close = False

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="compactlog-model-"))
        self.clock = FakeClock()
        self.store = self.open_store()
        self.reader: LogStore | None = None
        self.models: list[PartitionModel] = []
        self.config: dict[str, Any] = {}

    # -- setup and teardown -----------------------------------------------------------

    @initialize(
        partitions=st.integers(min_value=1, max_value=2),
        segment_bytes=st.sampled_from([1024, 1024, 2048, 8192]),
        segment_ms=st.sampled_from([1000, 60_000, DAY_MS]),
        retention_ms=st.sampled_from([-1, 0, 5_000, 3_600_000, 7 * DAY_MS]),
        retention_bytes=st.sampled_from([-1, 0, 4_000, 12_000, 40_000]),
    )
    def create_topic(
        self,
        partitions: int,
        segment_bytes: int,
        segment_ms: int,
        retention_ms: int,
        retention_bytes: int,
    ) -> None:
        self.config = {
            "cleanup.policy": "delete",
            "segment.bytes": segment_bytes,
            "segment.ms": segment_ms,
            "retention.ms": retention_ms,
            "retention.bytes": retention_bytes,
        }
        self.store.create_topic(TOPIC, partitions, {k: str(v) for k, v in self.config.items()})
        self.models = [PartitionModel() for _ in range(partitions)]

    def watermark(self, partition: Partition, model: PartitionModel) -> int:
        """The high watermark `partition` must have: on a local directory every append
        is durable once it returns (test_model_s3.py: what the bucket holds)."""
        return model.end

    def open_store(self, read_only: bool = False) -> LogStore:
        """The store under test (test_model_s3.py opens it on an s3:// location)."""
        if read_only:
            return LogStore.open(self.directory, read_only=True)
        return LogStore.open(self.directory, clock=self.clock)

    def teardown(self) -> None:
        try:
            if self.reader is not None:
                self.reader.close()
            self.store.close()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    def partition(self, index: int, store: LogStore | None = None) -> Partition:
        return (store or self.store).topic(TOPIC).partitions[index]

    # -- appending --------------------------------------------------------------------

    @rule(
        specs=st.lists(record_specs, min_size=1, max_size=6),
        to_partition=st.one_of(st.none(), st.integers(min_value=0, max_value=1)),
    )
    def append(
        self,
        specs: list[tuple[bytes | None, bytes | None, Headers, int | None]],
        to_partition: int | None,
    ) -> None:
        count = len(self.models)
        target = None if to_partition is None else to_partition % count
        now = self.clock.ms
        records = [
            ProducerRecord(key, value, headers, None if ts is None else max(0, now + ts))
            for key, value, headers, ts in specs
        ]
        results = self.store.append(TOPIC, records, partition=target)

        # Where each record went: the given partition, its key's, or (keyless) the one
        # partition that took the keyless records as a whole.
        keyless = [r for r in records if r.key is None]
        keyed_count = [0] * count
        for r in records:
            if r.key is not None:
                keyed_count[partition_for_key(r.key, count)] += 1
        sizes = {res.partition: res.last_offset - res.base_offset + 1 for res in results}
        assert [res.partition for res in results] == sorted(sizes)
        placement: list[int | None]
        if target is not None:
            placement = [target] * len(records)
        else:
            keyless_target = None
            if keyless:
                fits = [p for p, n in sizes.items() if n == keyed_count[p] + len(keyless)]
                assert len(fits) == 1, (sizes, keyed_count, len(keyless))
                keyless_target = fits[0]
            placement = [
                keyless_target if r.key is None else partition_for_key(r.key, count)
                for r in records
            ]
        for res in results:
            model = self.models[res.partition]
            group = [r for r, p in zip(records, placement, strict=True) if p == res.partition]
            assert res.base_offset == model.end
            assert res.last_offset == model.end + len(group) - 1
            for r in group:
                timestamp = r.timestamp if r.timestamp is not None else now
                model.records.append(Record(model.end, timestamp, r.key, r.value, r.headers))
        assert sum(sizes.values()) == len(records)

    # -- rolling and sealing ------------------------------------------------------------

    @rule(ms=st.sampled_from([1, 999, 1000, 60_000, 3_600_000, DAY_MS, 8 * DAY_MS]))
    def advance_clock(self, ms: int) -> None:
        self.clock.ms += ms

    @rule(index=st.integers(min_value=0, max_value=1))
    def roll_if_due(self, index: int) -> None:
        partition = self.partition(index % len(self.models))
        before = partition.log_end_offset
        rolled = partition.roll_if_due()
        assert partition.log_end_offset == before
        if rolled:
            assert partition.active.is_empty
            assert len(partition.logs) == 1
            assert partition.manifest.sealed_end_offset == before

    @rule(index=st.integers(min_value=0, max_value=1))
    def roll(self, index: int) -> None:
        partition = self.partition(index % len(self.models))
        before = partition.log_end_offset
        partition.roll()
        assert partition.log_end_offset == before
        assert partition.active.is_empty
        assert partition.manifest.sealed_end_offset == before

    @rule(index=st.integers(min_value=0, max_value=1))
    def seal_rolled(self, index: int) -> None:
        partition = self.partition(index % len(self.models))
        assert partition.seal_rolled() == []  # auto_seal already sealed every rolled segment
        assert len(partition.logs) == 1

    @rule(index=st.integers(min_value=0, max_value=1), min_run=st.sampled_from([2, 3, 8]),
          segment_bytes=st.sampled_from([64 << 10, 1 << 20]))
    def merge_small_segments(self, index: int, min_run: int, segment_bytes: int) -> None:
        # Parquet files of a few records are a few KiB, so the topic's tiny segment.bytes
        # would never call them small: the rule passes a larger bound.
        partition = self.partition(index % len(self.models))
        before = partition.manifest.segments
        run = choose_run(partition.manifest, segment_bytes, min_run)
        merged = merge_small_segments(partition, min_run, segment_bytes)
        if not run:
            assert merged is None and partition.manifest.segments == before
            return
        assert merged is not None
        event(f"merged {len(run)} segments")
        start = before.index(run[0])
        assert partition.manifest.segments == (*before[:start], merged,
                                               *before[start + len(run):])
        assert (merged.base_offset, merged.last_offset, merged.record_count) == (
            run[0].base_offset, run[-1].last_offset, sum(i.record_count for i in run))

    # -- retention --------------------------------------------------------------------

    @rule(
        retention_ms=st.sampled_from([None, -1, 0, 5_000, 3_600_000, 7 * DAY_MS]),
        retention_bytes=st.sampled_from([None, -1, 0, 4_000, 12_000, 40_000]),
    )
    def alter_retention(self, retention_ms: int | None, retention_bytes: int | None) -> None:
        pairs = (("retention.ms", retention_ms), ("retention.bytes", retention_bytes))
        changes = {name: value for name, value in pairs if value is not None}
        self.store.alter_topic(TOPIC, {k: str(v) for k, v in changes.items()})
        self.config.update(changes)

    @rule(index=st.integers(min_value=0, max_value=1))
    def apply_retention(self, index: int) -> None:
        index %= len(self.models)
        partition = self.partition(index)
        model = self.models[index]
        segments = list(partition.manifest.segments)
        now = self.clock.ms

        # What the documented rule deletes: the oldest sealed segments whose newest record
        # is older than retention.ms, then more while the partition's bytes (sealed and log
        # segments, as Kafka counts the whole log) exceed retention.bytes.
        expected = []
        retention_ms = self.config["retention.ms"]
        if retention_ms >= 0:
            for info in segments:
                in_segment = model.records[info.base_offset : info.last_offset + 1]
                newest = max(r.timestamp for r in in_segment)
                if now - newest <= retention_ms:
                    break
                expected.append(info)
        retention_bytes = self.config["retention.bytes"]
        if retention_bytes >= 0:
            total = sum(s.size_bytes for s in segments[len(expected) :]) + sum(
                log.size for log in partition.logs)
            for info in segments[len(expected) :]:
                if total <= retention_bytes:
                    break
                expected.append(info)
                total -= info.size_bytes

        deleted = partition.apply_retention()
        assert deleted == expected
        event("retention deleted segments" if deleted else "retention deleted nothing")
        if deleted:
            kept = segments[len(deleted) :]
            new_start = kept[0].base_offset if kept else deleted[-1].last_offset + 1
            assert new_start > model.start
            model.start = new_start
        assert partition.log_start_offset == model.start
        assert partition.log_end_offset == model.end

    # -- reading ----------------------------------------------------------------------

    def check_read(
        self, partition: Partition, model: PartitionModel, offset: int, max_records: int,
        max_bytes: int,
    ) -> None:
        got = partition.read(offset, max_records, max_bytes)
        watermark = self.watermark(partition, model)
        assert partition.high_watermark == watermark
        expected = model.visible(offset, watermark)
        assert got == expected[: len(got)], (offset, max_records, max_bytes)
        if expected:
            assert 1 <= len(got) <= max_records
        else:
            assert got == []
        if len(got) < min(max_records, len(expected)):
            event("read stopped by max_bytes")
            # A read stops short of max_records only once it reached max_bytes (sizes as the
            # store counts them: key + value + 16, plus Arrow's per-row buffer overhead).
            taken = sum(approx_size(r) for r in got) + approx_size(expected[len(got)])
            assert taken + 10 * (len(got) + 1) + 16 > max_bytes, (offset, max_records, max_bytes)

    def check_everything(self, store: LogStore) -> None:
        for index, model in enumerate(self.models):
            partition = self.partition(index, store)
            assert partition.log_start_offset == model.start
            assert partition.log_end_offset == model.end
            watermark = self.watermark(partition, model)
            assert partition.high_watermark == watermark
            assert partition.read(0, EVERYTHING, EVERYTHING) == model.visible(0, watermark)

    @rule(
        index=st.integers(min_value=0, max_value=1),
        data=st.data(),
        max_records=st.one_of(st.integers(min_value=1, max_value=40), st.just(EVERYTHING)),
        max_bytes=st.one_of(st.integers(min_value=1, max_value=4000), st.just(EVERYTHING)),
    )
    def read(self, index: int, data: st.DataObject, max_records: int, max_bytes: int) -> None:
        index %= len(self.models)
        model = self.models[index]
        offset = data.draw(st.integers(min_value=model.start - 3, max_value=model.end + 3))
        self.check_read(self.partition(index), model, offset, max_records, max_bytes)

    @rule(index=st.integers(min_value=0, max_value=1), data=st.data())
    def offset_for_timestamp(self, index: int, data: st.DataObject) -> None:
        index %= len(self.models)
        model = self.models[index]
        visible = model.visible(0, self.watermark(self.partition(index), model))
        candidates = [r.timestamp + d for r in visible[-20:] for d in (-1, 0, 1)]
        target = data.draw(st.sampled_from([0, self.clock.ms, *candidates]))
        expected = next((r.offset for r in visible if r.timestamp >= target), None)
        assert self.partition(index).offset_for_timestamp(target) == expected

    @rule()
    def reopen(self) -> None:
        before = [
            (self.partition(i).manifest.segments, self.partition(i).read(0, EVERYTHING, EVERYTHING))
            for i in range(len(self.models))
        ]
        self.store.close()
        self.store = self.open_store()
        for index, (segments, records) in enumerate(before):
            partition = self.partition(index)
            assert partition.recovery.clean, partition.recovery
            if not self.seals_on_close:
                assert partition.manifest.segments == segments
            else:  # what was sealed stays, and the active segment was sealed after it
                assert partition.manifest.segments[:len(segments)] == segments
            assert partition.read(0, EVERYTHING, EVERYTHING)[:len(records)] == records
        self.check_everything(self.store)

    @rule(
        index=st.integers(min_value=0, max_value=1),
        data=st.data(),
        max_records=st.one_of(st.integers(min_value=1, max_value=40), st.just(EVERYTHING)),
        max_bytes=st.one_of(st.integers(min_value=1, max_value=4000), st.just(EVERYTHING)),
    )
    def read_only_reader(
        self, index: int, data: st.DataObject, max_records: int, max_bytes: int
    ) -> None:
        """A second, read-only store kept open alongside the writer sees the same data."""
        self.reader = self.reader or self.open_store(read_only=True)
        for i, model in enumerate(self.models):
            partition = self.partition(i, self.reader)
            partition.refresh()
            assert partition.log_start_offset == model.start
            assert partition.log_end_offset == model.end
        if data.draw(st.booleans(), label="read everything"):
            self.check_everything(self.reader)
            event("read-only reader read everything")
        index %= len(self.models)
        model = self.models[index]
        offset = data.draw(st.integers(min_value=model.start - 3, max_value=model.end + 3))
        self.check_read(self.partition(index, self.reader), model, offset, max_records, max_bytes)

    @rule(
        index=st.integers(min_value=0, max_value=1),
        data=st.data(),
        max_records=st.one_of(st.integers(min_value=1, max_value=40), st.just(EVERYTHING)),
        max_bytes=st.one_of(st.integers(min_value=1, max_value=4000), st.just(EVERYTHING)),
    )
    def stale_reader_read(
        self, index: int, data: st.DataObject, max_records: int, max_bytes: int
    ) -> None:
        """The read-only store reads without refreshing first, as a consumer does when the
        writer seals or applies retention between its refresh and its read: its view may
        be old, but what it returns is true, dense, and no error."""
        self.reader = self.reader or self.open_store(read_only=True)
        index %= len(self.models)
        model = self.models[index]
        partition = self.partition(index, self.reader)
        view_start = partition.log_start_offset
        offset = data.draw(st.one_of(st.just(0), st.integers(min_value=0, max_value=model.end + 3)))
        event(f"stale read, {'behind' if view_start < model.start else 'level with'} retention")
        got = partition.read(offset, max_records, max_bytes)
        assert len(got) <= max_records
        if got:
            # From the start of the view it had, or of a view the read refreshed to.
            first = got[0].offset
            assert first in (max(offset, view_start), max(offset, partition.log_start_offset))
            assert got == model.records[first : first + len(got)]

    @rule(
        index=st.integers(min_value=0, max_value=1),
        action=st.sampled_from(["retention", "roll", "append"]),
        specs=st.lists(record_specs, min_size=1, max_size=6),
        data=st.data(),
    )
    def reader_races_writer(
        self,
        index: int,
        action: str,
        specs: list[tuple[bytes | None, bytes | None, Headers, int | None]],
        data: st.DataObject,
    ) -> None:
        """A consumer's poll: refresh, then read; the writer acts in between."""
        self.reader = self.reader or self.open_store(read_only=True)
        index %= len(self.models)
        self.partition(index, self.reader).refresh()
        if action == "retention":
            self.apply_retention(index)
        elif action == "roll":
            self.roll(index)
        else:
            self.append(specs, index)
        self.stale_reader_read(index, data, EVERYTHING, EVERYTHING)

    @rule()
    def reopen_reader(self) -> None:
        if self.reader is not None:
            self.reader.close()
        self.reader = self.open_store(read_only=True)
        self.check_everything(self.reader)

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def offsets_are_dense(self) -> None:
        for index, model in enumerate(self.models):
            partition = self.partition(index)
            assert partition.log_start_offset == model.start
            assert partition.log_end_offset == model.end
            segments = partition.manifest.segments
            # Sealed segments tile [log start, sealed end) without gaps; the log segments
            # continue from there to the log end.
            position = model.start
            for info in segments:
                assert info.base_offset == position
                assert info.last_offset >= info.base_offset
                assert info.record_count == info.last_offset - info.base_offset + 1
                in_segment = model.records[info.base_offset : info.last_offset + 1]
                assert info.max_timestamp == max(r.timestamp for r in in_segment)
                position = info.last_offset + 1
            assert partition.manifest.sealed_end_offset == position
            for log in partition.logs:
                assert log.base_offset == position
                position = log.next_offset
            assert position == model.end
            event(f"sealed segments: {min(len(segments), 3)}{'+' if len(segments) >= 3 else ''}")
            # Every listed file is there; besides them only retired ones, which wait for
            # file.delete.delay.ms before the sweep deletes them.
            on_disk = {found.name for found in partition.volume.listing(SEGMENT_DIR)
                       if found.name.endswith(".parquet")}
            listed = {s.file for s in segments}
            retired = {item.path.rpartition("/")[2] for item in partition.manifest.retired}
            assert listed <= on_disk <= listed | retired
            for info in segments:
                path = partition.data_path(f"{SEGMENT_DIR}/{info.file}")
                assert path.stat().st_size == info.size_bytes

    @invariant()
    def reads_everything(self) -> None:
        if self.models:
            self.check_everything(self.store)


def model_settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=50,
        deadline=None,
        # No explain phase, and one bug shrunk at a time: shrinking these multi-step cases
        # is the slow part of a failing run (test_store.py reproduces each bug directly).
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
