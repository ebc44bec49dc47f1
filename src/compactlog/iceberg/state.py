"""`sync`: steps 1 to 6 of a table's commit (the package's "Commit"), for the compacted
state table and the raw table alike (kinds.py says which files and rows each shows).

Invariant: a snapshot is built only from partition manifests loaded, as committed,
after the table version it follows was loaded; it is committed by creating the next
metadata file only if absent; and it is made only when the state changed (a ledger
file, a delete file, or a partition's horizon, run id or effective deleted_below).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.conversions import from_bytes, to_bytes
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestEntry, ManifestFile
from pyiceberg.table.metadata import TableMetadataUtil
from pyiceberg.typedef import Record
from pyiceberg.types import LongType

from compactlog.errors import ConflictError, CorruptionError
from compactlog.iceberg import SyncResult
from compactlog.iceberg.avro import (
    TableIO,
    data_file,
    entries,
    read_list,
    write_list,
    write_manifest,
)
from compactlog.iceberg.deletes import (
    content_hash,
    delete_file_bytes,
    delete_file_name,
    deleted_positions,
    inputs_of,
    may_hold_tombstones,
    name_hashes,
    needs_no_read,
)
from compactlog.iceberg.files import TableFiles, data_file_url, table_files
from compactlog.iceberg.kinds import STATE, TableKind
from compactlog.iceberg.relocate import moved_from, new_table, release_history
from compactlog.iceberg.schema import (
    DELETE_FILE_PATH_ID,
    DELETE_POS_ID,
    OFFSET_ID,
    SCHEMA,
    TIMESTAMP_ID,
)
from compactlog.storage import (
    LogStore,
    Partition,
    PartitionManifest,
    SegmentMissingError,
    TimeRules,
)

log = logging.getLogger(__name__)

ATTEMPTS = 8
HINT = "metadata/version-hint.text"
PREVIOUS_VERSIONS_MAX = 100  # Iceberg's write.metadata.previous-versions-max default
PREFIX = "compactlog.partition."


def metadata_name(version: int) -> str:
    return f"metadata/v{version}.metadata.json"


@dataclass
class Current:
    """The table's current metadata version (0 and None: no table yet)."""

    version: int
    body: dict[str, Any] | None
    # The location the table at this version was written at, when not here: the body
    # is then a new table's, to start afresh at the next version (relocate.py).
    moved_from: str | None = None

    @property
    def snapshot(self) -> dict[str, Any] | None:
        if self.body is None or self.body.get("current-snapshot-id") is None:
            return None
        wanted = self.body["current-snapshot-id"]
        found: dict[str, Any] = next(s for s in self.body["snapshots"]
                                     if s["snapshot-id"] == wanted)
        return found

    def summary_of(self, partition: int) -> dict[str, str]:
        snapshot = self.snapshot
        if snapshot is None:
            return {}
        start = f"{PREFIX}{partition}."
        return {key[len(start):]: value for key, value in snapshot["summary"].items()
                if key.startswith(start)}


def load_current(files: TableFiles) -> Current:
    """Step 1: the hint, then every newer version that exists."""
    hint = files.read(HINT)
    version = int(hint) if hint is not None and hint.strip().isdigit() else 0
    while files.size(metadata_name(version + 1)) is not None:
        version += 1
    while version > 0:
        raw = files.read(metadata_name(version))
        if raw is not None:
            try:
                return Current(version, json.loads(raw))
            except ValueError as error:
                raise CorruptionError(files.url(metadata_name(version)),
                                      f"unreadable Iceberg metadata: {error}") from None
        version -= 1  # a hint ahead of its file: never written by a sync
    return Current(0, None)


