"""Every read path serves one compacted view (DESIGN.md, contract item 14), whatever
happened to the partition: a property test over random schedules.

A schedule is appends (tombstones and, when null.key.policy permits, null keys), rolls
(each seals at once), merges of small sealed segments (storage/merging.py), compactions
(in this process: the Arrow tasks, deletion vectors on or off, every strategy but
user functions), retention, DeleteRecords, a fake clock moving past delete.retention.ms
and retention.ms, and config changes (cleanup.policy compact <-> compact,delete,
retention.ms). After every step, the raw and compacted views read by the Reader, by Kafka
Fetch (wire.read_batches, decoded as a consumer does) and by `tables.view_dataset`
through DuckDB and through Polars (their sealed part) are the same records, and the
compacted view is the model's. The Spark data source (its own planner and tasks, at the
fake clock's instant, tests/support/read_paths.py `ClockedSource`) and `read_topic` are compared
at the end of each schedule only, on the session the test run shares (conftest.py), as
a Spark query costs a second or so. The default run takes about a minute and a half;
the slow variant runs longer schedules, many more of them.

The model (`PartitionModel`) holds the appended records and the ledger as the contract
defines it: each compaction folds, in offset order, the records then in the view up to
the new horizon (the ledger's and the newly sealed ones'), by the strategy, with
tombstones resetting a key; then drops tombstones past delete.retention.ms, records past
retention.ms on compact,delete and records below DeleteRecords' offset. A read of the
view is that ledger, minus what the read-time rules take out now, then the raw records
after the horizon. Where compaction departs from it (under `first` or `order:`, a
survivor that retention.ms then drops: see `compact`), the model says so (`diverged`)
and from then on that partition's read paths are compared with each other only.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from pyspark.sql import SparkSession

from compactlog.storage.merging import merge_small_segments
from compactlog.storage.partition import Partition
from compactlog.storage.records import ProducerRecord, Record
from compactlog.storage.store import LogStore
from local_engine import LocalCompactionService
from support.fakes import FakeClock
from support.read_paths import (
    Row,
    by_partition,
    clocked_spark_rows,
    duckdb_rows,
    fetch_rows,
    polars_rows,
    read_topic_rows,
    reader_rows,
    sealed_part,
)

PARTITIONS = 2
KEYS = [b"a", b"b", b"c", b"d"]
STRATEGIES = ["latest", "first", "order:timestamp", "order:header:v:long"]
RETENTION_MS = [2_000, 10_000, 60_000]


def header_order(record: Record) -> int | None:
    for name, value in record.headers:
        if name == "v" and value is not None:
            return int(value)
    return None


def replaces(strategy: str, kept: Record, current: Record) -> bool:
    """Whether `current` (later) replaces `kept` as its key's survivor, neither a
    tombstone (compactlog/strategy.py: ties go to the greater offset)."""
    if strategy == "latest":
        return True
    if strategy == "first":
        return False
    if strategy == "order:timestamp":
        return current.timestamp >= kept.timestamp
    new, old = header_order(current), header_order(kept)
    return new is not None and (old is None or new >= old)


@dataclass
class PartitionModel:
    """One partition's records and ledger, as the contract defines them."""

    log: list[Record] = field(default_factory=list)
    horizon: int = -1
    deleted_below: int = 0
    # The ledger: (record, when its run first kept it if it is a keyed tombstone).
    ledger: list[tuple[Record, int | None]] = field(default_factory=list)
    diverged: bool = False  # an expired survivor under first/order (see `compact`)

    def visible(self, record: Record, since: int | None, now_ms: int, rules: Rules) -> bool:
        """Whether a ledger record is in the view now (the read-time rules)."""
        if record.offset < self.deleted_below:
            return False
        if rules.retention_ms >= 0 and record.timestamp < now_ms - rules.retention_ms:
            return False
        return since is None or now_ms - since < rules.delete_retention_ms

    def view(self, now_ms: int, rules: Rules) -> list[Record]:
        ledger = [r for r, since in self.ledger if self.visible(r, since, now_ms, rules)]
        start = max(self.horizon + 1, self.deleted_below)
        return ledger + [r for r in self.log if r.offset >= start]

    def compact(self, segments: list[tuple[int, int]], now_ms: int, rules: Rules) -> None:
        """A run over the sealed `segments` (first and last offsets) the store lists."""
        sealed_end = segments[-1][1] + 1 if segments else 0
        dirty = [r for r in self.log if self.horizon < r.offset < sealed_end]
        # The records in the view now, and only those, compete.
        ledger = self.fold(
            [(r, s) for r, s in self.ledger if self.visible(r, s, now_ms, rules)]
            + [(r, None) for r in dirty if self.visible(r, None, now_ms, rules)],
            now_ms, rules)
        # Compaction leaves rows below DeleteRecords' offset (and deletion vectors') out
        # of its survivor selection (issue 21, item 8), but lets records past retention.ms
        # compete and then drops the survivors that expired, so under `first` or `order:`
        # a key whose survivor expired vanishes though later records of it are live
        # (NotInView in compaction/arrow_survivors.py says why: with timestamps out of
        # order, leaving them out could bring back a value the key had overwritten).
        # Where that happens, only the read paths are compared with each other from then
        # on.
        stored = [r for r in dirty if any(first <= r.offset <= last for first, last in segments)]
        competing = [(r, s) for r, s in self.ledger if r.offset >= self.deleted_below] + [
            (r, None) for r in stored if r.offset >= self.deleted_below]
        if self.fold(competing, now_ms, rules) != ledger:
            self.diverged = True
        self.ledger = ledger
        if any(r.offset >= self.deleted_below for r in dirty):
            self.horizon = sealed_end - 1

    def fold(self, candidates: list[tuple[Record, int | None]], now_ms: int,
             rules: Rules) -> list[tuple[Record, int | None]]:
        """The ledger a run writes from `candidates` (in offset order): each key's
        survivor by the strategy, a tombstone resetting its key, null-key records by the
        policy; then the rules take out what is not in the view."""
        survivors: dict[bytes, tuple[Record, int | None]] = {}
        null_keys: list[tuple[Record, int | None]] = []
        for record, since in candidates:
            if record.key is None:
                if rules.null_key_policy == "keep":
                    null_keys.append((record, None))
                continue
            kept = survivors.get(record.key)
            if (kept is None or record.value is None or kept[0].value is None
                    or replaces(rules.strategy, kept[0], record)):
                survivors[record.key] = (record, since)
        ledger = []
        for record, since in list(survivors.values()) + null_keys:
            if record.key is None or record.value is not None:
                since = None
            elif since is None:
                since = now_ms  # a tombstone kept for the first time
            if self.visible(record, since, now_ms, rules):
                ledger.append((record, since))
        return sorted(ledger, key=lambda item: item[0].offset)


