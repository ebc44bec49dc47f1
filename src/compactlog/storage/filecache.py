"""The open Parquet files of a store: a bounded cache with leases.

Invariant: at most `capacity` sealed-segment and ledger files are open at once, plus
one per read in progress beyond that (a read holds a lease on the file it is reading,
and a leased file is never closed under it). Decoded row groups kept for sequential
readers take at most `row_group_bytes`. A file that a manifest retired is closed as
soon as its last lease ends, so a deleted file is never held open, and its disk space
is freed when the sweep deletes it.

Before a Parquet reader parses a file, its size and CRC32C are checked against the
manifest once (sealed.verify_file, paid at disk speed); the check is remembered by path,
size and checksum, so a file closed by the cache and opened again is not read twice.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

from compactlog.bounded_cache import BoundedCache
from compactlog.storage.manifest import SegmentInfo
from compactlog.storage.sealed import SealedSegment

DEFAULT_CAPACITY = 128
DEFAULT_ROW_GROUP_BYTES = 64 * 1024 * 1024
_VERIFIED_MEMO = 65536

RowGroupKey = tuple[Path, int, tuple[str, ...] | None]


class RowGroupCache:
    """Decoded row groups, least recently used out first, within a byte budget; a row
    group larger than the whole budget is not kept."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._tables: BoundedCache[RowGroupKey, pa.Table] = BoundedCache(
            max_weight=budget_bytes, weigh=lambda table: table.nbytes)

    def get(self, key: RowGroupKey) -> pa.Table | None:
        return self._tables.get(key)

    def put(self, key: RowGroupKey, table: pa.Table) -> None:
        if table.nbytes <= self.budget_bytes:
            self._tables.put(key, table)

    def drop_file(self, path: Path) -> None:
        self._tables.drop_where(lambda key: key[0] == path)

    @property
    def nbytes(self) -> int:
        return self._tables.weight


class VerifiedFiles:
    """Files whose size and CRC32C matched their manifest entry, by (path, size, crc)."""

    def __init__(self, limit: int = _VERIFIED_MEMO) -> None:
        self.limit = limit
        self._seen: BoundedCache[tuple[Path, int | None, int | None], bool] = BoundedCache(
            max_entries=limit)

    def __contains__(self, key: tuple[Path, int | None, int | None]) -> bool:
        return key in self._seen

    def add(self, key: tuple[Path, int | None, int | None]) -> None:
        self._seen.put(key, True)


class _Entry:
    __slots__ = ("leases", "retired", "segment")

    def __init__(self, segment: SealedSegment) -> None:
        self.segment = segment
        self.leases = 0
        self.retired = False


class OpenFiles:
    """Open SealedSegment readers of one store, shared by its partitions."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY,
                 row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES) -> None:
        if capacity < 1:
            raise ValueError(f"the open-file cache needs a capacity >= 1, got {capacity}")
        self.capacity = capacity
        self.row_groups = RowGroupCache(row_group_bytes)
        self._entries: OrderedDict[Path, _Entry] = OrderedDict()
        self._verified = VerifiedFiles()
        self._lock = threading.Lock()

    @contextmanager
    def lease(self, path: Path, info: SegmentInfo) -> Iterator[SealedSegment]:
        """The reader of `path`, held open for the block."""
        with self._lock:
            entry = self._entries.get(path)
            if entry is None or entry.retired or entry.segment.info != info:
                entry = _Entry(SealedSegment(path, info, self.row_groups, self._verified))
                if path not in self._entries or not self._entries[path].leases:
                    self._close_entry(path)
                    self._entries[path] = entry
            else:
                self._entries.move_to_end(path)
            entry.leases += 1
        try:
            yield entry.segment
        finally:
            with self._lock:
                entry.leases -= 1
                if entry.leases == 0 and (entry.retired or self._entries.get(path) is not entry):
                    entry.segment.close()
                self._evict()

    def retire(self, path: Path) -> None:
        """`path` left the manifest: close it once no read holds it."""
        with self._lock:
            entry = self._entries.get(path)
            if entry is None:
                return
            entry.retired = True
            if entry.leases == 0:
                self._close_entry(path)
        self.row_groups.drop_file(path)

    def open_count(self) -> int:
        with self._lock:
            return sum(1 for entry in self._entries.values() if entry.segment.is_open)

    def close_all(self) -> None:
        with self._lock:
            for path in list(self._entries):
                self._close_entry(path)

    def _evict(self) -> None:
        # Oldest unleased entries go first; leased ones stay, so the bound may be
        # passed by the reads in progress, never by idle files.
        if len(self._entries) <= self.capacity:
            return
        for path in list(self._entries):
            if len(self._entries) <= self.capacity:
                return
            if self._entries[path].leases == 0:
                self._close_entry(path)

    def _close_entry(self, path: Path) -> None:
        entry = self._entries.pop(path, None)
        if entry is not None:
            entry.segment.close()