@dataclass
class Partial:
    """One partition's part of a new snapshot: its entries in the snapshot's data and
    delete manifests."""

    index: int
    summary: dict[str, str]
    changed: bool = False
    new_data: list[DataFile] = field(default_factory=list)
    kept_data: list[ManifestEntry] = field(default_factory=list)  # carried as existing
    gone_data: list[ManifestEntry] = field(default_factory=list)  # marked deleted
    new_deletes: list[DataFile] = field(default_factory=list)
    kept_deletes: list[ManifestEntry] = field(default_factory=list)
    gone_deletes: list[ManifestEntry] = field(default_factory=list)
    relatives: list[str] = field(default_factory=list)  # its data files, in its volume

    @property
    def data_files(self) -> int:
        return len(self.new_data) + len(self.kept_data)

    @property
    def records(self) -> int:
        return (sum(f.record_count for f in self.new_data)
                + sum(e.data_file.record_count for e in self.kept_data))

    @property
    def delete_files(self) -> int:
        return len(self.new_deletes) + len(self.kept_deletes)

    @property
    def position_deletes(self) -> int:
        return (sum(f.record_count for f in self.new_deletes)
                + sum(e.data_file.record_count for e in self.kept_deletes))

    @property
    def delete_changes(self) -> bool:  # delete files added or dropped
        return bool(self.new_deletes or self.gone_deletes)

    @property
    def added_rows(self) -> tuple[int, int, int]:
        """(records, first offset, last offset) of the data files added."""
        return _rows_of(self.new_data)

    @property
    def removed_rows(self) -> tuple[int, int, int]:
        return _rows_of([e.data_file for e in self.gone_data])


def sync(store: LogStore, topic_name: str, cause: str = "sync", run_id: str = "",
         now_ms: int | None = None, kind: TableKind = STATE) -> SyncResult:
    started = time.monotonic()
    files = table_files(store, topic_name, kind.name)
    result = SyncResult(topic_name)
    for _attempt in range(ATTEMPTS):
        topic = store.topic(topic_name)
        current = relocated(load_current(files), files, topic_name, kind)  # 1.
        manifests = [_committed(partition) for partition in topic.partitions]  # 2.
        clock_ms = int(store.clock() * 1000)
        instant = clock_ms if now_ms is None else now_ms
        rules = TimeRules.of(topic.config, instant)
        if any(int(current.summary_of(index).get("manifest-version", -1)) > version
               for index, (version, _) in enumerate(manifests)):
            continue  # loaded before a snapshot of a newer manifest: load again
        table_io = TableIO(files)
        snapshot_id = uuid.uuid4().int >> 65
        written: list[tuple[str, bytes]] = []
        try:
            previous = _previous_entries(table_io, current)
            parts = [_partition_part(kind, topic.partitions[index], version, manifest, rules,
                                     current, previous.get(index, ([], [])), files, written)
                     for index, (version, manifest) in enumerate(manifests)]  # 3.
        except FileNotFoundError:  # retired and deleted since step 2: load again
            continue
        except SegmentMissingError:  # a DV (or file) gone: the same if a commit moved on
            if not _moved_on(topic.partitions, manifests):
                raise  # listed by the manifest still: missing, not retired
            continue
        if current.moved_from is None and not any(part.changed for part in parts):
            result.current = current
            result.seconds = time.monotonic() - started
            return result
        body = _next_metadata(files, current, parts, snapshot_id, cause, run_id, instant,
                              clock_ms, written, kind)  # 4.
        files.create_all(written)  # names are new (a uuid each): never taken
        for part in parts:  # 4b. hold what the snapshot lists before it exists
            if part.changed:
                topic.partitions[part.index].holds.add(kind.holder, part.relatives,
                                                       clock_ms)
        if not _still_listed(topic.partitions, parts):  # 4c.
            log.info("%s: a commit retired a file of the %s table's next snapshot while "
                     "it was made; it starts again", topic_name, kind.name)
            continue
        version = current.version + 1
        if not files.create(metadata_name(version), json.dumps(body).encode()):  # 5.
            continue  # another sync made version N+1 first
        try:
            files.replace(HINT, str(version).encode())  # 6.
        except Exception as error:  # a stale hint shows an older snapshot; step 1 probes
            log.warning("%s: version-hint.text not updated to %d: %s", topic_name,
                        version, error)
        if current.moved_from is not None:
            release_history(topic_name, kind.name, kind.holder, files, topic.partitions,
                            {part.index: part.relatives for part in parts},
                            {files.url(name) for name, _ in written}, clock_ms,
                            int(topic.config["file.delete.delay.ms"]))
        result.snapshot_id = snapshot_id
        result.version = version
        result.current = Current(version, body)
        result.metadata = files.url(metadata_name(version))
        result.changed_partitions = [part.index for part in parts if part.changed]
        result.files_written = len(written) + 1
        result.seconds = time.monotonic() - started
        return result
    raise ConflictError(f"{topic_name}: the Iceberg state table changed under {ATTEMPTS} "
                        "syncs in a row; the next sync tries again")


