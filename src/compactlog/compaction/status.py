"""Compaction status per partition, kept on disk so it survives restarts.

Pulsar keeps its compaction status in memory and reports NOT_RUN after a restart even
when a compacted ledger exists; here it is a file next to the partition's manifest:
`compaction-status.json`, replaced atomically. While a run holds the partition's
compaction lock its state is RUNNING; a RUNNING file whose lock is free was left by a
compactor that died, and reads as ERROR.

The per-partition compaction lock, which makes runs on one partition exclusive across
processes, is in storage/locks.py (the store's writer respects it before it deletes
ledger files that no manifest lists); it is re-exported here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from compactlog import fsutil
from compactlog.storage import CompactionRunningError, compaction_lock, is_locked

__all__ = ["CompactionRunningError", "CompactionStatus", "compaction_lock", "is_locked",
           "read_status", "remove_status_temps", "write_status"]

State = Literal["NOT_RUN", "RUNNING", "SUCCESS", "ERROR"]
STATUS_FILE = "compaction-status.json"


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
    """Replace the status file atomically (called only under the compaction lock, whose
    holder also removes what a crashed writer of it left: `remove_status_temps`)."""
    temp = fsutil.temp_path(partition_dir, "status")
    try:
        fsutil.write_file_durably(temp, json.dumps(status.to_json(), sort_keys=True).encode())
        fsutil.publish_replace(temp, partition_dir / STATUS_FILE)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def remove_status_temps(partition_dir: Path) -> None:
    """Temporary status files of a run that crashed (only status files are written in
    the partition directory itself); the caller holds the compaction lock."""
    fsutil.remove_temp_files(partition_dir)
