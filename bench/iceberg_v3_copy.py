"""A diagnostic for bench/iceberg_tables.py: a copy of a state table's current snapshot
as an Iceberg v3 table whose deletes are deletion vectors (Puffin `deletion-vector-v1`
blobs) instead of v2 position-delete files, to measure what DuckDB pays for each.

Invariant: the copy lists the same data files (the ledger files, not copied) with the
same deleted positions, or, with `contiguous=True`, the same number of positions per
file taken from its first rows (a different answer: it only shows whether DuckDB pays
per deleted row or per vector of rows that holds one). The table's own files are left
as they are; the copy's metadata, manifests and Puffin file go to `folder`.

Not the product's writer: pyiceberg 0.12 writes v1 and v2 manifests only, so the v3
manifest and manifest-list writers below widen pyiceberg's v2 ones to the v3 schemas
(which pyiceberg defines) and assign row lineage (`first_row_id`) as the spec asks of a
new table: data manifests get consecutive row-id ranges from 0.
"""

from __future__ import annotations

import copy
import json
import struct
import uuid
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from pyiceberg.avro.file import AvroOutputFile
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    MANIFEST_LIST_FILE_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestListWriterV2,
    ManifestWriterV2,
    read_manifest_list,
)
from pyroaring import BitMap

from compactlog.iceberg.schema import SCHEMA, SPEC

PUFFIN_MAGIC = b"PFA1"
DV_MAGIC = b"\xd1\xd3\x39\x64"
ROW_POSITION_FIELD = 2147483645  # Iceberg's `_pos` metadata column


class _ManifestWriterV3(ManifestWriterV2):
    def __init__(self, output: Any, snapshot_id: int, deletes: bool) -> None:
        super().__init__(SPEC, SCHEMA, output, snapshot_id, "deflate")
        self.deletes = deletes

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES if self.deletes else ManifestContent.DATA

    @property
    def version(self) -> Any:
        return 3

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes" if self.deletes else "data"}

    def new_writer(self) -> AvroOutputFile[ManifestEntry]:
        return AvroOutputFile[ManifestEntry](
            output_file=self._output_file, file_schema=self._with_partition(3),
            record_schema=self._with_partition(3), schema_name="manifest_entry",
            metadata=self._meta)


class _ManifestListWriterV3(ManifestListWriterV2):
    def __init__(self, output: Any, snapshot_id: int, sequence_number: int) -> None:
        super().__init__(output, snapshot_id, None, sequence_number, "deflate")
        self._format_version = 3
        self._meta = {**self._meta, "format-version": "3", "first-row-id": "0"}
        self.next_row_id = 0

    def __enter__(self) -> _ManifestListWriterV3:
        self._writer = AvroOutputFile[ManifestFile](
            output_file=self._output_file, record_schema=MANIFEST_LIST_FILE_SCHEMAS[3],
            file_schema=MANIFEST_LIST_FILE_SCHEMAS[3], schema_name="manifest_file",
            metadata=self._meta)
        self._writer.__enter__()
        return self

    def prepare_manifest(self, manifest_file: ManifestFile) -> ManifestFile:
        prepared = super().prepare_manifest(manifest_file)
        fields = {field.name: getattr(prepared, field.name)
                  for field in MANIFEST_LIST_FILE_SCHEMAS[2].fields}
        first_row_id = None
        if prepared.content == ManifestContent.DATA:
            first_row_id = self.next_row_id
            self.next_row_id += ((prepared.added_rows_count or 0)
                                 + (prepared.existing_rows_count or 0))
        return ManifestFile.from_args(_table_format_version=3, **fields,
                                      first_row_id=first_row_id)


def deletion_vector(positions: np.ndarray) -> bytes:
    """A `deletion-vector-v1` blob: length, magic, the 64-bit portable Roaring bitmap (one
    32-bit bitmap, key 0: a ledger file has fewer than 2^32 rows), CRC-32."""
    vector = struct.pack("<QI", 1, 0) + BitMap(positions.astype(np.uint32)).serialize()
    body = DV_MAGIC + vector
    return struct.pack(">I", len(body)) + body + struct.pack(">I", zlib.crc32(body))


