"""The compacted view of one partition, as an object: `partition.compacted`.

Invariant: every method reads through reads.py, the store's one read path, so the
compacted view never mixes two manifests: the (horizon, ledger) pair comes from one
committed version (manifest.CompactionState), and the raw log after the horizon from
the same view.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from compactlog.storage import reads
from compactlog.storage.records import Record

if TYPE_CHECKING:
    from compactlog.storage.partition import Partition


class CompactedView:
    """The ledger up to the horizon, then the raw log (see reads.py)."""

    def __init__(self, partition: Partition) -> None:
        self.partition = partition

    def horizon(self) -> int | None:
        return self.partition.manifest.horizon

    def read(self, offset: int, max_records: int, max_bytes: int) -> list[Record]:
        return reads.read_records(self.partition, offset, max_records, max_bytes, True)

    def read_table(self, offset: int, max_records: int, max_bytes: int) -> pa.Table:
        return reads.read_table(self.partition, offset, max_records, max_bytes, True)

    def read_ledger(self, offset: int, max_records: int) -> list[Record]:
        return reads.read_ledger(self.partition, offset, max_records)

    def last_ledger_record(self) -> Record | None:
        return reads.last_ledger_record(self.partition)

    def last_record(self) -> Record | None:
        return reads.last_record(self.partition)

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        return reads.offset_for_timestamp(self.partition, timestamp, compacted=True)