@dataclass(frozen=True)
class Rules:
    strategy: str
    delete_retention_ms: int
    retention_ms: int  # -1 unless cleanup.policy has delete
    null_key_policy: str


def rows_of(index: int, records: list[Record]) -> list[Row]:
    return [(index, r.offset, r.key, r.value) for r in records]


class ReadPathsMachine(RuleBasedStateMachine):
    """Subclasses set `spark` (None: no Spark comparison)."""

    spark: SparkSession | None = None

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="read-paths-"))
        self.clock = FakeClock()
        self.store = LogStore.open(self.directory / "data", clock=self.clock)
        self.models = [PartitionModel() for _ in range(PARTITIONS)]
        self.config: dict[str, str] = {}
        self.appended = 0

    @initialize(strategy=st.sampled_from(STRATEGIES),
                delete_retention=st.sampled_from([0, 10_000]),
                null_policy=st.sampled_from(["reject", "drop", "keep"]),
                deletion_vectors=st.booleans(), rewrite=st.sampled_from([0.0, 0.5, 1.0]),
                policy=st.sampled_from(["compact", "compact,delete"]),
                retention=st.sampled_from(RETENTION_MS))
    def create(self, strategy: str, delete_retention: int, null_policy: str,
               deletion_vectors: bool, rewrite: float, policy: str, retention: int) -> None:
        self.config = {
            "cleanup.policy": policy, "retention.ms": str(retention),
            "min.compaction.lag.ms": "0", "segment.bytes": str(1 << 30),
            "compaction.strategy": strategy, "delete.retention.ms": str(delete_retention),
            "null.key.policy": null_policy, "file.delete.delay.ms": "0",
            "compaction.deletion.vectors": str(deletion_vectors).lower(),
            "compaction.ledger.rewrite.live.fraction": str(rewrite),
        }
        self.store.create_topic("t", PARTITIONS, self.config)
        self.service = LocalCompactionService(self.store, "t",
                                              {"clock": self.clock, "engine": "arrow"})

    @property
    def topic_rules(self) -> Rules:
        config = self.store.topic("t").config
        retention = config["retention.ms"] if "delete" in config.cleanup_policy else -1
        return Rules(config["compaction.strategy"], config["delete.retention.ms"],
                     retention, config["null.key.policy"])

    def partition(self, index: int) -> Partition:
        return self.store.topic("t").partition(index)

    # -- the schedule ---------------------------------------------------------------------

    @rule(index=st.integers(0, PARTITIONS - 1), then_roll=st.booleans(), data=st.data())
    def produce(self, index: int, then_roll: bool, data: Any) -> None:
        keys = KEYS + ([None] if self.topic_rules.null_key_policy != "reject" else [])
        batch = data.draw(st.lists(st.tuples(st.sampled_from(keys), st.one_of(
            st.none(), st.integers(0, 99))), min_size=1, max_size=6))
        records = [ProducerRecord(key, None if n is None else b"%02d" % n,
                                  () if n is None else (("v", b"%d" % (n % 7)),))
                   for key, n in batch]
        (result,) = self.store.append("t", records, partition=index)
        now_ms = self.clock.ms
        for position, record in enumerate(records):
            self.models[index].log.append(Record(result.base_offset + position, now_ms,
                                                 record.key, record.value, record.headers))
        if then_roll:
            self.roll(index)

    @rule(index=st.integers(0, PARTITIONS - 1))
    def roll(self, index: int) -> None:
        self.partition(index).roll()  # and sealed at once (auto_seal)

    @rule(index=st.integers(0, PARTITIONS - 1), min_run=st.sampled_from([2, 3]))
    def merge(self, index: int, min_run: int) -> None:
        # Parquet files of a few records are a few KiB: a bound of 1 MiB calls them small.
        merge_small_segments(self.partition(index), min_run, 1 << 20)

    @rule()
    def compact(self) -> None:
        rules = self.topic_rules
        now_ms = self.clock.ms
        self.service.compact()
        for index, model in enumerate(self.models):
            segments = [(info.base_offset, info.last_offset)
                        for info in self.partition(index).manifest.segments]
            model.compact(segments, now_ms, rules)

    @rule(index=st.integers(0, PARTITIONS - 1))
    def retention(self, index: int) -> None:
        self.partition(index).apply_retention()

    @rule(index=st.integers(0, PARTITIONS - 1), data=st.data())
    def delete_records(self, index: int, data: Any) -> None:
        model = self.models[index]
        # From what is deleted already to the log end: a cut below changes nothing.
        cut = data.draw(st.integers(model.deleted_below, len(model.log)))
        self.partition(index).delete_records(cut)
        model.deleted_below = max(model.deleted_below, cut)

    @rule(seconds=st.sampled_from([1, 3, 11, 61]))
    def tick(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @precondition(lambda self: bool(self.config))
    @rule(policy=st.sampled_from(["compact", "compact,delete"]),
          retention=st.sampled_from(RETENTION_MS))
    def alter(self, policy: str, retention: int) -> None:
        self.store.alter_topic("t", {"cleanup.policy": policy, "retention.ms": str(retention)})

    # -- the views --------------------------------------------------------------------

    def expected(self, rows: list[Row]) -> list[Row]:
        """The model's view, but `rows`' own for a partition the model cannot follow."""
        rules, now_ms = self.topic_rules, self.clock.ms
        return [row for index, model in enumerate(self.models)
                for row in ([r for r in rows if r[0] == index] if model.diverged
                            else rows_of(index, model.view(now_ms, rules)))]

    @invariant()
    def every_path_serves_the_view(self) -> None:
        if not self.config:
            return
        path = self.directory / "data"
        compacted = reader_rows(self.store, "t")
        assert compacted == self.expected(compacted), "the Reader is not the model"
        assert fetch_rows(self.store, "t") == compacted, "Fetch"
        sealed = sealed_part(compacted, self.store, "t")
        assert duckdb_rows(path, "t", clock=self.clock) == sealed, "DuckDB"
        assert polars_rows(path, "t", clock=self.clock) == sealed, "Polars"
        raw = reader_rows(self.store, "t", "raw")
        assert raw == [row for index, model in enumerate(self.models)
                       for row in rows_of(index, model.log)
                       if row[1] >= self.partition(index).log_start_offset], "raw"
        assert fetch_rows(self.store, "t", "raw") == raw, "Fetch, raw"
        raw_sealed = sealed_part(raw, self.store, "t")
        assert duckdb_rows(path, "t", "raw", self.clock) == raw_sealed, "DuckDB, raw"
        assert polars_rows(path, "t", "raw", self.clock) == raw_sealed, "Polars, raw"

    def teardown(self) -> None:
        try:
            if self.spark is not None and self.config:
                path = self.directory / "data"
                compacted = by_partition(reader_rows(self.store, "t"))
                now = self.clock()
                assert clocked_spark_rows(self.spark, path, "t", now) == compacted, "Spark"
                assert read_topic_rows(self.spark, path, "t", clock=self.clock) == \
                    compacted, "read_topic"
        finally:
            self.store.close()
            shutil.rmtree(self.directory, ignore_errors=True)


def machine_with(spark: SparkSession | None) -> type[ReadPathsMachine]:
    class Machine(ReadPathsMachine):
        pass

    Machine.spark = spark
    return Machine


def run(machine: type[ReadPathsMachine], examples: int, steps: int) -> None:
    run_state_machine_as_test(machine, settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))


def test_every_read_path_serves_the_same_view(spark: SparkSession) -> None:
    run(machine_with(spark), examples=20, steps=30)


def test_every_read_path_serves_the_same_view_without_spark() -> None:
    run(machine_with(None), examples=40, steps=30)


@pytest.mark.slow
def test_every_read_path_serves_the_same_view_at_length(spark: SparkSession) -> None:
    run(machine_with(spark), examples=200, steps=50)
