"""Log segments: files of Kafka v2 record batches, appended to and never rewritten.

The active segment is the last log file of a partition. A rolled segment is a log file
that is no longer appended to and waits to be sealed into Parquet. Both are read here.

An in-memory index of batch positions, last offsets and max timestamps is rebuilt by
scanning the file on open (headers only, plus a CRC32C check of each batch). What the
scan finds that is not a whole, checksum-valid batch is classified:

- a torn tail: invalid bytes with no valid batch after them, left by a crash in the
  middle of a write. The writer cuts the file back to the last valid batch.
- a corrupt range: invalid bytes followed by valid batches, which a crash cannot
  cause. The valid batches on both sides stay readable; a read that needs the corrupt
  range fails with a CorruptionError naming the file, the bytes and the offsets.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from compactlog import faults
from compactlog.errors import CorruptionError, PartitionFailedError, StorageError
from compactlog.storage.records import (
    CRC_START,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    BatchError,
    BatchHeader,
    Record,
    check_batch,
    decode_batch,
    parse_header,
)

log = logging.getLogger(__name__)

SUFFIX = ".log"
SCAN_CHUNK = 8 * 1024 * 1024


def log_file_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SUFFIX}"


def base_offset_of(path: Path) -> int | None:
    stem = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else ""
    return int(stem) if stem.isdigit() else None


@dataclass(frozen=True)
class CorruptRange:
    path: Path
    byte_start: int
    byte_end: int
    first_offset: int  # offsets that may have been in the range (bounded by its neighbours)
    last_offset: int | None  # None: unknown (nothing valid after it)

    def describe(self) -> str:
        last = "?" if self.last_offset is None else str(self.last_offset)
        return (
            f"bytes {self.byte_start}..{self.byte_end} "
            f"(offsets {self.first_offset}..{last}) fail their checks"
        )


@dataclass(frozen=True)
class TornTail:
    path: Path
    valid_bytes: int
    dropped_bytes: int
    reason: str


class LogSegment:
    """One log file and the index of its batches."""

    def __init__(self, path: Path, base_offset: int, writable: bool,
                 created_ms: int = 0) -> None:
        self.path = path
        self.base_offset = base_offset
        self.writable = writable
        # When this process opened the segment: segment.ms counts from here (a record's
        # timestamp says when it was made, not how long the segment has been filling).
        self.created_ms = created_ms
        flags = os.O_RDWR | os.O_CREAT if writable else os.O_RDONLY
        self._fd = -1
        self._fd = os.open(path, flags, 0o644)
        self.positions = array("q")
        self.ends = array("q")
        self.last_offsets = array("q")
        self.max_timestamps = array("q")
        self.size = 0  # bytes of whole batches known so far
        # Corrupt ranges, by the index of the first batch after each one.
        self.corrupt: dict[int, CorruptRange] = {}
        self.torn_tail: TornTail | None = None
        self.unflushed_records = 0
        self.first_unflushed_ms: int | None = None
        # Set when a failed append could not be cut off (see `_cut`).
        self.uncut_from: int | None = None

    # -- scanning -------------------------------------------------------------------

    def scan(self, repair: bool) -> None:
        """Index the batches from `self.size` to the end of the file.

        With repair (the single writer, on open) a torn tail is cut off; without it the
        scan stops before the tail, which may be a write in progress.
        """
        file_size = os.fstat(self._fd).st_size
        pos = self.size
        # Offsets are dense within a segment: each batch starts right after the one before.
        # Only the first batch after a corrupt range may start later (the range hid some).
        after_hole = bool(self.corrupt) and max(self.corrupt) == len(self.positions)
        while pos < file_size:
            data = os.pread(self._fd, min(SCAN_CHUNK, file_size - pos), pos)
            header, error = self._check_at(pos, data, file_size, after_hole)
            if header is not None:
                self._index(pos, header)
                pos += header.size
                self.size = pos
                after_hole = False
                continue
            resume = self._resync(pos + 1, file_size)
            if resume is None:
                if repair:
                    self.torn_tail = TornTail(self.path, pos, file_size - pos, str(error))
                    os.ftruncate(self._fd, pos)
                    os.fsync(self._fd)
                    log.warning(
                        "%s: cut a torn tail of %d bytes at byte %d (%s)",
                        self.path, file_size - pos, pos, error,
                    )
                return
            next_header = parse_header(os.pread(self._fd, HEADER_SIZE, resume))
            previous_last = self.last_offsets[-1] if self.last_offsets else self.base_offset - 1
            hole = CorruptRange(
                self.path, pos, resume, previous_last + 1, next_header.base_offset - 1
            )
            self.corrupt[len(self.positions)] = hole
            log.error("%s: %s (%s)", self.path, hole.describe(), error)
            pos = resume
            self.size = pos
            after_hole = True

    def _check_at(
        self, pos: int, data: bytes, file_size: int, after_hole: bool
    ) -> tuple[BatchHeader | None, BatchError | None]:
        if len(data) >= HEADER_SIZE:
            length = parse_header(data).size
            if length > len(data) and pos + length <= file_size:
                data = os.pread(self._fd, length, pos)
        try:
            header = check_batch(data, 0, min(len(data), file_size - pos))
        except BatchError as error:
            return None, error
        expected = self.last_offsets[-1] + 1 if self.last_offsets else self.base_offset
        # The base offset is outside the CRC32C, so a flipped bit there shows only here.
        if header.base_offset < expected or (header.base_offset > expected and not after_hole):
            return None, BatchError(
                f"batch base offset {header.base_offset} is not the next offset {expected}"
            )
        return header, None

    def _resync(self, start: int, file_size: int) -> int | None:
        """The position of the next valid batch after a bad one, or None."""
        expected = self.last_offsets[-1] + 1 if self.last_offsets else self.base_offset
        pos = start
        while pos + HEADER_SIZE <= file_size:
            data = os.pread(self._fd, min(SCAN_CHUNK, file_size - pos), pos)
            magic_at = data.find(bytes([MAGIC_V2]), 16)
            while magic_at != -1:
                candidate = pos + magic_at - 16
                if candidate + HEADER_SIZE <= file_size:
                    head = HEADER.unpack_from(os.pread(self._fd, HEADER_SIZE, candidate))
                    length = head[1] + LOG_OVERHEAD
                    if (
                        head[0] >= expected
                        and HEADER_SIZE <= length <= file_size - candidate
                        and head[12] >= 0
                    ):
                        body = os.pread(self._fd, length, candidate)
                        try:
                            check_batch(body, 0, len(body))
                            return candidate
                        except BatchError:
                            pass
                magic_at = data.find(bytes([MAGIC_V2]), magic_at + 1)
            pos += max(1, len(data) - HEADER_SIZE)
        return None

    def _index(self, pos: int, header: BatchHeader) -> None:
        # Readers run without the partition's lock and bound their loops by
        # len(positions): it grows last, so every array already has what it counts.
        self.ends.append(pos + header.size)
        self.last_offsets.append(header.last_offset)
        self.max_timestamps.append(header.max_timestamp)
        self.positions.append(pos)

    # -- writing --------------------------------------------------------------------

    def append(self, batch: bytes | bytearray, header: BatchHeader, sync: bool) -> None:
        """Append one whole batch after the indexed data, fsync it when `sync`, and only
        then index it, so that no reader sees a batch whose append failed.

        A failed or short write is cut off again and raised as StorageError. A failed
        fsync cuts the batch off too and raises PartitionFailedError: the caller must
        stop writing (the page cache may have dropped what it could not write).
        """
        start = self.size
        try:
            faults.point("write", self.path)
            written = os.pwrite(self._fd, batch, start)
            if written != len(batch):
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(batch)} bytes)")
        except OSError as error:
            self._cut(start, error)
            raise StorageError(f"{self.path}: append of offsets {header.base_offset}.."
                               f"{header.last_offset} failed: {error}") from error
        if sync:
            try:
                faults.point("fsync", self.path)
                os.fsync(self._fd)
            except OSError as error:
                self._cut(start, error)
                raise PartitionFailedError(
                    f"{self.path}: fsync after appending offsets {header.base_offset}.."
                    f"{header.last_offset} failed: {error}") from error
        self._index(start, header)
        self.size = start + len(batch)

    def _cut(self, size: int, cause: OSError) -> None:
        """Cut the file back to `size` after a failed append. If even that fails, the
        bytes left behind are after the indexed data, where no reader of this segment
        looks; the partition must stop writing, and `cut_pending` cuts them when it is
        reopened (a whole batch would otherwise scan as valid)."""
        try:
            os.ftruncate(self._fd, size)
        except OSError as error:
            self.uncut_from = size
            raise PartitionFailedError(
                f"{self.path}: could not cut a failed append ({cause}) back to {size} "
                f"bytes: {error}") from error

    def cut_pending(self) -> None:
        """Cut what a failed append left when its own cut failed (see `_cut`)."""
        if self.uncut_from is not None:
            os.truncate(self.path, self.uncut_from)
            self.uncut_from = None

    def flush(self) -> None:
        faults.point("fsync", self.path)
        os.fsync(self._fd)
        self.unflushed_records = 0
        self.first_unflushed_ms = None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        # A sealed log file is unlinked while readers in other threads may still hold
        # this segment; its descriptor closes when the last of them lets go.
        self.close()

    # -- reading --------------------------------------------------------------------

    @property
    def is_empty(self) -> bool:
        return not self.positions

    @property
    def next_offset(self) -> int:
        count = len(self.positions)  # indexed batches (see _index)
        return self.last_offsets[count - 1] + 1 if count else self.base_offset

    def _batch_index(self, offset: int) -> int:
        return bisect.bisect_left(self.last_offsets, offset)

    def _check_start(self, offset: int, index: int) -> None:
        hole = self.corrupt.get(index)
        if hole is not None and (hole.last_offset is None or offset <= hole.last_offset):
            raise CorruptionError(self.path, hole.describe())

    def _batch_end(self, index: int) -> int:
        return self.ends[index]

    def read_raw(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one holding `offset`: at least one, then up to max_bytes.

        Stops before a corrupt range; a read that starts inside one raises CorruptionError.
        """
        index = self._batch_index(offset)
        if index >= len(self.positions):
            return b""
        self._check_start(offset, index)
        start = self.positions[index]
        end = self._batch_end(index)
        for i in range(index + 1, len(self.positions)):
            if i in self.corrupt or self._batch_end(i) - start > max_bytes:
                break
            end = self._batch_end(i)
        return os.pread(self._fd, end - start, start)

    def read(self, offset: int, max_records: int, max_bytes: int) -> list[Record]:
        """Records at or after `offset`: at most max_records, and about max_bytes.

        Stops before a corrupt range; a read that starts inside one raises CorruptionError.
        """
        records: list[Record] = []
        index = self._batch_index(offset)
        if index >= len(self.positions):
            return records
        self._check_start(offset, index)
        taken_bytes = 0
        for i in range(index, len(self.positions)):
            if i > index and (i in self.corrupt or taken_bytes >= max_bytes):
                break
            start = self.positions[i]
            for record in decode_batch(os.pread(self._fd, self._batch_end(i) - start, start)):
                if record.offset < offset:
                    continue
                records.append(record)
                taken_bytes += _record_size(record)
                if len(records) >= max_records:
                    return records
        return records

    def iter_batches(self) -> Iterator[tuple[BatchHeader, bytes]]:
        """Every indexed batch, whole, for sealing; corrupt ranges are skipped."""
        for i, start in enumerate(self.positions):
            raw = os.pread(self._fd, self._batch_end(i) - start, start)
            yield parse_header(raw), raw

    def iter_headers(self, count: int | None = None) -> Iterator[BatchHeader]:
        """The headers of the first `count` indexed batches (all by default), in order.

        Reads only headers: one pread covers as many consecutive headers as fit in
        SCAN_CHUNK bytes, so small batches are read in chunks and large ones skipped.
        (The server rebuilds idempotent producers' state from these.)
        """
        positions = self.positions
        total = len(positions) if count is None else min(count, len(positions))
        i = 0
        while i < total:
            start = positions[i]
            end = bisect.bisect_right(positions, start + SCAN_CHUNK - HEADER_SIZE, i + 1, total)
            data = os.pread(self._fd, positions[end - 1] + HEADER_SIZE - start, start)
            for k in range(i, end):
                yield parse_header(data, positions[k] - start)
            i = end

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        for i in range(len(self.positions)):
            max_ts = self.max_timestamps[i]
            if max_ts < timestamp:
                continue
            start = self.positions[i]
            for record in decode_batch(os.pread(self._fd, self._batch_end(i) - start, start)):
                if record.timestamp >= timestamp:
                    return record.offset
        return None


def _record_size(record: Record) -> int:
    return 16 + (len(record.key) if record.key else 0) + (len(record.value) if record.value else 0)


__all__ = ["CRC_START", "CorruptRange", "LogSegment", "TornTail"]