def current_snapshot(table: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    hint = int((table / "metadata" / "version-hint.text").read_text())
    metadata = json.loads((table / "metadata" / f"v{hint}.metadata.json").read_text())
    return metadata, next(item for item in metadata["snapshots"]
                          if item["snapshot-id"] == metadata["current-snapshot-id"])


def v3_copy(table: Path, folder: Path, contiguous: bool = False) -> str:
    """The path of a v3 metadata file for `table`'s current snapshot (see above)."""
    folder.mkdir(parents=True, exist_ok=True)
    metadata, snapshot = current_snapshot(table)
    table_io = PyArrowFileIO()
    data: list[ManifestEntry] = []
    deletes: list[ManifestEntry] = []
    for manifest in read_manifest_list(table_io.new_input(snapshot["manifest-list"])):
        found = manifest.fetch_manifest_entry(table_io, discard_deleted=True)
        (data if manifest.content == ManifestContent.DATA else deletes).extend(found)
    snapshot_id, sequence_number = snapshot["snapshot-id"], snapshot["sequence-number"]

    puffin = folder / f"{uuid.uuid4()}-deletes.puffin"  # 1. one Puffin file, a blob each
    body, blobs, vectors = bytearray(PUFFIN_MAGIC), [], []
    for entry in deletes:
        rows = pq.read_table(entry.data_file.file_path, columns=["file_path", "pos"])
        referenced = rows.column("file_path")[0].as_py()
        positions = rows.column("pos").to_numpy()
        if contiguous:
            positions = np.arange(len(positions))
        blob = deletion_vector(positions)
        blobs.append({"type": "deletion-vector-v1", "fields": [ROW_POSITION_FIELD],
                      "snapshot-id": -1, "sequence-number": -1, "offset": len(body),
                      "length": len(blob), "properties": {
                          "referenced-data-file": referenced,
                          "cardinality": str(len(positions))}})
        vectors.append((entry.data_file, referenced, len(body), len(blob), len(positions)))
        body += blob
    footer = json.dumps({"blobs": blobs, "properties": {"created-by": "compactlog bench"}})
    body += (PUFFIN_MAGIC + footer.encode() + struct.pack("<i", len(footer.encode()))
             + bytes(4) + PUFFIN_MAGIC)
    puffin.write_bytes(body)

    manifests = []  # 2. a data and a delete manifest (if any deletes), v3
    for kind in ("data", "deletes") if vectors else ("data",):
        location = str(folder / f"{uuid.uuid4()}-{kind}.avro")
        with _ManifestWriterV3(table_io.new_output(location), snapshot_id,
                               kind == "deletes") as writer:
            for data_entry in (data if kind == "data" else []):
                source = data_entry.data_file
                added = DataFile.from_args(
                    _table_format_version=3, content=source.content,
                    file_path=source.file_path, file_format=source.file_format,
                    partition=source.partition, record_count=source.record_count,
                    file_size_in_bytes=source.file_size_in_bytes)
                added.spec_id = source.spec_id
                writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED,
                                                   snapshot_id=snapshot_id, data_file=added))
            for source, referenced, offset, length, cardinality in (
                    vectors if kind == "deletes" else []):
                vector = DataFile.from_args(
                    _table_format_version=3, content=DataFileContent.POSITION_DELETES,
                    file_path=str(puffin), file_format=FileFormat.PUFFIN,
                    partition=source.partition, record_count=cardinality,
                    file_size_in_bytes=len(body), referenced_data_file=referenced,
                    content_offset=offset, content_size_in_bytes=length)
                vector.spec_id = source.spec_id
                writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED,
                                                   snapshot_id=snapshot_id, data_file=vector))
        manifests.append(writer.to_manifest_file())

    manifest_list = str(folder / f"snap-{snapshot_id}-{uuid.uuid4()}.avro")  # 3.
    with _ManifestListWriterV3(table_io.new_output(manifest_list), snapshot_id,
                               sequence_number) as list_writer:
        list_writer.add_manifests(manifests)

    copied = copy.deepcopy(metadata)  # 4. one snapshot, with its row lineage
    copied.update({"format-version": 3, "next-row-id": list_writer.next_row_id,
                   "metadata-log": [],
                   "snapshot-log": [{"snapshot-id": snapshot_id,
                                     "timestamp-ms": snapshot["timestamp-ms"]}],
                   "refs": {"main": {"snapshot-id": snapshot_id, "type": "branch"}}})
    only = {key: value for key, value in snapshot.items() if key != "parent-snapshot-id"}
    copied["snapshots"] = [only | {"manifest-list": manifest_list, "first-row-id": 0,
                                   "added-rows": list_writer.next_row_id}]
    path = folder / "v3.metadata.json"
    path.write_text(json.dumps(copied))
    return str(path)
