"""Planning a compaction run: what each partition reads, and how phase 2 splits its work.

The input of one partition is its clean part, the previous ledger files, plus its dirty
part, the sealed segments above the horizon, up to the cleanable bound: the longest
prefix of dirty segments whose newest record is older than min.compaction.lag.ms. The
active and rolled log segments are never input (they are not sealed), so the horizon
stays below them. The new horizon is the last offset of the last dirty segment read,
or the old horizon when no segment is cleanable.

The dirty part never holds a record at or below the old horizon: the ledger covers
those. No commit lists a segment across the horizon (compaction/runner.py, step 5;
storage/merging.py, step 4), and were one listed all the same, only its rows above the
horizon are input (`InputFile.from_offset`, applied by every engine in both phases).

After phase 1 the surviving offsets are known, so phase 2 is split into pieces: runs
of consecutive input files whose surviving bytes (estimated from the survivor counts
and each file's bytes per record) fill about one target ledger file. Files with no
survivors are not read at all, nor is a file wholly below DeleteRecords' deleted_below
(`wholly_cut`: nothing of it is in the view, null-key records included); the runner
counts a cut ledger file's live records as removed by their position.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from compactlog.backend import Volume
from compactlog.backend.local.volume import LocalVolume
from compactlog.compaction.ledger import PieceInput, TombstoneRules
from compactlog.compaction.strategies import Strategy, parse_strategy
from compactlog.config import TopicConfig
from compactlog.storage import (
    LEDGER_DIR,
    SEGMENT_DIR,
    PartitionManifest,
    SegmentInfo,
    read_deletion_vector,
    retention_ms,
)

MAX_LEDGER_FILE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class InputFile:
    info: SegmentInfo
    path: Path  # where the driver reads it (on S3: its read cache's copy, once fetched)
    is_ledger: bool
    # Its rows below this offset are not input: set on a dirty segment that straddles
    # the old horizon, whose rows up to it the ledger already covers (see the module).
    from_offset: int = 0

    @property
    def relative(self) -> str:
        """Its name in the partition's volume (compactlog.backend Volume)."""
        return f"{LEDGER_DIR if self.is_ledger else SEGMENT_DIR}/{self.info.file}"


