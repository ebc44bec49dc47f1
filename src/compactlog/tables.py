"""A topic's sealed part, raw or compacted, as a pyarrow dataset for any Arrow engine
(DuckDB, Polars, pyarrow), from a local data directory or an s3:// location.

    from compactlog.tables import view_dataset
    prices = view_dataset("s3://bucket/prefix", "prices", "compacted")
    duckdb.sql("SELECT count(*) FROM prices")          # DuckDB scans it (and pushes filters)
    polars.scan_pyarrow_dataset(prices).collect()      # so does Polars

Invariant: the dataset holds exactly the rows of the view that are sealed, as of one
snapshot of each partition's manifest taken when it is made, and as decided by
storage/view_rows.py, the definition every read path shares: for the raw view, the
sealed segments' rows from the log start offset; for the compacted view, the ledger's
rows in the view (minus deletion vectors, below-DeleteRecords offsets, records past
retention.ms on compact,delete, tombstones past delete.retention.ms, all evaluated when
the dataset is made), then the rows of the sealed segments above the horizon; all below
the high watermark. That is the Reader's view below each partition's sealed end (records
still in log segments are on the writer's disk, in Kafka's format, and are not in it).
It reads only the files the manifest lists (never a listing of the folders), which are
never modified once listed. A file that retention or a newer compaction deletes after
the dataset was made fails the scan: make the dataset again.

The files are read through `pyarrow.fs`: `LocalFileSystem`, or on S3 an `S3FileSystem`
configured from the standard AWS settings of this process's environment
(`S3Settings.from_env().pyarrow_filesystem()`). Each file is a fragment whose partition
expression gives two constant columns, `partition` and `ledger` (whether the row is from
a ledger file); the view's per-file conditions are a filter on the dataset
(`Dataset.filter`), which engines apply when they scan it: the offset and time bounds as
expressions, and the offsets to leave out (a ledger file's deletion vector, read through
the store with its size and CRC32C checked, and its expired tombstones, found from the
file's offset, value_size and tombstone_since_ms columns) as offset sets.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyarrow import fs

from compactlog.backend import Location
from compactlog.backend.s3.settings import S3Settings
from compactlog.errors import UserError
from compactlog.storage import (
    RECORD_COLUMNS,
    SCHEMA,
    FileRows,
    LogStore,
    Partition,
    RowCondition,
    read_deletion_vector,
    rows_of,
)

VIEWS = ("raw", "compacted")

# The dataset's columns: the partition and where the row is from, then the records'.
DATASET_SCHEMA = pa.schema(
    [pa.field("partition", pa.int32(), nullable=False),
     pa.field("ledger", pa.bool_(), nullable=False)]
    + [SCHEMA.field(name) for name in RECORD_COLUMNS]
)


@dataclass(frozen=True)
class ViewFile:
    """One Parquet file of a view: its rows that meet `condition` (the view's condition
    for every file of its partition and kind), minus the `excluded` offsets (a ledger
    file's deletion vector and expired tombstones), are in the view."""

    partition: int
    path: str  # in the view's filesystem: a local path, or BUCKET/KEY on S3
    ledger: bool
    condition: RowCondition
    excluded: np.ndarray | None = None


@dataclass(frozen=True)
class ViewFiles:
    """The files of one view of a topic and the filesystem that reads them."""

    topic: str
    view: str
    filesystem: fs.FileSystem
    files: tuple[ViewFile, ...]


Clock = Callable[[], float]


def view_files(location: str | os.PathLike[str], topic: str, view: str = "compacted",
               partitions: Sequence[int] | None = None, clock: Clock = time.time
               ) -> ViewFiles:
    """The files that hold the sealed part of `view` ("raw" or "compacted") of `topic`,
    from each partition's current manifest, with the view's time rules evaluated at
    `clock()` (see the module's invariant)."""
    if view not in VIEWS:
        raise UserError(f"unknown view {view!r}: use 'raw' or 'compacted'")
    where = Location.parse(location)
    if not where.is_s3:
        return _view_files(LogStore.open(location, read_only=True, clock=clock), topic, view,
                           partitions, fs.LocalFileSystem())
    filesystem = S3Settings.from_env().pyarrow_filesystem()
    # A local directory of our own: the manifests are all we read, and no writer's logs.
    with tempfile.TemporaryDirectory(prefix="compactlog-view-") as local_dir:
        return _view_files(LogStore.open(where, read_only=True, local_dir=local_dir,
                                         clock=clock), topic, view, partitions, filesystem)


def _view_files(store: LogStore, topic_name: str, view: str,
                partitions: Sequence[int] | None, filesystem: fs.FileSystem) -> ViewFiles:
    with store:
        topic = store.topic(topic_name)
        indexes = range(len(topic.partitions)) if partitions is None else partitions
        found: list[ViewFile] = []
        for index in indexes:
            found.extend(_partition_files(topic.partition(index), view, filesystem))
        return ViewFiles(topic_name, view, filesystem, tuple(found))


def _partition_files(partition: Partition, view: str,
                     filesystem: fs.FileSystem) -> list[ViewFile]:
    rows = rows_of(partition, partition.view(), view == "compacted")
    found = []
    for file in rows.files():
        path = _path(partition, file.relative)
        excluded = [_expired_tombstones(file, path, filesystem)]
        if file.dv_relative is not None:
            info = file.info
            excluded.append(read_deletion_vector(partition.data_path(file.dv_relative),
                                                 info.dv_size_bytes, info.dv_crc32c))
        condition = rows.ledger_condition if file.is_ledger else rows.segment_condition
        offsets = np.concatenate(excluded)
        found.append(ViewFile(partition.index, path, file.is_ledger, condition,
                              offsets if len(offsets) else None))
    return found


def _expired_tombstones(file: FileRows, path: str, filesystem: fs.FileSystem) -> np.ndarray:
    """The offsets of `file`'s tombstones past delete.retention.ms: only the narrow
    columns the rule needs are read (on S3, by ranged reads of their column chunks)."""
    if file.condition.tombstone_cutoff_ms is None:
        return np.empty(0, np.int64)
    with filesystem.open_input_file(path) as handle:
        table = pq.read_table(handle,
                              columns=["offset", *file.condition.tombstone_columns])
    return file.expired_tombstones(table)


def _path(partition: Partition, relative: str) -> str:
    # pyarrow's S3 filesystem names an object bucket/key, without the scheme.
    return partition.volume.url(relative).removeprefix("s3://")


def view_dataset(location: str | os.PathLike[str], topic: str, view: str = "compacted",
                 partitions: Sequence[int] | None = None, clock: Clock = time.time
                 ) -> ds.Dataset:
    """The sealed part of `view` of `topic` as a filtered pyarrow dataset, with columns
    partition, ledger, offset, timestamp, key, value, headers (see the module's
    invariant). DuckDB and Polars (`pl.scan_pyarrow_dataset`) scan it directly. The
    view's time rules (retention.ms on compact,delete, delete.retention.ms) are
    evaluated at `clock()` when the dataset is made."""
    return dataset_of(view_files(location, topic, view, partitions, clock))


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
        # One condition for every file of the partition and kind (view_rows.py).
        bounds = group[0].condition.bounds_expression()
        if bounds is not None:
            here = here & bounds
        excluded = [f.excluded for f in group if f.excluded is not None]
        if excluded:
            here = here & ~ds.field("offset").isin(pa.array(np.concatenate(excluded),
                                                            pa.int64()))
        conditions.append(here)
    if not conditions:
        return dataset
    condition = conditions[0]
    for other in conditions[1:]:
        condition = condition | other
    return dataset.filter(condition)
