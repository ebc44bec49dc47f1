"""Opening a partition: load its manifest, repair what a crash or a failure left, and
find its log segments.

Invariant: after `recover` (a value: the log segments and what was repaired, which
Partition.open installs) a writable partition holds only what some committed
manifest reaches, whole log segments (a torn tail cut back to the last whole batch),
and no temporary file; nothing that a committed manifest lists has been deleted.

Recovery steps for a writer (each repairs one crash point of a protocol in sealing.py,
backend/local/document.py or the compaction runner; the crash tests name them):
  1. remove temporary files in manifest/, holds/, log/ and segments/ (a crash before a
     rename; tests/faults/test_fault_steps.py kills at every step of the hold commit);
  2. sweep (sweep.py): orphans in segments/ (a seal that crashed after its rename but
     before its commit), orphans in ledger/ if no compaction holds the partition, and
     retired files whose delay has passed;
  3. delete log files wholly covered by the manifest's sealed segments (a seal that
     crashed after its commit but before deleting its log file);
  4. scan every log segment, cutting a torn tail (a crash in the middle of an append)
     and recording corrupt ranges;
  5. seal the rolled segments (auto_seal), which may have waited for a seal that
     never came.
On an object store, before any of these, the writer (holding the lease):
  0a. removes the audit copies of manifest versions never committed (a committer killed
      between its audit copy and its commit point): test_a_writer_killed_at_a_commit_
      point_does_not_block_the_next_writer (tests/faults/test_fault_steps_s3.py);
  0b. compares the epoch this local directory last wrote under (its `writer_epoch` file)
      with the epoch stamped in the manifest: a newer stamp means another writer took
      over since, so every local log file is superseded, whatever offsets it holds (its
      records were never acknowledged to acks=all, or they are in the bucket already),
      and all of them are set aside as one suffix; offsets then go on from the bucket's
      sealed end, dense and never reused. test_a_restart_after_a_take_over_sets_aside_
      the_whole_local_suffix (tests/faults/test_failover_steps_s3.py). Log files without that
      file were written by a build that kept none (738e3b6): step 3b alone decides;
  0c. records its own epoch in that file (fsynced), then stamps it into the manifest
      (lease.py), and takes the manifest's sealed end as its durable high watermark
      (Partition.high_watermark). A crash between 0c's two writes leaves a local epoch
      newer than the manifest's, which 0b reads as "nobody took over": right, since 0b
      already set aside what was superseded;
and after step 3, with nobody having taken over, a local file that starts below the
sealed end or after a gap is set aside with every file after it (step 3b).

A reader (read-only, another process) opens and refreshes by `follow_writer`: the log
files first, then the manifest (see there why in that order).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from compactlog import fsutil
from compactlog.backend.lease import EPOCH_KEY
from compactlog.errors import CorruptionError, StorageError
from compactlog.storage import locks
from compactlog.storage.logfile import LogSegment, TornTail, base_offset_of, log_file_name
from compactlog.storage.manifest import LEDGER_DIR, SEGMENT_DIR, PartitionManifest
from compactlog.storage.sweep import SweepResult, sweep_unreachable

if TYPE_CHECKING:
    from compactlog.storage.partition import Partition

log = logging.getLogger(__name__)


def log_files(log_dir: Path) -> list[tuple[int, Path]]:
    """The log files of a partition, by base offset."""
    found: list[tuple[int, Path]] = []
    if not log_dir.is_dir():
        return found
    for path in log_dir.glob("*.log"):
        base = base_offset_of(path)
        if base is not None:
            found.append((base, path))
    return sorted(found)


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
class Recovered:
    """What a writer's recovery found: the partition's log segments (rolled ones, then
    the active one last) and what it repaired. The partition installs both (Partition.
    open and reopen), so a recovery that fails leaves its state as it was."""

    logs: list[LogSegment]
    report: RecoveryReport


def recover(partition: Partition) -> Recovered:
    """Steps 0-4 for a writer. The caller holds the seal lock, then the partition's lock
    (the order sealing takes them): Partition.open and Partition.reopen."""
    report = RecoveryReport()
    _load_or_create_manifest(partition)
    if not partition.volume.is_local:
        # A writer killed between a commit's audit copy and its PUT of current.json
        # (backend/s3/document.py steps 3 and 4) left an audit copy of a version never
        # committed, on which every commit of that version conflicts: the stamp below
        # would give up ("manifest kept changing") and the store could not open. This
        # writer holds the lease, so it is the document's owner and may purge it, as its
        # sweep does. test_a_writer_killed_at_a_commit_point_does_not_block_the_next_
        # writer (tests/faults/test_fault_steps_s3.py)
        partition.document.purge_uncommitted()  # 0a.
        _set_aside_after_take_over(partition, report)  # 0b.
        _write_local_epoch(partition)  # 0c.
    partition.stamp_epoch()  # on an object store: fence former writers (lease.py)
    if not partition.volume.is_local:
        partition.note_durable_at_open()
    _recover_files(partition, report)
    logs = _open_logs(partition)
    for segment in logs:
        if segment.torn_tail:
            report.torn_tails.append(segment.torn_tail)
        report.corrupt_ranges.extend(hole.describe() for hole in segment.corrupt.values())
    return Recovered(logs, report)


def open_as_reader(partition: Partition) -> list[LogSegment]:
    """A reader's open: the writer's files, followed (`follow_writer`); nothing repaired.
    The caller holds the partition's lock."""
    return follow_writer(partition, lambda: _load_or_create_manifest(partition))