@dataclass
class PartitionPlan:
    topic: str
    partition: int
    directory: Path
    manifest_version: int
    old_horizon: int | None
    new_horizon: int | None
    clean: list[InputFile]
    dirty: list[InputFile]
    rules: TombstoneRules
    strategy: Strategy
    target_file_bytes: int
    compression: str
    oldest_tombstone_ms: int | None = None
    # DeleteRecords' deleted_below that the current ledger was compacted with: it holds
    # no live record below (manifest.CompactionState.deleted_below).
    ledger_deleted_below: int = 0
    # Phase 1 engine wanted (compaction.phase1.engine) and one Arrow task's memory budget.
    phase1_engine: str = "auto"
    task_memory_bytes: int = 512 * 1024 * 1024
    # compaction.deletion.vectors and compaction.ledger.rewrite.live.fraction.
    deletion_vectors: bool = False
    rewrite_live_fraction: float = 0.5
    # compaction.ledger.merge.below.bytes (0: never) and .min.files (incremental.py).
    merge_below_bytes: int = 0
    merge_min_files: int = 5
    # compaction.segment.adopt.min.bytes (adoption.py; -1: never) and .live.fraction.
    adopt_min_bytes: int = -1
    adopt_live_fraction: float = 0.9
    # The partition's volume when it is not its local directory (an S3 prefix): tasks
    # fetch their inputs from it and publish their outputs to it (remote_files.py).
    volume_spec: dict[str, str] | None = None
    # compaction.without.spark (arrow_pipeline.runs_without_spark).
    without_spark: bool = False
    # Filled by phase 1: the sorted surviving offsets (tombstones included).
    survivors: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    # Set instead by an engine whose tasks keep the survivors to themselves: how many.
    survivor_count: int | None = None

    @property
    def inputs(self) -> list[InputFile]:
        return [*self.clean, *self.dirty]

    @property
    def has_work(self) -> bool:
        """Dirty segments to read, kept tombstones whose retention has passed, (on a
        compact,delete topic) ledger records older than retention.ms, or ledger records
        that DeleteRecords deleted."""
        return (bool(self.dirty) or self.tombstones_due or self.ledger_expired
                or self.deletion_due)

    @property
    def deletion_due(self) -> bool:
        """DeleteRecords cut into the ledger since it was compacted: reads hide the
        deleted records at once (storage/view_rows.py), and a run makes that final
        (erases them from the ledger's files, or deletes them by a deletion vector)
        even when no new data comes."""
        cut, done = self.rules.deleted_below, self.ledger_deleted_below
        return cut > done and any(item.info.base_offset < cut and item.info.last_offset >= done
                                  for item in self.clean)

    @property
    def tombstones_due(self) -> bool:
        return (self.oldest_tombstone_ms is not None
                and self.rules.now_ms - self.oldest_tombstone_ms >= self.rules.delete_retention_ms)

    @property
    def expiry_cutoff_ms(self) -> int | None:
        """compact,delete: records older than this leave the view (else None)."""
        retention = self.rules.retention_ms
        return None if retention < 0 else self.rules.now_ms - retention

    @property
    def ledger_expired(self) -> bool:
        """Some ledger record is older than retention.ms (compact,delete)."""
        cutoff = self.expiry_cutoff_ms
        return cutoff is not None and any(item.info.min_timestamp < cutoff
                                          for item in self.clean)

    @property
    def ledger_file_expired(self) -> bool:
        """A whole ledger file is older than retention.ms: as Kafka's retention deletes a
        segment once its newest record is past retention.ms (compact,delete)."""
        cutoff = self.expiry_cutoff_ms
        return cutoff is not None and any(item.info.max_timestamp < cutoff
                                          for item in self.clean)

    @property
    def cut_ledger_records(self) -> int:
        """The live records of the previous ledger's files wholly below deleted_below:
        they leave with their files, which phase 2 never reads (`wholly_cut`)."""
        return sum(item.info.live_count for item in self.clean
                   if wholly_cut(item.info, self.rules.deleted_below))

    @property
    def ledger_dir(self) -> Path:
        return self.directory / LEDGER_DIR

    def describe(self) -> str:
        return f"{self.topic}/{self.partition}"


@dataclass(frozen=True)
class Piece:
    """One phase-2 task: consecutive input files of one partition into one ledger file."""

    plan: PartitionPlan
    sequence: int
    inputs: list[InputFile]
    survivors: np.ndarray

    def piece_inputs(self) -> list[PieceInput]:
        return [PieceInput.of(item.path, item.is_ledger, item.info,
                              from_offset=item.from_offset) for item in self.inputs]


def plan_partition(
    topic: str,
    partition: int,
    directory: Path,
    manifest: PartitionManifest,
    manifest_version: int,
    config: TopicConfig,
    now_ms: int,
    volume: Volume | None = None,
) -> PartitionPlan:
    volume = volume if volume is not None else LocalVolume(directory)
    old_horizon = manifest.horizon
    clean = [InputFile(info, volume.path_of(f"{LEDGER_DIR}/{info.file}"), True)
             for info in manifest.ledger]
    lag = config["min.compaction.lag.ms"]
    dirty: list[InputFile] = []
    for info in manifest.segments:
        if old_horizon is not None and info.last_offset <= old_horizon:
            continue
        if info.missing:
            break  # damaged segment: stop before it, so the horizon never passes a hole
        if lag > 0 and now_ms - info.max_timestamp < lag:
            # A prefix only, so the horizon covers everything below it. (As in Kafka, a
            # producer timestamp in the future holds its segment back until it is past.)
            break
        from_offset = 0
        if old_horizon is not None and info.base_offset <= old_horizon:
            from_offset = old_horizon + 1  # defence in depth: the rows up to it are the ledger's
        dirty.append(InputFile(info, volume.path_of(f"{SEGMENT_DIR}/{info.file}"), False,
                               from_offset))
    new_horizon = dirty[-1].info.last_offset if dirty else old_horizon
    rules = TombstoneRules(
        now_ms=now_ms,
        delete_retention_ms=config["delete.retention.ms"],
        empty_value_is_tombstone=config["empty.value.is.tombstone"],
        null_key_policy=config["null.key.policy"],
        # The records a read already leaves out (storage/view_rows.py), for good.
        retention_ms=retention_ms(config),
        deleted_below=manifest.deleted_below,
    )
    return PartitionPlan(
        topic=topic,
        partition=partition,
        directory=directory,
        manifest_version=manifest_version,
        old_horizon=old_horizon,
        new_horizon=new_horizon,
        clean=clean,
        dirty=dirty,
        rules=rules,
        strategy=parse_strategy(config["compaction.strategy"]),
        target_file_bytes=min(config["segment.bytes"], MAX_LEDGER_FILE_BYTES),
        compression=config["parquet.compression"],
        oldest_tombstone_ms=(None if manifest.compaction is None
                             else manifest.compaction.oldest_tombstone_ms),
        ledger_deleted_below=(0 if manifest.compaction is None
                              else manifest.compaction.deleted_below),
        phase1_engine=config["compaction.phase1.engine"],
        task_memory_bytes=config["compaction.task.memory.bytes"],
        deletion_vectors=config["compaction.deletion.vectors"],
        rewrite_live_fraction=config["compaction.ledger.rewrite.live.fraction"],
        merge_below_bytes=config["compaction.ledger.merge.below.bytes"],
        merge_min_files=config["compaction.ledger.merge.min.files"],
        adopt_min_bytes=config["compaction.segment.adopt.min.bytes"],
        adopt_live_fraction=config["compaction.segment.adopt.live.fraction"],
        volume_spec=None if volume.is_local else volume.spec,
        without_spark=config["compaction.without.spark"],
    )


