"""Incremental runs with deletion vectors: what becomes of each previous ledger file.

Invariant: after phase 1 over (the previous ledger's live rows + the dirty segments),
a previous ledger file's row stays in the view exactly when phase 2 would have copied
it (ledger._filter_group's rules: it is its key's survivor, or a null-key record under
`null.key.policy=keep`; not a tombstone past delete.retention.ms; not older than
retention.ms on compact,delete; not below DeleteRecords' deleted_below). Each file then
gets one fate:
  - keep: nothing of it left the view; its entry (and current DV, if any) is unchanged;
  - dv: some rows left; a new DV file holding the old DV's offsets and the new ones is
    written under a name carrying the run id (storage/deletion.py), and the entry
    points at it (the old DV is retired by the commit);
  - rewrite: its live rows fall below compaction.ledger.rewrite.live.fraction of its
    rows, or a kept row's tombstone_since_ms is wrong for the current
    empty.value.is.tombstone (set on a non-tombstone, or missing on a tombstone: only
    writing the row corrects it), or it is one of at least
    compaction.ledger.merge.min.files small files next to each other (`small_runs`:
    below compaction.ledger.merge.below.bytes): phase 2 copies its live rows into a new
    file, with its neighbours' and the dirty part's survivors;
  - drop: no row is left.
A dirty segment gets a fate too when it is adopted into the ledger as it is
(adoption.py): `adopt`, with a DV of the rows phase 2 would not have copied; the others
are written by phase 2.
A file adopted by an earlier run has no tombstone_since_ms column: its entry's
adopted_at_ms stands for it on its tombstones (null values), and a kept empty value that
is a tombstone now counts as unset (rewrite).
So the view over (kept files with their DVs + new files) is the view a full rewrite
would have written, record for record, save tombstone_since_ms of rows not rewritten,
which is unchanged and so the same too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from compactlog.compaction.io_throttle import observe_row_group
from compactlog.compaction.ledger import PieceResult, TombstoneRules
from compactlog.compaction.plan import InputFile, wholly_cut
from compactlog.storage import (
    deleted_mask,
    drop_deleted,
    dv_file_name,
    tombstones_by_size,
    write_deletion_vector,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fate:
    """What one previous ledger file becomes (see the module)."""

    item: InputFile
    action: str  # keep | dv | rewrite | drop | adopt (a dirty segment: adoption.py)
    result: PieceResult | None = None  # for keep, dv and drop: the file's counts


def small_runs(ledger: list[InputFile], below_bytes: int, min_files: int) -> set[str]:
    """The paths of the previous ledger files that this run merges. Every incremental
    run adds a file per partition, which would otherwise stay a file of its own while it
    keeps half its rows.

    Only neighbours merge: a file of at least `below_bytes` between two small ones stays
    as it is, and phase 2's new files never interleave with a kept file's range
    (runs_to_write). Within each maximal run of small neighbours (in offset order, as
    `ledger` lists them), walking back from the newest, a file joins the newer files'
    group while it is at most twice what they hold together, else it starts the next
    group; a group of at least `min_files` merges. So a file is rewritten again only
    once the data after it has grown to half its size (each byte is rewritten about
    log2(below_bytes / a run's new bytes) times), and what stays unmerged is groups of
    fewer than `min_files` files, each starting with a file more than twice the newer
    group: at most log2(below_bytes / the smallest file) of them, whatever the number of
    runs (a write rate that falls run after run included)."""
    merged: set[str] = set()
    run: list[InputFile] = []
    for item in [*ledger, None]:
        if item is not None and item.info.size_bytes < below_bytes:
            run.append(item)
            continue
        group: list[InputFile] = []
        total = 0
        for member in [*reversed(run), None]:
            if member is not None and (not group or member.info.size_bytes <= 2 * total):
                group.append(member)
                total += member.info.size_bytes
                continue
            if len(group) >= min_files:
                merged.update(str(file.path) for file in group)
            group, total = ([member], member.info.size_bytes) if member else ([], 0)
        run = []
    return merged


def decide(item: InputFile, deleted: np.ndarray | None, survivors: np.ndarray,
           rules: TombstoneRules, rewrite_below: float, run_id: str,
           page_checksums: bool, merge: bool = False) -> Fate:
    """The fate of ledger file `item` (whose DV deletes `deleted`); writes its new DV
    when the fate is `dv`. `merge`: it is one of the small files this run merges
    (`small_runs`), so it is rewritten unless nothing of it is left."""
    info = item.info
    if wholly_cut(info, rules.deleted_below):
        # Nothing of it is in the view: dropped unread (the runner counts its records).
        return Fate(item, "drop", PieceResult(None, 0, 0, 0, 0, 0, 0, 0))
    if rules.null_key_policy != "keep":
        # Phase 1's survivors in the file's offset range bound its live rows from above
        # (the rules only take more away): below the threshold, rewrite without reading.
        low, high = np.searchsorted(survivors, [info.base_offset, info.last_offset + 1])
        if high - low < rewrite_below * info.record_count:
            return Fate(item, "rewrite")
    # Only the columns the rules need (no value, no key unless null keys are kept). An
    # adopted file has no tombstone_since_ms: its tombstones were kept when it was.
    adopted = info.adopted_at_ms
    columns = ["offset", "value_size"] + (["tombstone_since_ms"] if adopted is None else [])
    columns += ["key"] if rules.null_key_policy == "keep" else []
    columns += ["timestamp"] if rules.retention_ms >= 0 else []
    # ParquetFile, not read_table: the dataset layer costs more than the read here.
    handle = pq.ParquetFile(item.path, page_checksum_verification=page_checksums)
    try:
        whole = handle.read(columns=columns)
        table = drop_deleted(whole, deleted)
        for index in range(handle.metadata.num_row_groups):
            observe_row_group(handle.metadata, index, columns)
    finally:
        handle.close()
    offsets = table.column("offset").to_numpy()
    chosen = deleted_mask(offsets, survivors)
    if rules.null_key_policy == "keep":
        null_key = pc.is_null(table.column("key")).to_numpy(zero_copy_only=False)
        keep = chosen | null_key
    else:
        null_key = np.zeros(len(offsets), bool)
        keep = chosen
    size = table.column("value_size")
    null_value = pc.is_null(size).to_numpy(zero_copy_only=False)
    tombstone = tombstones_by_size(size, rules.empty_value_is_tombstone) & ~null_key
    if adopted is None:
        since_column = table.column("tombstone_since_ms")
        since_null = pc.is_null(since_column).to_numpy(zero_copy_only=False)
        since = since_column.fill_null(rules.now_ms).to_numpy()
    else:
        # Set, in effect, on the rows that were tombstones when it was adopted: a key's
        # null value. An empty value may have become a tombstone since (by
        # empty.value.is.tombstone): it counts as unset, so its file is rewritten.
        since_null = ~(null_value & ~null_key)
        since = np.full(len(offsets), adopted, np.int64)
    expired_tombstone = tombstone & (rules.now_ms - since >= rules.delete_retention_ms)
    tombstones_removed = int((keep & expired_tombstone).sum())
    keep &= ~expired_tombstone
    expired = 0
    if rules.retention_ms >= 0:
        too_old = table.column("timestamp").to_numpy() < rules.now_ms - rules.retention_ms
        expired += int((keep & too_old).sum())
        keep &= ~too_old
    if rules.deleted_below:
        # Phase 1 never sees a row below the cut, so none is chosen: each live row there
        # (a key's, or a null key's kept by the policy) left the view by DeleteRecords.
        below = offsets < rules.deleted_below
        expired += int((below & (keep | ~null_key)).sum())
        keep &= ~below
    live = int(keep.sum())
    removed = offsets[~keep]
    kept_tombstones = keep & tombstone
    if live == 0:
        return Fate(item, "drop", PieceResult(None, len(offsets), 0, 0, 0, tombstones_removed,
                                              int((~chosen & null_key).sum()), expired))
    # tombstone_since_ms must be set exactly on kept tombstones: a row whose status
    # changed with empty.value.is.tombstone can only be corrected by writing it.
    stale = (kept_tombstones & since_null) | (keep & ~tombstone & ~since_null)
    if merge or stale.any() or live < rewrite_below * item.info.record_count:
        return Fate(item, "rewrite")
    oldest = int(since[kept_tombstones].min()) if kept_tombstones.any() else None
    action = "keep"
    if len(removed):
        action = "dv"
        union = removed if deleted is None else merge_sorted(deleted, removed)
        name = dv_file_name(info.file, run_id)
        # Each deleted offset's row in the file, for the state table's position deletes:
        # the sync then need not read the offsets again. (An old DV's offset that the
        # file does not hold would leave them unknown rather than wrong.)
        positions = np.flatnonzero(deleted_mask(whole.column("offset").to_numpy(), union))
        if len(positions) != len(union):
            log.warning("%s: %d offsets of its deletion vector are not rows of the file; "
                        "the new DV %s records no positions", item.path,
                        len(union) - len(positions), name)
        dv_size, dv_crc = write_deletion_vector(
            item.path.parent, name, union,
            positions if len(positions) == len(union) else None)
        info = replace(info, dv_file=name, dv_size_bytes=dv_size, dv_crc32c=dv_crc,
                       dv_count=len(union))
    return Fate(item, action, PieceResult(info, len(offsets), 0, live,
                                          int(kept_tombstones.sum()), tombstones_removed,
                                          0, expired, oldest))


def merge_sorted(deleted: np.ndarray, removed: np.ndarray) -> np.ndarray:
    """The sorted union of two sorted arrays without common members (an old DV's offsets
    and the rows this run takes out of what it left). A stable sort merges two ascending
    runs in one pass: for a 250,000-row file's 157,000 offsets, 0.9 ms against 32 ms for
    np.union1d, which hashes them (bench/deletion_vectors.py, docs/benchmarks.md)."""
    merged: np.ndarray = np.sort(np.concatenate([deleted, removed]), kind="stable")
    if len(merged) > 1 and not bool((merged[1:] > merged[:-1]).all()):
        merged = np.unique(merged)  # a member of both: never from decide, kept exact
    return merged


def runs_to_write(inputs: list[InputFile], fates: dict[str, Fate]) -> list[list[InputFile]]:
    """The maximal runs of consecutive inputs that phase 2 writes (rewritten ledger
    files and dirty segments), split at every file that stays as it is (a kept ledger
    file, or an adopted segment), so that
    the new files' offset ranges never interleave with the kept files'."""
    runs: list[list[InputFile]] = [[]]
    for item in inputs:
        fate = fates.get(str(item.path))
        if fate is None or fate.action == "rewrite":
            runs[-1].append(item)
        elif fate.action != "drop" and runs[-1]:
            runs.append([])
    return [run for run in runs if run]