def _load_or_create_manifest(partition: Partition) -> None:
    document = partition.document
    if document.load() is not None:
        partition.load_manifest()
        return
    has_data = any(item.name.endswith(".parquet")
                   for item in partition.volume.listing(SEGMENT_DIR)) or any(
        path.stat().st_size > 0 for _, path in log_files(partition.log_dir))
    if has_data:
        raise CorruptionError(
            partition.volume.describe("manifest"),
            f"partition {partition.name} holds data files but its manifest is missing",
        )
    if not partition.writable:
        return
    document.commit(0, PartitionManifest().to_json())
    partition.load_manifest()


def _recover_files(partition: Partition, report: RecoveryReport) -> None:
    removed = report.removed_files
    for directory in (partition.log_dir, partition.segment_dir):
        directory.mkdir(parents=True, exist_ok=True)
    if partition.volume.is_local:
        (partition.directory / "manifest").mkdir(exist_ok=True)
    for directory in (partition.log_dir, partition.segment_dir):
        removed.extend(fsutil.remove_temp_files(directory))
    removed.extend(Path(item) for item in partition.document.recover())
    # The hold document's commits (a compaction's Iceberg sync, the upkeep's expiry) can
    # be killed between writing and renaming too: its leftovers go the same way, under
    # its commit lock, so a holder committing now keeps its files (Document.recover).
    removed.extend(Path(item) for item in partition.holds.document.recover())
    # Orphans are what a crash left; retired files past their delay are housekeeping.
    # A sweep that fails deletes nothing it should keep: open goes on, upkeep retries.
    try:
        removed.extend(sweep_as_writer(partition, seal_lock_held=True).orphans)
    except (OSError, StorageError) as error:  # StorageError: an object store's request
        partition.sweeps.soon()
        log.warning("%s: the sweep at open failed (retried by upkeep): %s", partition.name,
                    error)
    # Covered: sealed, or wholly below the log start (DeleteRecords).
    sealed_end = max(partition.manifest.sealed_end_offset, partition.log_start_offset)
    found = log_files(partition.log_dir)
    deleted = False
    for (_, path), (next_base, _) in itertools.pairwise(found):
        if next_base <= sealed_end and fsutil.remove(path):
            # Sealed and committed; the crash came before its deletion.
            removed.append(path)
            deleted = True
            log.info("%s: removed %s, already sealed", partition.name, path.name)
    if deleted:
        fsutil.fsync_dir(partition.log_dir)
    if not partition.volume.is_local:
        _set_aside_superseded(partition, sealed_end, report)


LOCAL_EPOCH_FILE = "writer_epoch"


