"""Compaction inputs already proven whole by this process: their CRC32C is not read again.

Invariant: `verify_input` skips the whole-file CRC32C of a file only when this process
computed it before and found the manifest's checksum, and the file still has the same
path, size, inode, modification and change times (ns) as then. Data files are never
written in place (a name is published once, by rename; compactlog/fsutil.py), so in a
long-lived process (the warm compaction worker, the server's compaction worker, a Spark
Python worker that local mode reuses) a ledger file that every run reads is read for
its checksum once, not once per run. Anything that rewrites the file, or replaces it
under its name, changes the change time or the inode, and the file is checked again.
What the memo cannot see is damage done by the disk itself after the check, without any
write (a run then reads what the pages hold, as a reader holding an open file would),
or an in-place write within the same tick of the file system's clock as the check
(a few ms on some kernels), which no compactlog code does.

Files this process wrote itself (`remember`) count as checked: their checksum is the
one computed from their bytes for the manifest.
"""

from __future__ import annotations

import os
from pathlib import Path

from compactlog.bounded_cache import BoundedCache
from compactlog.compaction.io_throttle import observe_read
from compactlog.storage import verify_file

MEMO_LIMIT = 65536  # files; an entry is about 200 bytes

Key = tuple[str, int, int, int, int, int]  # path, size, inode, mtime, ctime, CRC32C

_memo: BoundedCache[Key, bool] = BoundedCache(max_entries=MEMO_LIMIT)


def _key(path: Path, crc32c: int) -> Key:
    stat = os.stat(path)
    return (str(path), stat.st_size, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns, crc32c)


def remember(path: Path, crc32c: int) -> None:
    """Record `path` as whole with checksum `crc32c` (just computed from its bytes)."""
    key = _key(path, crc32c)
    _memo.put(key, True)


def verify_input(path: Path, size_bytes: int | None, crc32c: int | None, what: str) -> None:
    """verify_file(path, size_bytes, crc32c, what), the CRC32C computed only when this
    process has not proven this very file before (see the module)."""
    if crc32c is None:
        verify_file(path, size_bytes, None, what)
        return
    key = _key(path, crc32c)
    if (size_bytes is None or key[1] == size_bytes) and key in _memo:
        return
    verify_file(path, size_bytes, crc32c, what)
    observe_read(key[1])  # the CRC32C read the whole file
    remember(path, crc32c)


def forget_all() -> None:
    """Empty the memo (for tests)."""
    _memo.clear()
