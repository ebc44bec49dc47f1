"""Dropping a table that its topic no longer keeps (the raw table once
`iceberg.raw.enabled` is turned off), as Iceberg's DROP TABLE with PURGE.

Invariant: once a topic stops keeping a table, the table stops pinning files. Its
retained snapshots held data files in the partitions' hold documents (storage/holds.py),
so that a sweep kept sealed segments a merge or retention had retired; a table nothing
syncs or expires any more would keep them forever. The drop removes the table first and
its holds after, so that no reader finds a live table whose files vanish:
  1. remove `metadata/v1.metadata.json`, then `metadata/version-hint.text`: from then on
     `load_current` (DuckDB's `iceberg_scan(dir)`, pyiceberg's `StaticTable`, the REST
     catalog) finds no table, since it probes from the hint, or from v1 without one;
  2. remove every other file of the table (metadata, manifests, position deletes);
  3. drop the table's holder from each partition's hold document: the sweep deletes
     what only the table held (a file retired longer ago than file.delete.delay.ms) at
     its next round.
A crash between steps leaves a table that no reader finds, or holds without a table;
the next drop (the server's upkeep drops once per process start and at each switch-off)
finishes it. A reader that loaded the metadata before step 1 and reads on may find its
files gone, as with an expired snapshot. A sync by hand (`sync_raw_table`) of a topic
whose raw table is off makes the table again, held, until the next server start drops it.
Tests: tests/iceberg/test_iceberg_raw.py (the raw table switched off).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from compactlog.iceberg.files import table_files
from compactlog.iceberg.kinds import TableKind
from compactlog.iceberg.state import HINT, metadata_name
from compactlog.storage import LogStore

log = logging.getLogger(__name__)


@dataclass
class DropResult:
    topic: str
    table_files_removed: int = 0
    holds_released: int = 0  # partitions whose hold document named the table


def drop(store: LogStore, topic_name: str, kind: TableKind) -> DropResult:
    files = table_files(store, topic_name, kind.name)
    result = DropResult(topic_name)
    # 1. (a HEAD each on S3 when there is no table, rather than two DELETEs)
    if files.size(metadata_name(1)) is not None or files.size(HINT) is not None:
        result.table_files_removed += files.remove(metadata_name(1))
        result.table_files_removed += files.remove(HINT)
    result.table_files_removed += files.remove_all()  # 2.
    for partition in store.topic(topic_name).partitions:  # 3.
        if partition.holds.release(kind.holder):
            result.holds_released += 1
            if partition.writable:
                partition.sweeps.soon()
    if result.table_files_removed or result.holds_released:
        log.info("%s: dropped the Iceberg %s table (%d file(s)) and released its holds in "
                 "%d partition(s)", topic_name, kind.name, result.table_files_removed,
                 result.holds_released)
    return result