def relocated(current: Current, files: TableFiles, topic_name: str,
              kind: TableKind) -> Current:
    """`current`, or, when it was written at another location (a moved or copied data
    directory), no table at its version: the sync then starts the table afresh."""
    moved = moved_from(current.body, files)
    if moved is None:
        return current
    log.warning("%s: the Iceberg %s table at %s was written at %s (a moved or copied data "
                "directory); it starts afresh with one snapshot, its history is dropped",
                topic_name, kind.name, files.url(""), moved)
    return Current(current.version, new_table(files, current.body), moved)


def _still_listed(partitions: list[Partition], parts: list[Partial]) -> bool:
    """Step 4c: every data file of the changed partitions' parts is still listed by the
    partition's manifest as committed now, so none was retired (and maybe deleted)
    between step 2 and its hold in 4b; from 4b on, the hold keeps it."""
    for part in parts:
        if part.changed:
            live = _committed(partitions[part.index])[1].live_files()
            if any(relative not in live for relative in part.relatives):
                return False
    return True


def _moved_on(partitions: list[Partition], loaded: list[tuple[int, PartitionManifest]]
              ) -> bool:
    """A partition's committed manifest is newer than the one loaded in step 2."""
    return any(_committed(partition)[0] != version
               for partition, (version, _) in zip(partitions, loaded, strict=True))


def _committed(partition: Partition) -> tuple[int, PartitionManifest]:
    """Step 2: the partition's manifest as committed now (not this process' copy)."""
    snapshot = partition.document.load()
    where = partition.volume.describe("manifest/current.json")
    if snapshot is None:
        raise FileNotFoundError(where)
    return snapshot.version, PartitionManifest.from_json(snapshot.body, where)


def _previous_entries(table_io: TableIO, current: Current
                      ) -> dict[int, tuple[list[ManifestEntry], list[ManifestEntry]]]:
    """The current snapshot's live (data, delete) entries, by partition: one read of
    each of its manifests (one data and one delete manifest, or, in a table written
    before, two per partition)."""
    snapshot = current.snapshot
    if snapshot is None:
        return {}
    found: dict[int, tuple[list[ManifestEntry], list[ManifestEntry]]] = {}
    for manifest in read_list(table_io, snapshot["manifest-list"]):
        for entry in entries(table_io, manifest):
            data, deletes = found.setdefault(int(entry.data_file.partition[0]), ([], []))
            (data if entry.data_file.content == DataFileContent.DATA else deletes).append(entry)
    return found


def _fingerprint(fields: dict[str, str], keys: list[str], rules: TimeRules) -> str:
    decided_by = [sorted(fields.items()), keys, rules.empty_value_is_tombstone]
    return hashlib.sha256(json.dumps(decided_by).encode()).hexdigest()[:16]


