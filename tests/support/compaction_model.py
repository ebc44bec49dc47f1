"""The model of compaction's contract (DESIGN.md) that the compaction model tests check
random steps against, on a local directory and on S3."""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from compactlog.compaction import TopicCompactionService, load_factory
from compactlog.storage.merging import merge_small_segments
from compactlog.storage.records import ProducerRecord, Record
from compactlog.storage.store import LogStore
from user_strategies import keep_larger_value

T0 = 1_800_000_000.0


RETENTION_MS = 10_000


KEYS = [b"a", b"b", b"c", b"d", None]


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _order(record: Record) -> int | None:
    for name, value in record.headers:
        if name == "v":
            return int(value or b"0")
    return None


def _wins(strategy: str, kept: Record, current: Record) -> bool:
    """Whether `current` replaces `kept` (neither a tombstone) under `strategy`."""
    if strategy == "latest":
        return True
    if strategy == "first":
        return False
    if strategy.startswith("order:"):
        new, old = _order(current), _order(kept)
        return new is not None and (old is None or new >= old)
    return not keep_larger_value(kept, current)


class CompactionModel(RuleBasedStateMachine):
    make_service: Callable[[LogStore, str, Clock], TopicCompactionService]

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="compaction-model-"))
        self.clock = Clock()
        self.store = self.open_store()
        self.log: list[Record] = []
        self.sealed_end = 0  # offsets below this are in sealed segments
        self.horizon = -1
        self.ledger: dict[bytes | None, tuple[Record, int | None]] = {}
        self.null_ledger: list[Record] = []
        self.deleted_below = 0  # DeleteRecords: no view serves an offset below it
        self.full_run_comparable = True  # see the module: one_full_run_agrees

    extra_config: dict[str, str] = {}  # noqa: RUF012  (read only)
    # compaction.segment.adopt.min.bytes: 0 adopts every segment that qualifies
    # (compaction/adoption.py), -1 none; the tests' segments are far below the default.
    adopt_min_bytes = -1
    # compaction.ledger.merge.below.bytes: 0 never merges; 1 GiB makes every ledger file
    # small, so that any two neighbours merge (merge.min.files is 2 here).
    merge_below_bytes = 0

    def open_store(self) -> LogStore:
        """The store under test (test_compaction_model_s3.py: on an s3:// location)."""
        return LogStore.open(self.directory, clock=self.clock)

    def create_topic(self, strategy: str, retention: int, null_policy: str,
                     deletion_vectors: bool, rewrite: float) -> None:
        self.strategy = strategy
        self.retention = retention
        self.null_policy = null_policy
        self.topic_config = {
            "cleanup.policy": "compact", "min.compaction.lag.ms": "0",
            "compaction.strategy": strategy, "delete.retention.ms": str(retention),
            "null.key.policy": null_policy, "segment.bytes": str(1 << 30),
            "compaction.deletion.vectors": str(deletion_vectors).lower(),
            "compaction.ledger.rewrite.live.fraction": str(rewrite),
            "compaction.segment.adopt.min.bytes": str(self.adopt_min_bytes),
            # The rewrite fraction alone decides, so that files with dead rows are adopted.
            "compaction.segment.adopt.live.fraction": "0",
            "compaction.ledger.merge.below.bytes": str(self.merge_below_bytes),
            "compaction.ledger.merge.min.files": "2",
            **self.extra_config,
        }
        self.store.create_topic("m", config=self.topic_config)
        self.partition = self.store.topic("m").partitions[0]
        self.service = self.make_service(self.store, "m", self.clock)

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    @rule(batch=st.lists(st.tuples(st.sampled_from(KEYS), st.one_of(
        st.none(), st.integers(0, 99))), min_size=1, max_size=6))
    def produce(self, batch: list[tuple[bytes | None, int | None]]) -> None:
        records = [
            ProducerRecord(key, None if n is None else b"%02d" % n,
                           () if n is None else (("v", b"%d" % (n % 7)),),
                           int(self.clock.now * 1000))
            for key, n in batch
        ]
        (result,) = self.store.append("m", records, partition=0)
        for position, record in enumerate(records):
            self.log.append(Record(result.base_offset + position, record.timestamp or 0,
                                   record.key, record.value, tuple(record.headers)))

    @rule()
    def seal(self) -> None:
        if self.partition.roll():
            self.sealed_end = len(self.log)

    @rule(min_run=st.sampled_from([2, 3]))
    def merge_small_segments(self, min_run: int) -> None:
        # storage/merging.py: regroups sealed records, never across the horizon; the
        # views (invariant) must not change. Parquet files of a few records are a few
        # KiB, so a larger bound than the topic's segment.bytes calls them small.
        merge_small_segments(self.partition, min_run, 1 << 20)
        horizon = (self.partition.manifest.compaction.horizon
                   if self.partition.manifest.compaction is not None else None)
        for info in self.partition.manifest.segments:
            assert horizon is None or not info.base_offset <= horizon < info.last_offset

    @rule(seconds=st.sampled_from([1, 5, 11]))
    def tick(self, seconds: int) -> None:
        self.clock.now += seconds

    @precondition(lambda self: hasattr(self, "service"))
    @rule()
    def compact(self) -> None:
        now_ms = int(self.clock.now * 1000)
        dirty = self.log[self.horizon + 1 : self.sealed_end]
        has_expiring = any(since is not None and now_ms - since >= self.retention
                           for _, since in self.ledger.values())
        self.service.compact()
        if not dirty and not has_expiring:
            return
        for record in dirty:
            if record.offset < self.deleted_below:
                continue  # not in the view: DeleteRecords deleted it before this run
            if record.key is None:
                if self.null_policy == "keep":
                    self.null_ledger.append(record)
                continue
            kept = self.ledger.get(record.key)
            if (kept is None or record.value is None or kept[0].value is None
                    or _wins(self.strategy, kept[0], record)):
                self.ledger[record.key] = (record, None)
        if dirty:
            self.horizon = dirty[-1].offset
        for key, (record, since) in list(self.ledger.items()):
            if record.value is None:
                since = now_ms if since is None else since
                if now_ms - since >= self.retention:
                    del self.ledger[key]
                else:
                    self.ledger[key] = (record, since)

    @precondition(lambda self: hasattr(self, "partition"))
    @rule(data=st.data())
    def delete_records(self, data: Any) -> None:
        # Kafka's bound: only up to the high watermark (what consumers may read).
        cut = data.draw(st.integers(self.deleted_below,
                                    max(self.deleted_below, self.durable_end())))
        self.partition.delete_records(cut)
        if self.strategy != "latest" and cut <= self.horizon:
            self.full_run_comparable = False
        self.deleted_below = cut
        self.ledger = {key: kept for key, kept in self.ledger.items() if kept[0].offset >= cut}
        self.null_ledger = [record for record in self.null_ledger if record.offset >= cut]

    @precondition(lambda self: hasattr(self, "service"))
    @rule()
    def one_full_run_agrees(self) -> None:
        """Seal and compact, then compact the same records once in a fresh store."""
        self.seal()
        self.compact()
        if not self.full_run_comparable or not self.log:
            return
        directory = Path(tempfile.mkdtemp(prefix="compaction-full-"))
        try:
            with LogStore.open(directory, clock=self.clock) as full:
                full.create_topic("m", config=self.topic_config)
                full.append("m", [ProducerRecord(r.key, r.value, r.headers, r.timestamp)
                                  for r in self.log], partition=0)
                partition = full.topic("m").partitions[0]
                partition.delete_records(self.deleted_below)
                partition.roll()
                self.make_service(full, "m", self.clock).compact()
                once = partition.read_compacted(0, 10_000, 1 << 40)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        incremental = self.partition.read_compacted(0, 10_000, 1 << 40)

        def live(view: list[Record]) -> list[Record]:
            return [record for record in view if record.value is not None]

        assert live(incremental) == live(once)

    def durable_end(self) -> int:
        """The high watermark the partition must have: on a local disk every append is
        durable once it returns (test_compaction_model_s3.py: what the bucket holds)."""
        return len(self.log)

    def expected_view(self) -> list[Record]:
        # A kept tombstone leaves the view once delete.retention.ms has passed since the
        # run that kept it, at read time (contract item 2), before a run drops it.
        now_ms = int(self.clock.now * 1000)
        kept = [record for record, since in self.ledger.values()
                if since is None or now_ms - since < self.retention] + self.null_ledger
        tail = self.log[max(self.horizon + 1, self.deleted_below):self.durable_end()]
        return sorted(kept, key=lambda r: r.offset) + tail

    @invariant()
    def views_match(self) -> None:
        if not hasattr(self, "partition"):
            return
        view: list[Record] = []
        offset = 0
        while batch := self.partition.read_compacted(offset, 5):
            view += batch
            offset = batch[-1].offset + 1
        assert self.partition.high_watermark == self.durable_end()
        assert view == self.expected_view()
        assert self.partition.read(0, 10_000, 1 << 40) == \
            self.log[self.deleted_below:self.durable_end()]

    @precondition(lambda self: hasattr(self, "partition"))
    @rule(data=st.data())
    def seek(self, data: Any) -> None:
        expected = self.expected_view()
        offset = data.draw(st.integers(0, len(self.log) + 1))
        got = self.partition.read_compacted(offset, 1_000)
        assert got == [r for r in expected if r.offset >= offset]


