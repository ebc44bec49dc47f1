"""The two tables of a topic, as the sync (state.py) and expiry (expiry.py) see them.

Invariant: a table kind names which files of a partition are the table's data files and
which of their rows the table shows, both taken from storage/view_rows.py's one
definition of the views, never restated:
  - STATE, the compacted state table: the ledger files of the compacted view up to the
    horizon, less every tombstone (the package's docstring);
  - RAW, the raw table: the sealed segments of the raw view (every record from the log
    start, or DeleteRecords' cut, to the sealed end), tombstones included, as a consumer
    of the log reads them. The newest records, not sealed yet, join it with their seal.
Each kind has its own folder under `<topic>/iceberg/`, its own holder in the partitions'
hold documents (storage/holds.py), and the summary fields that make a snapshot of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from compactlog.storage import FileRows, PartitionManifest, TimeRules, partition_rows


@dataclass(frozen=True)
class TableKind:
    name: str  # the table's folder: <topic>/iceberg/<name>
    holder: str  # its entry in each partition's hold document
    rows: Callable[[PartitionManifest, TimeRules], list[FileRows]]
    drop_tombstones: bool  # the state has no row for a deleted key; the raw log has
    summary: Callable[[PartitionManifest], dict[str, str]]  # per partition, in snapshots
    # Summary fields whose change alone makes a snapshot (the files unchanged).
    decisive: tuple[str, ...]
    # Whether files rewritten over the same offsets with as many records hold the same
    # rows (a merge of the raw log's segments: Iceberg's `replace`); a compaction's new
    # ledger files hold other rows.
    rewrites_keep_rows: bool


def state_rows(manifest: PartitionManifest, rules: TimeRules) -> list[FileRows]:
    """The ledger files with rows in the compacted view up to the horizon."""
    horizon = manifest.horizon
    if horizon is None:
        return []
    return list(partition_rows(manifest, rules, True, horizon + 1).ledger())


def ledger_deleted_below(manifest: PartitionManifest) -> int:
    """deleted_below as far as it reaches into the ledger."""
    horizon = manifest.horizon
    return manifest.deleted_below if horizon is None else min(manifest.deleted_below,
                                                              horizon + 1)


def state_summary(manifest: PartitionManifest) -> dict[str, str]:
    compaction = manifest.compaction
    if compaction is None:
        return {}
    return {"horizon": str(compaction.horizon), "run-id": compaction.run_id,
            "deleted-below": str(ledger_deleted_below(manifest))}


def raw_rows(manifest: PartitionManifest, rules: TimeRules) -> list[FileRows]:
    """The sealed segments with rows in the raw view."""
    return list(partition_rows(manifest, rules, False, manifest.sealed_end_offset).segments())


def raw_summary(manifest: PartitionManifest) -> dict[str, str]:
    return {"log-start-offset": str(max(manifest.log_start_offset, manifest.deleted_below)),
            "sealed-end-offset": str(manifest.sealed_end_offset)}


STATE = TableKind("state", "iceberg-state", state_rows, True, state_summary,
                  ("horizon", "run-id", "deleted-below"), False)
RAW = TableKind("raw", "iceberg-raw", raw_rows, False, raw_summary,
                ("log-start-offset", "sealed-end-offset"), True)
KINDS = {kind.name: kind for kind in (STATE, RAW)}
