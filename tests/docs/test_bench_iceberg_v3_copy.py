"""bench/iceberg_v3_copy.py, the diagnostic whose DuckDB timings docs/benchmarks.md
quotes ("Deletion vectors, and where DuckDB pays for deletes"): its v3 copy of a state
table, deletes as Puffin deletion vectors, must read as the state table does in every
engine, or the timings compare different answers. The copy whose deleted positions sit
at each file's start deletes as many rows."""

from __future__ import annotations

import sys
from pathlib import Path

from compactlog.iceberg import state_table_location
from compactlog.storage.store import LogStore
from support.fakes import FakeClock
from support.iceberg_readers import duckdb_rows
from support.iceberg_support import (
    CONFIG,
    TOPIC,
    assert_engines_read,
    compact,
    expected_state,
    produce,
    updates,
)
from support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from iceberg_v3_copy import v3_copy


def test_the_v3_copy_reads_as_the_state_table(tmp_path: Path, clock: FakeClock) -> None:
    store = LogStore.open(tmp_path / "data", clock=clock)
    store.create_topic(TOPIC, 3, CONFIG)
    produce(store, updates(0, 400, 60, tombstone_every=7))
    compact(store)
    produce(store, updates(400, 60, 90, tombstone_every=5))
    compact(store)  # deletion vectors and tombstones: position deletes in the table
    table = Path(state_table_location(store, TOPIC))
    expected = expected_state(store)
    copy = v3_copy(table, tmp_path / "v3")
    assert_engines_read(copy, expected)
    at_starts = duckdb_rows(v3_copy(table, tmp_path / "v3-first", contiguous=True))
    assert len(at_starts) == len(expected) and at_starts != expected
