"""Compaction status per partition, kept on disk so it survives restarts.

Pulsar keeps its compaction status in memory and reports NOT_RUN after a restart even
when a compacted ledger exists; here it is a file next to the partition's manifest:
`compaction-status.json`, replaced atomically. While a run holds the partition's
compaction lock its state is RUNNING; a RUNNING file whose lock is free was left by a
compactor that died, and reads as ERROR.

Also here: the per-partition compaction lock (an flock on `compaction.lock`), which
makes runs on one partition exclusive across processes, and which the store's open
respects before removing ledger files that no manifest lists.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from compactlog.errors import ConflictError
from compactlog.storage import fsutil

State = Literal["NOT_RUN", "RUNNING", "SUCCESS", "ERROR"]
STATUS_FILE = "compaction-status.json"
LOCK_FILE = "compaction.lock"


@dataclass
class CompactionStatus:
    state: State = "NOT_RUN"
    run_id: str | None = None
    started_ms: int | None = None
    finished_ms: int | None = None
    error: str | None = None
    # The last successful run's summary (records in and out, bytes, tombstones, ...).
    last_success: dict[str, Any] = field(default_factory=dict)
    failures_in_a_row: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class CompactionRunningError(ConflictError):
    """A compaction of this partition is already running (in this or another process)."""


def read_status(partition_dir: Path) -> CompactionStatus:
    path = partition_dir / STATUS_FILE
    try:
        body = json.loads(path.read_bytes())
        status = CompactionStatus(**body)
    except FileNotFoundError:
        return CompactionStatus()
    except (ValueError, TypeError) as error:
        return CompactionStatus("ERROR", error=f"unreadable status file {path}: {error}")
    if status.state == "RUNNING" and not is_locked(partition_dir):
        status.state = "ERROR"
        status.error = (
            f"run {status.run_id} was interrupted: its compaction process stopped before "
            "finishing (nothing it wrote was committed)"
        )
    return status


def write_status(partition_dir: Path, status: CompactionStatus) -> None:
    temp = fsutil.temp_path(partition_dir, "status")
    fsutil.write_file_durably(temp, json.dumps(status.to_json(), sort_keys=True).encode())
    fsutil.publish_replace(temp, partition_dir / STATUS_FILE)


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


@contextmanager
def compaction_lock(partition_dir: Path, name: str) -> Iterator[None]:
    """Hold the partition's compaction lock, or raise CompactionRunningError."""
    fd = os.open(partition_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CompactionRunningError(
                f"{name}: a compaction is already running on this partition"
            ) from None
        yield
    finally:
        os.close(fd)