def load_deleted(clean: list[InputFile]) -> dict[str, np.ndarray]:
    """Per ledger file path with a deletion vector, its deleted offsets: rows that are
    not input to phase 1 (they left the view in an earlier run)."""
    return {str(item.path): read_deletion_vector(item.path.parent / item.info.dv_file,
                                                 item.info.dv_size_bytes, item.info.dv_crc32c)
            for item in clean if item.info.dv_file}


def deleted_offsets(clean: list[InputFile]) -> np.ndarray:
    """Every offset the ledger files' deletion vectors delete, sorted."""
    found = list(load_deleted(clean).values())
    return np.sort(np.concatenate(found)) if found else np.empty(0, np.int64)


def wholly_cut(info: SegmentInfo, deleted_below: int) -> bool:
    """Whether every offset of the file `info` lies below DeleteRecords' cut."""
    return info.last_offset < deleted_below


def split_pieces(plan: PartitionPlan) -> list[Piece]:
    """Group the plan's input files into phase-2 pieces, by estimated surviving bytes."""
    groups = split_inputs(plan.inputs, plan.survivors, plan.target_file_bytes,
                          plan.rules.null_key_policy == "keep", plan.rules.deleted_below)
    return [Piece(plan, sequence, files, survivors)
            for sequence, (files, survivors) in enumerate(groups)]


def split_inputs(
    inputs: list[InputFile], survivors: np.ndarray, target_file_bytes: int, keep_nulls: bool,
    deleted_below: int = 0,
) -> list[tuple[list[InputFile], np.ndarray]]:
    """Runs of consecutive input files whose surviving bytes fill about one ledger file,
    each with its slice of the sorted surviving offsets (files with none are skipped,
    and files wholly below `deleted_below`)."""
    pieces: list[tuple[list[InputFile], np.ndarray]] = []
    current: list[InputFile] = []
    current_bytes = 0.0

    def close() -> None:
        nonlocal current, current_bytes
        if current:
            low = np.searchsorted(survivors, current[0].info.base_offset, "left")
            high = np.searchsorted(survivors, current[-1].info.last_offset, "right")
            pieces.append((current, survivors[low:high]))
        current, current_bytes = [], 0.0

    for item in inputs:
        info = item.info
        low = np.searchsorted(survivors, info.base_offset, "left")
        high = np.searchsorted(survivors, info.last_offset, "right")
        surviving = int(high - low)
        if (surviving == 0 and not keep_nulls) or wholly_cut(info, deleted_below):
            continue  # nothing of this file survives: it is not even read
        per_record = info.size_bytes / max(info.record_count, 1)
        current.append(item)
        current_bytes += surviving * per_record
        if current_bytes >= target_file_bytes:
            close()
    close()
    return pieces
