"""A partition: sealed Parquet segments, rolled log segments and one active log segment.

Directory layout:
  manifest/   the partition's manifest, committed by compare-and-swap (a backend Document)
  log/        <base offset>.log files of v2 record batches; the last is the active one
  segments/   <base offset>-<id>.parquet sealed segments, listed by the manifest
  ledger/     the compacted ledger's Parquet files, listed by the manifest (compaction)

Invariants:
- Offsets are assigned here, densely, and never reused; sealing and retention keep them.
- An append is all or nothing as its caller sees it: if it returns, its records are
  written (and fsynced, when the flush policy says so) and visible; if it raises, no
  reader ever sees them. After a failed fsync the partition takes no more writes until
  it is reopened (`failed`), and reads go on.
- A data file exists for readers only once a committed manifest lists it, and is deleted
  only by reachability (sweep.py). A log file is deleted only once a committed manifest's
  sealed segments cover it.
- One process writes a partition (the store's writer lock); others open it read-only
  and `refresh`. Compaction commits to the same manifest from its own process, so every
  commit here re-applies its change to the current manifest after a conflict.

This module keeps the partition's state and its manifest, and is the one owner of both,
as Kafka's UnifiedLog is of its LocalLog and LogSegments: it holds the lock, the segment
list and the committed manifest, and no other module takes that lock or changes them.
That is why it is one concept past 500 lines: every method is a step taken under the
lock (or the commit loop around it), and the protocols' bodies live in the sibling
modules, which reach the state only through these methods. Appends and rolls are in
appending.py, what a topic's config admits in log_validator.py, opening and recovery in
recovery.py (which returns what it found; `open`, `reopen` and `refresh` install it),
sealing in sealing.py, retention in retention.py, reads in reads.py, and when the next
sweep is due in sweep.py (SweepSchedule).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from compactlog import fsutil
from compactlog.backend import CommitOutcomeUnknown, Snapshot, Volume
from compactlog.backend.lease import EPOCH_KEY, LeaseLostError
from compactlog.backend.local.document import CommitLockTimeout
from compactlog.backend.local.volume import LocalVolume
from compactlog.config import TopicConfig
from compactlog.errors import (
    ConflictError,
    FencedError,
    InvalidRecordError,
    PartitionFailedError,
    ReadOnlyStoreError,
    StorageError,
)
from compactlog.storage import (
    appending,
    log_validator,
    reads,
    recovery,
    retention,
    sealing,
)
from compactlog.storage.appending import AppendResult as AppendResult
from compactlog.storage.compacted import CompactedView
from compactlog.storage.filecache import OpenFiles
from compactlog.storage.holds import HOLDS, Holds
from compactlog.storage.logfile import LogSegment, log_file_name
from compactlog.storage.manifest import (
    LEDGER_DIR,
    SEGMENT_DIR,
    PartitionManifest,
    SegmentInfo,
)
from compactlog.storage.records import (
    MAX_UNCOMPRESSED_BATCH_BYTES,
    ProducerRecord,
    Record,
    parse_header,
    set_base_offset,
)
from compactlog.storage.sealed import SegmentMissingError
from compactlog.storage.sweep import SweepSchedule, delete_forgotten

log = logging.getLogger(__name__)

Clock = Callable[[], float]
DEFAULT_MAX_RECORDS = 500
DEFAULT_MAX_BYTES = 1024 * 1024


@dataclass(frozen=True)
class View:
    """One consistent view of a partition for a read: a manifest and the log segments,
    log end offset and high watermark that went with it. Reads serve only offsets below
    `high_watermark` (Partition.high_watermark; storage/view_rows.py, `upper_bound`)."""

    manifest: PartitionManifest
    version: int
    logs: tuple[LogSegment, ...]
    log_end_offset: int
    high_watermark: int
    # How many batches each of `logs` held at the view's instant (a log segment's
    # positions only grow: reads of the view stop there).
    log_batches: tuple[int, ...] = ()


class Partition:
    def __init__(
        self,
        directory: Path,
        topic: str,
        index: int,
        config: Callable[[], TopicConfig],
        writable: bool,
        clock: Clock = time.time,
        files: OpenFiles | None = None,
        volume: Volume | None = None,
    ) -> None:
        # `directory` is local: log segments, locks, compaction status, files being
        # written. The durable files (manifest, sealed segments, ledger) are in `volume`:
        # the same directory, or an S3 prefix (its Volume).
        self.directory = directory
        self.volume: Volume = volume if volume is not None else LocalVolume(directory)
        self.topic = topic
        self.index = index
        self._config = config
        self.writable = writable
        self.clock = clock
        self.files = files if files is not None else OpenFiles()
        self.document = self.volume.document("manifest")
        # Files that readers outside the manifests hold (the Iceberg state table's
        # retained snapshots): the sweep keeps them (holds.py).
        self.holds = Holds(self.volume.document(HOLDS))
        self.log_dir = directory / "log"
        self.segment_dir = directory / SEGMENT_DIR
        self.ledger_dir = directory / LEDGER_DIR
        self.snapshot: Snapshot | None = None
        self.manifest = PartitionManifest()
        self.manifest_version = 0
        self.logs: list[LogSegment] = []  # rolled segments, then the active one last
        self._lock = threading.RLock()
        self.seal_lock = threading.Lock()
        self._appended = threading.Condition(self._lock)
        self.recovery = recovery.RecoveryReport()
        self.auto_seal = True
        # What a producer's compressed batch may decompress to (the store sets it).
        self.max_uncompressed_batch_bytes = MAX_UNCOMPRESSED_BATCH_BYTES
        # Set when an fsync failed: no more writes until the partition is reopened.
        self.failed: BaseException | None = None
        self.sweeps = SweepSchedule(self.now_ms, lambda: self.config["file.delete.delay.ms"])
        self.compacted = CompactedView(self)
        # On an object store, the writer lease's epoch (lease.py): every commit this
        # writer makes checks the manifest is not stamped by a newer writer.
        self.writer_epoch: int | None = None
        # On an object store, the sealed end of the manifest versions this writer itself
        # committed (or found at open): what is in the bucket by this writer's own
        # doing, never by a manifest another writer committed (`high_watermark`).
        self._durable_end = 0

    @property
    def name(self) -> str:
        return f"{self.topic}/{self.index}"

    @property
    def config(self) -> TopicConfig:
        return self._config()

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # -- opening ----------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, topic: str, index: int, config: Callable[[], TopicConfig],
               clock: Clock = time.time, volume: Volume | None = None) -> None:
        """Lay out a new, empty partition: an empty manifest and an active segment at 0."""
        for sub in ("log", SEGMENT_DIR):
            (directory / sub).mkdir(parents=True, exist_ok=True)
        if volume is None:
            (directory / "manifest").mkdir(exist_ok=True)
            volume = LocalVolume(directory)
        volume.document("manifest").commit(0, PartitionManifest().to_json())
        (directory / "log" / log_file_name(0)).touch()

    def data_path(self, relative: str) -> Path:
        """A local path holding data file `relative` (its Volume: on S3 a cached copy,
        downloaded now if need be). A file that is gone raises SegmentMissingError, so a
        read retries from a newer manifest (reads.with_view)."""
        try:
            return self.volume.fetch(relative)
        except FileNotFoundError:
            raise SegmentMissingError(self.volume.describe(relative),
                                      "listed by the manifest but gone") from None

    def open(self) -> Partition:
        """Open with recovery (recovery.py) as a writer, or follow the writer's files as
        a reader. A writer takes the seal lock, then the partition's lock, in the order
        sealing takes them."""
        if not self.volume.is_local:
            # Its local directory is scratch space (locks, compaction status, staging),
            # which a reader on another machine, or a compaction there, needs too.
            self.directory.mkdir(parents=True, exist_ok=True)
        if not self.writable:
            with self._lock:
                self.logs = recovery.open_as_reader(self)
            return self
        with self.seal_lock, self._lock:
            recovered = recovery.recover(self)
            self.logs, self.recovery = recovered.logs, recovered.report
        if self.auto_seal:
            self.seal_rolled_quietly()
        return self

    def reopen(self) -> None:
        """Close and open again with recovery (recovery.py): how a failed partition
        takes writes again. A batch whose fsync failed and whose cut failed too is cut
        here first; the log files are then scanned afresh. Until recovery succeeds the
        old state stays in force (readers see what they saw), and if it fails the
        partition stays failed with the new error. Takes the seal lock, then the
        partition's lock, in the order sealing takes them."""
        with self.seal_lock, self._lock:
            try:
                for segment in self.logs:
                    segment.cut_pending()
                if self.writable:
                    recovered = recovery.recover(self)
                else:  # a reader repairs nothing: it follows the writer's files afresh
                    recovered = recovery.Recovered(recovery.follow_writer(
                        self, self.load_manifest, known=[]), recovery.RecoveryReport())
            except Exception as error:
                self.failed = None
                self.fail(error)
                return
            # The old segments are not closed: reads in other threads may still hold
            # them; each closes when its last reader lets go (LogSegment.__del__), so no
            # descriptor is closed, and reused, under a read.
            self.logs, self.recovery = recovered.logs, recovered.report
            self.failed = None
        if self.auto_seal:
            self.seal_rolled_quietly()

    def view(self) -> View:
        """One consistent view of the partition (see View), taken under its lock."""
        with self._lock:
            return View(self.manifest, self.manifest_version, tuple(self.logs),
                        self.log_end_offset, self.high_watermark,
                        tuple(len(segment.positions) for segment in self.logs))

    def next_to_seal(self) -> LogSegment | None:
        """The oldest rolled log segment with records to seal (sealing.py), dropping on
        the way those with none (empty, or wholly below what DeleteRecords deleted);
        None when only the active segment is left."""
        with self._lock:
            while len(self.logs) > 1:
                segment = self.logs[0]
                if segment.is_empty or segment.next_offset <= self.log_start_offset:
                    self.drop_covered_logs(force=segment)
                    continue
                return segment
            return None

    def drop_covered_logs(self, force: LogSegment | None = None) -> None:
        """Delete the rolled log files that the committed manifest's sealed segments
        cover, or that lie wholly below the log start, and `force` (sealing.py, step 4).
        The active segment always stays."""
        with self._lock:
            sealed_end = max(self.manifest.sealed_end_offset, self.log_start_offset)
            doomed = [segment for segment in self.logs[:-1]
                      if segment is force or segment.next_offset <= sealed_end]
            if not doomed:
                return
            try:
                for segment in doomed:
                    # Not closed here: a concurrent read may still be using it; its
                    # descriptor closes when the last reader lets go (LogSegment.__del__).
                    fsutil.remove(segment.path)
                fsutil.fsync_dir(self.log_dir)
            except OSError as error:
                # The commit stands and the records are read from the sealed file; a log
                # file left behind (or brought back by a crash) is covered and goes at
                # the next open.
                log.warning("%s: deleting sealed log files failed (removed at the next "
                            "open): %s", self.name, error)
            finally:
                for segment in doomed:
                    if segment in self.logs:
                        self.logs.remove(segment)

    def notify_appended(self) -> None:
        """Wake the reads waiting for records (`wait_for`); the caller holds the lock,
        as an append does."""
        self._appended.notify_all()

    # -- the manifest -----------------------------------------------------------------

    def load_manifest(self) -> None:
        """Read the current manifest (a Document falls back past a damaged current.json)."""
        snapshot = self.document.load()
        where = self.volume.describe("manifest/current.json")
        if snapshot is None:
            raise FileNotFoundError(where)
        self._install(snapshot, PartitionManifest.from_json(snapshot.body, where))

    def _install(self, snapshot: Snapshot, manifest: PartitionManifest) -> None:
        with self._lock:
            if snapshot.version < self.manifest_version:
                return  # another thread installed a newer version meanwhile
            theirs = int(manifest.extra.get(EPOCH_KEY, 0))
            if self.writable and self.writer_epoch is not None and theirs > self.writer_epoch:
                # Whatever this writer was doing, a newer one owns the partition now: it
                # acknowledges and serves nothing more (lease.py).
                self.fail(FencedError(
                    f"{self.name}: a newer writer (epoch {theirs}) took over from this "
                    f"one (epoch {self.writer_epoch}); this writer stops"))
            gone = self.manifest.live_files() - manifest.live_files()
            self.snapshot = snapshot
            self.manifest = manifest
            self.manifest_version = snapshot.version
            self.sweeps.after_commit(manifest)
        for relative in gone:
            # Readers holding the file finish with it; then it closes (filecache.py).
            self.files.retire(self.volume.path_of(relative))

    def commit_manifest(
        self, change: Callable[[PartitionManifest], PartitionManifest], attempts: int = 20
    ) -> PartitionManifest:
        """Apply `change` to the current manifest and commit it by compare-and-swap,
        re-applying it to the newer manifest after a conflict.

        Files that the change stops listing are retired (manifest.RetiredFile), not
        deleted: the sweep deletes them after file.delete.delay.ms. `change` may raise
        ConflictError itself to give up (a compaction whose pair was replaced).
        """
        delay_ms = self.config["file.delete.delay.ms"]
        for _ in range(attempts):
            with self._lock:
                base, version = self.manifest, self.manifest_version
            try:
                updated = self._stamped(change)(base)
            except FencedError as error:
                self.fail(error)
                raise
            dropped = base.live_files() - updated.live_files()
            updated = updated.retiring(dropped, self.now_ms(), delay_ms)
            try:
                snapshot = self.document.commit(version, updated.to_json())
            except CommitLockTimeout:
                raise  # waiting again would take as long: the caller retries later
            except ConflictError:
                self.load_manifest()
                continue
            except CommitOutcomeUnknown as error:
                # Published, maybe not durable: what is visible is what counts, and a
                # writer whose directory fsync failed stops writing (see `fail`).
                self.load_manifest()
                if self.writable:
                    self.fail(error)
                raise
            self._install(snapshot, updated)
            if self.writable:
                with self._lock:
                    self._durable_end = max(self._durable_end, updated.sealed_end_offset)
                    self._appended.notify_all()  # the high watermark may have moved
            self._delete_forgotten(base, updated)
            return updated
        raise ConflictError(f"{self.name}: manifest kept changing; gave up after {attempts} tries")

    def _stamped(self, change: Callable[[PartitionManifest], PartitionManifest]
                 ) -> Callable[[PartitionManifest], PartitionManifest]:
        """`change` as this writer's (lease.py): refused once a newer writer stamped the
        manifest, and stamping it with this writer's epoch."""
        epoch = self.writer_epoch
        if not self.writable or epoch is None:
            return change

        def stamped(manifest: PartitionManifest) -> PartitionManifest:
            theirs = int(manifest.extra.get(EPOCH_KEY, 0))
            if theirs > epoch:
                raise FencedError(f"{self.name}: a newer writer (epoch {theirs}) took over "
                                  f"from this one (epoch {epoch}); this writer stops")
            updated = change(manifest)
            if int(updated.extra.get(EPOCH_KEY, 0)) != epoch:
                updated = replace(updated, extra={**updated.extra, EPOCH_KEY: epoch})
            return updated

        return stamped

    def stamp_epoch(self) -> None:
        """Step 1 of a writer's open on an object store (lease.py): stamp the manifest
        with this writer's epoch before anything is written, so that a former writer's
        late commit fails."""
        if self.writer_epoch is not None and int(
                self.manifest.extra.get(EPOCH_KEY, 0)) != self.writer_epoch:
            self.commit_manifest(lambda manifest: manifest)

    def _delete_forgotten(self, base: PartitionManifest, updated: PartitionManifest) -> None:
        """The retired files this commit stopped mentioning go now (sweep.py's rules)."""
        try:
            delete_forgotten(self.volume, base, updated, self.holds.held,
                             self.files.retire, self.name)
        except (OSError, StorageError) as error:  # StorageError: an object store's DELETE
            log.warning("%s: could not delete a retired file (the sweep retries): %s",
                        self.name, error)
            self.sweeps.soon()

    def prove_manifest(self) -> bool:
        """Whether the manifest's current version is proven, so that files it does not
        list are orphans (the Document). Its owner, the writer holding the lease, removes
        audit copies of versions never committed on the way; any other process (a
        compaction, a fenced writer) only looks, since on an object store a stalled
        owner's commit looks the same as a dead one's (backend/s3/document.py)."""
        owner = self.writable and not isinstance(self.failed, FencedError | LeaseLostError)
        return self.document.purge_uncommitted() if owner else self.document.proven()

    def refresh(self) -> None:
        """Pick up what other processes committed or appended: a writer, the manifests
        that compactions commit; a reader, the writer's log files too, listed before the
        manifest is loaded (recovery.follow_writer says why)."""
        with self._lock:
            if self.writable:
                if self.document.changed_since(self.snapshot):
                    self.load_manifest()
                return
            self.logs = recovery.follow_writer(self, self._load_manifest_if_changed)

    def _load_manifest_if_changed(self) -> None:
        if self.document.changed_since(self.snapshot):
            self.load_manifest()

    def sweep(self) -> list[Path]:
        """Delete what the manifest made unreachable (sweep.py), as the writer: retired
        files past their delay, orphans in segments/ (no seal runs meanwhile), and
        orphans in ledger/ when no compaction holds the partition."""
        return recovery.sweep_as_writer(self).deleted

    # -- appending --------------------------------------------------------------------

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
    def high_watermark(self) -> int:
        """The durable high watermark (DESIGN.md, contract 13): consumers, and every read
        of the view, are served only offsets below it. On a local directory an append
        is durable by the flush policy once it returns, so it is the log end offset. On
        an object store it is what the bucket holds: for the writer, the sealed end of
        the manifests it committed itself (a manifest another writer committed never
        raises it); for a reader, the committed manifest's sealed end."""
        if self.volume.is_local:
            return self.log_end_offset
        if self.writable:
            return self._durable_end
        return self.manifest.sealed_end_offset

    def note_durable_at_open(self) -> None:
        """Recovery's last step on an object store: the manifest this writer opened on
        (stamped with its epoch) lists what is in the bucket."""
        with self._lock:
            self._durable_end = self.manifest.sealed_end_offset

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
        self.require_writable()
        if not records:
            raise InvalidRecordError(f"{self.name}: nothing to append")
        self.check_keys(records)
        batch = log_validator.encode_for(self.name, self.config, records, self.now_ms())
        self.check_size(len(batch))
        return batch

    def append_prepared(self, batch: bytearray) -> AppendResult:
        """Append a batch from `prepare`, giving it the next offsets."""
        with self._lock:
            set_base_offset(batch, self.log_end_offset)
            result = appending.append_encoded(self, batch, parse_header(batch))
        self._seal_after_append()
        return result

    def _seal_after_append(self) -> None:
        """Step 5 of the append protocol (appending.py), after the partition's lock is
        released: appends and reads go on while the Parquet file is written."""
        if self.auto_seal and len(self.logs) > 1:
            self.seal_rolled_quietly()

    def check_keys(self, records: Sequence[ProducerRecord | Record]) -> None:
        """Refuse null keys on a compacted topic whose null.key.policy is reject."""
        log_validator.check_null_key(self.name, self.topic, self.config,
                                     log_validator.first_null_key(records))

    def append_batch(self, batch: bytearray) -> AppendResult:
        """Append a v2 batch built elsewhere (a Kafka producer): validated, offsets assigned.

        Its size as sent is checked against max.message.bytes first, as Kafka checks it,
        before anything is decompressed; a compressed batch's records are decompressed
        no further than `max_uncompressed_batch_bytes` (RecordTooLargeError past it).
        """
        self.require_writable()
        config = self.config
        header, facts = log_validator.check_producer_batch(
            self.name, config, batch, self.max_uncompressed_batch_bytes)
        log_validator.check_null_key(self.name, self.topic, config, facts.first_null_key)
        # Timestamps checked and stamped, codec applied (Kafka's LogValidator).
        batch, append_time = log_validator.admit(self.name, config, batch, header, facts,
                                                 self.now_ms())
        with self._lock:
            set_base_offset(batch, self.log_end_offset)
            result = appending.append_encoded(self, batch, parse_header(batch))
        self._seal_after_append()
        return replace(result, log_append_time=append_time)

    def check_size(self, batch_bytes: int) -> None:
        log_validator.check_size(self.name, self.config, batch_bytes)

    def roll(self) -> bool:
        """Roll the active segment now if it holds anything, and seal it (when auto_seal)."""
        self.require_writable()
        with self._lock:
            if self.active.is_empty:
                return False
            self.roll_locked()
        if self.auto_seal:
            self.seal_rolled()
        return True

    def roll_if_due(self) -> bool:
        """Roll an idle active segment that has passed segment.ms (appends alone never would)."""
        self.require_writable()
        with self._lock:
            if not appending.should_roll(self, 0, self.now_ms()):
                return False
            self.roll_locked()
        if self.auto_seal:
            self.seal_rolled_quietly()
        return True

    def roll_locked(self) -> None:
        """Start a new active segment (appending.next_segment), with the partition's
        lock held: the one place the segment list grows."""
        with self._lock:  # re-entrant: the callers hold it already
            self.logs.append(appending.next_segment(self))

    def flush_if_due(self) -> None:
        """fsync unflushed records that have waited flush.ms (appends alone may not come)."""
        now_ms = self.now_ms()
        with self._lock:
            for segment in self.logs:
                first = segment.first_unflushed_ms
                if first is not None and now_ms - first >= self.config["flush.ms"]:
                    appending.flush_segment(self, segment)

    def flush(self) -> None:
        with self._lock:
            for segment in self.logs:
                if segment.unflushed_records:
                    appending.flush_segment(self, segment)

    def fail(self, error: BaseException) -> None:
        """Stop taking writes: an fsync failed, so what the page cache holds can no longer
        be trusted to reach the disk. Reopening the partition recovers it."""
        if self.failed is None:
            self.failed = error
            log.error("%s: stopped taking writes until it is reopened: %s", self.name, error)

    def require_owner(self) -> None:
        """The error a read or a write answers with once another writer owns this
        partition (fenced, or the lease lost): the reader goes to the new owner."""
        if isinstance(self.failed, FencedError | LeaseLostError):
            raise self.failed

    def require_writable(self) -> None:
        if not self.writable:
            raise ReadOnlyStoreError(f"{self.name} is open read-only")
        if isinstance(self.failed, FencedError | LeaseLostError):
            raise self.failed  # another writer owns it now (lease.py): for good
        if self.failed is not None:
            raise PartitionFailedError(
                f"{self.name} takes no writes since an fsync failed ({self.failed}); "
                "it is retried when the partition is reopened")

    # -- sealing, retention and reads (in their own modules) --------------------------

    def seal_rolled(self) -> list[SegmentInfo]:
        return sealing.seal_rolled(self)

    def seal_rolled_quietly(self) -> None:
        """Seal now if possible; a failure is logged and the rolled segments stay logs,
        to be sealed by a later call (they are readable meanwhile)."""
        try:
            self.seal_rolled()
        except Exception as error:  # a seal is retried; the caller's work is done
            log.warning("%s: sealing failed, retried later: %s", self.name, error)

    def apply_retention(self) -> list[SegmentInfo]:
        return retention.apply_retention(self)

    def delete_records(self, before: int) -> int:
        """Kafka's DeleteRecords (retention.py); returns the new log start offset."""
        return retention.delete_records(self, before)

    def read(self, offset: int, max_records: int = DEFAULT_MAX_RECORDS,
             max_bytes: int = DEFAULT_MAX_BYTES) -> list[Record]:
        """Records from `offset` on, in offset order (reads.py)."""
        return reads.read_records(self, offset, max_records, max_bytes, compacted=False)

    def read_compacted(self, offset: int, max_records: int = DEFAULT_MAX_RECORDS,
                       max_bytes: int = DEFAULT_MAX_BYTES) -> list[Record]:
        """As `read`, from the compacted view: the ledger up to the horizon, then the
        raw log. Offsets have gaps where compaction removed records."""
        return reads.read_records(self, offset, max_records, max_bytes, compacted=True)

    def read_table(self, offset: int, max_records: int = DEFAULT_MAX_RECORDS,
                   max_bytes: int = DEFAULT_MAX_BYTES, compacted: bool = False) -> pa.Table:
        """As `read`, but columnar: offset, timestamp, key, value, headers."""
        return reads.read_table(self, offset, max_records, max_bytes, compacted)

    def wait_for_data(self, offset: int, timeout: float) -> bool:
        """Block until a record at or after `offset` may exist, or `timeout` passes."""
        deadline = time.monotonic() + timeout
        with self._appended:
            while self.high_watermark <= offset:
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
        return reads.offset_for_timestamp(self, timestamp)

    # -- lifecycle --------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        with self._lock:
            manifest = self.manifest
            sealed_bytes = sum(s.size_bytes for s in manifest.segments)
            log_bytes = sum(s.size for s in self.logs)
            horizon = manifest.horizon
            ledger = manifest.ledger
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
                "ledger_records": sum(info.live_count for info in ledger),
                "ledger_bytes": ledger_bytes,
                "dirty_bytes": dirty_bytes,
                "dirty_ratio": dirty_bytes / total if total else 0.0,
                "failed": None if self.failed is None else str(self.failed),
            }

    def close(self) -> None:
        with self._lock:
            if self.writable and self.failed is None:
                self._close_flush()
            for segment in self.logs:
                segment.close()
            self.logs = []
            for relative in self.manifest.live_files():
                self.files.retire(self.volume.path_of(relative))

    def _close_flush(self) -> None:
        try:
            self.flush()
        except Exception as error:  # the failure is logged by fail(); close goes on
            log.error("%s: the final flush failed: %s", self.name, error)
