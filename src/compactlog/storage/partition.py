"""A partition: sealed Parquet segments, rolled log segments and one active log segment.

Directory layout:
  manifest/   versioned PartitionManifest documents (see manifest.py)
  log/        <base offset>.log files of v2 record batches; the last is the active one
  segments/   <base offset>-<id>.parquet sealed segments, listed by the manifest

Invariants:
- Offsets are assigned here, densely, and never reused; sealing and retention keep them.
- A sealed segment exists for readers only once the manifest lists it. A log file is
  deleted only after a manifest listing its sealed form is committed.
- One process writes a partition (the store's writer lock); others open it read-only
  and `refresh` to see new data. Compaction commits to the manifest concurrently, so
  the writer's manifest commits retry on conflict by re-applying their change.

Sealing protocol for a rolled log segment (a crash after any step is recovered on open):
  1. write the Parquet file under a temporary name and fsync it;
  2. rename it to its final name in segments/ and fsync the directory;
  3. commit a manifest version that lists it;
  4. delete the log file.
Recovery removes temporary files (crash in 1), Parquet files no manifest lists (crash
after 2), and log files wholly covered by sealed segments (crash after 3).
"""

from __future__ import annotations

import bisect
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from compactlog.config import TopicConfig
from compactlog.errors import (
    ConflictError,
    CorruptionError,
    CorruptRecordError,
    InvalidRecordError,
    ReadOnlyStoreError,
)
from compactlog.storage import fsutil
from compactlog.storage.compacted import CompactedView, horizon_of, ledger_infos, trim_to_bytes
from compactlog.storage.logfile import LogSegment, TornTail, base_offset_of, log_file_name
from compactlog.storage.manifest import PartitionManifest, SegmentInfo, VersionedDocument
from compactlog.storage.records import (
    BatchError,
    BatchHeader,
    ChecksumError,
    ProducerRecord,
    Record,
    check_batch,
    encode_batch,
    parse_header,
    set_base_offset,
    validate_records,
)
from compactlog.storage.sealed import (
    RECORD_COLUMNS,
    SealedSegment,
    SegmentMissingError,
    WriteOptions,
    record_bytes,
    records_to_table,
    table_to_records,
    write_segment,
)

log = logging.getLogger(__name__)

Clock = Callable[[], float]
DEFAULT_MAX_RECORDS = 500
DEFAULT_MAX_BYTES = 1024 * 1024
READ_ATTEMPTS = 5


@dataclass
class RecoveryReport:
    """What opening a partition had to repair, for logs and for `topics describe`."""

    torn_tails: list[TornTail] = field(default_factory=list)
    removed_files: list[Path] = field(default_factory=list)
    corrupt_ranges: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.torn_tails or self.removed_files or self.corrupt_ranges)


@dataclass(frozen=True)
class AppendResult:
    partition: int
    base_offset: int
    last_offset: int


