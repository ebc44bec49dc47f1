"""Kafka v2 record batches for Fetch: the bytes a consumer gets for a partition.

A Fetch response carries, per partition, a concatenation of v2 record batches. What a
consumer may rely on (shared/notes/kafka-protocol.md §6) decides how they are made:

- Offsets never change, and a batch keeps its original base offset and its original
  *last* offset even when records inside it are gone (Kafka's cleaner does the same with
  `overrideLastOffset`). A consumer advances to base + last_offset_delta + 1 after a
  batch, so keeping the last offset is what carries it over gaps at a batch's tail;
  the records themselves carry their true, possibly sparse, offset deltas.
- The first batch may start before the fetch offset (clients skip records below their
  position), the first batch goes out whole even when it is bigger than max_bytes (or
  a consumer could never get past it), and no later batch is cut: we stop before the
  batch that would go over.

Where the bytes come from:

- Log segments (rolled and active) hold the batches exactly as a producer sent them,
  so they are served as they are, without decoding (`LogSegment.read_raw`).
- Sealed Parquet segments and compacted-ledger files hold one row per record plus the
  batch fields (base and last offset, attributes, producer id, epoch and base
  sequence). Batches are rebuilt from runs of rows with the same batch base offset, by
  aiokafka's compiled builder, uncompressed, or in the codec the topic's
  compression.type names (Kafka stores batches in that codec); then the header fields
  the builder cannot set (last offset delta, attributes) are patched and the CRC32C is
  recomputed.
- The compacted view reads the ledger up to the horizon, then the raw log from
  horizon + 1, as `Partition.read_compacted` does. A fully compacted tail (nothing left
  in the ledger up to the horizon, and nothing after it yet) is answered with one empty
  batch over the rest of the range: a batch with no records is how Kafka lets a
  consumer advance over offsets that no longer hold anything, and without it the
  consumer would sit below the high watermark ("lag never reaches 0"). kafka-python,
  aiokafka and librdkafka all moved their fetch position past it.

The grouping of rows into batches, the density checks and the byte budget are done on
whole Arrow columns with numpy; per record there is only the call into the builder.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable
from contextlib import closing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from aiokafka.record._crecords import DefaultRecordBatchBuilder

from compactlog.errors import CorruptionError
from compactlog.storage import (
    CONTROL_MASK,
    CRC_START,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    NO_PRODUCER_ID,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    PartitionRows,
    SegmentMissingError,
    gc_paused,
    ledger_tables,
    rows_of,
    sealed_tables,
    upper_bound,
    view_start,
    with_view,
)

if TYPE_CHECKING:
    from compactlog.storage import Partition, View

__all__ = ["WIRE_COLUMNS", "WireRead", "empty_batch", "read_batches", "view_start_offset"]

# Every column a rebuilt batch needs (all of the sealed schema but value_size).
WIRE_COLUMNS = [
    "offset", "timestamp", "key", "value", "headers",
    "batch_base_offset", "batch_last_offset", "batch_attributes",
    "producer_id", "producer_epoch", "base_sequence",
]
# Attribute bits a rebuilt batch keeps. The codec bits go (a rebuilt batch has the
# topic's codec, or none), and so does bit 6, KIP-534's "base timestamp is a delete horizon",
# because a rebuilt batch's base timestamp is its first record's timestamp.
KEPT_ATTRIBUTES = TIMESTAMP_TYPE_MASK | TRANSACTIONAL_MASK | CONTROL_MASK
# The builder refuses appends past its size limit; a rebuilt batch must take every row.
_NO_SIZE_LIMIT = 2**31 - 1
# Fewest bytes a record can take in a v2 batch besides its key and value: one byte each
# for length, attributes, timestamp delta, offset delta, key length, value length and
# header count. A lower bound, so it can only say that a batch cannot fit.
_MIN_RECORD_OVERHEAD = 7
_NO_TIMESTAMP = -1
_NO_HEADERS: list[tuple[str, bytes | None]] = []  # shared; the builder only reads it
_ATTRS_AND_DELTA = struct.Struct(">hi")  # attributes at 21, last offset delta at 23
_CRC = struct.Struct(">I")  # at 17
_BASE_OFFSET = struct.Struct(">q")  # at 0
_FRAME = struct.Struct(">qi")  # base offset, batch length
_LAST_DELTA = struct.Struct(">i")  # at 23
_LAST_DELTA_AT = 23
_CRC_AT = 17
_ATTRIBUTES_AT = 21


@dataclass(frozen=True, slots=True)
class WireRead:
    """The answer to one partition's Fetch.

    `records`: whole v2 batches, in offset order (empty when there is nothing to send).
    `next_offset`: where the consumer's position goes after these batches, the last
    batch's base + last_offset_delta + 1; the read's start offset when `records` is
    empty. `high_watermark` (the log end offset) and `log_start_offset` (the first
    offset of the view read, see `view_start_offset`) come from the same view of the
    partition as the records, so no record at or past the high watermark is sent.
    """

    records: bytes
    next_offset: int
    high_watermark: int
    log_start_offset: int


def read_batches(
    partition: Partition, offset: int, max_bytes: int, compacted: bool = False
) -> WireRead:
    """v2 record batches of `partition` from `offset`, for a Fetch response.

    `compacted` reads the compacted view (ledger up to the horizon, then the raw log),
    else the raw log. The first batch is returned whole whatever its size; later ones
    only while the total stays within `max_bytes`. An offset below the view's start
    (`view_start_offset`) reads from there; at or after the log end the records are
    empty.

    Raises CorruptionError when stored data fails a check where the read starts (data
    before damage is returned, and the next read fails on it), ConflictError when
    files kept being replaced under the read.
    """

    def read(view: View) -> WireRead:
        # One consistent view: the manifest, the log segments and the high watermark;
        # which of their rows the view holds is view_rows.py's to say.
        rows = rows_of(partition, view, compacted, offset)
        reader = _BatchReader(partition, view, rows, max_bytes)
        reader.run(offset)
        return WireRead(
            records=bytes(reader.out),
            next_offset=reader.next_offset,
            high_watermark=upper_bound(view),
            log_start_offset=rows.view_start,
        )

    return with_view(partition, read)


def view_start_offset(partition: Partition, compacted: bool = False) -> int:
    """The first offset a read of the view can serve (Fetch's log_start_offset).

    For the raw log, the log start. For the compacted view it can be lower: retention
    deletes raw segments the horizon covers and moves the log start past them, but
    their surviving records stay in the ledger (docs/design.md, Retention), and
    `read_compacted` still serves them; so does a compacted read here
    (storage/view_rows.py).
    """
    return view_start(partition.view().manifest, compacted)


def empty_batch(base_offset: int, last_offset: int) -> bytearray:
    """A v2 batch with no records covering base_offset..last_offset (header only).

    It stands for records that no longer exist, so it carries no producer state (-1)
    and no timestamp (-1, Kafka's NO_TIMESTAMP); consumers use only its offsets (the
    layout is Kafka's `DefaultRecordBatch.writeEmptyHeader`).
    """
    batch = bytearray(
        HEADER.pack(
            base_offset, HEADER_SIZE - LOG_OVERHEAD, -1, MAGIC_V2, 0, 0,
            last_offset - base_offset, _NO_TIMESTAMP, _NO_TIMESTAMP,
            NO_PRODUCER_ID, -1, -1, 0,
        )
    )
    _CRC.pack_into(batch, _CRC_AT, crc32c.crc32c(memoryview(batch)[CRC_START:]))
    return batch


class _BatchReader:
    """One bounded read over a fixed view of a partition; the output grows in `out`.

    `expected` is the next offset the raw log must continue with: raw offsets are
    dense, so a batch that does not start there means lost data, and the read stops
    before it (or fails, when nothing came before it), as Partition.read does.
    """

    def __init__(self, partition: Partition, view: View, rows: PartitionRows,
                 max_bytes: int) -> None:
        self.partition = partition
        self.rows = rows
        self.logs = view.logs
        self.high_watermark = rows.end
        self.max_bytes = max_bytes
        self.out = bytearray()
        self.next_offset = 0
        self.expected = 0
        self.stopped = False  # the budget is spent, or the raw log has a gap

    def run(self, offset: int) -> None:
        horizon = self.rows.horizon
        start = max(offset, self.rows.view_start)
        self.next_offset = start
        if start >= self.high_watermark:
            return
        try:
            if horizon is None or start > horizon:
                self._raw()
            else:
                self._compacted(horizon)
        except SegmentMissingError:
            raise  # a file went under this view: the caller retries on a new one
        except CorruptionError:
            # As the record reads (storage/reads.py): what precedes damage is served,
            # and the consumer's next read, starting at the damage, gets the error.
            if not self.out:
                raise

    # -- the two views ----------------------------------------------------------------

    def _compacted(self, horizon: int) -> None:
        tables = ledger_tables(self.partition, self.rows, WIRE_COLUMNS)
        with closing(tables):
            self._emit_tables(tables, dense=False)
        if self.stopped:
            return
        before_raw = len(self.out)
        try:
            self._raw()
        except SegmentMissingError:
            raise
        except CorruptionError:
            if len(self.out) > before_raw or self.next_offset > horizon:
                raise
            # Still let the consumer reach horizon + 1, where its next read will fail.
            self._append_empty(horizon)
            return
        if len(self.out) == before_raw and not self.stopped and self.next_offset <= horizon:
            # The rest of the compacted range holds nothing, and nothing follows it yet.
            self._append_empty(horizon)

    def _raw(self) -> None:
        self.expected = self.rows.raw_start
        tables = sealed_tables(self.partition, self.rows, WIRE_COLUMNS)
        with closing(tables):
            self._emit_tables(tables, dense=True)
        if self.stopped:
            return
        self._log_segments()

    # -- sealed segments and ledger files ---------------------------------------------

    def _emit_tables(self, tables: Iterable[pa.Table], dense: bool) -> None:
        # A ledger row group may end in the middle of a batch; its rows wait for the
        # next table. (A sealed segment's row groups hold whole batches.)
        carry: pa.Table | None = None
        for table in tables:
            if not table.num_rows:
                continue
            if carry is not None:
                table = pa.concat_tables([carry, table])
            carry = self._emit(table, dense, final=False)
            if self.stopped:
                return
        if carry is not None:
            self._emit(carry, dense, final=True)

    def _emit(self, table: pa.Table, dense: bool, final: bool) -> pa.Table | None:
        """Rebuild the batches of `table`'s rows; returns the rows of an unfinished
        last batch (unless `final`), which may continue in the next table."""
        rows = table.num_rows
        offsets = _int_column(table, "offset")
        bases = _int_column(table, "batch_base_offset")
        lasts = _int_column(table, "batch_last_offset")
        # Runs of rows from one batch: base offsets are unique per batch and sorted.
        change = np.flatnonzero(bases[1:] != bases[:-1]) + 1
        starts = np.concatenate(([0], change))
        ends = np.concatenate((change, [rows]))
        carry = None
        if not final and offsets[-1] < lasts[-1]:
            carry = table.slice(int(starts[-1]))
            starts, ends = starts[:-1], ends[:-1]
        runs = len(starts)
        if not runs:
            return carry
        run_lasts = lasts[starts]

        usable = runs
        missing = -1  # the first offset missing, when a batch is not whole
        if dense:
            # Each batch must start where the one before ended (the first where the read
            # is), and hold every offset up to its last: else records are missing.
            firsts = offsets[starts]
            expected = np.empty(runs, dtype=np.int64)
            expected[0] = self.expected
            expected[1:] = run_lasts[:-1] + 1
            whole = (
                (firsts == expected)
                & (offsets[ends - 1] == run_lasts)
                & (ends - starts == run_lasts - firsts + 1)
            )
            broken = np.flatnonzero(~whole)
            if broken.size:
                usable = int(broken[0])
                missing = _first_missing(
                    offsets[starts[usable] : ends[usable]], int(expected[usable])
                )

        # Skip building batches that cannot fit: a lower bound of each batch's size.
        lengths = (
            _lengths(table.column("key")) + _lengths(table.column("value"))
            + _MIN_RECORD_OVERHEAD
        )
        cumulative = np.concatenate(([0], np.cumsum(lengths)))
        run_bounds = np.cumsum(cumulative[ends] - cumulative[starts] + HEADER_SIZE)
        fitting = int(np.searchsorted(run_bounds, self.max_bytes - len(self.out), side="right"))
        if not self.out:
            fitting = max(fitting, 1)  # the first batch goes out whatever its size
        taken = min(usable, fitting)
        if taken:
            # Converting columns makes a Python object per value; with the cyclic GC on,
            # its passes over them cost as much as the building (storage/gcpause.py).
            with gc_paused():
                self._build_batches(table, offsets, bases, starts[:taken], ends[:taken],
                                    run_lasts[:taken])
        if self.stopped:
            return None
        if taken < runs:
            self.stopped = True
            if taken == usable < runs and not self.out:
                self._gap(missing)
            return None
        return carry

    def _build_batches(
        self,
        table: pa.Table,
        offsets: np.ndarray[Any, Any],
        bases: np.ndarray[Any, Any],
        starts: np.ndarray[Any, Any],
        ends: np.ndarray[Any, Any],
        run_lasts: np.ndarray[Any, Any],
    ) -> None:
        rows = int(ends[-1])
        part = table.slice(0, rows)
        # Python values once per table; the loop below indexes them per record.
        deltas = (offsets[:rows] - bases[:rows]).tolist()
        timestamps = _int_column(part, "timestamp").tolist()
        keys = part.column("key").to_pylist()
        values = part.column("value").to_pylist()
        headers = _headers(part.column("headers"))
        run_bases = bases[starts].tolist()
        batch_fields = zip(
            starts.tolist(),
            ends.tolist(),
            run_bases,
            (run_lasts - bases[starts]).tolist(),
            (_int_column(part, "batch_attributes")[starts] & KEPT_ATTRIBUTES).tolist(),
            _int_column(part, "producer_id")[starts].tolist(),
            _int_column(part, "producer_epoch")[starts].tolist(),
            _int_column(part, "base_sequence")[starts].tolist(),
            strict=True,
        )
        out = self.out
        budget = self.max_bytes
        # compression.type names a codec: the rebuilt batches carry it, as Kafka's
        # stored batches do; `producer` serves them uncompressed.
        codec = self.partition.config.codec or 0
        for start, end, base, last_delta, attributes, producer_id, epoch, sequence in (
            batch_fields
        ):
            builder = DefaultRecordBatchBuilder(
                MAGIC_V2, codec, 0, producer_id, epoch, sequence, _NO_SIZE_LIMIT
            )
            append = builder.append
            for i in range(start, end):
                append(deltas[i], timestamps[i], keys[i], values[i], headers[i])
            batch: bytearray = builder.build()
            if out and len(out) + len(batch) > budget:
                self.stopped = True
                return
            _BASE_OFFSET.pack_into(batch, 0, base)
            # The builder wrote attributes holding only the codec, and the last record's
            # delta; when the batch had other attributes or lost its tail, patch them and
            # redo the CRC.
            if attributes or last_delta != deltas[end - 1]:
                _ATTRS_AND_DELTA.pack_into(batch, _ATTRIBUTES_AT, attributes | codec,
                                           last_delta)
                _CRC.pack_into(batch, _CRC_AT, crc32c.crc32c(memoryview(batch)[CRC_START:]))
            out += batch
            self.next_offset = self.expected = base + last_delta + 1

    # -- log segments -----------------------------------------------------------------

    def _log_segments(self) -> None:
        for segment in self.logs:
            if self.stopped:
                return
            if segment.next_offset <= self.expected:
                continue
            remaining = max(self.max_bytes - len(self.out), 1)
            raw = segment.read_raw(self.expected, remaining)
            if not raw:
                continue
            if not self._take_raw(raw):
                self.stopped = True
                return
            if self.expected < segment.next_offset:
                # It stopped before a corrupt range (or the high watermark): the next
                # read starts there.
                self.stopped = True
                return

    def _take_raw(self, raw: bytes) -> bool:
        """Append the batches of `raw` that follow on, fit and are below the high
        watermark; False when one of them did not."""
        size = len(raw)
        position = 0
        used = len(self.out)
        expected = self.expected
        complete = True
        while position < size:
            base, length = _FRAME.unpack_from(raw, position)
            if base >= self.high_watermark:
                complete = False  # appended after this read's view was taken
                break
            last = base + _LAST_DELTA.unpack_from(raw, position + _LAST_DELTA_AT)[0]
            if not base <= expected <= last:
                complete = False
                if not used and not position:
                    self._gap(expected)
                break
            batch_size = length + LOG_OVERHEAD
            if (used or position) and used + position + batch_size > self.max_bytes:
                complete = False
                break
            position += batch_size
            expected = last + 1
        if position:
            self.out += raw if position == size else memoryview(raw)[:position]
            self.next_offset = self.expected = expected
        return complete

    # -- helpers ----------------------------------------------------------------------

    def _append_empty(self, horizon: int) -> None:
        if self.out and len(self.out) + HEADER_SIZE > self.max_bytes:
            return
        self.out += empty_batch(self.next_offset, horizon)
        self.next_offset = horizon + 1

    def _gap(self, missing: int) -> None:
        raise CorruptionError(
            self.partition.directory, f"offset {missing} is missing from the log"
        )


def _first_missing(offsets: np.ndarray[Any, Any], expected: int) -> int:
    """The first offset from `expected` on that the sorted `offsets` lack."""
    wanted = np.arange(expected, expected + len(offsets))
    differ = np.flatnonzero(offsets != wanted)
    return int(wanted[differ[0]]) if differ.size else expected + len(offsets)


def _int_column(table: pa.Table, name: str) -> np.ndarray[Any, Any]:
    array: np.ndarray[Any, Any] = table.column(name).to_numpy()
    return array


def _lengths(column: pa.ChunkedArray) -> np.ndarray[Any, Any]:
    lengths: np.ndarray[Any, Any] = pc.binary_length(column).fill_null(0).to_numpy()
    return lengths.astype(np.int64, copy=False)


def _headers(column: pa.ChunkedArray) -> list[list[tuple[str, bytes | None]]]:
    """Each row's headers as the builder takes them: a list of (key, value) tuples."""
    rows = len(column)
    if column.null_count == rows or all(len(chunk.values) == 0 for chunk in column.chunks):
        return [_NO_HEADERS] * rows
    # Flattened once for the table rather than per row: to_pylist() would build a dict
    # per header, which costs more than the rest of the batch building together.
    counts = pc.list_value_length(column).fill_null(0).to_numpy()
    flat = pc.list_flatten(column).combine_chunks()
    pairs = list(zip(flat.field("key").to_pylist(), flat.field("value").to_pylist(),
                     strict=True))
    bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
    return [
        pairs[first:end] if end > first else _NO_HEADERS
        for first, end in itertools.pairwise(bounds)
    ]
