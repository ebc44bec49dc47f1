"""Which rows of a partition are in its raw or compacted view: the one definition that
every read path applies (DESIGN.md, contract items 2, 10, 13 and 14).

Invariant: a read of a view serves exactly the rows `partition_rows` names, from one
manifest, one upper bound and one instant, and nothing else. The Reader and Kafka Fetch
(storage/reads.py, server/protocol/record_batches.py), the Spark data source and
`read_topic` (spark/), and `tables.view_dataset` (DuckDB, Polars) all take their files,
offset ranges and row conditions from here; none of them restates a rule.

The compacted view of a partition, for a read from offset `start`:
  1. the ledger's rows, offsets <= horizon, minus
     - the offsets of the file's deletion vector (rows a later run took out),
     - offsets below `deleted_below` (DeleteRecords; compaction drops them for good at
       its next run, which the deletion schedules: compaction/plan.py),
     - on a topic whose cleanup.policy includes `delete` with retention.ms >= 0, rows
       older than retention.ms: they leave on time alone, as in Kafka, not only at the
       next compaction,
     - tombstones kept (tombstone_since_ms; in a segment adopted as it is, the entry's
       adopted_at_ms) delete.retention.ms ago or longer: after that the key does not
       appear at all (item 2), whether or not a run has dropped them yet;
  2. then the raw log from max(horizon + 1, log start): sealed segments, then log
     segments (the tail), whose offsets are dense;
  all from `start` on and below the upper bound, the durable high watermark (item 13):
  no read serves a record at or past it. The raw view is part 2 alone, from the log
  start (never below `deleted_below`).

Time rules are evaluated once per read (`TimeRules`), where the read is planned, so that
all of its parts agree: a Spark query's tasks apply the instant its driver planned at.
Each read path applies a `RowCondition` in its own form: a row mask over Arrow tables
(`FileRows.keep`), a pyarrow dataset expression with the offsets to exclude (tables.py),
a Spark SQL predicate with the offsets to exclude (spark/fast.py); the three are built
from the same fields, here.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from compactlog.config import TopicConfig
from compactlog.storage.deletion import deleted_mask
from compactlog.storage.manifest import LEDGER_DIR, SEGMENT_DIR, PartitionManifest, SegmentInfo

if TYPE_CHECKING:
    from compactlog.storage.partition import Partition, View

# The columns a tombstone rule reads: no values (value_size is null for a tombstone).
TOMBSTONE_COLUMNS = ["value_size", "tombstone_since_ms"]


def tombstones_by_size(size: pa.ChunkedArray | pa.Array,
                       empty_value_is_tombstone: bool) -> np.ndarray:
    """Per row, from its value_size column, whether its value deletes its key: a null
    value, or an empty one under empty.value.is.tombstone (a null key's deletes nothing:
    the caller masks those out, when it has the key column). Never null."""
    found: np.ndarray = pc.is_null(size).to_numpy(zero_copy_only=False)
    if empty_value_is_tombstone:
        found |= pc.fill_null(pc.equal(size, 0), False).to_numpy(zero_copy_only=False)
    return found


def upper_bound(view: View) -> int:
    """The offset below which a read of `view` may serve records: the durable high
    watermark. Every read path takes its end from here."""
    return view.high_watermark


def retention_ms(config: TopicConfig) -> int:
    """retention.ms where it takes records out of the compacted view (a cleanup.policy
    including `delete`), else -1. Compaction drops the same records for good."""
    if "delete" not in config.cleanup_policy.split(","):
        return -1
    found: int = config["retention.ms"]
    return found


@dataclass(frozen=True)
class TimeRules:
    """The rules that depend on the time, evaluated at one instant for a whole read."""

    now_ms: int
    expire_before_ms: int | None  # ledger records with an older timestamp are out
    tombstone_cutoff_ms: int  # ledger tombstones kept at or before this are out
    empty_value_is_tombstone: bool

    @classmethod
    def of(cls, config: TopicConfig, now_ms: int) -> TimeRules:
        retention = retention_ms(config)
        return cls(now_ms, None if retention < 0 else now_ms - retention,
                   now_ms - int(config["delete.retention.ms"]),
                   bool(config["empty.value.is.tombstone"]))


@dataclass(frozen=True)
class RowCondition:
    """Which rows of a data file are in the view, besides its deletion vector. None: no
    such bound (a file's statistics may prove a bound holds for all its rows)."""

    min_offset: int | None = None
    end_offset: int | None = None  # exclusive
    min_timestamp: int | None = None  # compact,delete: retention.ms
    tombstone_cutoff_ms: int | None = None  # ledger: tombstones kept at or before this
    empty_value_is_tombstone: bool = False
    # Set on a ledger file adopted from a sealed segment (SegmentInfo.adopted_at_ms),
    # whose tombstones were all kept at this instant: it has no tombstone_since_ms
    # column, and the rule reads value_size and key instead.
    tombstones_kept_at_ms: int | None = None

    def within(self, first_offset: int, last_offset: int, min_timestamp: int) -> RowCondition:
        """This condition without the bounds that rows with these statistics all meet."""
        return RowCondition(
            self.min_offset if self.min_offset is not None and first_offset < self.min_offset
            else None,
            self.end_offset if self.end_offset is not None and last_offset >= self.end_offset
            else None,
            self.min_timestamp if self.min_timestamp is not None
            and min_timestamp < self.min_timestamp else None,
            self.tombstone_cutoff_ms, self.empty_value_is_tombstone)

    def trimmed(self, info: SegmentInfo) -> RowCondition:
        """This condition for the file `info`: `within` its statistics, and with its
        tombstones' one instant if it was adopted (SegmentInfo.adopted_at_ms)."""
        found = self.within(info.base_offset, info.last_offset, info.min_timestamp)
        adopted = info.adopted_at_ms
        if found.tombstone_cutoff_ms is None or adopted is None:
            return found
        if adopted > found.tombstone_cutoff_ms:
            # None of its tombstones is past delete.retention.ms yet.
            return replace(found, tombstone_cutoff_ms=None)
        return replace(found, tombstones_kept_at_ms=adopted)

    def excludes_all(self, info: SegmentInfo) -> bool:
        """No row of the file `info` can be in the view."""
        return ((self.min_offset is not None and info.last_offset < self.min_offset)
                or (self.end_offset is not None and info.base_offset >= self.end_offset)
                or (self.min_timestamp is not None and info.max_timestamp < self.min_timestamp))

    @property
    def is_everything(self) -> bool:
        return (self.min_offset is None and self.end_offset is None
                and self.min_timestamp is None and self.tombstone_cutoff_ms is None)

    @property
    def columns(self) -> list[str]:
        """The columns `mask` reads."""
        found = ["offset"]
        found += ["timestamp"] if self.min_timestamp is not None else []
        found += self.tombstone_columns
        return found

    @property
    def tombstone_columns(self) -> list[str]:
        """The columns the tombstone rule reads (none when it has nothing to do)."""
        if self.tombstone_cutoff_ms is None:
            return []
        if self.tombstones_kept_at_ms is not None:
            # The key too: a null key's null value is no tombstone (only the column that
            # an adopted file lacks would say so). Read only while one of its tombstones
            # is past retention: the next compaction drops them (plan.tombstones_due).
            return ["value_size", "key"]
        return TOMBSTONE_COLUMNS

    def mask(self, table: pa.Table) -> np.ndarray | None:
        """True for the rows of `table` (with `columns` among its own) in the view; None
        when all are."""
        keep: np.ndarray | None = None
        offsets = table.column("offset").to_numpy()
        if self.min_offset is not None:
            keep = offsets >= self.min_offset
        if self.end_offset is not None:
            below = offsets < self.end_offset
            keep = below if keep is None else keep & below
        if self.min_timestamp is not None:
            recent = table.column("timestamp").to_numpy() >= self.min_timestamp
            keep = recent if keep is None else keep & recent
        if self.tombstone_cutoff_ms is not None:
            live = ~self.expired_tombstones(table)
            keep = live if keep is None else keep & live
        return keep

    def expired_tombstones(self, table: pa.Table) -> np.ndarray:
        """True for the ledger tombstones of `table` (value_size, tombstone_since_ms)
        whose retention has passed. tombstone_since_ms is set on the tombstones a run
        kept; which values are tombstones is the topic's setting now, as for the run
        that will drop them (compaction/incremental.py)."""
        assert self.tombstone_cutoff_ms is not None
        tombstone = tombstones_by_size(table.column("value_size"),
                                       self.empty_value_is_tombstone)
        if self.tombstones_kept_at_ms is not None:
            # Adopted: every tombstone was kept at that instant, at or before the cutoff
            # (`trimmed` leaves the rule out otherwise); a null key's value deletes nothing.
            every: np.ndarray = tombstone & pc.is_valid(table.column("key")).to_numpy(
                zero_copy_only=False)
            return every
        old = pc.fill_null(pc.less_equal(table.column("tombstone_since_ms"),
                                         self.tombstone_cutoff_ms), False)
        found: np.ndarray = tombstone & old.to_numpy(zero_copy_only=False)
        return found

    def bounds_expression(self) -> ds.Expression | None:
        """The offset and time bounds as a pyarrow dataset filter (tombstones apart:
        their offsets are excluded by the caller, see `FileRows.expired_tombstones`)."""
        parts = []
        if self.min_offset is not None:
            parts.append(ds.field("offset") >= self.min_offset)
        if self.end_offset is not None:
            parts.append(ds.field("offset") < self.end_offset)
        if self.min_timestamp is not None:
            parts.append(ds.field("timestamp") >= self.min_timestamp)
        if not parts:
            return None
        found = parts[0]
        for part in parts[1:]:
            found = found & part
        return found

    def bounds_sql(self) -> str | None:
        """The offset and time bounds as a SQL predicate (Spark's, DuckDB's)."""
        parts = []
        if self.min_offset is not None:
            parts.append(f"`offset` >= {int(self.min_offset)}")
        if self.end_offset is not None:
            parts.append(f"`offset` < {int(self.end_offset)}")
        if self.min_timestamp is not None:
            parts.append(f"`timestamp` >= {int(self.min_timestamp)}")
        return " AND ".join(parts) or None


@dataclass(frozen=True)
class FileRows:
    """One data file of a view and the condition on its rows, trimmed to the file."""

    folder: str  # LEDGER_DIR or SEGMENT_DIR
    info: SegmentInfo
    condition: RowCondition

    @property
    def relative(self) -> str:
        return f"{self.folder}/{self.info.file}"

    @property
    def dv_relative(self) -> str | None:
        return f"{self.folder}/{self.info.dv_file}" if self.info.dv_file else None

    @property
    def is_ledger(self) -> bool:
        return self.folder == LEDGER_DIR

    @property
    def first_offset(self) -> int:
        """Where reading the file starts (its rows below are not in the view)."""
        bound = self.condition.min_offset
        return self.info.base_offset if bound is None else max(bound, self.info.base_offset)

    @property
    def is_whole(self) -> bool:
        """Every row of the file is in the view."""
        return self.condition.is_everything and not self.info.dv_file

    def keep(self, table: pa.Table, deleted: np.ndarray | None) -> pa.Table:
        """The rows of `table` (rows of this file, with the condition's columns) in the
        view; `deleted` is the file's deletion vector (None: it has none)."""
        keep = self.condition.mask(table)
        if deleted is not None and len(deleted) and table.num_rows:
            live = ~deleted_mask(table.column("offset").to_numpy(), deleted)
            keep = live if keep is None else keep & live
        if keep is None or keep.all():
            return table
        return table.filter(pa.array(keep))

    def expired_tombstones(self, table: pa.Table) -> np.ndarray:
        """The offsets of `table` (offset, value_size, tombstone_since_ms) that the
        tombstone rule takes out: for engines that filter by offset sets."""
        if self.condition.tombstone_cutoff_ms is None or not table.num_rows:
            return np.empty(0, np.int64)
        offsets: np.ndarray = table.column("offset").to_numpy()
        expired: np.ndarray = offsets[self.condition.expired_tombstones(table)]
        return expired


@dataclass(frozen=True)
class PartitionRows:
    """The rows of one partition's view from `start`, below `end` (see the module)."""

    compacted: bool
    view_start: int  # the first offset the view can serve (Fetch's log_start_offset)
    horizon: int | None  # the ledger's horizon, for a compacted view with a ledger
    raw_start: int  # the raw part's first offset; raw offsets are dense from here
    sealed_end: int  # offsets from here on are in log segments
    end: int  # the upper bound, exclusive: the durable high watermark
    # The conditions on every ledger file's and sealed segment's rows, before trimming to
    # each file: what an engine filtering many files at once applies (tables.py,
    # spark/fast.py).
    ledger_condition: RowCondition
    segment_condition: RowCondition
    ledger_infos: tuple[SegmentInfo, ...]  # the manifest's (none for a raw view)
    segment_infos: tuple[SegmentInfo, ...]

    @property
    def tail_start(self) -> int:
        """The first offset of the raw part that log segments hold."""
        return max(self.raw_start, self.sealed_end)

    def ledger(self) -> Iterator[FileRows]:
        """The ledger files with rows in the view, in offset order, each with its
        condition. Lazily: a read that fills up early builds no more of them."""
        return _files(LEDGER_DIR, self.ledger_infos, self.ledger_condition)

    def segments(self) -> Iterator[FileRows]:
        """The sealed segments of the raw part, in offset order (as `ledger`)."""
        return _files(SEGMENT_DIR, self.segment_infos, self.segment_condition)

    def files(self) -> Iterator[FileRows]:
        yield from self.ledger()
        yield from self.segments()


def partition_rows(manifest: PartitionManifest, rules: TimeRules, compacted: bool,
                   end: int, start: int = 0) -> PartitionRows:
    """The rows of `manifest`'s raw or compacted view with offsets in [start, end)."""
    horizon = manifest.horizon if compacted else None
    raw_start = max(start, manifest.log_start_offset, manifest.deleted_below)
    ledger_condition = RowCondition(0, 0)  # no ledger: nothing of it is in the view
    if horizon is not None:
        raw_start = max(raw_start, horizon + 1)
        ledger_condition = _ledger_condition(manifest, rules, start, min(horizon + 1, end))
    return PartitionRows(
        compacted, view_start(manifest, compacted), horizon, raw_start,
        manifest.sealed_end_offset, end, ledger_condition, RowCondition(raw_start, end),
        manifest.ledger if horizon is not None else (), manifest.segments)


def _ledger_condition(manifest: PartitionManifest, rules: TimeRules, start: int,
                      end: int) -> RowCondition:
    compaction = manifest.compaction
    assert compaction is not None
    oldest = compaction.oldest_tombstone_ms
    # Only when a kept tombstone may have expired: else no file's tombstones are read.
    due = oldest is not None and oldest <= rules.tombstone_cutoff_ms
    return RowCondition(max(start, manifest.deleted_below), end, rules.expire_before_ms,
                        rules.tombstone_cutoff_ms if due else None,
                        rules.empty_value_is_tombstone)


def _files(folder: str, infos: tuple[SegmentInfo, ...],
           condition: RowCondition) -> Iterator[FileRows]:
    """The files of `infos` (in offset order) with rows in the view, each with
    `condition` trimmed to it: from the first that reaches the condition's first offset
    (a binary search, as reads seek), up to its end offset."""
    first = 0
    if condition.min_offset is not None:
        first = bisect.bisect_left(infos, condition.min_offset, key=_last_offset)
    for info in infos[first:]:
        if condition.end_offset is not None and info.base_offset >= condition.end_offset:
            return
        if not condition.excludes_all(info):
            yield FileRows(folder, info, condition.trimmed(info))


def _last_offset(info: SegmentInfo) -> int:
    return info.last_offset


def view_start(manifest: PartitionManifest, compacted: bool) -> int:
    """The first offset a read of the view can serve (Fetch's log_start_offset): the raw
    log's start; for the compacted view the ledger's first offset when retention moved
    the raw log past it; never below what DeleteRecords deleted."""
    log_start = manifest.log_start_offset
    if not compacted or manifest.horizon is None or not manifest.ledger:
        return log_start
    return max(manifest.deleted_below, min(log_start, manifest.ledger[0].base_offset))


def rules_now(partition: Partition) -> TimeRules:
    """The time rules of `partition`'s topic at the partition's clock's now."""
    return TimeRules.of(partition.config, partition.now_ms())


def rows_of(partition: Partition, view: View, compacted: bool, start: int = 0,
            rules: TimeRules | None = None) -> PartitionRows:
    """The rows of `view` of `partition` from `start`, up to the view's upper bound."""
    return partition_rows(view.manifest, rules or rules_now(partition), compacted,
                          upper_bound(view), start)