def _partition_part(kind: TableKind, partition: Partition, version: int,
                    manifest: PartitionManifest, rules: TimeRules, current: Current,
                    previous: tuple[list[ManifestEntry], list[ManifestEntry]],
                    files: TableFiles, written: list[tuple[str, bytes]]) -> Partial:
    """Step 3 for one partition: its entries in the new snapshot, and its new delete
    files (into `written`) when its state changed; an unchanged one carries the
    previous snapshot's entries as they are."""
    index = partition.index
    rows = kind.rows(manifest, rules)
    urls = [data_file_url(partition.volume, item.relative) for item in rows]
    keys = [inputs_of(url, item, rules, kind.drop_tombstones)
            for url, item in zip(urls, rows, strict=True)]
    fields = kind.summary(manifest)
    summary = {"manifest-version": str(version),
               "inputs": _fingerprint(fields, keys, rules)} | fields
    before = current.summary_of(index)
    part = Partial(index, summary)
    previous_data, previous_deletes = previous
    if before.get("inputs") == summary["inputs"] and current.snapshot is not None:
        part.kept_data, part.kept_deletes = previous_data, previous_deletes  # unchanged
        part.relatives = [item.relative for item in rows]
        return part
    old_data = {entry.data_file.file_path: entry for entry in previous_data}
    old_deletes = {_referenced(entry.data_file): entry for entry in previous_deletes}
    tombstones = kind.drop_tombstones and may_hold_tombstones(manifest, rules)
    null_keys = partition.config["null.key.policy"] == "keep"
    kept_data: dict[str, ManifestEntry] = {}
    kept_deletes: dict[str, ManifestEntry] = {}
    for item, key, url in zip(rows, keys, urls, strict=True):
        delete: DataFile | ManifestEntry | None = None
        if not needs_no_read(item, tombstones):
            old = old_deletes.get(url)
            hashes = None if old is None else name_hashes(old.data_file.file_path)
            if old is not None and hashes is not None and hashes[0] == key:
                delete = old
            else:
                positions = deleted_positions(partition.volume, item, rules, key,
                                              null_keys, kind.drop_tombstones, tombstones)
                if len(positions) == item.info.record_count:
                    continue  # no row of it in the state: not in the snapshot
                content = content_hash(positions)
                if old is not None and hashes is not None and hashes[1] == content:
                    delete = old
                elif len(positions):
                    name = delete_file_name(index, item, key, content)
                    data = delete_file_bytes(url, positions)
                    written.append((name, data))
                    delete = _delete_file(files.url(name), index, url, positions, len(data))
        if isinstance(delete, ManifestEntry):
            kept_deletes[url] = delete
        elif delete is not None:
            part.new_deletes.append(delete)
        part.relatives.append(item.relative)
        if url in old_data:
            kept_data[url] = old_data[url]
        else:
            part.new_data.append(_data_file(url, index, item.info))
    part.kept_data, part.kept_deletes = list(kept_data.values()), list(kept_deletes.values())
    part.gone_data = [entry for url, entry in old_data.items() if url not in kept_data]
    part.gone_deletes = [entry for url, entry in old_deletes.items()
                         if kept_deletes.get(url) is not entry]
    changed_files = bool(part.new_data or part.new_deletes or part.gone_data
                         or part.gone_deletes)
    part.changed = changed_files or any(before.get(name) != summary.get(name)
                                        for name in kind.decisive)
    return part


def _write_manifests(files: TableFiles, parts: list[Partial], snapshot_id: int,
                     sequence: int, written: list[tuple[str, bytes]]) -> list[ManifestFile]:
    """Step 4's manifests: one of every partition's data files and one of their delete
    files, whatever changed. A reader opens two manifests per snapshot however many
    partitions there are (DuckDB pays about half a millisecond a manifest); the price,
    rewriting every partition's entries (one per ledger file) at each snapshot, is
    smaller than a file more per changed partition."""
    stem = f"metadata/{uuid.uuid4().hex}"
    found: list[ManifestFile] = []
    for deletes, suffix in ((False, "data"), (True, "deletes")):
        added = [f for p in parts for f in (p.new_deletes if deletes else p.new_data)]
        existing = [e for p in parts for e in (p.kept_deletes if deletes else p.kept_data)]
        removed = [e for p in parts for e in (p.gone_deletes if deletes else p.gone_data)]
        if not (added or existing or removed):
            continue
        name = f"{stem}-{suffix}.avro"
        manifest, data = write_manifest(files.url(name), snapshot_id, sequence, deletes,
                                        added, existing, removed)
        written.append((name, data))
        found.append(manifest)
    return found


def _referenced(delete: DataFile) -> str:
    bound = (delete.lower_bounds or {}).get(DELETE_FILE_PATH_ID)
    if bound is None:
        raise CorruptionError(delete.file_path, "position-delete file without a file_path "
                                                "bound: not written by compactlog")
    return bound.decode() if isinstance(bound, bytes) else str(bound)


def _long(value: int) -> bytes:
    return to_bytes(LongType(), value)


def _data_file(url: str, index: int, info: Any) -> DataFile:
    return data_file(
        content=DataFileContent.DATA, file_path=url, file_format=FileFormat.PARQUET,
        partition=Record(index), record_count=info.record_count,
        file_size_in_bytes=info.size_bytes,
        lower_bounds={OFFSET_ID: _long(info.base_offset), TIMESTAMP_ID: _long(info.min_timestamp)},
        upper_bounds={OFFSET_ID: _long(info.last_offset), TIMESTAMP_ID: _long(info.max_timestamp)},
    )


def _delete_file(url: str, index: int, data_url: str, positions: Any, size: int) -> DataFile:
    path = data_url.encode()
    return data_file(
        content=DataFileContent.POSITION_DELETES, file_path=url,
        file_format=FileFormat.PARQUET, partition=Record(index),
        record_count=len(positions), file_size_in_bytes=size,
        lower_bounds={DELETE_FILE_PATH_ID: path, DELETE_POS_ID: _long(int(positions[0]))},
        upper_bounds={DELETE_FILE_PATH_ID: path, DELETE_POS_ID: _long(int(positions[-1]))},
    )


