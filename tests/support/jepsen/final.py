"""The state after a run, read with no node running: the raw log of every partition
and each partition's manifest, through a read-only LogStore on moto directly (never the
proxy); and the compacted view from the read paths that work without a node: the
Reader (Partition.read_compacted), and compactlog.tables.view_dataset through DuckDB
and Polars. (Kafka Fetch is read before the nodes stop: clients.read_view.)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from compactlog.client import Reader
from compactlog.storage.records import Record
from compactlog.storage.store import LogStore
from compactlog.tables import view_dataset, view_files
from support.jepsen.clients import RID

# (offset, key, value): a record as every read path can give it.
Row = tuple[int, bytes | None, bytes | None]


@dataclass
class FinalPartition:
    topic: str
    index: int
    log_start: int
    deleted_below: int
    horizon: int | None
    end: int  # the high watermark: one past the last offset
    records: list[Record]
    by_offset: dict[int, Record] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_offset = {record.offset: record for record in self.records}


@dataclass
class Final:
    partitions: dict[tuple[str, int], FinalPartition]
    views: dict[str, dict[int, list[Row]]]  # read path -> partition -> rows
    view_errors: dict[str, str]
    # (topic, partition, offset) -> (producer id, epoch, base sequence, batch base
    # offset) of the batch that holds it, from the sealed segments' batch columns.
    batches: dict[tuple[str, int, int], tuple[int, int, int, int]] = field(
        default_factory=dict)


def rid(record: Record) -> str | None:
    for name, value in record.headers:
        if name == RID and value is not None:
            return value.decode()
    return None


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def read_all(read: object, start: int) -> list[Record]:
    assert callable(read)
    found: list[Record] = []
    offset = start
    while True:
        batch = read(offset, 10_000, 1 << 30)
        if not batch:
            return found
        found.extend(batch)
        offset = batch[-1].offset + 1


def read_final(where: str, moto_env: dict[str, str], local_dir: Path,
               topics: dict[str, int], compacted: str) -> Final:
    """Everything the checker compares, as the bucket holds it now."""
    partitions: dict[tuple[str, int], FinalPartition] = {}
    views: dict[str, dict[int, list[Row]]] = {"reader": {}}
    errors: dict[str, str] = {}
    with environment(moto_env):
        with LogStore.open(where, read_only=True, local_dir=local_dir) as store:
            for name, count in topics.items():
                for index in range(count):
                    partition = store.topic(name).partition(index)
                    partition.refresh()
                    manifest = partition.manifest
                    records = read_all(partition.read, partition.log_start_offset)
                    partitions[(name, index)] = FinalPartition(
                        name, index, manifest.log_start_offset, manifest.deleted_below,
                        manifest.horizon, partition.high_watermark, records)
                    if name == compacted:
                        reader = Reader(store, name, index, "earliest", read_compacted=True)
                        rows: list[Row] = []
                        while batch := reader.poll(10_000):
                            rows.extend((r.offset, r.key, r.value) for r in batch)
                        views["reader"][index] = rows
        try:
            dataset = view_dataset(where, compacted, "compacted")
            import duckdb

            connection = duckdb.connect()
            connection.register("view", dataset)
            table = connection.execute(
                'SELECT "partition", "offset", "key", "value" FROM view '
                'ORDER BY "partition", "offset"').fetchall()
            views["duckdb"] = _by_partition(table, topics[compacted])
            import polars as pl

            frame = pl.scan_pyarrow_dataset(dataset).select(
                ["partition", "offset", "key", "value"]).collect().sort(
                ["partition", "offset"])
            views["polars"] = _by_partition(frame.rows(), topics[compacted])
        except Exception as error:
            errors["tables"] = f"{type(error).__name__}: {error}"
        batches: dict[tuple[str, int, int], tuple[int, int, int, int]] = {}
        for name in topics:
            try:
                files = view_files(where, name, "raw")
                for item in files.files:
                    table = pq.read_table(item.path, filesystem=files.filesystem, columns=[
                        "offset", "producer_id", "producer_epoch", "base_sequence",
                        "batch_base_offset"])
                    for row in table.to_pylist():
                        batches[(name, item.partition, row["offset"])] = (
                            row["producer_id"], row["producer_epoch"], row["base_sequence"],
                            row["batch_base_offset"])
            except Exception as error:
                errors.setdefault("batch columns (detail only)", repr(error))
    return Final(partitions, views, {k: v for k, v in errors.items() if "detail" not in k},
                 batches)


def _by_partition(rows: list[tuple[object, ...]], count: int) -> dict[int, list[Row]]:
    found: dict[int, list[Row]] = {p: [] for p in range(count)}
    for partition, offset, key, value in rows:
        assert isinstance(partition, int) and isinstance(offset, int)
        found[partition].append((offset, _bytes(key), _bytes(value)))
    return found


def _bytes(value: object) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"not bytes: {value!r}")
