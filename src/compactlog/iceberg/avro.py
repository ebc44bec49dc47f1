"""Iceberg's Avro files (manifests, manifest lists), written and read in memory through
pyiceberg's own writers and readers, so that the bytes go to the table's files
(files.py) with their crash-safe publication rather than through pyiceberg's FileIO.

Invariant: a manifest never changes once written (its name holds a uuid), so the live
entries of one this process wrote or read are kept (`entries`, up to ENTRIES_KEPT
manifests) as a reader would see them, with the sequence numbers a reader inherits
from the manifest list (Iceberg's spec, "Sequence Number Inheritance"): each sync
reads the previous snapshot's manifests, most often the ones the sync before it wrote,
and pyiceberg's Avro reader costs milliseconds a file.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any, Literal

from pyiceberg.io import FileIO, InputFile, InputStream, OutputFile, OutputStream
from pyiceberg.manifest import (
    DataFile,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
    read_manifest_list,
    write_manifest_list,
)
from pyiceberg.schema import Schema
from pyiceberg.typedef import TableVersion

from compactlog.bounded_cache import BoundedCache
from compactlog.iceberg.files import TableFiles
from compactlog.iceberg.schema import SCHEMA, SPEC

COMPRESSION: Literal["deflate"] = "deflate"
ENTRIES_KEPT = 512
_entries: BoundedCache[str, list[ManifestEntry]] = BoundedCache(max_entries=ENTRIES_KEPT)


class _Buffer(io.BytesIO):
    """A stream that hands its bytes to its file when closed."""

    def __init__(self, owner: MemoryOutputFile) -> None:
        super().__init__()
        self.owner = owner

    def close(self) -> None:
        if not self.closed:
            self.owner.data = self.getvalue()
        super().close()


class MemoryOutputFile(OutputFile):
    """An OutputFile whose bytes stay in memory (`data`) for the caller to publish."""

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.data = b""

    def __len__(self) -> int:
        return len(self.data)

    def exists(self) -> bool:
        return False

    def to_input_file(self) -> InputFile:
        return MemoryInputFile(self.location, self.data)

    def create(self, overwrite: bool = False) -> OutputStream:
        return _Buffer(self)


class MemoryInputFile(InputFile):
    def __init__(self, location: str, data: bytes) -> None:
        super().__init__(location)
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def exists(self) -> bool:
        return True

    def open(self, seekable: bool = True) -> InputStream:
        return io.BytesIO(self.data)


class TableIO(FileIO):
    """pyiceberg's reads of a table's own files, through TableFiles (read-only)."""

    def __init__(self, files: TableFiles) -> None:
        super().__init__()
        self.files = files
        self.root = files.url("").rstrip("/") + "/"

    def relative(self, location: str) -> str:
        if not location.startswith(self.root):
            raise ValueError(f"{location} is not a file of the table at {self.root}")
        return location[len(self.root):]

    def new_input(self, location: str) -> InputFile:
        data = self.files.read(self.relative(location))
        if data is None:
            raise FileNotFoundError(location)
        return MemoryInputFile(location, data)

    def new_output(self, location: str) -> OutputFile:
        raise NotImplementedError("the table's files are published through TableFiles")

    def delete(self, location: str | InputFile | OutputFile) -> None:
        raise NotImplementedError("the table's files are deleted through TableFiles")


# The manifest entry schemas with the table's partition type, by format version: every
# manifest of a table here has the spec and schema of schema.py, and pyiceberg builds
# these (about 1 ms each, twice a manifest) anew for every writer.
_entry_schemas: dict[int, Schema] = {}


class _DataManifestWriter(ManifestWriterV2):
    """pyiceberg's v2 manifest writer, with its entry schemas built once."""

    def _with_partition(self, format_version: TableVersion) -> Schema:
        if self._spec is not SPEC or self._schema is not SCHEMA:
            return super()._with_partition(format_version)
        found = _entry_schemas.get(format_version)
        if found is None:
            found = _entry_schemas[format_version] = super()._with_partition(format_version)
        return found


class _DeleteManifestWriter(_DataManifestWriter):
    """pyiceberg 0.12 writes data manifests only; a delete manifest differs in its
    content field and metadata."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


def write_manifest(location: str, snapshot_id: int, sequence_number: int, deletes: bool,
                   added: Iterable[DataFile], existing: Iterable[ManifestEntry],
                   removed: Iterable[ManifestEntry]) -> tuple[ManifestFile, bytes]:
    """A manifest of `added` files (of this snapshot, whose sequence number is
    `sequence_number`), `existing` entries carried from the previous snapshot and
    `removed` ones marked deleted; its ManifestFile and bytes."""
    out = MemoryOutputFile(location)
    kind = _DeleteManifestWriter if deletes else _DataManifestWriter
    live: list[ManifestEntry] = []
    with kind(SPEC, SCHEMA, out, snapshot_id, COMPRESSION) as writer:
        for data_file in added:
            writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED,
                                               snapshot_id=snapshot_id, data_file=data_file))
            live.append(ManifestEntry.from_args(  # as a reader inherits them
                status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id,
                sequence_number=sequence_number, file_sequence_number=sequence_number,
                data_file=data_file))
        for entry in existing:
            writer.existing(entry)
            live.append(ManifestEntry.from_args(
                status=ManifestEntryStatus.EXISTING, snapshot_id=entry.snapshot_id,
                sequence_number=entry.sequence_number,
                file_sequence_number=entry.file_sequence_number, data_file=entry.data_file))
        for entry in removed:
            writer.delete(entry)
    _keep(location, live)
    return writer.to_manifest_file(), out.data


def write_list(location: str, snapshot_id: int, parent: int | None, sequence_number: int,
               manifests: list[ManifestFile]) -> bytes:
    out = MemoryOutputFile(location)
    with write_manifest_list(2, out, snapshot_id, parent, sequence_number,
                             COMPRESSION) as writer:
        writer.add_manifests(manifests)
    return out.data


def read_list(table_io: TableIO, location: str) -> list[ManifestFile]:
    return list(read_manifest_list(table_io.new_input(location)))


def entries(table_io: TableIO, manifest: ManifestFile) -> list[ManifestEntry]:
    """The live entries of `manifest` (sequence numbers inherited as readers do)."""
    found = _entries.get(manifest.manifest_path)
    if found is not None:
        return list(found)
    fetched = manifest.fetch_manifest_entry(table_io, discard_deleted=True)
    _keep(manifest.manifest_path, fetched)
    return fetched


def _keep(location: str, live: list[ManifestEntry]) -> None:
    _entries.put(location, list(live))


def forget_entries() -> None:
    """Empty the kept entries (for tests: a reader in a process of its own)."""
    _entries.clear()


def data_file(**fields: Any) -> DataFile:
    return DataFile.from_args(_table_format_version=2, **fields)
