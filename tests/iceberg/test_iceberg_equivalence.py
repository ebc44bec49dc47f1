"""Equivalence of the Iceberg state table with the compacted view, under random
schedules (hypothesis): produce (tombstones, headers), compaction (deletion vectors on
and off, adoption on and off, small ledger files merged eagerly or at the default, every
strategy the Arrow tasks run), merging small segments, retention
(raw segments on `compact`, retention.ms on `compact,delete`), DeleteRecords, the
clock moving past tombstone retention and retention.ms, and the upkeep's syncs.

Checked, read by DuckDB, pyiceberg and Polars (tests/support/iceberg_readers.py):
  - the current snapshot equals the view's fold up to each partition's horizon: the
    Reader's compacted view (`Partition.read_compacted`) up to the horizon, less
    tombstones; under the `latest` strategy also a model's fold of what was produced
    (each key's last record up to the horizon, gone when a tombstone, below
    DeleteRecords' cut or past retention.ms);
  - every earlier snapshot equals the state that was current when it was committed.
Each schedule starts by producing into both partitions and compacting, and ends with a
produce and a compaction. The default run is small; `test_..._long` (slow) runs
longer schedules, more of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from compactlog.iceberg import state_table_location, sync_state_table
from compactlog.storage.merging import merge_small_segments
from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from local_engine import LocalCompactionService
from support.fakes import FakeClock
from support.iceberg_readers import ENGINES, StateRow, read_state, snapshots
from support.iceberg_support import expected_state

TOPIC = "ticks"
PARTITIONS = 2
KEYS = 12
STRATEGIES = ["latest", "first", "order:timestamp"]

# The last field: whether one record in five is a tombstone. Produces without any let a
# ledger lose its tombstones (past delete.retention.ms), so that a sync takes a DV'd
# file's positions from its deletion vector (iceberg/deletes.py).
produce_op = st.tuples(st.just("produce"), st.integers(1, 25), st.integers(0, 10**6),
                       st.integers(0, 4), st.booleans())
# Deletion vectors on or off; dirty segments adopted into the ledger as they are or not;
# small ledger files merged as soon as two are neighbours (merge.min.files 2) or at the
# default 5.
compact_op = st.tuples(st.just("compact"), st.booleans(), st.booleans(), st.booleans())
merge_op = st.just(("merge",))
retention_op = st.just(("retention",))
delete_op = st.tuples(st.just("delete_records"), st.integers(0, PARTITIONS - 1),
                      st.floats(0, 1))
clock_op = st.tuples(st.just("advance"), st.sampled_from([1, 30, 90, 4000]))
sync_op = st.just(("sync",))
operations = st.one_of(produce_op, produce_op, produce_op, compact_op, compact_op, merge_op,
                       retention_op, delete_op, clock_op, sync_op)


@dataclass
class Model:
    """What was produced, per partition: (offset, key, value, timestamp)."""

    records: dict[int, list[tuple[int, bytes, bytes | None, int]]] = field(
        default_factory=lambda: {index: [] for index in range(PARTITIONS)})

    def fold(self, store: LogStore, retention_ms: int) -> list[tuple[int, int, bytes, bytes]]:
        now_ms = int(store.clock() * 1000)
        rows = []
        for partition in store.topic(TOPIC).partitions:
            manifest = partition.manifest
            if manifest.horizon is None:
                continue
            latest: dict[bytes, tuple[int, bytes, bytes | None, int]] = {}
            for record in self.records[partition.index]:
                if record[0] <= manifest.horizon:
                    latest[record[1]] = record
            for offset, key, value, timestamp in latest.values():
                if value is None or offset < manifest.deleted_below:
                    continue
                if retention_ms >= 0 and timestamp < now_ms - retention_ms:
                    continue
                rows.append((partition.index, offset, key, value))
        return sorted(rows)


def run_schedule(root: Path, strategy: str, compact_delete: bool,
                 schedule: list[tuple[Any, ...]]) -> None:
    clock = FakeClock()
    retention_ms = 200_000 if compact_delete else -1
    config = {"cleanup.policy": "compact,delete" if compact_delete else "compact",
              "retention.ms": str(retention_ms), "min.compaction.lag.ms": "0",
              "compaction.strategy": strategy, "delete.retention.ms": "60000",
              "compaction.ledger.rewrite.live.fraction": "0.3",
              # Replaced files are deleted at once, but every snapshot is retained: the
              # holds (storage/holds.py) must keep each one readable.
              "segment.bytes": "2000", "file.delete.delay.ms": "0",
              "iceberg.history.expire.max-snapshot-age-ms": str(10**12)}
    model = Model()
    taken: list[tuple[int, list[StateRow]]] = []
    with LogStore.open(root, clock=clock) as store:
        store.create_topic(TOPIC, PARTITIONS, config)
        table = state_table_location(store, TOPIC)

        def note(snapshot_id: int | None) -> None:
            if snapshot_id is not None:
                taken.append((snapshot_id, expected_state(store, TOPIC)))

        warm_up = [("produce", 20, 1, 0), ("produce", 20, 2, 1), ("compact", True)]
        for op in [*warm_up, *schedule, ("produce", 10, 3, 0), ("compact", False)]:
            name = op[0]
            if name == "produce":
                count, seed, partition = op[1:4]
                tombstones = len(op) < 5 or op[4]
                index = partition % PARTITIONS
                now_ms = int(clock() * 1000)
                records = [ProducerRecord(b"k%d" % ((seed + i * 7) % KEYS),
                                          None if tombstones and (seed + i) % 5 == 0
                                          else b"v%d-%d" % (seed, i),
                                          (("h", b"%d" % i),) if i % 3 == 0 else (),
                                          now_ms - (seed + i) % 3 * 1000)
                           for i in range(count)]
                result = store.append(TOPIC, records, partition=index)[0]
                first = result.base_offset
                model.records[index] += [(first + i, r.key or b"", r.value,
                                          r.timestamp or 0) for i, r in enumerate(records)]
                store.topic(TOPIC).partition(index).roll()
            elif name == "compact":
                adopt = len(op) > 2 and op[2]
                eager_merge = len(op) > 3 and op[3]
                store.alter_topic(TOPIC, {"compaction.deletion.vectors": str(op[1]).lower(),
                                          "compaction.segment.adopt.min.bytes":
                                          "0" if adopt else "-1",
                                          "compaction.segment.adopt.live.fraction": "0",
                                          "compaction.ledger.merge.min.files":
                                          "2" if eager_merge else "5"})
                report = LocalCompactionService(store, TOPIC, {"engine": "arrow",
                                                               "clock": clock}).compact()
                if eager_merge and report.total("ledger_files_in") >= 2:
                    event("a compaction with two or more small ledger files to merge")
                if any(any(info.dv_file for info in p.manifest.ledger)
                       and p.manifest.compaction is not None
                       and p.manifest.compaction.oldest_tombstone_ms is None
                       for p in store.topic(TOPIC).partitions):
                    event("a ledger with deletion vectors and no tombstone: positions "
                          "from the DVs")
                after = snapshots(table)[-1]["id"] if Path(table).exists() else None
                if after is not None and all(after != s for s, _ in taken):
                    note(after)
            elif name == "merge":
                for partition in store.topic(TOPIC).partitions:
                    merge_small_segments(partition, min_run=2, segment_bytes=10**6)
            elif name == "retention":
                for partition in store.topic(TOPIC).partitions:
                    partition.apply_retention()
            elif name == "delete_records":
                partition = store.topic(TOPIC).partition(op[1])
                end = partition.log_end_offset
                start = partition.log_start_offset
                partition.delete_records(start + int((end - start) * op[2]))
            elif name == "advance":
                clock.advance(op[1])
            elif name == "sync":
                note(sync_state_table(store, TOPIC, cause="upkeep").snapshot_id)
            for partition in store.topic(TOPIC).partitions:  # delete what nothing holds
                partition.sweep()
        note(sync_state_table(store, TOPIC).snapshot_id)
        event(f"snapshots: {min(len(taken), 5)}{'+' if len(taken) >= 5 else ''}")
        if not taken:
            return
        state = expected_state(store, TOPIC)
        for engine in ENGINES:
            assert read_state(engine, table) == state, engine
        if strategy == "latest":
            assert [row[:4] for row in state] == model.fold(store, retention_ms)
        # Every snapshot reads as the state that was current when it was committed.
        for number, (snapshot_id, then) in enumerate(taken):
            engines = ENGINES if number % 2 == 0 or number == len(taken) - 1 else ("duckdb",)
            for engine in engines:
                assert read_state(engine, table, snapshot_id) == then, (engine, number)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(strategy=st.sampled_from(STRATEGIES), compact_delete=st.booleans(),
       schedule=st.lists(operations, min_size=4, max_size=14))
def test_the_state_table_equals_the_view_under_random_schedules(
        tmp_path_factory: pytest.TempPathFactory, strategy: str, compact_delete: bool,
        schedule: list[tuple[Any, ...]]) -> None:
    run_schedule(tmp_path_factory.mktemp("iceberg") / "data", strategy, compact_delete,
                 schedule)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(strategy=st.sampled_from(STRATEGIES), compact_delete=st.booleans(),
       schedule=st.lists(operations, min_size=10, max_size=40))
def test_the_state_table_equals_the_view_under_random_schedules_long(
        tmp_path_factory: pytest.TempPathFactory, strategy: str, compact_delete: bool,
        schedule: list[tuple[Any, ...]]) -> None:
    run_schedule(tmp_path_factory.mktemp("iceberg") / "data", strategy, compact_delete,
                 schedule)
