"""Deleting data files by reachability, never by guesswork.

Invariant: a sealed segment or ledger file is deleted only when the current manifest
does not list it, no hold (holds.py: the Iceberg state table's retained snapshots) lists
it, and either a committed manifest retired it at least file.delete.delay.ms ago
(so readers in other processes that loaded an older manifest have had that long to
finish), or no manifest mentions it at all and no writer can still be about to commit
it (an orphan: a seal or compaction that crashed or failed before its commit; on an
object store also older than OBJECT_ORPHAN_MIN_AGE_MS, since a compaction on another
machine is not excluded by this machine's locks). Orphans
are deleted only when the current version is proven (Document.purge_uncommitted).
A reader in this process that still holds a deleted file reads on (POSIX keeps an
unlinked file's data until its last descriptor closes), and the open-file cache closes
it when that read ends; on an object store the delay is what protects readers.

Who may write uncommitted files where decides who may call an orphan an orphan:
- segments/: only the store's writer process seals, one seal at a time under the
  partition's seal lock; the writer sweeps segments/ while holding that lock.
- ledger/: only a compaction run writes, under the partition's compaction lock; ledger
  orphans are swept only by whoever holds that lock (the run itself at its start and
  end, or the writer when it can take the lock without waiting).
Retired files past their delay may be deleted by either; a file that is already gone
is fine. A commit that stops mentioning retired files (their delay had passed, so
manifest.retiring dropped them) deletes them at once (`delete_forgotten`), by the same
rules: not live, not held. The sweep is idempotent: running it twice, or after a crash
midway, deletes nothing that the first run would have kept.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from compactlog import fsutil
from compactlog.backend import Volume
from compactlog.storage.manifest import LEDGER_DIR, SEGMENT_DIR, PartitionManifest

# On an object store, an unlisted data file is an orphan only once it is this old (see
# `sweep_unreachable`): longer than any compaction run or seal takes from its first
# write to its commit.
OBJECT_ORPHAN_MIN_AGE_MS = 6 * 3600 * 1000

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepResult:
    retired: list[Path]  # deleted after their delay
    orphans: list[Path]  # deleted as never committed
    # Retired entries (relative paths) whose file is gone now, deleted here or before:
    # nothing is left to do for them until a commit forgets them.
    retired_done: list[str]

    @property
    def deleted(self) -> list[Path]:
        return self.retired + self.orphans


def sweep_unreachable(
    volume: Volume,
    manifest: PartitionManifest,
    now_ms: int,
    delay_ms: int,
    orphan_dirs: Iterable[str] = (),
    release: Callable[[Path], None] = lambda path: None,
    name: str = "",
    held: frozenset[str] = frozenset(),
) -> SweepResult:
    """Delete what `manifest` (the current one) makes unreachable.

    `orphan_dirs` are the directories (SEGMENT_DIR, LEDGER_DIR) whose writers the caller
    has excluded (see the module invariant); only there are orphans deleted. `release`
    closes a path in the caller's open-file cache before it goes. `held` (holds.py) are
    kept whatever the manifest says: retired or unlisted, a reader still needs them.
    """
    live = manifest.live_files()
    mentioned = live | held | {item.path for item in manifest.retired}
    retired: list[str] = []
    done: list[str] = []
    touched: set[str] = set()
    for item in manifest.retired:
        if item.path in live or now_ms - item.retired_ms < delay_ms:
            continue
        if item.path in held:
            # Kept for its holder; done until the holder releases it, which asks for a
            # sweep again (iceberg/expiry.py), so an idle partition is not swept each round.
            done.append(item.path)
            continue
        release(volume.path_of(item.path))
        if volume.remove(item.path):
            retired.append(item.path)
            touched.add(item.path.rpartition("/")[0])
        done.append(item.path)
    orphans: list[str] = []
    # On an object store a writer elsewhere (a compaction driver on another machine)
    # is not excluded by this machine's locks: only files older than any run are orphans.
    min_age_ms = 0 if volume.is_local else max(delay_ms, OBJECT_ORPHAN_MIN_AGE_MS)
    for directory in orphan_dirs:
        assert directory in (SEGMENT_DIR, LEDGER_DIR), directory
        for found in volume.listing(directory):
            relative = f"{directory}/{found.name}"
            if found.name.startswith(fsutil.TEMP_PREFIX):
                # A writer's file before its rename: the caller excluded writers here.
                volume.remove(relative)
                touched.add(directory)
                continue
            if not found.name.endswith(".parquet") or relative in mentioned:
                continue
            if now_ms - found.modified_ms < min_age_ms:
                continue
            release(volume.path_of(relative))
            if volume.remove(relative):
                orphans.append(relative)
                touched.add(directory)
    for folder in touched:
        volume.settle(folder)
    for relative in retired:
        log.info("%s: deleted %s, retired by an earlier commit", name or volume, relative)
    for relative in orphans:
        log.info("%s: deleted %s, written but never committed", name or volume, relative)
    return SweepResult([volume.path_of(r) for r in retired],
                       [volume.path_of(r) for r in orphans], done)


def delete_forgotten(
    volume: Volume,
    base: PartitionManifest,
    updated: PartitionManifest,
    held: Callable[[], frozenset[str]],
    release: Callable[[Path], None] = lambda path: None,
    name: str = "",
) -> list[str]:
    """Delete the retired files of `base` that the commit of `updated` stopped
    mentioning (their delay had passed): no manifest names them now, so they go unless
    `updated` lists them live again or a holder holds them (`held`, read only when
    there is something to delete). A failure raises (OSError, or StorageError on an
    object store) and leaves an orphan for the next sweep. The relative paths deleted."""
    kept = {item.path for item in updated.retired} | updated.live_files()
    forgotten = [item.path for item in base.retired if item.path not in kept]
    if not forgotten:
        return []
    holds_now = held()
    deleted: list[str] = []
    for relative in forgotten:
        if relative in holds_now:
            continue
        release(volume.path_of(relative))
        if volume.remove(relative):
            deleted.append(relative)
            log.info("%s: deleted %s, retired by an earlier commit", name or volume,
                     relative)
    return deleted


class SweepSchedule:
    """When a partition's next sweep may find something to delete: the first retired
    file not yet deleted passes its delay, or at once after a failure that may have
    left an orphan. The partition's upkeep sweeps only when one is due, so an idle
    partition is not listed every round."""

    def __init__(self, now_ms: Callable[[], int], delay_ms: Callable[[], int]) -> None:
        self._now_ms = now_ms
        self._delay_ms = delay_ms  # file.delete.delay.ms, read when needed (it may change)
        self.due_at_ms: int | None = None  # None: nothing waits
        self._swept: set[str] = set()  # retired files already deleted (after_sweep)

    def after_commit(self, manifest: PartitionManifest) -> None:
        """A manifest was installed: the sweep is due when its first retired file not
        yet deleted passes its delay."""
        waiting = [item.retired_ms for item in manifest.retired if item.path not in self._swept]
        if waiting:
            due = min(waiting) + self._delay_ms()
            self.due_at_ms = due if self.due_at_ms is None else min(self.due_at_ms, due)

    def after_sweep(self, manifest: PartitionManifest, done: list[str]) -> None:
        """A sweep ran: the retired files it deleted (`done`) keep no sweep due until a
        commit forgets them (else an idle partition would be swept every round); the
        next one is due by what `manifest` still retires."""
        self._swept.update(done)
        self._swept &= {item.path for item in manifest.retired}
        self.due_at_ms = None
        self.after_commit(manifest)

    def soon(self) -> None:
        """A failure may have left an orphan: sweep at the next chance."""
        self.due_at_ms = self._now_ms()

    @property
    def due(self) -> bool:
        return self.due_at_ms is not None and self._now_ms() >= self.due_at_ms
