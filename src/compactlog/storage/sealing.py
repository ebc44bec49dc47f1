"""Sealing: a rolled log segment becomes an immutable Parquet file listed by the manifest.

Invariant: a rolled segment's records are readable throughout, from the log file until
the commit that lists its sealed form and from the Parquet file after; the log file is
deleted only after that commit, and a sealed file that no commit lists is never read.

Sealing protocol for a rolled log segment (tests/faults/test_fault_steps.py covers a fault at
every step, and tests/storage/test_crash.py a kill):
  1. write the Parquet file under a temporary name in segments/ and fsync it;
  2. publish it under its final name (its Volume: rename it and fsync the directory; on
     S3 a create-only PUT);
  3. commit a manifest version that lists it (compare-and-swap, a Document); a manifest
     whose sealed segments already reach past the file's first offset means another
     writer sealed those offsets (two writers on one object-store prefix): FencedError,
     and this partition takes no more writes (tests/storage/test_store_s3.py,
     test_a_second_writer_on_one_prefix_is_fenced_not_merged);
  4. delete the log files that the committed manifest's sealed segments cover.
A failure in 1-3 leaves the log file in force; the file of 1-2, if any, is an orphan
that the sweep deletes (at once here: the seal lock keeps other sealers out). A crash
is repaired at the next open (recovery.py): a temporary file (1), an orphan (2), a log
file already covered (after 3).

What others may change under a seal, and what its commit checks (step 3 re-applies
`add_segment` to the newest manifest after a conflict):
- a compaction (another process) commits a new (horizon, ledger) pair: the fields are
  disjoint and the new segment lies above any horizon, so both stand;
  tests/storage/test_commit_races.py test_a_seal_re_applies_itself_over_a_compaction_that_
  landed_first, and the other order, test_a_compaction_that_landed_after_a_seal_
  keeps_the_new_segment;
- merging and retention are this writer's own and take the seal lock or commit only a
  prefix; DeleteRecords moves the log start (a rolled segment wholly below it is
  dropped unsealed, step 0 of seal_rolled);
- another writer (a take-over on an object store) stamps a newer epoch or seals these
  offsets: FencedError, this writer stops and acknowledges nothing (the wait for an
  upload reads this writer's own high watermark: server/uploads.py).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING

from compactlog import fsutil
from compactlog.errors import FencedError, StorageError
from compactlog.storage.logfile import LogSegment
from compactlog.storage.manifest import SEGMENT_DIR, PartitionManifest, SegmentInfo
from compactlog.storage.sealed import WriteOptions, write_segment

if TYPE_CHECKING:
    from compactlog.storage.partition import Partition

log = logging.getLogger(__name__)


def seal_rolled(partition: Partition) -> list[SegmentInfo]:
    """Seal every rolled log segment into Parquet, oldest first.

    A rolled segment never changes, so its Parquet file is written without the
    partition's lock: appends and reads go on meanwhile. Only the manifest commit and
    the removal of the log file take the lock.

    One sealer runs at a time. A call that finds another at work returns at once: that
    one seals every rolled segment before it stops, this call's included, and waiting
    for it while holding the partition's lock would deadlock.
    """
    partition.require_writable()
    sealed: list[SegmentInfo] = []
    if not partition.seal_lock.acquire(blocking=False):
        return sealed
    try:
        while (segment := partition.next_to_seal()) is not None:
            sealed.append(_seal(partition, segment))
    finally:
        partition.seal_lock.release()
    return sealed


def _seal(partition: Partition, segment: LogSegment) -> SegmentInfo:
    config = partition.config
    options = WriteOptions(config["parquet.row.group.bytes"], config["parquet.compression"])
    name = f"{segment.base_offset:020d}-{uuid.uuid4().hex[:8]}.parquet"
    temp = fsutil.temp_path(partition.segment_dir, name)
    try:
        info = write_segment(segment.iter_batches(), temp, name, options)  # 1.
        partition.volume.publish(temp, f"{SEGMENT_DIR}/{name}")  # 2.
        missing = tuple(
            (hole.first_offset, hole.last_offset if hole.last_offset is not None else -1)
            for hole in segment.corrupt.values()
        )
        for hole in segment.corrupt.values():
            log.error("%s: sealing %s without %s", partition.name, segment.path.name,
                      hole.describe())
        if missing:
            # The manifest keeps the holes, so reads of them fail as they did from the log.
            info = replace(info, base_offset=min(info.base_offset, segment.base_offset),
                           missing=missing)

        def add_segment(manifest: PartitionManifest) -> PartitionManifest:
            if manifest.segments and info.base_offset <= manifest.segments[-1].last_offset:
                # Only another writer can have sealed these offsets: two writers on one
                # object-store prefix. Adding ours would list two records per offset.
                raise FencedError(
                    f"{partition.name}: offsets {info.base_offset}..{info.last_offset} were "
                    f"sealed by another writer (the manifest ends at "
                    f"{manifest.segments[-1].last_offset}); this writer stops")
            return replace(manifest, segments=(*manifest.segments, info))

        partition.commit_manifest(add_segment)  # 3.
    except BaseException as error:
        temp.unlink(missing_ok=True)
        remove_unlisted(partition, name, "sealed")
        if isinstance(error, FencedError):
            partition.fail(error)
        if isinstance(error, OSError):
            raise StorageError(f"{partition.name}: sealing {segment.path.name} failed: "
                               f"{error}") from error
        raise
    partition.drop_covered_logs()  # 4.
    log.info(
        "%s: sealed offsets %d..%d (%d records, %d bytes) into %s",
        partition.name, info.base_offset, info.last_offset, info.record_count,
        info.size_bytes, name,
    )
    return info


def remove_unlisted(partition: Partition, name: str, what: str) -> None:
    """The segment file `name` of a failed seal or merge (`what`: "sealed", "merged")
    goes if no committed manifest lists it. The outcome of a failed commit may be
    unknown, so the manifest decides, not the error."""
    try:
        proven = partition.prove_manifest()
        partition.load_manifest()
        if not proven:
            partition.sweeps.soon()  # the sweep decides once the version is proven
        elif (name not in {info.file for info in partition.manifest.segments}
              and partition.volume.remove(f"{SEGMENT_DIR}/{name}")):
            partition.volume.settle(SEGMENT_DIR)
            log.info("%s: removed %s, %s but not committed", partition.name, name, what)
    except Exception as error:  # the next sweep finds it; the seal's own error matters
        partition.sweeps.soon()
        log.warning("%s: could not remove %s, %s but not committed: %s", partition.name,
                    name, what, error)
