"""A topic's sealed part, raw or compacted, as a pyarrow dataset for any Arrow engine
(DuckDB, Polars, pyarrow), from a local data directory or an s3:// location.

    from compactlog.tables import view_dataset
    prices = view_dataset("s3://bucket/prefix", "prices", "compacted")
    duckdb.sql("SELECT count(*) FROM prices")          # DuckDB scans it (and pushes filters)
    polars.scan_pyarrow_dataset(prices).collect()      # so does Polars

Invariant: the dataset holds exactly the rows of the view that are sealed, as of one
snapshot of each partition's manifest taken when it is made: for the raw view, the sealed
segments' rows from the log start offset; for the compacted view, the ledger files' rows
minus their deletion vectors' offsets, then the rows of the sealed segments above the
horizon. That is the Reader's view below each partition's sealed end (records still in
log segments are on the writer's disk, in Kafka's format, and are not in it). It reads
only the files the manifest lists (never a listing of the folders), which are never
modified once listed. A file that retention or a newer compaction deletes after the
dataset was made fails the scan: make the dataset again.

The files are read through `pyarrow.fs`: `LocalFileSystem`, or on S3 an `S3FileSystem`
configured from the standard AWS settings of this process's environment
(`S3Settings.from_env().pyarrow_filesystem()`). Each file is a fragment whose partition
expression gives two constant columns, `partition` and `ledger` (whether the row is from
a ledger file); the view's per-file conditions are a filter on the dataset
(`Dataset.filter`), which engines apply when they scan it. Deletion vectors are read
when the dataset is made, through the store (size and CRC32C checked), and go into that
filter as offset sets.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
from pyarrow import fs

from compactlog.errors import UserError
from compactlog.storage.deletion import read_deletion_vector
from compactlog.storage.location import Location, S3Settings
from compactlog.storage.manifest import LEDGER_DIR, SEGMENT_DIR
from compactlog.storage.partition import Partition
from compactlog.storage.sealed import RECORD_COLUMNS, SCHEMA
from compactlog.storage.store import LogStore
from compactlog.storage.volume import ObjectVolume

VIEWS = ("raw", "compacted")

# The dataset's columns: the partition and where the row is from, then the records'.
DATASET_SCHEMA = pa.schema(
    [pa.field("partition", pa.int32(), nullable=False),
     pa.field("ledger", pa.bool_(), nullable=False)]
    + [SCHEMA.field(name) for name in RECORD_COLUMNS]
)


@dataclass(frozen=True)
class ViewFile:
    """One Parquet file of a view: rows with offsets from `start_offset` on, minus the
    `deleted` offsets (a ledger file's deletion vector), are in the view."""

    partition: int
    path: str  # in the view's filesystem: a local path, or BUCKET/KEY on S3
    ledger: bool
    start_offset: int
    deleted: np.ndarray | None = None


@dataclass(frozen=True)
class ViewFiles:
    """The files of one view of a topic and the filesystem that reads them."""

    topic: str
    view: str
    filesystem: fs.FileSystem
    files: tuple[ViewFile, ...]


def view_files(location: str | os.PathLike[str], topic: str, view: str = "compacted",
               partitions: Sequence[int] | None = None) -> ViewFiles:
    """The files that hold the sealed part of `view` ("raw" or "compacted") of `topic`,
    from each partition's current manifest (see the module's invariant)."""
    if view not in VIEWS:
        raise UserError(f"unknown view {view!r}: use 'raw' or 'compacted'")
    where = Location.parse(location)
    if not where.is_s3:
        return _view_files(LogStore.open(location, read_only=True), topic, view, partitions,
                           fs.LocalFileSystem())
    filesystem = S3Settings.from_env().pyarrow_filesystem()
    # A local directory of our own: the manifests are all we read, and no writer's logs.
    with tempfile.TemporaryDirectory(prefix="compactlog-view-") as local_dir:
        return _view_files(LogStore.open(where, read_only=True, local_dir=local_dir), topic,
                           view, partitions, filesystem)


def _view_files(store: LogStore, topic_name: str, view: str,
                partitions: Sequence[int] | None, filesystem: fs.FileSystem) -> ViewFiles:
    with store:
        topic = store.topic(topic_name)
        indexes = range(len(topic.partitions)) if partitions is None else partitions
        found: list[ViewFile] = []
        for index in indexes:
            found.extend(_partition_files(topic.partition(index), view))
        return ViewFiles(topic_name, view, filesystem, tuple(found))


def _partition_files(partition: Partition, view: str) -> list[ViewFile]:
    manifest = partition.manifest
    start = manifest.log_start_offset
    found = []
    if view == "compacted" and manifest.horizon is not None:
        for info in manifest.ledger:
            deleted = None
            if info.dv_file:
                dv = partition.data_path(f"{LEDGER_DIR}/{info.dv_file}")
                deleted = read_deletion_vector(dv, info.dv_size_bytes, info.dv_crc32c)
            found.append(ViewFile(partition.index, _path(partition, LEDGER_DIR, info.file),
                                  True, info.base_offset, deleted))
        start = max(start, manifest.horizon + 1)
    for info in manifest.segments:
        if info.last_offset >= start:
            found.append(ViewFile(partition.index, _path(partition, SEGMENT_DIR, info.file),
                                  False, start))
    return found


def _path(partition: Partition, folder: str, name: str) -> str:
    volume = partition.volume
    relative = f"{folder}/{name}"
    if isinstance(volume, ObjectVolume):
        return f"{volume.bucket}/{volume.key(relative)}"
    return str(Path(volume.path_of(relative)).resolve())


def view_dataset(location: str | os.PathLike[str], topic: str, view: str = "compacted",
                 partitions: Sequence[int] | None = None) -> ds.Dataset:
    """The sealed part of `view` of `topic` as a filtered pyarrow dataset, with columns
    partition, ledger, offset, timestamp, key, value, headers (see the module's
    invariant). DuckDB and Polars (`pl.scan_pyarrow_dataset`) scan it directly."""
    return dataset_of(view_files(location, topic, view, partitions))


def dataset_of(files: ViewFiles) -> ds.Dataset:
    """The dataset over `files`, filtered to the view's rows."""
    guarantees = [
        (ds.field("partition") == pa.scalar(f.partition, pa.int32()))
        & (ds.field("ledger") == pa.scalar(f.ledger)) for f in files.files
    ]
    dataset = ds.FileSystemDataset.from_paths(
        [f.path for f in files.files], schema=DATASET_SCHEMA, format=ds.ParquetFileFormat(),
        filesystem=files.filesystem, partitions=guarantees)
    conditions: list[ds.Expression] = []
    by_partition: dict[tuple[int, bool], list[ViewFile]] = {}
    for f in files.files:
        by_partition.setdefault((f.partition, f.ledger), []).append(f)
    for (partition, ledger), group in sorted(by_partition.items()):
        here = ((ds.field("partition") == pa.scalar(partition, pa.int32()))
                & (ds.field("ledger") == pa.scalar(ledger)))
        if ledger:
            deleted = [f.deleted for f in group if f.deleted is not None and len(f.deleted)]
            if deleted:
                offsets = pa.array(np.concatenate(deleted), pa.int64())
                here = here & ~ds.field("offset").isin(offsets)
        else:
            # One start per partition: the log start, or the horizon + 1.
            here = here & (ds.field("offset") >= min(f.start_offset for f in group))
        conditions.append(here)
    if not conditions:
        return dataset
    condition = conditions[0]
    for other in conditions[1:]:
        condition = condition | other
    return dataset.filter(condition)
