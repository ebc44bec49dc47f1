"""Merging small sealed segments: a run of consecutive small segments becomes one.

Why: a server that acknowledges only once records are in the object store
(`ack_after_upload`) seals a small segment every `upload_interval_s` while producers
send, and a partition sealed at every shutdown or by a short segment.ms does too. Each
segment is an object to list, fetch and keep open, and a line in every manifest
commit, so without merging a busy partition's manifest and reads grow by thousands of
entries a day.

Invariant: a merge changes how sealed records are grouped into files, never which
records there are, their offsets, bytes or batch attributes: the merged file holds the
inputs' rows, in order, unchanged; it replaces exactly its inputs in one manifest
commit, and only if they are all still listed, contiguous, and not split by the
compaction horizon (a compaction's dirty input is the segments above the horizon, so a
file that straddles it would feed records the ledger already holds back in; a
compaction that commits after the merge checks the same of its own new horizon). Until the
commit readers use the inputs; after it the merged file; the inputs are retired
(deleted after file.delete.delay.ms, as retention's are), so a read that began before
goes on.

Which runs: at least MIN_RUN consecutive segments, each smaller than a
1/MIN_RUN of segment.bytes, without holes (`missing`), together at most segment.bytes
and MAX_MERGE_BYTES, at most MAX_INPUTS of them; the oldest such run first. Merged files
grow by a factor of MIN_RUN or more per round, so a record is rewritten about
log_MIN_RUN(MAX_MERGE_BYTES / its first file's size) times, and files stop growing at
MAX_MERGE_BYTES (a good object size; one merge is a bounded step of the upkeep, which
seals other partitions in turn). Inputs are read one at a time, so a merge holds one
input's rows in memory and two files open besides the open-file cache: its output, and
the input it reads.

Merge protocol (merge_small_segments; tests in tests/storage/test_merging.py):
  1. take the seal lock (without waiting: a seal in progress means a merge later) and
     choose a run in the current manifest; while this machine runs a compaction of the
     partition, only a run wholly at or below the horizon (a dirty run could straddle
     the horizon that compaction commits, and make it conflict);
     test_small_segments_are_merged_and_reads_are_unchanged,
     test_a_run_is_not_merged_across_the_horizon,
     test_a_merge_leaves_dirty_segments_alone_while_a_compaction_runs
  2. fetch each input (the read cache on S3), check its size and CRC32C against the
     manifest (a damaged input stops the merge: CorruptionError, nothing changed);
     test_a_damaged_input_stops_the_merge_and_changes_nothing
  3. write the merged Parquet file under a temporary name and fsync it; publish it
     under a new name (rename, or a create-only PUT on S3)
  4. commit a manifest that lists it in place of its inputs, compare-and-swap, re-
     checked on the newest manifest: inputs gone (retention, DeleteRecords) or the
     horizon moved inside the run: ConflictError, nothing changed;
     test_a_merge_that_loses_a_race_changes_nothing (DeleteRecords),
     test_a_compaction_committed_under_a_merge_makes_the_merge_give_up (a compaction
     that committed a horizon inside the run after step 1)
Against a compaction still running when the merge commits, the merge checks nothing
more: it cannot know the horizon that run will commit. That run's own commit does
(compaction/runner.py, step 5c): it conflicts when a listed segment straddles its new
horizon, and goes through when the merged file lies wholly at or below it; and a run's
dirty input never holds a row at or below the old horizon, even from a file across it
(compaction/plan.py). Tests, in tests/storage/test_merging.py:
  test_a_merge_across_a_running_compactions_horizon_makes_its_commit_conflict
  test_a_merge_below_a_running_compactions_horizon_lets_it_commit
  test_a_segment_across_the_horizon_feeds_only_its_rows_above_it
A failure in 2-4 removes the file of 3 if no committed manifest lists it (else the
sweep does); the inputs stay in force. tests/faults/test_fault_steps.py ("merge") raises a
fault at every disk step of two merges, one on each side of a horizon, and kills the
process at sampled steps; tests/storage/test_model.py and
tests/compaction/test_compaction_model.py interleave merges with appends, retention and
compactions; tests/server/test_merging_server_s3.py merges what an ack_after_upload server
sealed while it serves.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from compactlog import fsutil
from compactlog.errors import ConflictError
from compactlog.storage import locks
from compactlog.storage.manifest import SEGMENT_DIR, PartitionManifest, SegmentInfo
from compactlog.storage.sealed import (
    FORMAT_VERSION,
    SCHEMA,
    file_crc32c,
    open_segment_writer,
    open_writer,
    verify_file,
)
from compactlog.storage.sealing import remove_unlisted

if TYPE_CHECKING:
    from compactlog.storage.partition import Partition

log = logging.getLogger(__name__)

MIN_RUN = 8
MAX_MERGE_BYTES = 64 << 20
MAX_INPUTS = 256


def choose_run(manifest: PartitionManifest, segment_bytes: int,
               min_run: int = MIN_RUN, clean_only: bool = False) -> tuple[SegmentInfo, ...]:
    """The oldest run of small segments worth merging (step 1), or (). `clean_only`:
    only segments wholly at or below the horizon (a compaction is running, and would
    choose its new horizon among the dirty segments' ends)."""
    small = max(1, segment_bytes // min_run)
    most = min(segment_bytes, MAX_MERGE_BYTES)
    horizon = manifest.compaction.horizon if manifest.compaction is not None else None
    run: list[SegmentInfo] = []
    total = 0
    for info in manifest.segments:
        fits = (info.size_bytes < small and not info.missing
                and total + info.size_bytes <= most
                and not (clean_only and (horizon is None or info.last_offset > horizon)))
        joins = (fits and run and len(run) < MAX_INPUTS
                 and info.base_offset == run[-1].last_offset + 1
                 and not _straddles(run[0], info, horizon))
        if joins:
            run.append(info)
            total += info.size_bytes
            continue
        if len(run) >= min_run:
            return tuple(run)
        run, total = ([info], info.size_bytes) if fits else ([], 0)
    return tuple(run) if len(run) >= min_run else ()


def _straddles(first: SegmentInfo, last: SegmentInfo, horizon: int | None) -> bool:
    """Whether a file of offsets first..last would hold records on both sides of the
    horizon."""
    return horizon is not None and first.base_offset <= horizon < last.last_offset


def merge_small_segments(partition: Partition, min_run: int = MIN_RUN,
                         segment_bytes: int | None = None) -> SegmentInfo | None:
    """Merge the oldest run of small sealed segments (the module's protocol); the
    merged segment, or None when there was nothing to merge or a seal was running.
    `segment_bytes` (tests): instead of the topic's segment.bytes."""
    partition.require_writable()
    if not partition.seal_lock.acquire(blocking=False):  # 1.
        return None
    try:
        # A merge of dirty segments would make a compaction running now conflict if it
        # straddled the horizon that compaction commits (step 4 of the runner's
        # protocol), and a busy partition merges every few seconds: so while this
        # machine runs one (its compaction lock is held), only clean segments merge.
        # test_a_merge_leaves_dirty_segments_alone_while_a_compaction_runs
        running = locks.is_locked(partition.directory)
        run = choose_run(partition.manifest, segment_bytes or partition.config["segment.bytes"],
                         min_run, clean_only=running)
        if not run:
            return None
        return _merge(partition, run)
    finally:
        partition.seal_lock.release()


def _merge(partition: Partition, run: tuple[SegmentInfo, ...]) -> SegmentInfo:
    name = f"{run[0].base_offset:020d}-{uuid.uuid4().hex[:8]}.parquet"
    temp = fsutil.temp_path(partition.segment_dir, name)
    published = False
    try:
        merged = _write(partition, temp, name, run)  # 2. and 3.
        partition.volume.publish(temp, f"{SEGMENT_DIR}/{name}")
        published = True
        inputs = [info.file for info in run]

        def replace_run(manifest: PartitionManifest) -> PartitionManifest:  # 4.
            files = [info.file for info in manifest.segments]
            try:
                start = files.index(inputs[0])
            except ValueError:
                raise ConflictError(f"{partition.name}: {inputs[0]} is no longer "
                                    "listed; merge given up") from None
            if files[start:start + len(inputs)] != inputs:
                raise ConflictError(f"{partition.name}: the segments to merge changed; "
                                    "merge given up")
            horizon = manifest.compaction.horizon if manifest.compaction is not None else None
            if _straddles(run[0], run[-1], horizon):
                raise ConflictError(f"{partition.name}: a compaction moved the horizon "
                                    f"to {horizon}, inside the run; merge given up")
            segments = manifest.segments
            return replace(manifest, segments=(*segments[:start], merged,
                                               *segments[start + len(inputs):]))

        partition.commit_manifest(replace_run)
    except BaseException:
        temp.unlink(missing_ok=True)
        if published:
            remove_unlisted(partition, name, "merged")
        raise
    log.info("%s: merged %d sealed segments (offsets %d..%d, %d bytes) into %s",
             partition.name, len(run), merged.base_offset, merged.last_offset,
             merged.size_bytes, name)
    return merged


def _write(partition: Partition, path: Path, name: str,
           run: tuple[SegmentInfo, ...]) -> SegmentInfo:
    """Steps 2 and 3: each input fetched, checked and copied in turn."""
    row_group_bytes = partition.config["parquet.row.group.bytes"]
    compression = partition.config["parquet.compression"]
    writer: pq.ParquetWriter | None = None
    pending: list[pa.Table] = []  # rows for the next row groups, under row_group_bytes

    def write_pending() -> None:
        nonlocal writer
        table = pa.concat_tables(pending)
        rows = max(1, int(table.num_rows * row_group_bytes / max(1, table.nbytes)))
        # The first rows choose the key encoding, as a seal's first row group does.
        writer = writer or open_segment_writer(path, compression, table.slice(0, rows))
        writer.write_table(table, row_group_size=rows)
        pending.clear()

    try:
        for info in run:
            source = partition.data_path(f"{SEGMENT_DIR}/{info.file}")
            verify_file(source, info.size_bytes, info.crc32c, f"sealed segment {info.file}")
            pending.append(pq.read_table(source, schema=SCHEMA))
            if sum(table.nbytes for table in pending) >= row_group_bytes:
                write_pending()
        if pending:
            write_pending()
        writer = writer or open_writer(path, SCHEMA, compression)
        writer.add_key_value_metadata({
            "compactlog.format": FORMAT_VERSION,
            "compactlog.base_offset": str(run[0].base_offset),
            "compactlog.last_offset": str(run[-1].last_offset),
        })
    finally:
        if writer is not None:
            writer.close()
    fsutil.fsync_path(path)
    stamped = [info for info in run if info.record_count]
    return SegmentInfo(
        file=name,
        base_offset=run[0].base_offset,
        last_offset=run[-1].last_offset,
        record_count=sum(info.record_count for info in run),
        size_bytes=path.stat().st_size,
        min_timestamp=min((info.min_timestamp for info in stamped), default=0),
        max_timestamp=max((info.max_timestamp for info in stamped), default=0),
        # The newest seal's time: what decides a segment's age (producer state rebuild).
        sealed_at_ms=max(info.sealed_at_ms for info in run),
        crc32c=file_crc32c(path),
    )
