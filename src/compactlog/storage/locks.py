"""The per-partition compaction lock: who may write (and sweep) ledger files.

Invariant: while a process holds a partition's compaction lock (an flock on
`compaction.lock` in the partition's directory), no other process writes, commits or
deletes that partition's uncommitted ledger files. A compaction run holds it from
planning to its last sweep; the store's writer takes it without waiting, or not at
all, before it deletes ledger orphans (sweep.py). The kernel releases the lock when
its holder dies, so a crashed run never blocks the next.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from compactlog.errors import ConflictError

LOCK_FILE = "compaction.lock"


class CompactionRunningError(ConflictError):
    """A compaction of this partition is already running (in this or another process)."""


def try_lock(partition_dir: Path) -> int | None:
    """The descriptor holding the lock, or None if another holds it (close it to release)."""
    fd = os.open(partition_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


# The store's writer holds the lock for milliseconds at a time (its sweep), and the
# server's cleaner probes it: a run waits this long before it says another is running.
BRIEF_HOLD_S = 2.0


@contextmanager
def compaction_lock(partition_dir: Path, name: str,
                    wait_s: float = BRIEF_HOLD_S) -> Iterator[None]:
    """Hold the partition's compaction lock, or raise CompactionRunningError."""
    deadline = time.monotonic() + wait_s
    while (fd := try_lock(partition_dir)) is None:
        if time.monotonic() >= deadline:
            raise CompactionRunningError(
                f"{name}: a compaction is already running on this partition")
        time.sleep(0.02)
    try:
        yield
    finally:
        os.close(fd)


def is_locked(partition_dir: Path) -> bool:
    path = partition_dir / LOCK_FILE
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
