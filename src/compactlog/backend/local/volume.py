"""A partition's durable files in its own local directory (LocalVolume), laid out as they
always were.

Invariant (the Volume invariant of compactlog.backend, on a local disk): a data file is
published whole under a name that is never reused, and is never overwritten, by an
atomic rename of an fsynced temporary file (fsutil.publish_replace); a reader's local
path is the file itself.
"""

from __future__ import annotations

from pathlib import Path

from compactlog import fsutil
from compactlog.backend import Document, Listed
from compactlog.backend.local.document import LocalDocument


class LocalVolume:
    """A partition's files in its own local directory, laid out as they always were."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def spec(self) -> dict[str, str]:
        return {"kind": "local", "root": str(self.root)}

    @property
    def is_local(self) -> bool:
        return True

    def document(self, name: str) -> Document:
        return LocalDocument(self.root / name)

    def path_of(self, relative: str) -> Path:
        return self.root / relative

    def fetch(self, relative: str) -> Path:
        return self.root / relative

    def publish(self, temp: Path, relative: str) -> None:
        final = self.root / relative
        if temp.parent != final.parent:
            raise ValueError(f"{temp} must be written in {final.parent}")
        fsutil.publish_replace(temp, final)

    def publish_copy(self, temp: Path, relative: str, source: str) -> None:
        """`temp` already holds the bytes (a hard link to `source`, as adoption makes it)."""
        self.publish(temp, relative)

    def remove(self, relative: str) -> bool:
        return fsutil.remove(self.root / relative)

    def evict(self, relative: str) -> None:
        """A local file is the file itself: never dropped."""

    def settle(self, folder: str) -> None:
        fsutil.fsync_dir(self.root / folder)

    def listing(self, folder: str) -> list[Listed]:
        directory = self.root / folder
        if not directory.is_dir():
            return []
        found = []
        for entry in directory.iterdir():
            try:
                found.append(Listed(entry.name, int(entry.stat().st_mtime * 1000)))
            except FileNotFoundError:
                continue
        return found

    def describe(self, relative: str) -> str:
        return str(self.root / relative)

    def url(self, relative: str) -> str:
        return str(self.path_of(relative).resolve())