class ArrowDeletionVectorModel(CompactionModel):
    """The Arrow tasks (run in this process) with deletion vectors: incremental runs
    leave previous ledger files in place with DVs, or rewrite them below a live
    fraction forced tiny (0: never rewrite), middling or high (1: always rewrite)."""

    @initialize(strategy=st.sampled_from(["latest", "first", "order:header:v"]),
                retention=st.sampled_from([0, RETENTION_MS]),
                null_policy=st.sampled_from(["drop", "keep"]),
                rewrite=st.sampled_from([0.0, 0.01, 0.5, 0.9, 1.0]), adopt=st.booleans(),
                merge=st.booleans())
    def create(self, strategy: str, retention: int, null_policy: str, rewrite: float,
               adopt: bool, merge: bool) -> None:
        self.adopt_min_bytes = 0 if adopt else -1
        self.merge_below_bytes = 1 << 30 if merge else 0
        self.create_topic(strategy, retention, null_policy, True, rewrite)

    def make_service(self, store: LogStore, topic: str, clock: Clock) -> TopicCompactionService:
        factory = load_factory("local_engine:LocalCompactionServiceFactory")
        return factory.new_service(store, topic, {"clock": clock, "engine": "arrow"})

    @invariant()
    def ledger_files_are_ordered_and_live(self) -> None:
        if not hasattr(self, "partition"):
            return
        ledger = self.partition.manifest.ledger
        for before, after in itertools.pairwise(ledger):
            assert before.last_offset < after.base_offset
        assert all(info.live_count > 0 for info in ledger)
