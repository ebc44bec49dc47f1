"""Snapshot expiry, and the holds that keep a retained snapshot's data files.

Invariant: a data file (a ledger file of the state table, a sealed segment of the raw
table) that a retained snapshot references is never deleted. The sweep
(storage/sweep.py) keeps every file the partition's hold document lists
(storage/holds.py); this module keeps that document a superset of what the retained
snapshots reference:
  - a sync holds the data files of its new snapshot before committing it
    (state.py, step 4b, between its steps 4 and 5);
  - expiry releases files only after committing table metadata without the expired
    snapshots, and only files first held longer ago than file.delete.delay.ms (a sync
    in flight may still commit a snapshot that references them: a sync that takes
    longer than half of that starts again, state.py step 5).

`expire(store, topic)`:
  1. load the table's current version N (state.py's step 1);
  2. retain the current snapshot, the newest `iceberg.history.expire.min-snapshots-to-
     keep`, and every snapshot younger than `iceberg.history.expire.max-snapshot-age-ms`
     (Iceberg's history.expire.max-snapshot-age-ms and min-snapshots-to-keep; one hour,
     not Iceberg's 5 days, since a kept snapshot keeps the ledger files compaction
     replaced, and 1); the others expire (0: all but those);
  3. if any expire, create v<N+1>.metadata.json without them only if absent (another
     commit first: back to 1), then the hint;
  4. per partition, replace the hold with the data files the retained snapshots
     reference (plus what is within the grace period), which also holds the files of a
     table made before holds existed; ask the writer's sweep to run soon;
  5. delete the table's own files (manifest lists, manifests, position-delete files)
     that no retained snapshot references and that are older than the grace period
     (a sync in flight writes files before its commit). Metadata files are kept: the
     metadata log names them, as Iceberg keeps them by default.
Runs in the server's upkeep (iceberg/upkeep.py) and after each compaction's sync.
Tests: tests/test_iceberg_expiry.py.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.manifest import DataFileContent, ManifestEntryStatus
from pyiceberg.table.metadata import TableMetadataUtil

from compactlog.iceberg.avro import TableIO, entries, read_list
from compactlog.iceberg.files import TableFiles, relative_of, table_files
from compactlog.iceberg.kinds import STATE, TableKind
from compactlog.iceberg.state import HINT, load_current, metadata_name
from compactlog.storage.store import LogStore

log = logging.getLogger(__name__)

ATTEMPTS = 8
MAX_AGE = "iceberg.history.expire.max-snapshot-age-ms"
MIN_KEEP = "iceberg.history.expire.min-snapshots-to-keep"


@dataclass
class ExpiryResult:
    topic: str
    expired: list[int] = field(default_factory=list)  # snapshot ids
    version: int | None = None  # the metadata version committed without them
    table_files_removed: int = 0


def expire(store: LogStore, topic_name: str, now_ms: int | None = None,
           kind: TableKind = STATE) -> ExpiryResult:
    files = table_files(store, topic_name, kind.name)
    result = ExpiryResult(topic_name)
    for _attempt in range(ATTEMPTS):
        topic = store.topic(topic_name)
        now = int(store.clock() * 1000) if now_ms is None else now_ms
        current = load_current(files)  # 1.
        if current.body is None:  # no table (never made, or its directory deleted by
            # hand to be made again): nothing references what the holds list
            for partition in topic.partitions:
                if partition.holds.has(kind.holder):
                    partition.holds.replace(kind.holder, [], now,
                                            int(topic.config["file.delete.delay.ms"]))
            return result
        expired = expired_snapshots(current.body, now, int(topic.config[MAX_AGE]),
                                    int(topic.config[MIN_KEEP]))  # 2.
        body = current.body
        if expired:
            body = without(current.body, set(expired))
            version = current.version + 1
            if not files.create(metadata_name(version), json.dumps(body).encode()):  # 3.
                continue
            try:
                files.replace(HINT, str(version).encode())
            except Exception as error:  # step 1 of every reader probes past a stale hint
                log.warning("%s: version-hint.text not updated to %d: %s", topic_name,
                            version, error)
            result.expired, result.version = expired, version
            log.info("%s: expired %d snapshot(s) of the %s table (metadata v%d)",
                     topic_name, len(expired), kind.name, version)
        elif all(partition.holds.has(kind.holder) for partition in topic.partitions):
            return result  # nothing expired, and every partition's hold is there
        grace_ms = int(topic.config["file.delete.delay.ms"])
        data_urls, table_urls = referenced(TableIO(files), body)
        for partition in topic.partitions:  # 4.
            relatives = [relative for url in data_urls
                         if (relative := relative_of(partition.volume, url)) is not None]
            partition.holds.replace(kind.holder, relatives, now, grace_ms)
            if partition.writable:
                partition.sweep_soon()
        if expired:
            result.table_files_removed = remove_unreferenced(
                files, table_urls, [p.index for p in topic.partitions], now, grace_ms)  # 5.
        return result
    log.info("%s: the state table kept changing under %d expiries; the next round tries "
             "again", topic_name, ATTEMPTS)
    return result


def expired_snapshots(body: dict[str, Any], now_ms: int, max_age_ms: int,
                      min_keep: int) -> list[int]:
    """Step 2: the ids of the snapshots to expire, oldest first."""
    snapshots = sorted(body.get("snapshots", []), key=lambda s: (s["timestamp-ms"],
                                                                  s["sequence-number"]))
    keep = {s["snapshot-id"] for s in snapshots[-max(min_keep, 1):]}
    keep |= {ref["snapshot-id"] for ref in body.get("refs", {}).values()}
    current = body.get("current-snapshot-id")
    if current is not None:
        keep.add(current)
    return [s["snapshot-id"] for s in snapshots
            if s["snapshot-id"] not in keep and now_ms - s["timestamp-ms"] >= max_age_ms]


def without(body: dict[str, Any], expired: set[int]) -> dict[str, Any]:
    """Step 3's metadata: `body` without the expired snapshots and their log entries,
    as Iceberg's expireSnapshots leaves it (a retained snapshot may name an expired
    parent)."""
    updated = dict(body)
    updated["snapshots"] = [s for s in body["snapshots"] if s["snapshot-id"] not in expired]
    updated["snapshot-log"] = [entry for entry in body.get("snapshot-log", [])
                               if entry["snapshot-id"] not in expired]
    TableMetadataUtil.parse_obj(updated)  # what readers will parse: refuse to write less
    return updated


def referenced(table_io: TableIO, body: dict[str, Any]) -> tuple[set[str], set[str]]:
    """The data files (ledger files) and the table's own files (manifest lists,
    manifests, delete files) that the snapshots of `body` reference."""
    data: set[str] = set()
    table: set[str] = set()
    for snapshot in body.get("snapshots", []):
        table.add(snapshot["manifest-list"])
        for manifest in read_list(table_io, snapshot["manifest-list"]):
            if manifest.manifest_path in table:
                continue  # shared with a snapshot already read
            table.add(manifest.manifest_path)
            for entry in entries(table_io, manifest):
                if entry.status == ManifestEntryStatus.DELETED:
                    continue
                if entry.data_file.content == DataFileContent.DATA:
                    data.add(entry.data_file.file_path)
                else:
                    table.add(entry.data_file.file_path)
    return data, table


def remove_unreferenced(files: TableFiles, referenced_urls: set[str], partitions: list[int],
                        now_ms: int, grace_ms: int) -> int:
    """Step 5: the table's manifests, manifest lists and delete files that no retained
    snapshot references, older than the grace period."""
    removed = 0
    folders = ["metadata", *(f"deletes/{index}" for index in partitions)]
    for folder in folders:
        for found in files.listing(folder):
            relative = f"{folder}/{found.name}"
            if not found.name.endswith((".avro", ".parquet")):
                continue  # metadata files and the hint stay
            if files.url(relative) in referenced_urls or now_ms - found.modified_ms < grace_ms:
                continue
            if files.remove(relative):
                removed += 1
    return removed
