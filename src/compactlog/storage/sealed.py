"""Sealed segments: immutable Parquet files, one row per record, sorted by offset.

This is the one module that knows the on-disk format of sealed data, so that the
format can change in one place (Arrow IPC reads faster; Parquet is what Spark, DuckDB
and Polars read natively, and it compresses real payloads several-fold).

Columns (see docs/querying.md): the record itself (offset, timestamp, key, value,
headers), `value_size` so that compaction can find tombstones without reading values,
and the batch fields needed to rebuild Kafka record batches for the wire (batch base and
last offset, attributes, producer id, epoch and base sequence).

Row groups hold about `parquet.row.group.bytes` of records, and carry min/max statistics
on offset and timestamp, so a read seeks to its row group from the footer alone. The key
column has a dictionary only where keys repeat (`keys_repeat`, decided by a file's first
row group; never in ledger files, whose live keys are distinct): elsewhere it only costs.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any

import crc32c
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from aiokafka.record._crecords import DefaultRecordBatch

from compactlog import faults, fsutil
from compactlog.errors import CorruptionError
from compactlog.storage.gcpause import gc_paused
from compactlog.storage.manifest import SegmentInfo
from compactlog.storage.records import BatchHeader, Headers, Record

if TYPE_CHECKING:
    from compactlog.storage.filecache import RowGroupCache, VerifiedFiles

FORMAT_VERSION = "1"
HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
SCHEMA = pa.schema(
    [
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADER_TYPE),
        pa.field("value_size", pa.int32()),
        pa.field("batch_base_offset", pa.int64(), nullable=False),
        pa.field("batch_last_offset", pa.int64(), nullable=False),
        pa.field("batch_attributes", pa.int16(), nullable=False),
        pa.field("producer_id", pa.int64(), nullable=False),
        pa.field("producer_epoch", pa.int16(), nullable=False),
        pa.field("base_sequence", pa.int32(), nullable=False),
    ]
)
RECORD_COLUMNS = ["offset", "timestamp", "key", "value", "headers"]
CHECKSUM_CHUNK = 4 * 1024 * 1024
_new_record = partial(tuple.__new__, Record)
_NO_HEADERS: Headers = ()


class _ColumnBuffer:
    """Columns of decoded records, flushed to Parquet one row group at a time."""

    BATCH_COLUMNS = ("batch_base_offset", "batch_last_offset", "batch_attributes",
                     "producer_id", "producer_epoch", "base_sequence")

    def __init__(self) -> None:
        self.records: list[Any] = []
        self.batch_columns: dict[str, list[int]] = {name: [] for name in self.BATCH_COLUMNS}
        self.nbytes = 0

    def add_batch(self, header: BatchHeader, raw: bytes) -> int:
        records = list(DefaultRecordBatch(raw))
        count = len(records)
        self.records += records
        if header.codec:
            # Row groups are sized in uncompressed record bytes, as documented.
            self.nbytes += sum(
                16 + len(r.key or b"") + len(r.value or b"") for r in records
            )
        else:
            self.nbytes += len(raw)
        for name, item in zip(self.BATCH_COLUMNS, (
            header.base_offset, header.last_offset, header.attributes,
            header.producer_id, header.producer_epoch, header.base_sequence,
        ), strict=True):
            self.batch_columns[name] += repeat(item, count)
        return count

    def to_table(self) -> pa.Table:
        records = self.records
        values = pa.array([r.value for r in records], type=pa.binary())
        columns: dict[str, pa.Array] = {
            "offset": pa.array([r.offset for r in records], type=pa.int64()),
            "timestamp": pa.array([r.timestamp for r in records], type=pa.int64()),
            "key": pa.array([r.key for r in records], type=pa.binary()),
            "value": values,
            "headers": pa.array([r.headers or None for r in records], type=HEADER_TYPE),
            "value_size": pc.binary_length(values),
        }
        for name in self.BATCH_COLUMNS:
            columns[name] = pa.array(self.batch_columns[name], type=SCHEMA.field(name).type)
        table = pa.Table.from_arrays([columns[name] for name in SCHEMA.names], schema=SCHEMA)
        self.__init__()  # type: ignore[misc]
        return table

    def __bool__(self) -> bool:
        return bool(self.records)


@dataclass(frozen=True)
class WriteOptions:
    row_group_bytes: int
    compression: str


# A key dictionary pays when keys repeat: at most this share of a row group's rows
# distinct (bench/key_encoding.py: plain keys read in 0.69-0.75x the time where every key
# is distinct, 0.87-0.96x at a third distinct, 1.2x at 100 keys in 250,000 rows).
KEY_DICTIONARY_MAX_DISTINCT = 0.2


def keys_repeat(table: pa.Table) -> bool:
    """Whether `table`'s keys repeat enough for a key dictionary (see
    KEY_DICTIONARY_MAX_DISTINCT): the first row group decides for its file."""
    keys = table.column("key")
    distinct = pc.count_distinct(keys, mode="only_valid").as_py()
    return bool(distinct <= KEY_DICTIONARY_MAX_DISTINCT * max(1, keys.length() - keys.null_count))


def open_writer(path: Path, schema: pa.Schema, compression: str | Mapping[str, str],
                key_dictionary: bool = True) -> pq.ParquetWriter:
    """A Parquet writer with the layout of sealed data (segments and ledger files alike):
    offset statistics for seeking, delta-encoded offsets, page checksums.

    `key_dictionary=False` where keys do not repeat (`keys_repeat`): always for ledger
    files, whose live keys are distinct, and for segments whose first row group's keys
    are mostly distinct. There a dictionary only costs: for 250,000 distinct keys, plain
    ones read (key and offset) in 0.69x the time, the file writes in 0.88x and is 2%
    smaller; where keys repeat (100 keys), plain reads take 1.2x.
    bench/key_encoding.py, docs/benchmarks.md. `compression`: parquet.compression, or a
    codec per column path (bench/key_encoding.py compares the key column's codecs)."""
    faults.point("write", path)
    dictionary = ["batch_attributes", "producer_id", "producer_epoch"]
    return pq.ParquetWriter(
        path,
        schema,
        compression=compression,
        use_dictionary=["key", *dictionary] if key_dictionary else dictionary,
        column_encoding={
            "offset": "DELTA_BINARY_PACKED",
            "timestamp": "DELTA_BINARY_PACKED",
            "batch_base_offset": "DELTA_BINARY_PACKED",
            "batch_last_offset": "DELTA_BINARY_PACKED",
        },
        write_statistics=["offset", "timestamp", "key"],
        # Page CRCs let a reader find a flipped bit inside a page, not return wrong data.
        write_page_checksum=True,
    )


def write_segment(
    batches: Iterable[tuple[BatchHeader, bytes]],
    path: Path,
    file_name: str,
    options: WriteOptions,
) -> SegmentInfo:
    """Write the given whole, validated batches as one Parquet file at `path` and fsync it.

    `file_name` is the name the file will be published under (recorded in SegmentInfo).
    """
    buffer = _ColumnBuffer()
    writer: pq.ParquetWriter | None = None
    base_offset = last_offset = -1
    record_count = 0
    min_ts, max_ts = 2**63 - 1, -(2**63)
    try:
        with gc_paused():
            for header, raw in batches:
                if base_offset < 0:
                    base_offset = header.base_offset
                last_offset = header.last_offset
                if header.record_count:
                    min_ts = min(min_ts, header.base_timestamp)
                    max_ts = max(max_ts, header.max_timestamp)
                record_count += buffer.add_batch(header, raw)
                if buffer.nbytes >= options.row_group_bytes:
                    group = buffer.to_table()
                    writer = writer or open_segment_writer(path, options.compression, group)
                    writer.write_table(group)
            if buffer:
                group = buffer.to_table()
                writer = writer or open_segment_writer(path, options.compression, group)
                writer.write_table(group)
        writer = writer or open_writer(path, SCHEMA, options.compression)
        writer.add_key_value_metadata(
            {
                "compactlog.format": FORMAT_VERSION,
                "compactlog.base_offset": str(base_offset),
                "compactlog.last_offset": str(last_offset),
            }
        )
    finally:
        if writer is not None:
            writer.close()
    fsutil.fsync_path(path)
    checksum = file_crc32c(path)
    if record_count == 0:
        min_ts = max_ts = 0
    return SegmentInfo(
        file=file_name,
        base_offset=base_offset,
        last_offset=last_offset,
        record_count=record_count,
        size_bytes=path.stat().st_size,
        min_timestamp=min_ts,
        max_timestamp=max_ts,
        sealed_at_ms=int(time.time() * 1000),
        crc32c=checksum,
    )


def open_segment_writer(path: Path, compression: str, first_group: pa.Table) -> pq.ParquetWriter:
    """A segment's writer (a seal's or a merge's), opened at its first row group, whose
    keys choose the key column's encoding (`keys_repeat`). Callers keep it in a variable
    before writing anything, so that a failed write still closes it."""
    return open_writer(path, SCHEMA, compression, key_dictionary=keys_repeat(first_group))


def file_crc32c(path: Path) -> int:
    # One buffer, refilled: a new 4 MiB bytes object per chunk costs its allocation and
    # page faults, which made this 1.45x slower (3.6 against 5.2 GB/s from the page cache).
    checksum = 0
    buffer = memoryview(bytearray(CHECKSUM_CHUNK))
    with open(path, "rb", buffering=0) as handle:
        while filled := handle.readinto(buffer):
            checksum = crc32c.crc32c(buffer[:filled], checksum)
    return checksum


def verify_file(path: Path, size_bytes: int | None, checksum: int | None, what: str) -> None:
    """Prove a Parquet file whole against its manifest entry (size, then CRC32C) before
    any Parquet reader parses it: a damaged footer can make a reader abort the process
    rather than raise. `what` names the file in the error. Paid at disk speed."""
    size = os.stat(path).st_size
    if size_bytes is not None and size != size_bytes:
        raise CorruptionError(path, f"{what}: the file is {size} bytes, the manifest says "
                                    f"{size_bytes}")
    if checksum is not None and (actual := file_crc32c(path)) != checksum:
        raise CorruptionError(path, f"{what}: CRC32C mismatch (manifest {checksum:#010x}, "
                                    f"file {actual:#010x})")


class SegmentMissingError(CorruptionError):
    """A sealed segment listed by the manifest is gone: corrupt, or deleted since the
    reader loaded its manifest (retention, compaction); the reader reloads to tell."""


class SealedSegment:
    """Reads one sealed segment (or ledger file), seeking by the offset statistics of
    its row groups. Opened lazily; `close` releases the file (the store's open-file
    cache, storage/filecache.py, decides when)."""

    def __init__(self, path: Path, info: SegmentInfo, row_groups: RowGroupCache | None = None,
                 verified: VerifiedFiles | None = None) -> None:
        self.path = path
        self.info = info
        self._row_groups = row_groups
        self._verified = verified
        self._file: pq.ParquetFile | None = None
        # Two reads of one cached file may ask to open it at once: one opens it.
        self._opening = threading.Lock()
        self._group_first: list[int] = []
        self._group_last: list[int] = []
        self._group_min_ts: list[int] = []
        self._group_max_ts: list[int] = []

    @property
    def is_open(self) -> bool:
        return self._file is not None

    def _corrupt(self, detail: str) -> CorruptionError:
        return CorruptionError(
            self.path,
            f"sealed segment with offsets {self.info.base_offset}..{self.info.last_offset}: "
            f"{detail}",
        )

    def _verify(self) -> None:
        """Check size and CRC32C (verify_file), once per file while it is remembered."""
        key = (self.path, self.info.size_bytes, self.info.crc32c)
        if self._verified is not None and key in self._verified:
            return
        verify_file(self.path, self.info.size_bytes, self.info.crc32c,
                    f"sealed segment with offsets {self.info.base_offset}.."
                    f"{self.info.last_offset}")
        if self._verified is not None:
            self._verified.add(key)

    def _open(self) -> pq.ParquetFile:
        if self._file is not None:
            return self._file
        with self._opening:
            if self._file is not None:
                return self._file
            return self._open_file()

    def _open_file(self) -> pq.ParquetFile:
        handle: pq.ParquetFile | None = None
        try:
            self._verify()
            handle = pq.ParquetFile(self.path, page_checksum_verification=True)
            meta = handle.metadata
            schema = meta.schema.to_arrow_schema()
            absent = [name for name in RECORD_COLUMNS if schema.get_field_index(name) < 0]
            if absent:
                raise self._corrupt(f"not a sealed segment: no column {', '.join(absent)}")
            offset_col = schema.get_field_index("offset")
            ts_col = schema.get_field_index("timestamp")
            firsts, lasts, min_ts, max_ts = [], [], [], []
            for i in range(meta.num_row_groups):
                group = meta.row_group(i)
                stats = group.column(offset_col).statistics
                ts_stats = group.column(ts_col).statistics
                if stats is None or not stats.has_min_max:
                    raise self._corrupt(f"row group {i} has no offset statistics")
                firsts.append(stats.min)
                lasts.append(stats.max)
                min_ts.append(ts_stats.min if ts_stats is not None else 0)
                max_ts.append(ts_stats.max if ts_stats is not None else 2**63 - 1)
        except FileNotFoundError:
            raise SegmentMissingError(
                self.path,
                f"sealed segment with offsets {self.info.base_offset}..{self.info.last_offset}:"
                " the file is missing",
            ) from None
        except BaseException as error:
            if handle is not None:
                handle.close()
            if isinstance(error, CorruptionError | OSError) or not isinstance(error, Exception):
                raise
            # pyarrow raises many types for damaged files
            raise self._corrupt(f"unreadable Parquet: {error}") from None
        self._group_first, self._group_last = firsts, lasts
        self._group_min_ts, self._group_max_ts = min_ts, max_ts
        self._file = handle
        return handle

    def _read_group(self, index: int, columns: list[str] | None) -> pa.Table:
        key = (self.path, index, tuple(columns) if columns is not None else None)
        if self._row_groups is not None:
            cached = self._row_groups.get(key)
            if cached is not None:
                return cached
        handle = self._open()
        try:
            table = handle.read_row_group(index, columns=columns)
        except OSError:
            raise
        except Exception as error:  # pyarrow raises many types for damaged pages
            raise self._corrupt(f"row group {index} unreadable: {error}") from None
        # Sequential readers ask for the same row group many times in small steps.
        if self._row_groups is not None:
            self._row_groups.put(key, table)
        return table

    def iter_tables(
        self, start_offset: int, columns: list[str] | None = None
    ) -> Iterator[pa.Table]:
        """Row groups from the one holding `start_offset`, sliced to start there.

        `columns`, when given, must include "offset".
        """
        self._open()
        first = bisect.bisect_left(self._group_last, start_offset)
        for index in range(first, len(self._group_last)):
            table = self._read_group(index, columns)
            if self._group_first[index] < start_offset:
                table = table.slice(_count_below(table.column("offset"), start_offset))
            yield table

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """The first offset whose timestamp is >= `timestamp`, or None."""
        self._open()
        for index, max_ts in enumerate(self._group_max_ts):
            if max_ts < timestamp:
                continue
            table = self._read_group(index, ["offset", "timestamp"])
            offsets = table.column("offset").to_pylist()
            for offset, ts in zip(offsets, table.column("timestamp").to_pylist(), strict=True):
                if ts >= timestamp:
                    return int(offset)
        return None


def _count_below(offsets: pa.ChunkedArray, start_offset: int) -> int:
    # Offsets are sorted within a file, so a binary search finds the slice point.
    return bisect.bisect_left(_OffsetView(offsets), start_offset)


class _OffsetView:
    """A sorted offset column, indexable without converting it all to Python ints."""

    def __init__(self, offsets: pa.ChunkedArray) -> None:
        self.array = offsets.combine_chunks() if offsets.num_chunks != 1 else offsets.chunk(0)

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, index: int) -> int:
        value: int = self.array[index].as_py()
        return value


