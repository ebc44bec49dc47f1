"""Crash-safe file primitives.

Every file a reader may open is created whole: written under a temporary name that
starts with TEMP_PREFIX, fsynced, then published by an atomic rename or link, and
the directory fsynced so that the new name survives power loss. A crash leaves at
worst a temporary file, which `remove_temp_files` deletes on the next open.
"""

from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path

TEMP_PREFIX = ".tmp-"


def temp_path(directory: Path, hint: str) -> Path:
    return directory / f"{TEMP_PREFIX}{hint}-{uuid.uuid4().hex[:12]}"


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_durably(path: Path, data: bytes) -> None:
    """Write `data` to `path` (a temporary name) and fsync it."""
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def publish_exclusive(temp: Path, final: Path) -> bool:
    """Give `temp` the name `final` only if `final` does not exist yet (put-if-absent).

    Returns False, and removes `temp`, when another writer already published `final`.
    A hard link is atomic and fails on an existing name, which a rename would overwrite.
    """
    try:
        os.link(temp, final)
    except FileExistsError:
        temp.unlink(missing_ok=True)
        return False
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        # Filesystems without hard links: O_EXCL create is the same put-if-absent test.
        try:
            fd = os.open(final, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            temp.unlink(missing_ok=True)
            return False
        with os.fdopen(fd, "wb") as out:
            out.write(temp.read_bytes())
            out.flush()
            os.fsync(out.fileno())
    temp.unlink(missing_ok=True)
    fsync_dir(final.parent)
    return True


def publish_replace(temp: Path, final: Path) -> None:
    """Give `temp` the name `final`, replacing any file of that name, atomically."""
    os.replace(temp, final)
    fsync_dir(final.parent)


def remove_temp_files(directory: Path) -> list[Path]:
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    for entry in directory.iterdir():
        if entry.name.startswith(TEMP_PREFIX):
            entry.unlink(missing_ok=True)
            removed.append(entry)
    if removed:
        fsync_dir(directory)
    return removed
