"""Reading one planned task on an executor, as Arrow record batches.

File tasks open their file through the partition's volume, rebuilt here from the spec
the task carries (`volume_from_spec(spec).fetch(relative)`: the file itself in a local
data directory; on S3 a copy downloaded into this process's read cache, with the AWS
settings of this process's environment), deletion vectors likewise. They read it
through `SealedSegment`, the store's own reader: it
checks the file's size and CRC32C against the manifest before parsing (a damaged footer
can crash a Parquet reader rather than fail it), verifies page checksums, and slices the
first row group at the task's start offset. The task keeps the rows its `FileRows`
(storage/view_rows.py, evaluated by the driver at planning) puts in the view: minus a
ledger file's deletion vector (storage/deletion.py), DeleteRecords, retention.ms on
compact,delete and expired tombstones, below the end offset. Row groups go to Spark as
Arrow batches, so no Python object is built per record.

Tail tasks read the unsealed log through the partition's read API, a bounded chunk at
a time, and stop at the end offset the driver planned, so the DataFrame is the snapshot
taken at planning even while a writer appends.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from compactlog.errors import ConflictError, CorruptionError, RetryableError
from compactlog.spark.kafka_schema import spark_batches
from compactlog.spark.read_plan import FilePart, TailPart
from compactlog.storage import (
    RECORD_COLUMNS,
    Partition,
    SealedSegment,
    SegmentMissingError,
    read_deletion_vector,
)

TAIL_CHUNK_RECORDS = 50_000
TAIL_CHUNK_BYTES = 16 * 1024 * 1024


def read_part(part: FilePart | TailPart) -> Iterator[pa.RecordBatch]:
    if isinstance(part, FilePart):
        return read_file(part)
    return read_tail(part)


def read_file(part: FilePart) -> Iterator[pa.RecordBatch]:
    volume = part.open_volume()
    try:
        segment = SealedSegment(volume.fetch(part.relative), part.info)
    except FileNotFoundError as error:
        raise _deleted(part) from error
    rows = part.rows
    # The row condition's own columns are read too (a ledger file's tombstone columns).
    columns = RECORD_COLUMNS + [c for c in rows.condition.columns if c not in RECORD_COLUMNS]
    end = rows.condition.end_offset
    try:
        info = part.info  # a ledger file's deletion vector: its offsets are not read
        deleted = (read_deletion_vector(volume.fetch(part.sibling(info.dv_file)),
                                        info.dv_size_bytes, info.dv_crc32c)
                   if info.dv_file else None)
        for table in segment.iter_tables(part.start_offset, columns):
            past_end = (end is not None and table.num_rows > 0
                        and table.column("offset")[-1].as_py() >= end - 1)
            yield from spark_batches(rows.keep(table, deleted), part.topic, part.partition)
            if past_end:
                break  # a streaming micro-batch ends in this file: not the next row group
    except (SegmentMissingError, FileNotFoundError) as error:
        raise _deleted(part) from error
    except CorruptionError as error:
        if part.local_path is not None:
            raise
        # Checked on the downloaded copy: name the object, not the executor's cache.
        raise CorruptionError(part.where, error.detail) from error
    finally:
        segment.close()


def _deleted(part: FilePart) -> RetryableError:
    # Retention or a newer compaction deleted the file after the query was planned.
    return RetryableError(
        f"{part.where} ({part.topic}/{part.partition}) was deleted after the query was "
        "planned (by retention or a newer compaction); run the query again"
    )


def read_tail(part: TailPart) -> Iterator[pa.RecordBatch]:
    # One partition, opened read-only, rather than LogStore.open(...).topic(T): that
    # would open (and scan the active log of) every partition of the topic in every
    # tail task.
    config = part.config
    partition = Partition(Path(part.directory), part.topic, part.partition,
                          lambda: config, writable=False).open()
    try:
        offset = part.start_offset
        while offset < part.end_offset:
            table = partition.read_table(offset, TAIL_CHUNK_RECORDS, TAIL_CHUNK_BYTES)
            offsets = table.column("offset")
            if not table.num_rows or offsets[0].as_py() != offset:
                # Raw offsets are dense, so a gap means the records were deleted since
                # planning (retention of a segment sealed meanwhile).
                raise ConflictError(
                    f"{partition.name}: offset {offset} is gone since the query was "
                    "planned; run the query again"
                )
            wanted = int(np.searchsorted(offsets.to_numpy(), part.end_offset))
            yield from spark_batches(table.slice(0, wanted), part.topic, part.partition)
            offset += wanted
            if wanted < table.num_rows:
                break
    finally:
        partition.close()