def _local_epoch(partition: Partition) -> int:
    """The epoch under which this local directory's log files were written (0: not
    recorded, as before this file existed, or a new directory)."""
    try:
        return int((partition.directory / LOCAL_EPOCH_FILE).read_text().strip() or 0)
    except FileNotFoundError:
        return 0
    except ValueError:
        return 0  # damaged: treated as unknown, so a take-over is assumed (the safe side)


def _write_local_epoch(partition: Partition) -> None:
    if partition.writer_epoch is None or _local_epoch(partition) == partition.writer_epoch:
        return
    final = partition.directory / LOCAL_EPOCH_FILE
    temp = fsutil.temp_path(partition.directory, LOCAL_EPOCH_FILE)
    fsutil.write_file_durably(temp, f"{partition.writer_epoch}\n".encode())
    fsutil.publish_replace(temp, final)


def _set_aside_after_take_over(partition: Partition, report: RecoveryReport) -> None:
    """Step 0b: every local log file goes aside when a newer writer stamped the manifest
    since this directory's writer last wrote."""
    stamped = int(partition.manifest.extra.get(EPOCH_KEY, 0))
    local = _local_epoch(partition)
    if stamped <= local:
        return
    files = log_files(partition.log_dir)
    if not (partition.directory / LOCAL_EPOCH_FILE).exists() and files:
        # Log files and no epoch file: written by a build from before the file existed
        # (738e3b6), which recorded no epoch and acknowledged them from this disk. Nothing
        # says a writer took over since, so they are not all superseded: step 3b keeps a
        # file that continues the bucket's sealed end and sets aside one that does not,
        # as that build's recovery did (tests/contract/test_old_data.py, the crashed writer).
        return
    if any(path.stat().st_size > 0 for _, path in files):
        _set_aside(partition, report, [path for _, path in files],
                   f"written under epoch {local or 'unknown'}, and a newer writer (epoch "
                   f"{stamped}) took over since; the bucket's log ends at "
                   f"{partition.manifest.sealed_end_offset}")
    else:
        for _, path in files:  # empty: nothing to keep for inspection
            fsutil.remove(path)
        if files:
            fsutil.fsync_dir(partition.log_dir)


def _set_aside_superseded(partition: Partition, sealed_end: int,
                          report: RecoveryReport) -> None:
    """Step 3b, on an object store: the local log must continue the bucket's exactly. A
    file that starts below the sealed end and survived step 3 holds offsets that another
    writer sealed (its records never reached the bucket); a file that starts after it
    leaves a hole. Either one, and every file after it, is moved aside (kept for
    inspection, never read): appending after it would put two records at one offset,
    or offsets that never exist. tests/faults/test_failover_s3.py"""
    files = log_files(partition.log_dir)
    for position, (base, _) in enumerate(files):
        if base != sealed_end:
            _set_aside(partition, report, [path for _, path in files[position:]],
                       f"the bucket's log ends at {sealed_end}, and this file starts at "
                       f"{base}")
        break


def _set_aside(partition: Partition, report: RecoveryReport, paths: list[Path],
               why: str) -> None:
    aside = partition.directory / "superseded"
    aside.mkdir(exist_ok=True)
    stamp = partition.now_ms()
    for path in paths:
        target = aside / f"{path.name}.{stamp}"
        os.replace(path, target)
        report.removed_files.append(path)
        log.error("%s: set aside %s (%s): its records were never uploaded by this writer; "
                  "moved to %s", partition.name, path.name, why, target)
    fsutil.fsync_dir(partition.log_dir)


def sweep_as_writer(partition: Partition, seal_lock_held: bool = False) -> SweepResult:
    """The writer's sweep (sweep.py). Orphans may be deleted only when the manifest's
    current version is proven (Document.purge_uncommitted: current.json intact, and
    audit copies of versions never committed removed), and only where their writers are
    excluded: sealers by the seal lock (held here), compactions by the compaction lock,
    taken without waiting (else ledger orphans and a crashed run's temporary status
    file wait for the next run, which sweeps them)."""
    with contextlib.nullcontext() if seal_lock_held else partition.seal_lock:
        result = _sweep_with_seal_lock(partition)
    partition.sweeps.after_sweep(partition.manifest, result.retired_done)
    return result


