"""Retention: which sealed segments leave the raw log, by time and by size; and
DeleteRecords, which moves the start of every view to an offset.

Invariant: retention removes a prefix of the sealed segments (so the raw log stays
contiguous from its start), never a log segment, and on a compacted topic only segments
wholly at or below the compaction horizon: the compacted view is never changed by
retention, because the ledger keeps the surviving records of what it removes.

Protocol: 1. pick the expired prefix from the current manifest; 2. commit a manifest
without it and with the log start moved past it (backend/local/document.py; the dropped files are
retired by the commit, not deleted); 3. the sweep deletes them once
file.delete.delay.ms has passed (sweep.py), so readers that loaded the older manifest
can finish. A failure before 2 changes nothing; after it, the sweep runs later.

What others may change under it, and what step 2 checks: it re-applies its change to
the newest manifest after a conflict, removing only the files it chose (by name) and
never moving the log start back. A compaction that landed meanwhile only moved the
horizon forward, so what was at or below the old horizon still is, and its ledger
keeps what retention removes: tests/storage/test_commit_races.py test_retention_re_applies_
itself_over_a_compaction_and_keeps_the_view. DeleteRecords applies the same way over a
compaction's commit, keeping the compaction's pair and its own `deleted_below`:
test_delete_records_re_applies_itself_over_a_compaction. A merge of segments this
commit drops makes the merge conflict (merging.py step 4); a seal only appends.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from compactlog.config import TopicConfig
from compactlog.errors import OffsetOutOfRangeError
from compactlog.storage.manifest import PartitionManifest, SegmentInfo

if TYPE_CHECKING:
    from compactlog.storage.partition import Partition

log = logging.getLogger(__name__)


def apply_retention(partition: Partition) -> list[SegmentInfo]:
    """Retire whole sealed segments past retention.ms or retention.bytes."""
    partition.require_writable()
    config = partition.config
    now_ms = partition.now_ms()
    view = partition.view()
    log_bytes = sum(segment.size for segment in view.logs)
    doomed = expired_segments(view.manifest, config, now_ms, log_bytes)
    if not doomed:
        return []
    doomed_files = {info.file for info in doomed}

    def drop(manifest: PartitionManifest) -> PartitionManifest:
        kept = tuple(s for s in manifest.segments if s.file not in doomed_files)
        new_start = kept[0].base_offset if kept else manifest.sealed_end_offset
        return replace(manifest, segments=kept,
                       log_start_offset=max(manifest.log_start_offset, new_start))

    partition.commit_manifest(drop)
    for info in doomed:
        log.info("%s: retention removed %s (offsets %d..%d) from the log", partition.name,
                 info.file, info.base_offset, info.last_offset)
    if partition.sweeps.due:
        partition.sweep()
    return doomed


def delete_records(partition: Partition, before: int) -> int:
    """Kafka's DeleteRecords: no view serves offsets below `before` any more; returns the
    new log start (Kafka's low watermark). Sealed segments wholly below it leave the
    manifest (retired by the commit); a segment partly below it, and the log segments,
    keep their bytes, hidden from reads. Compaction drops ledger records below it at its
    next run. Raises OffsetOutOfRangeError past the high watermark (Kafka's rule: only
    records consumers may read can be deleted)."""
    partition.require_writable()
    end = partition.view().high_watermark
    if not 0 <= before <= end:
        raise OffsetOutOfRangeError(partition.topic, partition.index, before,
                                    partition.log_start_offset, end)

    def move_start(manifest: PartitionManifest) -> PartitionManifest:
        start = max(manifest.log_start_offset, before)
        return replace(manifest, log_start_offset=start,
                       segments=tuple(s for s in manifest.segments if s.last_offset >= start),
                       deleted_below=max(manifest.deleted_below, before))

    updated = partition.commit_manifest(move_start)
    log.info("%s: records below offset %d deleted (DeleteRecords); the log starts at %d",
             partition.name, before, updated.log_start_offset)
    return updated.log_start_offset


def expired_segments(
    manifest: PartitionManifest,
    config: TopicConfig,
    now_ms: int,
    log_bytes: int,
) -> list[SegmentInfo]:
    """The prefix of sealed segments that retention removes now.

    retention.bytes counts the whole partition, log segments included, as Kafka does;
    only sealed segments can be removed to bring it under the limit.

    Under `compact` and `compact,delete` only segments wholly at or below the compaction
    horizon are candidates: the compacted view must not lose what it has not covered.
    """
    candidates = list(manifest.segments)
    if config.compacted:
        horizon = manifest.horizon
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