def _next_metadata(files: TableFiles, current: Current, parts: list[Partial],
                   snapshot_id: int, cause: str, run_id: str, instant: int, clock_ms: int,
                   written: list[tuple[str, bytes]], kind: TableKind) -> dict[str, Any]:
    """Step 4's last files: the manifest list, and the metadata of version N+1."""
    body = current.body or new_table(files)
    sequence = int(body.get("last-sequence-number", 0)) + 1
    parent = body.get("current-snapshot-id")
    timestamp = max(clock_ms, int(body.get("last-updated-ms", 0)) + 1)
    list_name = f"metadata/snap-{snapshot_id}-{uuid.uuid4().hex}.avro"
    manifests = _write_manifests(files, parts, snapshot_id, sequence, written)
    written.append((list_name, write_list(files.url(list_name), snapshot_id, parent,
                                          sequence, manifests)))
    summary: dict[str, str] = {
        "operation": _operation(parts, kind),
        "added-data-files": str(sum(len(p.new_data) for p in parts)),
        "added-delete-files": str(sum(len(p.new_deletes) for p in parts)),
        "total-data-files": str(sum(p.data_files for p in parts)),
        "total-delete-files": str(sum(p.delete_files for p in parts)),
        "total-records": str(sum(p.records for p in parts)),
        "total-position-deletes": str(sum(p.position_deletes for p in parts)),
        "total-equality-deletes": "0",
        "compactlog.cause": cause,
        "compactlog.evaluated-at-ms": str(instant),
    }
    if run_id:
        summary["compactlog.run-id"] = run_id
    for part in parts:
        summary |= {f"{PREFIX}{part.index}.{key}": value for key, value in part.summary.items()}
    snapshot = {"snapshot-id": snapshot_id, "sequence-number": sequence,
                "timestamp-ms": timestamp, "manifest-list": files.url(list_name),
                "summary": summary, "schema-id": SCHEMA.schema_id}
    if parent is not None:
        snapshot["parent-snapshot-id"] = parent
    body = dict(body)
    body["snapshots"] = [*body.get("snapshots", []), snapshot]
    body["snapshot-log"] = [*body.get("snapshot-log", []),
                            {"snapshot-id": snapshot_id, "timestamp-ms": timestamp}]
    if current.version and current.moved_from is None:  # no entry of another place's
        log_entry = {"metadata-file": files.url(metadata_name(current.version)),
                     "timestamp-ms": body["last-updated-ms"]}
        body["metadata-log"] = [*body.get("metadata-log", []),
                                log_entry][-PREVIOUS_VERSIONS_MAX:]
    body["current-snapshot-id"] = snapshot_id
    body["refs"] = {**body.get("refs", {}),
                    "main": {"snapshot-id": snapshot_id, "type": "branch"}}
    body["last-sequence-number"] = sequence
    body["last-updated-ms"] = timestamp
    TableMetadataUtil.parse_obj(body)  # what readers will parse: refuse to write less
    return body


def _rows_of(files: list[DataFile]) -> tuple[int, int, int]:
    """Records, first and last offset of data files (from their offset bounds)."""
    if not files:
        return (0, 0, 0)
    lower = min(from_bytes(LongType(), f.lower_bounds[OFFSET_ID]) for f in files)
    upper = max(from_bytes(LongType(), f.upper_bounds[OFFSET_ID]) for f in files)
    return (sum(f.record_count for f in files), int(lower), int(upper))


def _operation(parts: list[Partial], kind: TableKind) -> str:
    """Iceberg's snapshot operation: `append` when data files were only added (a seal),
    `replace` when the raw table's files were rewritten with the same rows (a merge of
    small segments: the same offsets and as many records left as came), else
    `overwrite` (a compaction rewrites the state; retention takes rows out)."""
    if any(p.delete_changes for p in parts):
        return "overwrite"
    if not any(p.gone_data for p in parts):
        return "append"
    if not kind.rewrites_keep_rows:  # the state table: rewritten files hold other rows
        return "overwrite"
    same = all(p.added_rows == p.removed_rows for p in parts)
    return "replace" if same else "overwrite"
