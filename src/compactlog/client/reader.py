"""A reader of one partition that keeps its position, like a Kafka consumer's fetch loop."""

from __future__ import annotations

from typing import Literal

from compactlog.errors import UserError
from compactlog.storage import DEFAULT_MAX_BYTES, LogStore, Partition, Record

StartPosition = int | Literal["earliest", "latest"]


class Reader:
    """Reads one partition from a position, optionally waiting for more.

    With `read_compacted=True` it reads the compacted view: while its position is at or
    below the horizon it reads the ledger (the surviving record of each key, at its
    original offset), then the raw log from horizon + 1, as Pulsar's readCompacted
    readers and Kafka consumers of a compacted topic do. Otherwise it reads the raw log.

    `position` is the next offset to read. Offsets below the log start (deleted by
    retention) are served from the log start.
    """

    def __init__(
        self,
        store: LogStore,
        topic: str,
        partition: int,
        start: StartPosition = "earliest",
        read_compacted: bool = False,
    ) -> None:
        self.partition: Partition = store.topic(topic).partition(partition)
        self.topic = topic
        self.read_compacted = read_compacted
        self.position = 0
        self.seek(start)

    def seek(self, start: StartPosition) -> None:
        if start == "earliest":
            self.partition.refresh()
            self.position = 0 if self.read_compacted else self.partition.log_start_offset
        elif start == "latest":
            self.partition.refresh()
            self.position = self.partition.high_watermark
        elif isinstance(start, int) and start >= 0:
            self.position = start
        else:
            raise UserError(f"start position must be earliest, latest or an offset >= 0: {start!r}")

    def seek_to_timestamp(self, timestamp_ms: int) -> None:
        """Move to the first record whose timestamp is >= timestamp_ms, or to the end."""
        self.partition.refresh()
        if self.read_compacted:
            found = self.partition.compacted.offset_for_timestamp(timestamp_ms)
        else:
            found = self.partition.offset_for_timestamp(timestamp_ms)
        self.position = found if found is not None else self.partition.high_watermark

    def poll(
        self, max_records: int = 500, timeout: float = 0.0, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> list[Record]:
        """The next records; waits up to `timeout` seconds when none are there yet."""
        records = self._read(max_records, max_bytes)
        if not records and timeout > 0 and self.partition.wait_for_data(self.position, timeout):
            records = self._read(max_records, max_bytes)
        return records

    def _read(self, max_records: int, max_bytes: int) -> list[Record]:
        self.partition.refresh()
        if self.read_compacted:
            records = self.partition.read_compacted(self.position, max_records, max_bytes)
        else:
            records = self.partition.read(self.position, max_records, max_bytes)
        if records:
            self.position = records[-1].offset + 1
        return records

    def last_message(self) -> Record | None:
        """The last record this reader's view holds (a tombstone, maybe), or None.

        For the compacted view this is the ledger's last record when nothing was
        appended after the horizon, not the raw log's last offset: Pulsar readers once
        waited forever for a raw last message that compaction had removed.
        """
        if self.read_compacted:
            return self.partition.compacted.last_record()
        self.partition.refresh()
        end = self.partition.high_watermark
        if end <= self.partition.log_start_offset:
            return None
        found = self.partition.read(end - 1, 1)
        return found[-1] if found else None

    @property
    def at_end(self) -> bool:
        return self.position >= self.partition.high_watermark