def table_to_records(table: pa.Table) -> list[Record]:
    """Python records from a table with the record columns."""
    with gc_paused():
        return _table_to_records(table)


def _table_to_records(table: pa.Table) -> list[Record]:
    offsets = table.column("offset").to_pylist()
    timestamps = table.column("timestamp").to_pylist()
    keys = table.column("key").to_pylist()
    values = table.column("value").to_pylist()
    headers_col = table.column("headers")
    if headers_col.null_count == len(headers_col) or all(
        len(chunk.values) == 0 for chunk in headers_col.chunks
    ):
        headers: Iterable[Headers] = repeat(_NO_HEADERS)
    else:
        headers = [
            tuple((h["key"], h["value"]) for h in hs) if hs else _NO_HEADERS
            for hs in headers_col.to_pylist()
        ]
    return list(map(_new_record, zip(offsets, timestamps, keys, values, headers, strict=False)))


RECORD_SCHEMA = pa.schema([SCHEMA.field(name) for name in RECORD_COLUMNS])


def records_to_table(records: list[Record]) -> pa.Table:
    """An Arrow table with the record columns, from Python records."""
    return pa.Table.from_arrays(
        [
            pa.array([r.offset for r in records], type=pa.int64()),
            pa.array([r.timestamp for r in records], type=pa.int64()),
            pa.array([r.key for r in records], type=pa.binary()),
            pa.array([r.value for r in records], type=pa.binary()),
            pa.array([list(r.headers) or None for r in records], type=HEADER_TYPE),
        ],
        schema=RECORD_SCHEMA,
    )


def record_bytes(table: pa.Table) -> int:
    """Approximate size of the records in `table`, as counted against read limits."""
    return int(table.column("key").nbytes + table.column("value").nbytes + 16 * table.num_rows)
