"""Appends and rolls: how a batch becomes part of a partition's log.

Invariant: an append is all or nothing as its caller sees it. If it returns, its
records are written after the active segment's indexed bytes, fsynced when the flush
policy says so, and visible; if it raises, no reader ever sees them (the bytes are cut
off again, and the index never had them). A failed fsync is never retried as if
nothing happened: the partition stops taking writes until it is reopened (PostgreSQL's
"fsyncgate": after a failed fsync the page cache may have dropped what it could not
write). A segment rolls by size, and by the time it was opened, never by its records'
timestamps.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from compactlog import fsutil
from compactlog.errors import PartitionFailedError, StorageError
from compactlog.storage.logfile import LogSegment, log_file_name
from compactlog.storage.records import BatchHeader

if TYPE_CHECKING:
    from compactlog.storage.partition import Partition

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AppendResult:
    partition: int
    base_offset: int
    last_offset: int
    # The time the server stamped on the batch on a LogAppendTime topic, else -1
    # (Kafka's ProduceResponse log_append_time_ms).
    log_append_time: int = -1


def append_encoded(partition: Partition, batch: bytearray, header: BatchHeader) -> AppendResult:
    """Append protocol (called with the lock held; the "append" scenario of
    tests/faults/test_fault_steps.py fails, stalls and kills each step):
      1. roll first if the active segment is due (a failure here writes nothing);
      2. write the batch after the active segment's indexed bytes; a failed or short
         write is cut off again and raised as StorageError (the partition goes on);
      3. fsync if the flush policy says so; a failed fsync cuts the batch off, marks
         the partition failed and raises PartitionFailedError;
      4. index the batch: from here readers see it, and the append returns;
      5. (the caller, once the lock is released) seal rolled segments (auto_seal); a
         failed seal is logged and retried later, never reported as a failed append.
    """
    partition.require_writable()
    now_ms = partition.now_ms()
    config = partition.config
    partition.check_size(len(batch))
    if should_roll(partition, len(batch), now_ms):
        partition.roll_locked()
    active = partition.active
    pending = active.unflushed_records + header.record_count
    first_unflushed = active.first_unflushed_ms if active.first_unflushed_ms is not None \
        else now_ms
    sync = (pending >= config["flush.messages"]
            or now_ms - first_unflushed >= config["flush.ms"])
    try:
        active.append(batch, header, sync=sync)
    except PartitionFailedError as error:
        partition.fail(error)
        raise
    if sync:
        active.unflushed_records, active.first_unflushed_ms = 0, None
    else:
        active.unflushed_records, active.first_unflushed_ms = pending, first_unflushed
    partition.notify_appended()
    return AppendResult(partition.index, header.base_offset, header.last_offset)


def should_roll(partition: Partition, incoming: int, now_ms: int) -> bool:
    """Roll by size, and by the time the active segment was opened: a record's own
    timestamp says when it was made, not how long the segment has been filling (a
    backfill of week-old records must not roll a segment per append)."""
    active = partition.active
    if active.is_empty:
        return False
    if active.size + incoming > partition.config["segment.bytes"]:
        return True
    # As Kafka's LogConfig.maxSegmentMs (KIP-354): a compacted topic rolls by
    # max.compaction.lag.ms too, or records in the active segment could wait up to
    # segment.ms for the compaction that lag promises.
    roll_ms: int = partition.config["segment.ms"]
    if partition.config.compacted:
        roll_ms = min(roll_ms, partition.config["max.compaction.lag.ms"])
    return now_ms - active.created_ms >= roll_ms


def next_segment(partition: Partition) -> LogSegment:
    """The new active segment a roll starts, after the old one is flushed and the new
    file's directory entry fsynced; the partition installs it (Partition.roll_locked),
    and the old one waits to be sealed."""
    old = partition.active
    flush_segment(partition, old)
    path = partition.log_dir / log_file_name(old.next_offset)
    try:
        segment = LogSegment(path, old.next_offset, writable=True, created_ms=partition.now_ms())
    except OSError as error:
        raise StorageError(f"{partition.name}: cannot start a log segment: {error}") from error
    try:
        fsutil.fsync_dir(partition.log_dir)
    except OSError as error:
        segment.close()
        partition.fail(error)
        raise PartitionFailedError(f"{partition.name}: fsync of {partition.log_dir} failed: "
                                   f"{error}") from error
    log.debug("%s: rolled segment at offset %d", partition.name, old.next_offset)
    return segment


def flush_segment(partition: Partition, segment: LogSegment) -> None:
    try:
        segment.flush()
    except OSError as error:
        partition.fail(error)
        raise PartitionFailedError(f"{partition.name}: fsync of {segment.path} failed: "
                                   f"{error}") from error