class Partition:
    def __init__(
        self,
        directory: Path,
        topic: str,
        index: int,
        config: Callable[[], TopicConfig],
        writable: bool,
        clock: Clock = time.time,
    ) -> None:
        self.directory = directory
        self.topic = topic
        self.index = index
        self._config = config
        self.writable = writable
        self.clock = clock
        self.manifest_doc = VersionedDocument(directory / "manifest")
        self.log_dir = directory / "log"
        self.segment_dir = directory / "segments"
        self.manifest = PartitionManifest()
        self.manifest_version = 0
        self.logs: list[LogSegment] = []  # rolled segments, then the active one last
        self._sealed: dict[str, SealedSegment] = {}
        self._lock = threading.RLock()
        self._seal_lock = threading.Lock()
        self._appended = threading.Condition(self._lock)
        self.recovery = RecoveryReport()
        self.auto_seal = True
        self.compacted = CompactedView(self)

    @property
    def name(self) -> str:
        return f"{self.topic}/{self.index}"

    @property
    def config(self) -> TopicConfig:
        return self._config()

    # -- opening and recovery -------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, topic: str, index: int, config: Callable[[], TopicConfig],
               clock: Clock = time.time) -> None:
        """Lay out a new, empty partition: an empty manifest and an active segment at 0."""
        for sub in ("manifest", "log", "segments"):
            (directory / sub).mkdir(parents=True, exist_ok=True)
        VersionedDocument(directory / "manifest").commit(0, PartitionManifest().to_json())
        (directory / "log" / log_file_name(0)).touch()

    def open(self) -> Partition:
        with self._lock:
            self._load_manifest(initial=True)
            if self.writable:
                self._recover_files()
            self._open_logs()
            if self.writable:
                for segment in self.logs:
                    if segment.torn_tail:
                        self.recovery.torn_tails.append(segment.torn_tail)
                    self.recovery.corrupt_ranges.extend(
                        hole.describe() for hole in segment.corrupt.values()
                    )
                if self.auto_seal:
                    self.seal_rolled()
        return self

    def _load_manifest(self, initial: bool = False) -> None:
        loaded = self.manifest_doc.load()
        if loaded is None:
            has_data = any(self.segment_dir.glob("*.parquet")) or any(
                p.stat().st_size > 0 for p in self.log_dir.glob("*.log")
            )
            if has_data or not initial:
                raise CorruptionError(
                    self.manifest_doc.directory,
                    f"partition {self.name} holds data files but its manifest is missing",
                )
            if not self.writable:
                return
            self.manifest_doc.directory.mkdir(parents=True, exist_ok=True)
            self.manifest_version = self.manifest_doc.commit(0, PartitionManifest().to_json())
            self.manifest = PartitionManifest()
            return
        version, body = loaded
        self.manifest = PartitionManifest.from_json(body, self.manifest_doc.path_of(version))
        self.manifest_version = version

    def _recover_files(self) -> None:
        removed = self.recovery.removed_files
        for directory in (self.log_dir, self.segment_dir, self.manifest_doc.directory):
            directory.mkdir(parents=True, exist_ok=True)
            removed.extend(fsutil.remove_temp_files(directory))
        listed = {segment.file for segment in self.manifest.segments}
        for path in self.segment_dir.glob("*.parquet"):
            if path.name not in listed:
                path.unlink()
                removed.append(path)
                log.info("%s: removed %s, sealed but never committed", self.name, path.name)
        sealed_end = self.manifest.sealed_end_offset
        log_files = sorted(self._log_files())
        for (_, path), (next_base, _) in itertools.pairwise(log_files):
            if next_base <= sealed_end:
                path.unlink()  # sealed and committed; the crash came before its deletion
                removed.append(path)
                log.info("%s: removed %s, already sealed", self.name, path.name)
        if removed:
            fsutil.fsync_dir(self.log_dir)

    def _log_files(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.log_dir.glob("*.log"):
            base = base_offset_of(path)
            if base is not None:
                found.append((base, path))
        return found

    def _open_logs(self) -> None:
        sealed_end = self.manifest.sealed_end_offset
        files = sorted(self._log_files())
        if not files:
            if not self.writable:
                return
            path = self.log_dir / log_file_name(sealed_end)
            path.touch()
            fsutil.fsync_dir(self.log_dir)
            files = [(sealed_end, path)]
        for base, path in files:
            if self.writable or base >= sealed_end or base == files[-1][0]:
                segment = LogSegment(path, base, writable=self.writable)
                segment.scan(repair=self.writable)
                self.logs.append(segment)

    # -- appending ------------------------------------------------------------------

    @property
    def active(self) -> LogSegment:
        return self.logs[-1]

    @property
    def log_end_offset(self) -> int:
        """The offset the next record will get (Kafka's log end offset / high watermark)."""
        if self.logs:
            return max(self.active.next_offset, self.manifest.sealed_end_offset)
        return self.manifest.sealed_end_offset

    @property
    def log_start_offset(self) -> int:
        return self.manifest.log_start_offset

    def append(self, records: Sequence[ProducerRecord]) -> AppendResult:
        """Append records as one batch, atomically: all get offsets, or none does."""
        return self.append_prepared(self.prepare(records))

    def prepare(self, records: Sequence[ProducerRecord]) -> bytearray:
        """Encode and check records as one batch, without appending it (see append_prepared).

        A multi-partition append prepares every partition's batch first, so that a refused
        record leaves nothing appended anywhere.
        """
        self._require_writable()
        if not records:
            raise InvalidRecordError(f"{self.name}: nothing to append")
        self.check_keys(records)
        batch = encode_batch(records, 0, int(self.clock() * 1000))
        self.check_size(len(batch))
        return batch

    def append_prepared(self, batch: bytearray) -> AppendResult:
        """Append a batch from `prepare`, giving it the next offsets."""
        with self._lock:
            set_base_offset(batch, self.log_end_offset)
            return self._append_encoded(batch, parse_header(batch), int(self.clock() * 1000))

    def check_keys(self, records: Sequence[ProducerRecord | Record]) -> None:
        """Refuse null keys on a compacted topic whose null.key.policy is reject."""
        self._check_null_key(next(
            (position for position, record in enumerate(records) if record.key is None), None))

    def _check_null_key(self, position: int | None) -> None:
        config = self.config
        if position is not None and config.compacted and config["null.key.policy"] == "reject":
            raise InvalidRecordError(
                f"{self.name}: record {position} has no key; compacted topic "
                f"{self.topic!r} refuses null keys (null.key.policy=reject)"
            )

    def append_batch(self, batch: bytearray) -> AppendResult:
        """Append a v2 batch built elsewhere (a Kafka producer): validated, offsets assigned."""
        self._require_writable()
        try:
            header = check_batch(batch, 0, len(batch))
            if header.size != len(batch):
                raise BatchError(f"{len(batch) - header.size} trailing bytes")
            first_null_key = validate_records(batch, header)
        except ChecksumError as error:
            raise CorruptRecordError(f"{self.name}: rejected record batch: {error}") from None
        except BatchError as error:
            raise InvalidRecordError(f"{self.name}: rejected record batch: {error}") from None
        self._check_null_key(first_null_key)
        self.check_size(len(batch))
        with self._lock:
            set_base_offset(batch, self.log_end_offset)
            return self._append_encoded(batch, parse_header(batch), int(self.clock() * 1000))

    def check_size(self, batch_bytes: int) -> None:
        limit = self.config["max.message.bytes"]
        if batch_bytes > limit:
            raise InvalidRecordError(
                f"{self.name}: record batch of {batch_bytes} bytes exceeds "
                f"max.message.bytes={limit}"
            )

    def _append_encoded(self, batch: bytearray, header: BatchHeader, now_ms: int) -> AppendResult:
        config = self.config
        self.check_size(len(batch))
        if self._should_roll(len(batch), now_ms):
            self._roll()
        active = self.active
        active.append(batch, header)
        active.unflushed_records += header.record_count
        if active.first_unflushed_ms is None:
            active.first_unflushed_ms = now_ms
        if (
            active.unflushed_records >= config["flush.messages"]
            or now_ms - active.first_unflushed_ms >= config["flush.ms"]
        ):
            active.flush()
        self._appended.notify_all()
        result = AppendResult(self.index, header.base_offset, header.last_offset)
        if self.auto_seal and len(self.logs) > 1:
            self.seal_rolled()
        return result

    def _should_roll(self, incoming: int, now_ms: int) -> bool:
        active = self.active
        if active.is_empty:
            return False
        if active.size + incoming > self.config["segment.bytes"]:
            return True
        first_ts = active.first_batch_max_timestamp
        # As Kafka's LogConfig.maxSegmentMs (KIP-354): a compacted topic rolls by
        # max.compaction.lag.ms too, or records in the active segment could wait up to
        # segment.ms (7 days) for the compaction that lag promises.
        roll_ms = self.config["segment.ms"]
        if self.config.compacted:
            roll_ms = min(roll_ms, self.config["max.compaction.lag.ms"])
        return first_ts is not None and now_ms - first_ts >= roll_ms

    def _roll(self) -> None:
        """Start a new active segment; the old one waits to be sealed."""
        old = self.active
        old.flush()
        path = self.log_dir / log_file_name(old.next_offset)
        segment = LogSegment(path, old.next_offset, writable=True)
        fsutil.fsync_dir(self.log_dir)
        self.logs.append(segment)
        log.debug("%s: rolled segment at offset %d", self.name, old.next_offset)

    def roll(self) -> bool:
        """Roll the active segment now if it holds anything, and seal it (when auto_seal)."""
        self._require_writable()
        with self._lock:
            if self.active.is_empty:
                return False
            self._roll()
            if self.auto_seal:
                self.seal_rolled()
            return True

    def roll_if_due(self) -> bool:
        """Roll an idle active segment that has passed segment.ms (appends alone never would)."""
        self._require_writable()
        with self._lock:
            if self._should_roll(0, int(self.clock() * 1000)):
                self._roll()
                if self.auto_seal:
                    self.seal_rolled()
                return True
        return False

    def flush_if_due(self) -> None:
        """fsync unflushed records that have waited flush.ms (appends alone may not come)."""
        now_ms = int(self.clock() * 1000)
        with self._lock:
            for segment in self.logs:
                first = segment.first_unflushed_ms
                if first is not None and now_ms - first >= self.config["flush.ms"]:
                    segment.flush()

    def flush(self) -> None:
        with self._lock:
            for segment in self.logs:
                if segment.unflushed_records:
                    segment.flush()

    def _require_writable(self) -> None:
        if not self.writable:
            raise ReadOnlyStoreError(f"{self.name} is open read-only")

    # -- sealing --------------------------------------------------------------------

    def seal_rolled(self) -> list[SegmentInfo]:
        """Seal every rolled log segment into Parquet, oldest first.

        A rolled segment never changes, so its Parquet file is written without the
        partition's lock: appends and reads go on meanwhile (unless the caller holds the
        lock, as an append that seals at once does). Only the manifest commit and the
        removal of the log file take the lock.

        One sealer runs at a time. A call that finds another at work returns at once:
        that one seals every rolled segment before it stops, this call's included, and
        waiting for it while holding the partition's lock would deadlock.
        """
        self._require_writable()
        sealed: list[SegmentInfo] = []
        if not self._seal_lock.acquire(blocking=False):
            return sealed
        try:
            while True:
                with self._lock:
                    if len(self.logs) <= 1:
                        break
                    segment = self.logs[0]
                    if segment.is_empty:
                        self._drop_log(segment)
                        continue
                sealed.append(self._seal(segment))
        finally:
            self._seal_lock.release()
        return sealed

    def _seal(self, segment: LogSegment) -> SegmentInfo:
        config = self.config
        options = WriteOptions(config["parquet.row.group.bytes"], config["parquet.compression"])
        name = f"{segment.base_offset:020d}-{uuid.uuid4().hex[:8]}.parquet"
        temp = fsutil.temp_path(self.segment_dir, name)
        try:
            info = write_segment(segment.iter_batches(), temp, name, options)
            fsutil.publish_replace(temp, self.segment_dir / name)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        missing = tuple(
            (hole.first_offset, hole.last_offset if hole.last_offset is not None else -1)
            for hole in segment.corrupt.values()
        )
        for hole in segment.corrupt.values():
            log.error("%s: sealing %s without %s", self.name, segment.path.name, hole.describe())
        if missing:
            # The manifest keeps the holes, so reads of them fail as they did from the log.
            info = replace(
                info, base_offset=min(info.base_offset, segment.base_offset), missing=missing
            )

        def add_segment(manifest: PartitionManifest) -> PartitionManifest:
            return replace(manifest, segments=(*manifest.segments, info))

        with self._lock:
            self.commit_manifest(add_segment)
            self._drop_log(segment)
        log.info(
            "%s: sealed offsets %d..%d (%d records, %d bytes) into %s",
            self.name, info.base_offset, info.last_offset, info.record_count,
            info.size_bytes, name,
        )
        return info

    def _drop_log(self, segment: LogSegment) -> None:
        # Not closed here: a concurrent read may still be using it (see LogSegment.__del__).
        segment.path.unlink(missing_ok=True)
        fsutil.fsync_dir(self.log_dir)
        self.logs.remove(segment)

    def commit_manifest(
        self, change: Callable[[PartitionManifest], PartitionManifest], attempts: int = 20
    ) -> PartitionManifest:
        """Apply `change` to the current manifest and commit it, re-applying on conflict."""
        for _ in range(attempts):
            updated = change(self.manifest)
            try:
                version = self.manifest_doc.commit(self.manifest_version, updated.to_json())
            except ConflictError:
                self._load_manifest()
                continue
            self.manifest = updated
            self.manifest_version = version
            return updated
        raise ConflictError(f"{self.name}: manifest kept changing; gave up after {attempts} tries")

    # -- reading --------------------------------------------------------------------

    def refresh(self) -> None:
        """Pick up what other processes committed or appended (read-only instances)."""
        with self._lock:
            if self.manifest_doc.latest_version() != self.manifest_version:
                self._load_manifest()
            if self.writable:
                return
            known = {segment.base_offset for segment in self.logs}
            for base, path in sorted(self._log_files()):
                if base not in known:
                    try:
                        segment = LogSegment(path, base, writable=False)
                    except FileNotFoundError:
                        continue
                    self.logs.append(segment)
            self.logs.sort(key=lambda s: s.base_offset)
            for segment in self.logs:
                segment.scan(repair=False)
            sealed_end = self.manifest.sealed_end_offset
            while len(self.logs) > 1 and self.logs[0].next_offset <= sealed_end:
                self.logs.pop(0).close()

    def sealed_segment(self, info: SegmentInfo) -> SealedSegment:
        segment = self._sealed.get(info.file)
        if segment is None:
            segment = SealedSegment(self.segment_dir / info.file, info)
            self._sealed[info.file] = segment
        return segment

    def read(
        self,
        offset: int,
        max_records: int = DEFAULT_MAX_RECORDS,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> list[Record]:
        """Records from `offset` on, across sealed and log segments, in offset order.

        Returns at least one record when any exists at or after `offset`, then stops at
        max_records or once max_bytes are reached. Offsets below the log start are
        served from the log start, as a consumer resetting to earliest expects.
        """
        records: list[Record] = []
        for part in self._read_parts(offset, max_records, max_bytes):
            records.extend(table_to_records(part) if isinstance(part, pa.Table) else part)
        return records

    def read_compacted(
        self,
        offset: int,
        max_records: int = DEFAULT_MAX_RECORDS,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> list[Record]:
        """As `read`, from the compacted view: the ledger up to the horizon, then the
        raw log. Offsets have gaps where compaction removed records."""
        return self.compacted.read(offset, max_records, max_bytes)

    def read_table(
        self,
        offset: int,
        max_records: int = DEFAULT_MAX_RECORDS,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> pa.Table:
        """As `read`, but columnar: an Arrow table with offset, timestamp, key, value, headers.

        Sealed data comes straight from Parquet without building Python objects, which
        is what bulk readers (table views, the Spark source, analytics) want.
        """
        parts = [
            part if isinstance(part, pa.Table) else records_to_table(part)
            for part in self._read_parts(offset, max_records, max_bytes)
        ]
        if not parts:
            return records_to_table([])
        return pa.concat_tables(parts)

    def _read_parts(
        self, offset: int, max_records: int, max_bytes: int
    ) -> list[pa.Table | list[Record]]:
        for _ in range(READ_ATTEMPTS):
            with self._lock:
                manifest, version, logs = self.manifest, self.manifest_version, list(self.logs)
            try:
                return _PartRead(self, manifest, logs, max_records, max_bytes).run(offset)
            except SegmentMissingError:
                # Retention or compaction in another process (or thread) may have deleted
                # the file after this view of the manifest was loaded: look again.
                self.refresh()
                if self.manifest_version == version:
                    raise
        raise ConflictError(f"{self.name}: segments kept changing under a read")

    def _sealed_tables(
        self, manifest: PartitionManifest, offset: int
    ) -> Iterator[tuple[SegmentInfo, pa.Table]]:
        segments = manifest.segments
        start = bisect.bisect_left([s.last_offset for s in segments], offset)
        for info in segments[start:]:
            hole = info.missing_range_at(offset)
            if hole is not None:
                raise CorruptionError(
                    self.segment_dir / info.file,
                    f"offsets {hole[0]}..{hole[1]} were lost to a corrupt range in the log "
                    "before this segment was sealed",
                )
            for table in self.sealed_segment(info).iter_tables(offset, RECORD_COLUMNS):
                yield info, table
                if table.num_rows:
                    offset = table.column("offset")[-1].as_py() + 1

    def wait_for_data(self, offset: int, timeout: float) -> bool:
        """Block until a record at or after `offset` may exist, or `timeout` passes."""
        deadline = time.monotonic() + timeout
        with self._appended:
            while self.log_end_offset <= offset:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                if self.writable:
                    self._appended.wait(remaining)
                else:
                    # Another process appends: poll the files.
                    self._appended.wait(min(remaining, 0.05))
                    self.refresh()
        return True

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """The first offset whose record timestamp is >= `timestamp` (Kafka's ListOffsets)."""
        with self._lock:
            manifest = self.manifest
            logs = list(self.logs)
        for info in manifest.segments:
            if info.max_timestamp >= timestamp and info.last_offset >= manifest.log_start_offset:
                found = self.sealed_segment(info).offset_for_timestamp(timestamp)
                if found is not None and found >= manifest.log_start_offset:
                    return found
        for segment in logs:
            found = segment.offset_for_timestamp(timestamp)
            if found is not None:
                return found
        return None

    # -- retention ------------------------------------------------------------------

    def apply_retention(self) -> list[SegmentInfo]:
        """Delete whole sealed segments past retention.ms or retention.bytes.

        The active and rolled log segments are never deleted. On compacted topics only
        segments at or below the compaction horizon may go (none before a compaction).
        """
        self._require_writable()
        config = self.config
        horizon = (self.manifest.compaction or {}).get("horizon")
        now_ms = int(self.clock() * 1000)
        with self._lock:
            log_bytes = sum(segment.size for segment in self.logs)
            doomed = _expired_segments(self.manifest, config, now_ms, horizon, log_bytes)
            if not doomed:
                return []
            doomed_files = {info.file for info in doomed}

            def drop(manifest: PartitionManifest) -> PartitionManifest:
                kept = tuple(s for s in manifest.segments if s.file not in doomed_files)
                new_start = kept[0].base_offset if kept else manifest.sealed_end_offset
                return replace(
                    manifest,
                    segments=kept,
                    log_start_offset=max(manifest.log_start_offset, new_start),
                )

            self.commit_manifest(drop)
            for info in doomed:
                self._sealed.pop(info.file, None)
                (self.segment_dir / info.file).unlink(missing_ok=True)
                log.info(
                    "%s: retention deleted %s (offsets %d..%d)",
                    self.name, info.file, info.base_offset, info.last_offset,
                )
            fsutil.fsync_dir(self.segment_dir)
            return doomed

    # -- lifecycle ------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        with self._lock:
            manifest = self.manifest
            sealed_bytes = sum(s.size_bytes for s in manifest.segments)
            log_bytes = sum(s.size for s in self.logs)
            horizon = horizon_of(manifest)
            ledger = ledger_infos(manifest)
            ledger_bytes = sum(info.size_bytes for info in ledger)
            # Kafka's dirty ratio: dirty bytes over clean plus dirty bytes, where the clean
            # part is the compacted ledger and the dirty part the sealed data after it.
            dirty_bytes = sum(
                s.size_bytes for s in manifest.segments
                if horizon is None or s.last_offset > horizon
            )
            total = ledger_bytes + dirty_bytes
            return {
                "log_start_offset": self.log_start_offset,
                "log_end_offset": self.log_end_offset,
                "sealed_segments": len(manifest.segments),
                "sealed_bytes": sealed_bytes,
                "log_segments": len(self.logs),
                "log_bytes": log_bytes,
                "horizon": horizon,
                "ledger_files": len(ledger),
                "ledger_records": sum(info.record_count for info in ledger),
                "ledger_bytes": ledger_bytes,
                "dirty_bytes": dirty_bytes,
                "dirty_ratio": dirty_bytes / total if total else 0.0,
            }

    def close(self) -> None:
        with self._lock:
            if self.writable:
                self.flush()
            for segment in self.logs:
                segment.close()
            self.logs = []
            self._sealed.clear()


class _PartRead:
    """One bounded read over a fixed view (manifest and log segments) of a partition.

    Offsets in the raw log are dense from the log start, so every part must begin where
    the one before ended. A read stops at the first gap or damage after it has records
    (the caller gets what precedes the damage, as a consumer needs to get past it), and
    fails with CorruptionError only when the damage is where the read starts.
    """

    def __init__(
        self,
        partition: Partition,
        manifest: PartitionManifest,
        logs: list[LogSegment],
        max_records: int,
        max_bytes: int,
    ) -> None:
        self.partition = partition
        self.manifest = manifest
        self.logs = logs
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.parts: list[pa.Table | list[Record]] = []
        self.count = 0
        self.taken = 0

    @property
    def full(self) -> bool:
        return self.count >= self.max_records or (self.count > 0 and self.taken >= self.max_bytes)

    def run(self, offset: int) -> list[pa.Table | list[Record]]:
        offset = max(offset, self.manifest.log_start_offset)
        try:
            self._read(offset)
        except CorruptionError:
            if self.count:
                return self.parts
            raise
        return self.parts

    def _read(self, offset: int) -> None:
        expected = offset
        for _info, table in self.partition._sealed_tables(self.manifest, offset):
            if not table.num_rows:
                continue
            wanted = table.slice(0, self.max_records - self.count)
            kept = trim_to_bytes(wanted, self.max_bytes - self.taken)
            dense = _dense_prefix(kept, expected)
            if dense.num_rows:
                self.parts.append(dense)
                self.count += dense.num_rows
                self.taken += record_bytes(dense)
                expected += dense.num_rows
            if dense.num_rows < kept.num_rows:
                self._gap(expected)
                return
            # Stop before the generator reads another row group that would go unused.
            if kept.num_rows < wanted.num_rows or self.full:
                return
        for segment in self.logs:
            if self.full:
                return
            if segment.next_offset <= expected:
                continue
            more = segment.read(expected, self.max_records - self.count,
                                max(self.max_bytes - self.taken, 1))
            if not more:
                continue
            if more[0].offset != expected:
                self._gap(expected)
                return
            self.parts.append(more)
            self.count += len(more)
            self.taken += sum(16 + len(r.key or b"") + len(r.value or b"") for r in more)
            expected = more[-1].offset + 1
            if expected < segment.next_offset and not self.full:
                return  # the segment stopped before a corrupt range

    def _gap(self, expected: int) -> None:
        if not self.count:
            raise CorruptionError(
                self.partition.directory, f"offset {expected} is missing from the log"
            )


def _dense_prefix(table: pa.Table, expected: int) -> pa.Table:
    """The leading rows of `table` whose offsets run expected, expected + 1, ..."""
    offsets = table.column("offset")
    rows = table.num_rows
    if not rows or offsets[0].as_py() != expected:
        return table.slice(0, 0)
    if offsets[rows - 1].as_py() == expected + rows - 1:
        return table  # sorted and unique, so first and last prove it dense
    gaps = np.flatnonzero(offsets.to_numpy() != np.arange(expected, expected + rows))
    return table.slice(0, int(gaps[0]))


def _expired_segments(
    manifest: PartitionManifest,
    config: TopicConfig,
    now_ms: int,
    horizon: int | None,
    log_bytes: int,
) -> list[SegmentInfo]:
    """The prefix of sealed segments that retention deletes now.

    retention.bytes counts the whole partition, log segments included, as Kafka does;
    only sealed segments can be deleted to bring it under the limit.

    Under `compact` and `compact,delete` only segments wholly at or below the compaction
    horizon are candidates: the compacted view must not lose what it has not covered.
    """
    candidates = list(manifest.segments)
    if config.compacted:
        if horizon is None:
            return []
        candidates = [s for s in candidates if s.last_offset <= horizon]
    doomed: list[SegmentInfo] = []
    retention_ms = config["retention.ms"]
    if retention_ms >= 0:
        for info in candidates:
            if now_ms - info.max_timestamp <= retention_ms:
                break  # a prefix only, so the log stays contiguous from its start
            doomed.append(info)
    retention_bytes = config["retention.bytes"]
    if retention_bytes >= 0:
        total = (
            log_bytes
            + sum(s.size_bytes for s in manifest.segments)
            - sum(s.size_bytes for s in doomed)
        )
        for info in candidates[len(doomed):]:
            if total <= retention_bytes:
                break
            doomed.append(info)
            total -= info.size_bytes
    return doomed
