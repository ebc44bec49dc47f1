"""Holds: data files of a partition that something outside its manifests still reads.

The Iceberg state table's retained snapshots list ledger files that later compactions
retired: time travel to such a snapshot reads them. The manifests alone would let the
sweep delete those files file.delete.delay.ms after their retirement; a hold keeps them.

Invariant: the sweep (sweep.py) never deletes a file that the partition's committed
hold document lists. The document is `holds/current.json` in the partition's volume,
committed by compare-and-swap like the manifest (a backend Document), so that holders
on several machines (compaction runs and the server's upkeep) add and release entries
without losing one another's. Every change goes through backend.update_document, which
clears the claim a holder left when it died or its PUT failed inside a commit: else
every later commit of that version conflicted, and on S3 the Iceberg sync of that topic
failed at every run from then on (tests/faults/test_fault_steps_s3.py, compact-1 at request
30). It maps a holder ("iceberg-state") to the relative paths
it holds, each with the time it was first held:

    {"iceberg-state": {"ledger/00000000000000000000-....parquet": 1795737124603, ...}}

The protocol for a holder (iceberg/expiry.py is the one here):
  1. hold the files a commit of its own will reference *before* that commit (a hold
     that was taken for a commit that then failed only delays a deletion);
  2. release a file only after its own committed state no longer references it, and
     never a file first held less than a grace period ago (a commit in flight may
     still reference it: the holder's commits take less than that);
  3. a holder may rewrite its whole entry (`replace`) to what its committed state
     references plus what it holds within the grace period, which also repairs holds
     lost to a crash between steps; a holder with no entry at all (its state predates
     the document) writes one (`adopt`);
  4. a holder whose state is gone (a dropped table, iceberg/drop.py) removes its entry
     whole (`release`), only after nothing can read its state any more.
Each of these loads the document once and commits only if the entry changes (once
more per conflict).
Tests: tests/iceberg/test_iceberg_expiry.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from compactlog.backend import Document, Snapshot, update_document

HOLDS = "holds"
ATTEMPTS = 20


class Holds:
    """One partition's hold document (see the module's invariant)."""

    def __init__(self, document: Document) -> None:
        self.document = document
        self._snapshot: Snapshot | None = None
        self._held: frozenset[str] = frozenset()

    def held(self) -> frozenset[str]:
        """Every relative path that any holder holds, as committed now (read again only
        when the document changed)."""
        if self._snapshot is None or self.document.changed_since(self._snapshot):
            snapshot = self.document.load()
            body = {} if snapshot is None else snapshot.body
            self._held = frozenset(path for entries in body.get("holders", {}).values()
                                   for path in entries)
            self._snapshot = snapshot
        return self._held

    def entries(self, holder: str) -> dict[str, int]:
        """What `holder` holds: relative path -> when it was first held (ms)."""
        snapshot = self.document.load()
        body = {} if snapshot is None else snapshot.body
        return {str(path): int(since)
                for path, since in body.get("holders", {}).get(holder, {}).items()}

    def has(self, holder: str) -> bool:
        """Whether `holder` ever wrote its entry (an empty one counts)."""
        snapshot = self.document.load()
        return snapshot is not None and holder in snapshot.body.get("holders", {})

    def add(self, holder: str, paths: Iterable[str], now_ms: int) -> None:
        """Step 1: hold `paths` (those not held yet get `now_ms`)."""
        wanted = sorted(set(paths))

        def change(entries: dict[str, int]) -> dict[str, int]:
            return {**{path: now_ms for path in wanted}, **entries}

        self._commit(holder, change, only_if_new=wanted)

    def replace(self, holder: str, referenced: Iterable[str], now_ms: int,
                grace_ms: int) -> None:
        """Steps 2 and 3: hold exactly what the holder's committed state references, and
        keep what was first held less than `grace_ms` ago."""
        wanted = set(referenced)

        def change(entries: dict[str, int]) -> dict[str, int]:
            kept = {path: since for path, since in entries.items()
                    if path in wanted or now_ms - since < grace_ms}
            return {**{path: now_ms for path in wanted}, **kept}

        self._commit(holder, change)

    def adopt(self, holder: str, referenced: Callable[[], Iterable[str]],
              now_ms: int) -> bool:
        """Step 3 for a holder with no entry at all (its state predates the document):
        hold `referenced()`, called only then. One load, and a commit only then; True
        when it committed."""
        return self._commit(holder, lambda entries: {path: now_ms for path in referenced()},
                            only_if_absent=True)

    def release(self, holder: str) -> bool:
        """Drop `holder`'s entry whole (its table was dropped: nothing of it references
        a file any more); True when there was one. One load, and a commit only then."""
        def without_holder(snapshot: Snapshot | None) -> dict[str, Any] | None:
            if snapshot is None or holder not in snapshot.body.get("holders", {}):
                return None
            return {"holders": {name: entries
                                for name, entries in snapshot.body["holders"].items()
                                if name != holder}}

        return update_document(self.document, without_holder, ATTEMPTS) is not None

    def _commit(self, holder: str, change: Callable[[dict[str, int]], dict[str, int]],
                only_if_new: list[str] | None = None, only_if_absent: bool = False) -> bool:
        """One load of the document, and a commit only if `change` changes the holder's
        entry (an empty entry is not written where there was none); True if committed."""
        def with_change(snapshot: Snapshot | None) -> dict[str, Any] | None:
            body = {} if snapshot is None else dict(snapshot.body)
            holders: dict[str, Mapping[str, int]] = dict(body.get("holders", {}))
            if only_if_absent and holder in holders:
                return None
            before = {str(path): int(since) for path, since in holders.get(holder, {}).items()}
            if only_if_new is not None and all(path in before for path in only_if_new):
                return None  # nothing to add: no commit
            after = change(before)
            if after == before and (holder in holders or not after):
                return None
            holders[holder] = dict(sorted(after.items()))
            return {"holders": holders}

        return update_document(self.document, with_change, ATTEMPTS) is not None
