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
  4. per partition with a data file that only expired snapshots reference (whose hold
     may shrink: in the others the retained snapshots reference the same files),
     replace the hold with the data files the retained snapshots reference (plus what
     is within the grace period): one load of the hold document, and a commit only if
     it changes; ask the writer's sweep to run soon. Nothing expired: no partition's
     hold changes, and none is read, except (`repair`, the server's upkeep) to hold
     the files of a table made before holds existed in a partition with no entry;
  5. delete the table's own files (manifest lists, manifests, position-delete files)
     that no retained snapshot references and that are older than the grace period
     (a sync in flight writes files before its commit). Metadata files are kept: the
     metadata log names them, as Iceberg keeps them by default.
Runs in the server's upkeep (iceberg/table_upkeep.py) and after each compaction's sync,
which hands over the metadata it left (step 1 reads nothing then): an expiry that
expires nothing sends no request after a sync.
Tests: tests/iceberg/test_iceberg_expiry.py.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.manifest import DataFileContent, ManifestEntryStatus, ManifestFile
from pyiceberg.table.metadata import TableMetadataUtil

from compactlog.iceberg.avro import TableIO, entries, read_list
from compactlog.iceberg.files import relative_of, remove_unreferenced, table_files
from compactlog.iceberg.kinds import STATE, TableKind
from compactlog.iceberg.relocate import moved_from
from compactlog.iceberg.state import HINT, Current, load_current, metadata_name
from compactlog.storage import LogStore, Partition

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
    holds_replaced: int = 0  # partitions whose hold document step 4 replaced


def expire(store: LogStore, topic_name: str, now_ms: int | None = None,
           kind: TableKind = STATE, current: Current | None = None,
           repair: bool = True) -> ExpiryResult:
    """Steps 1 to 5. `current`: the metadata a sync just left (step 1 then loads
    nothing; a conflict at step 3 loads it again). `repair`: step 4 for a partition
    whose hold document has no entry of the table even when nothing expired."""
    files = table_files(store, topic_name, kind.name)
    result = ExpiryResult(topic_name)
    for attempt in range(ATTEMPTS):
        topic = store.topic(topic_name)
        now = int(store.clock() * 1000) if now_ms is None else now_ms
        grace_ms = int(topic.config["file.delete.delay.ms"])
        if current is None or attempt:
            current = load_current(files)  # 1.
        if current.body is None:  # no table (never made, or its directory deleted by
            # hand to be made again): nothing references what the holds list
            for partition in topic.partitions:
                partition.holds.replace(kind.holder, [], now, grace_ms)
            return result
        if moved_from(current.body, files) is not None:  # its paths name another place:
            return result  # the next sync starts it afresh here (relocate.py)
        expired = expired_snapshots(current.body, now, int(topic.config[MAX_AGE]),
                                    int(topic.config[MIN_KEEP]))  # 2.
        table_io = TableIO(files)
        if not expired:
            if repair:
                _adopt(topic.partitions, kind, table_io, current.body, now)
            return result
        lists = manifest_lists(table_io, current.body)
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
        data_urls, table_urls = referenced(table_io, body, lists)
        expired_body = {"snapshots": [snapshot for snapshot in current.body["snapshots"]
                                      if snapshot["snapshot-id"] in expired]}
        released = referenced(table_io, expired_body, lists)[0] - data_urls
        for partition in topic.partitions:  # 4.
            if not relatives_in(partition, released):
                continue  # the retained snapshots reference the same files in it
            partition.holds.replace(kind.holder, relatives_in(partition, data_urls), now,
                                    grace_ms)
            result.holds_replaced += 1
            if partition.writable:
                partition.sweeps.soon()
        result.table_files_removed = remove_unreferenced(
            files, table_urls, [p.index for p in topic.partitions], now, grace_ms)  # 5.
        return result
    log.info("%s: the state table kept changing under %d expiries; the next round tries "
             "again", topic_name, ATTEMPTS)
    return result


def relatives_in(partition: Partition, data_urls: set[str]) -> list[str]:
    return [relative for url in data_urls
            if (relative := relative_of(partition.volume, url)) is not None]


def _adopt(partitions: list[Partition], kind: TableKind, table_io: TableIO,
           body: dict[str, Any], now_ms: int) -> None:
    """Step 4 when nothing expired: hold, in each partition whose hold document has no
    entry of the table (a table made before holds existed), what the retained
    snapshots reference there; the manifests are read only for such a partition."""
    found: list[set[str]] = []

    def data_urls() -> set[str]:
        if not found:
            found.append(referenced(table_io, body, manifest_lists(table_io, body))[0])
        return found[0]

    def held_in(partition: Partition) -> list[str]:
        return relatives_in(partition, data_urls())

    for partition in partitions:
        adopted = partition.holds.adopt(kind.holder, functools.partial(held_in, partition),
                                        now_ms)
        if adopted and partition.writable:
            partition.sweeps.soon()


def manifest_lists(table_io: TableIO, body: dict[str, Any]) -> dict[int, list[ManifestFile]]:
    """Each snapshot's manifests, by snapshot id (one read of each manifest list)."""
    return {snapshot["snapshot-id"]: read_list(table_io, snapshot["manifest-list"])
            for snapshot in body.get("snapshots", [])}


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


def referenced(table_io: TableIO, body: dict[str, Any],
               lists: dict[int, list[ManifestFile]]) -> tuple[set[str], set[str]]:
    """The data files (ledger files) and the table's own files (manifest lists,
    manifests, delete files) that the snapshots of `body` reference (`lists`: their
    manifests, from `manifest_lists`)."""
    data: set[str] = set()
    table: set[str] = set()
    for snapshot in body.get("snapshots", []):
        table.add(snapshot["manifest-list"])
        for manifest in lists[snapshot["snapshot-id"]]:
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
