"""A table found where it was not written (a moved or copied data directory) starts
afresh where it now is.

Iceberg has no relative paths: a table's metadata names its `location`, its manifest
lists, manifests and delete files, and its data files (the ledger files, the sealed
segments) by absolute path. A data directory restored from a backup to another path,
renamed, or copied (tests/faults/test_fault_steps_s3.py copies a prefix before each replay) keeps
metadata that names the old directory: reading it there fails (moved) or reads the old
directory's files (copied), and a sync could not read the previous snapshot's manifests.

Invariant: a table whose recorded `location` is not where its files are now is never
built on. The sync (state.py) takes such a table as none, and commits at the next
version, as ever (create if absent: the table's one commit point), a table with the
same `table-uuid` whose one snapshot is the current state, from the partitions'
committed manifests like any other snapshot, so it never shows a state they did not.
The snapshots before are dropped with the old location's paths: time travel to them is
lost (docs/querying.md). Only after that commit (`release_history`):
  1. each partition's hold of this table becomes what the new snapshot references
     (storage/holds.py, step 3: files first held within file.delete.delay.ms stay, since
     a sync in flight may reference them), so the old history pins no file;
  2. the table's own files (manifest lists, manifests, position-delete files) that the
     new snapshot does not reference and older than that delay are deleted. Metadata
     files stay, as expiry leaves them (expiry.py, step 5).
A crash between the commit and 1 or 2 leaves held files or orphan table files behind:
the next expiry of a snapshot in that partition replaces the hold whole.
Tests: tests/iceberg/test_iceberg_moved.py.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from compactlog.iceberg.files import TableFiles, remove_unreferenced
from compactlog.iceberg.schema import (
    LAST_COLUMN_ID,
    PARTITION_FIELD_ID,
    SCHEMA,
    SPEC,
    table_properties,
)
from compactlog.storage import Partition

log = logging.getLogger(__name__)


def moved_from(body: dict[str, Any] | None, files: TableFiles) -> str | None:
    """The location a table was written at when it is not where its files are now."""
    if body is None:
        return None
    recorded = str(body.get("location", "")).rstrip("/")
    return None if recorded == files.url("").rstrip("/") else recorded


def new_table(files: TableFiles, before: dict[str, Any] | None = None) -> dict[str, Any]:
    """A table's metadata with no snapshot, at `files`' location. `before`: the metadata
    of the table it replaces at that location, whose uuid it keeps (a client that
    loaded the table refreshes it rather than refusing another table) and whose
    sequence number and timestamp it continues (Iceberg's numbers only grow)."""
    return {
        "format-version": 2,
        "table-uuid": str(uuid.uuid4()) if before is None else before["table-uuid"],
        "location": files.url(""),
        "last-sequence-number": 0 if before is None else before["last-sequence-number"],
        "last-updated-ms": 0 if before is None else before["last-updated-ms"],
        "last-column-id": LAST_COLUMN_ID,
        "current-schema-id": SCHEMA.schema_id,
        "schemas": [json.loads(SCHEMA.model_dump_json())],
        "default-spec-id": SPEC.spec_id,
        "partition-specs": [json.loads(SPEC.model_dump_json())],
        "last-partition-id": PARTITION_FIELD_ID,
        "default-sort-order-id": 0,
        "sort-orders": [{"order-id": 0, "fields": []}],
        "properties": table_properties(),
        "current-snapshot-id": None,
        "snapshots": [],
        "snapshot-log": [],
        "metadata-log": [],
        "refs": {},
    }


def release_history(topic_name: str, table: str, holder: str, files: TableFiles,
                    partitions: list[Partition], held: dict[int, list[str]],
                    referenced: set[str], now_ms: int, grace_ms: int) -> int:
    """Steps 1 and 2, after the fresh table's commit: `held`, each partition's data
    files in its snapshot; `referenced`, the URLs of the table files it references.
    How many table files were deleted."""
    for partition in partitions:  # 1.
        partition.holds.replace(holder, held.get(partition.index, []), now_ms, grace_ms)
        if partition.writable:
            partition.sweeps.soon()
    removed = remove_unreferenced(files, referenced, [p.index for p in partitions],
                                  now_ms, grace_ms)  # 2.
    log.info("%s: the %s table's history before it was moved to %s was dropped "
             "(%d file(s) of it deleted); its holds were released", topic_name, table,
             files.url(""), removed)
    return removed
