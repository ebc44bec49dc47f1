"""Crash-safe file primitives.

Invariant: every file a reader may open is created whole. It is written under a
temporary name that starts with TEMP_PREFIX, fsynced, then published by an atomic
rename or link, and the directory is fsynced so that the new name survives power loss.
A crash leaves at worst a temporary file, which `remove_temp_files` deletes on the next
open.

Every step passes a fault point (compactlog/faults.py) named by its kind, so that tests
can fail, stall or kill at exactly that step.
"""

from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path

from compactlog import faults

TEMP_PREFIX = ".tmp-"


def temp_path(directory: Path, hint: str) -> Path:
    return directory / f"{TEMP_PREFIX}{hint}-{uuid.uuid4().hex[:12]}"


def fsync_dir(directory: Path) -> None:
    faults.point("fsync_dir", directory)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_path(path: Path) -> None:
    """fsync a file written through another handle (a Parquet writer's)."""
    faults.point("fsync", path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_durably(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write `data` to `path` (a temporary name) and fsync it; `mode`: the new file's
    permission bits (else the umask's)."""
    faults.point("write", path)
    opener = None if mode is None else (
        lambda name, flags: os.open(name, flags, mode))
    with open(path, "wb", opener=opener) as handle:
        handle.write(data)
        handle.flush()
        faults.point("fsync", path)
        os.fsync(handle.fileno())


def publish_exclusive(temp: Path, final: Path) -> bool:
    """Give `temp` the name `final` only if `final` does not exist yet (put-if-absent).

    Returns False, and removes `temp`, when another writer already published `final`.
    A hard link is atomic and fails on an existing name, which a rename would overwrite.
    """
    if not link_new(temp, final):
        return False
    fsync_dir(final.parent)
    return True


def link_new(temp: Path, final: Path) -> bool:
    """`publish_exclusive` without its directory fsync: the caller fsyncs the directory
    (one fsync may cover several files). False, and `temp` removed, if `final` exists."""
    faults.point("rename", final)
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
    return True


def rename(temp: Path, final: Path) -> None:
    """Give `temp` the name `final`, replacing any file of that name, atomically; the
    caller fsyncs the directory (one fsync may cover several renames)."""
    faults.point("rename", final)
    os.replace(temp, final)


def publish_replace(temp: Path, final: Path) -> None:
    """Give `temp` the name `final`, replacing any file of that name, atomically."""
    rename(temp, final)
    fsync_dir(final.parent)


def remove(path: Path) -> bool:
    """Delete `path` if it exists; True when it did. The caller fsyncs the directory."""
    faults.point("unlink", path)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def remove_temp_files(directory: Path) -> list[Path]:
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    for entry in directory.iterdir():
        if entry.name.startswith(TEMP_PREFIX) and remove(entry):
            removed.append(entry)
    if removed:
        fsync_dir(directory)
    return removed
