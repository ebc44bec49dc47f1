"""The files of a topic's Iceberg table, on a local disk or under an S3 prefix.

Invariant: every file is published whole under a name no other file had, except
`metadata/version-hint.text`, which is replaced. `create` is put-if-absent (a hard link
locally, `If-None-Match: *` on S3): the metadata file of version N+1 is created this
way, which makes it the table's compare-and-swap (a second writer of N+1 is told so and
changes nothing). Names given here are relative to the table's location, '/'-separated;
`url` turns one into what a reader opens (an absolute path, or an s3:// URL).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from compactlog import fsutil
from compactlog.backend import Listed, Location, Volume
from compactlog.backend.local.volume import LocalVolume
from compactlog.backend.s3.layout import ObjectLayout
from compactlog.backend.s3.volume import ObjectVolume, remove_prefix
from compactlog.errors import ConflictError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from compactlog.storage import LogStore


class TableFiles(Protocol):
    """A table's files (see the module's invariant)."""

    def url(self, relative: str) -> str: ...

    def read(self, relative: str) -> bytes | None:
        """The file's bytes; None when there is no such file."""
        ...

    def create(self, relative: str, data: bytes) -> bool:
        """Publish `data` as `relative` if no file has that name; False if one has."""
        ...

    def create_all(self, items: list[tuple[str, bytes]]) -> None:
        """Publish each (relative, data) under a name no file has had (a uuid in each):
        `create` of each, made durable together (ConflictError if a name is taken)."""
        ...

    def replace(self, relative: str, data: bytes) -> None: ...

    def size(self, relative: str) -> int | None: ...

    def listing(self, folder: str) -> list[Listed]: ...

    def remove(self, relative: str) -> bool: ...

    def remove_all(self) -> int:
        """Delete every file of the table (a dropped table); how many there were."""
        ...


class LocalTableFiles:
    """A table under a local directory: temporary file, fsync, link or rename, then a
    directory fsync (compactlog/fsutil.py)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def url(self, relative: str) -> str:
        return str(self.root / relative) if relative else str(self.root)

    def read(self, relative: str) -> bytes | None:
        try:
            return (self.root / relative).read_bytes()
        except FileNotFoundError:
            return None

    def _temp(self, relative: str, data: bytes) -> tuple[Path, Path]:
        final = self.root / relative
        final.parent.mkdir(parents=True, exist_ok=True)
        temp = fsutil.temp_path(final.parent, final.name)
        try:
            fsutil.write_file_durably(temp, data)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        return temp, final

    def create(self, relative: str, data: bytes) -> bool:
        temp, final = self._temp(relative, data)
        try:
            return fsutil.publish_exclusive(temp, final)
        finally:
            temp.unlink(missing_ok=True)

    def create_all(self, items: list[tuple[str, bytes]]) -> None:
        """Every file written and fsynced, then linked, then each directory fsynced
        once, not once per file: a snapshot's files share two or three directories."""
        folders: set[Path] = set()
        for relative, data in items:
            temp, final = self._temp(relative, data)
            try:
                if not fsutil.link_new(temp, final):
                    raise ConflictError(f"{final}: the name is taken")
            finally:
                temp.unlink(missing_ok=True)
            folders.add(final.parent)
        for folder in sorted(folders):
            fsutil.fsync_dir(folder)

    def replace(self, relative: str, data: bytes) -> None:
        temp, final = self._temp(relative, data)
        try:
            fsutil.publish_replace(temp, final)
        finally:
            temp.unlink(missing_ok=True)

    def size(self, relative: str) -> int | None:
        try:
            return (self.root / relative).stat().st_size
        except FileNotFoundError:
            return None

    def listing(self, folder: str) -> list[Listed]:
        return LocalVolume(self.root).listing(folder)

    def remove(self, relative: str) -> bool:
        return fsutil.remove(self.root / relative)

    def remove_all(self) -> int:
        if not self.root.is_dir():
            return 0
        count = sum(1 for path in self.root.rglob("*") if path.is_file())
        shutil.rmtree(self.root)
        fsutil.fsync_dir(self.root.parent)
        return count


class ObjectTableFiles:
    """A table under an S3 prefix, through backend/s3/bucket.py (conditional PUTs)."""

    def __init__(self, location: Location, client: S3Client, cache_dir: Path) -> None:
        assert location.bucket is not None
        self.location = location
        self.bucket: str = location.bucket
        self.volume = ObjectVolume(location, cache_dir, client)
        self.objects = self.volume.objects

    def url(self, relative: str) -> str:
        key = self.location.key(relative) if relative else self.location.path
        return f"s3://{self.bucket}/{key}"

    def read(self, relative: str) -> bytes | None:
        found = self.objects.get(self.location.key(relative))
        return None if found is None else found[0]

    def create(self, relative: str, data: bytes) -> bool:
        return self.objects.create(self.location.key(relative), data)

    def create_all(self, items: list[tuple[str, bytes]]) -> None:
        for relative, data in items:
            if not self.create(relative, data):
                raise ConflictError(f"{self.url(relative)}: the name is taken")

    def replace(self, relative: str, data: bytes) -> None:
        self.objects.put(self.location.key(relative), data)

    def size(self, relative: str) -> int | None:
        head = self.objects.head(self.location.key(relative))
        return None if head is None else head.size

    def listing(self, folder: str) -> list[Listed]:
        return self.volume.listing(folder)

    def remove(self, relative: str) -> bool:
        return self.volume.remove(relative)

    def remove_all(self) -> int:
        return remove_prefix(self.location, self.objects.client)


def table_files(store: LogStore, topic: str, table: str) -> TableFiles:
    """The files of `topic`'s table `table` ("state"): beside the topic's partitions."""
    layout = store.layout
    if isinstance(layout, ObjectLayout):
        topic_id = store.topic(topic).meta.topic_id
        return ObjectTableFiles(layout.location.join("topics", topic, topic_id, "iceberg",
                                                     table), layout.client, layout.cache_dir)
    return LocalTableFiles(store.topics_dir / topic / "iceberg" / table)


def data_file_url(volume: Volume, relative: str) -> str:
    """What a table lists for a partition's data file `relative` (ledger/…)."""
    return volume.url(relative)


def relative_of(volume: Volume, url: str) -> str | None:
    """The inverse of `data_file_url`: the relative path of a table's data file in
    `volume`, or None when it is another partition's."""
    probe = "ledger/x"
    base = data_file_url(volume, probe)[:-len(probe)]
    return url[len(base):] if url.startswith(base) else None


def remove_unreferenced(files: TableFiles, referenced_urls: set[str], partitions: list[int],
                        now_ms: int, grace_ms: int) -> int:
    """Step 5: the table's manifests, manifest lists and delete files that no retained
    snapshot references, older than the grace period."""
    removed = 0
    folders = ["metadata", *(f"deletes/{index}" for index in partitions)]
    for folder in folders:
        for found in files.listing(folder):
            relative = f"{folder}/{found.name}"
            if not found.name.endswith((".avro", ".parquet")):
                continue  # metadata files and the hint stay
            if files.url(relative) in referenced_urls or now_ms - found.modified_ms < grace_ms:
                continue
            if files.remove(relative):
                removed += 1
    return removed
