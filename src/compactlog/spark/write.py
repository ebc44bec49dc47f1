"""Appending a DataFrame to a topic: tasks stage their rows, the driver appends them.

The store has one writer per data directory (a lock, DataDirLockedError), so appends
happen in one place: the job's commit on the driver. Each task writes its rows, already
in the store's column types, to an Arrow IPC file under
`<data dir>/spark-staging/<job id>/`, and returns the file's name as its commit message.
When every task has succeeded, `commit` takes the writer lock once, appends the files in
task order, and removes the staging directory; `abort` only removes it.

Why this, and not tasks taking the lock in turn: a failed or retried task then appends
nothing (Spark passes commit only the messages of successful attempts), a job that fails
appends nothing, and the lock is held once, briefly. The cost is one extra copy of the
data, and staging needs the data directory on a filesystem the executors share with the
driver, as reading does. `commit` checks every record first (null keys on a compacted
topic, max.message.bytes, partition numbers) and appends only if all pass, so bad input
appends nothing; a driver crash in the middle of the append pass can still leave a
prefix appended (the store's appends are atomic per batch, not per job).

Rows: `key` and `value` (binary or string; null value = tombstone), optional `partition`
(int; null or absent = by key, with Kafka's partitioner), `timestamp` (bigint ms or a
timestamp; null or absent = append time) and `headers` (array<struct<key: string,
value: binary or string>>). Within a partition, records keep the DataFrame's order.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from compactlog.errors import DataDirLockedError, UserError
from compactlog.spark.options import WriteOptions
from compactlog.storage import (
    HEADER_TYPE,
    LogStore,
    NullKeyPartitioner,
    ProducerRecord,
    Topic,
    partitions_for_keys,
)

STAGING_DIR = "spark-staging"
STAGED_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("partition", pa.int32()),
    ("timestamp", pa.int64()), ("headers", HEADER_TYPE),
])
_BYTES = (BinaryType, StringType)
_ALLOWED: dict[str, tuple[type[DataType], ...]] = {
    "key": _BYTES, "value": _BYTES, "partition": (IntegerType, LongType, ShortType),
    "timestamp": (LongType, TimestampType, TimestampNTZType), "headers": (ArrayType,),
}
# Per-record overhead of the v2 batch format, to keep each append under max.message.bytes.
RECORD_OVERHEAD = 32


def check_input_schema(schema: StructType) -> None:
    """Refuse, at planning, a DataFrame the writer cannot append."""
    names = schema.fieldNames()
    for required in ("key", "value"):
        if required not in names:
            raise UserError(f"the compactlog writer needs a {required!r} column "
                            f"(binary or string); the DataFrame has {names}")
    for field in schema.fields:
        allowed = _ALLOWED.get(field.name)
        if allowed is None:
            raise UserError(f"the compactlog writer does not know column {field.name!r}; "
                            f"it takes {', '.join(_ALLOWED)} (select those)")
        if not isinstance(field.dataType, allowed) or (
            field.name == "headers" and not _is_header_type(field.dataType)
        ):
            raise UserError(f"column {field.name!r} has type {field.dataType.simpleString()}, "
                            f"which the compactlog writer cannot append")


def _is_header_type(data_type: DataType) -> bool:
    element = data_type.elementType if isinstance(data_type, ArrayType) else None
    if not isinstance(element, StructType) or element.fieldNames() != ["key", "value"]:
        return False
    key, value = (field.dataType for field in element.fields)
    return isinstance(key, StringType) and isinstance(value, _BYTES)


@dataclass(frozen=True)
class StagedFile(WriterCommitMessage):
    task: int
    path: str
    rows: int


@dataclass(frozen=True)
class StagedWrite:
    options: WriteOptions
    job_id: str

    @classmethod
    def start(cls, options: WriteOptions, overwrite: bool) -> StagedWrite:
        if overwrite:
            raise UserError("compactlog topics are append-only logs: write with "
                            "mode('append')")
        # Fail at planning, not after every task has run, on a wrong path or topic.
        with LogStore.open(options.path, read_only=True) as store:
            store.topic(options.topic)
        return cls(options, uuid.uuid4().hex)

    @property
    def directory(self) -> Path:
        return Path(self.options.path) / STAGING_DIR / self.job_id

    def stage(self, batches: Iterator[pa.RecordBatch]) -> StagedFile:
        """Runs in a task: write its rows to one staging file, in the store's types."""
        context = TaskContext.get()
        task = context.partitionId() if context is not None else 0
        self.directory.mkdir(parents=True, exist_ok=True)
        # A retried attempt writes its own file; only the successful one is committed.
        path = self.directory / f"{task:06d}-{uuid.uuid4().hex[:8]}.arrow"
        rows = 0
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, STAGED_SCHEMA) as out:
            for batch in batches:
                out.write_batch(_normalized(batch))
                rows += batch.num_rows
        return StagedFile(task, str(path), rows)

    def commit(self, files: list[StagedFile]) -> None:
        """Runs on the driver once every task succeeded: check everything, then append."""
        files = sorted(files, key=lambda staged: staged.task)
        try:
            try:
                store = LogStore.open(self.options.path)
            except DataDirLockedError as error:
                raise UserError(
                    f"the compactlog writer appends when the Spark job commits, but {error}"
                ) from None
            with store:
                topic = store.topic(self.options.topic)
                for partition, records in _appends(topic, files):
                    topic.partition(partition).prepare(records)  # raises on bad input
                for partition, records in _appends(topic, files):
                    store.append(topic.name, records, partition=partition)
        finally:
            self.discard()

    def discard(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def _normalized(batch: pa.RecordBatch) -> pa.RecordBatch:
    columns: list[pa.Array] = []
    for field in STAGED_SCHEMA:
        index = batch.schema.get_field_index(field.name)
        if index < 0:
            columns.append(pa.nulls(batch.num_rows, field.type))
            continue
        column = batch.column(index)
        if field.name == "timestamp" and pa.types.is_timestamp(column.type):
            per_ms = {"s": 0, "ms": 1, "us": 1000, "ns": 1_000_000}[column.type.unit]
            column = column.cast(pa.int64())
            column = pc.multiply(column, 1000) if per_ms == 0 else pc.divide(column, per_ms)
        columns.append(column.cast(field.type))
    return pa.RecordBatch.from_arrays(columns, schema=STAGED_SCHEMA)


def _appends(topic: Topic, files: list[StagedFile]) -> Iterator[tuple[int, list[ProducerRecord]]]:
    """(partition, records) appends, in order, each one record batch under the size limit.

    Deterministic, so that the check pass and the append pass route alike.
    """
    count = len(topic.partitions)
    budget = max(topic.config["max.message.bytes"] // 2, 1)
    keyless = NullKeyPartitioner()
    for staged in files:
        with pa.memory_map(staged.path) as source:
            reader = pa.ipc.open_file(source)
            for index in range(reader.num_record_batches):
                batch = reader.get_batch(index).to_pydict()
                keys: list[bytes | None] = batch["key"]
                routed = partitions_for_keys(keys, count, keyless.next(count))
                groups: dict[int, list[ProducerRecord]] = {}
                for key, value, partition, timestamp, headers, by_key in zip(
                    keys, batch["value"], batch["partition"], batch["timestamp"],
                    batch["headers"], routed, strict=True,
                ):
                    record = ProducerRecord(key, value, tuple(
                        (h["key"], h["value"]) for h in headers or ()), timestamp)
                    target = by_key if partition is None else partition
                    if not 0 <= target < count:
                        raise UserError(f"row with partition {target}: topic {topic.name!r} "
                                        f"has partitions 0..{count - 1}")
                    groups.setdefault(target, []).append(record)
                for target, records in groups.items():
                    yield from ((target, chunk) for chunk in _chunks(records, budget))


def _chunks(records: list[ProducerRecord], budget: int) -> Iterator[list[ProducerRecord]]:
    chunk: list[ProducerRecord] = []
    size = 0
    for record in records:
        record_size = RECORD_OVERHEAD + len(record.key or b"") + len(record.value or b"") + sum(
            len(name) + len(value or b"") + 8 for name, value in record.headers)
        if chunk and size + record_size > budget:
            yield chunk
            chunk, size = [], 0
        chunk.append(record)
        size += record_size
    if chunk:
        yield chunk