def _sweep_with_seal_lock(partition: Partition) -> SweepResult:
    lock_fd = locks.try_lock(partition.directory) if partition.ledger_dir.is_dir() else None
    try:
        orphan_dirs: list[str] = []
        if partition.prove_manifest():
            orphan_dirs.append(SEGMENT_DIR)
            if lock_fd is not None:
                orphan_dirs.append(LEDGER_DIR)
                # A compaction run writes its status file in the partition directory
                # itself, under the same lock: a crashed run's temporary file goes too.
                fsutil.remove_temp_files(partition.directory)
        # What another process committed before we looked counts.
        partition.refresh()
        result = sweep_unreachable(partition.volume, partition.manifest, partition.now_ms(),
                       partition.config["file.delete.delay.ms"], orphan_dirs,
                       partition.files.retire, partition.name, partition.holds.held())
    finally:
        if lock_fd is not None:
            os.close(lock_fd)
    return result


FOLLOW_ATTEMPTS = 5


def follow_writer(partition: Partition, load_manifest: Callable[[], None],
                  known: list[LogSegment] | None = None) -> list[LogSegment]:
    """A reader's log segments, following the writer's files, at open (`load_manifest`
    loads the manifest) and at each refresh (it loads the manifest if it changed), from
    the segments it holds (or `known`: none, to open every file afresh); the caller
    installs them.

    Order matters. The writer seals a log file by committing a manifest that lists its
    Parquet form, and only then deletes the file (sealing.py, steps 3 and 4). So the
    reader lists log/ and opens the files first, then loads the manifest: a file it
    opened stays readable through its descriptor, and a file deleted before it could open
    it was covered by a committed manifest, hence by the one it loads next. In the other
    order a seal landing between the two steps left offsets in neither place: the old
    manifest did not list their segment and the listing no longer had their log file,
    and reads failed with a false "offset ... is missing" (issue 21, item 7;
    tests/storage/test_reader_refresh.py). Should the log files still begin past the covered
    end, the reader does both steps again, a few times; a gap that stays is real."""
    logs = list(partition.logs if known is None else known)
    for _ in range(FOLLOW_ATTEMPTS):
        logs = _with_new_logs(partition, logs)
        load_manifest()
        for segment in logs:
            segment.scan(repair=False)
        manifest = partition.manifest
        covered = max(manifest.sealed_end_offset, manifest.log_start_offset)
        while len(logs) > 1 and logs[0].next_offset <= covered:
            # Not closed: a read in another thread may hold it (LogSegment.__del__).
            logs.pop(0)
        if not logs or logs[0].base_offset <= covered:
            break
        log.info("%s: the log files start at %d, past the sealed end %d: looking again",
                 partition.name, logs[0].base_offset, covered)
    return logs


def _with_new_logs(partition: Partition, logs: list[LogSegment]) -> list[LogSegment]:
    """`logs` and the log files not among them yet, by base offset (one deleted since it
    was listed is skipped: a committed manifest covers it)."""
    known = {segment.base_offset for segment in logs}
    found = list(logs)
    for base, path in log_files(partition.log_dir):
        if base in known:
            continue
        try:
            segment = LogSegment(path, base, writable=False, created_ms=partition.now_ms())
        except FileNotFoundError:
            continue
        found.append(segment)
    return sorted(found, key=lambda segment: segment.base_offset)


def _open_logs(partition: Partition) -> list[LogSegment]:
    """The writer's log segments, scanned and repaired (a reader follows them by
    `follow_writer`)."""
    sealed_end = partition.manifest.sealed_end_offset
    files = log_files(partition.log_dir)
    now_ms = partition.now_ms()
    if not files:
        path = partition.log_dir / log_file_name(sealed_end)
        path.touch()
        fsutil.fsync_dir(partition.log_dir)
        files = [(sealed_end, path)]
    logs: list[LogSegment] = []
    for base, path in files:
        segment = LogSegment(path, base, writable=True, created_ms=now_ms)
        segment.scan(repair=True)
        logs.append(segment)
    return logs
