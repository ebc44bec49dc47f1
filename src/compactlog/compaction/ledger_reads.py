"""The read half of TopicCompactionService, shared by every implementation.

Whatever engine compacts, the result is the same on disk (a ledger and a horizon in
the partition manifest), so reading it is the same too.
"""

from __future__ import annotations

from compactlog.storage import LogStore, Partition, Record


class LedgerReads:
    def __init__(self, store: LogStore, topic: str) -> None:
        self.store = store
        self.topic = topic

    def _partition(self, partition: int) -> Partition:
        found = self.store.topic(self.topic).partition(partition)
        found.refresh()
        return found

    def read_compacted_entries(self, partition: int, start: int, count: int) -> list[Record]:
        return self._partition(partition).compacted.read_ledger(start, count)

    def read_last_compacted_entry(self, partition: int) -> Record | None:
        return self._partition(partition).compacted.last_ledger_record()

    def get_last_compacted_position(self, partition: int) -> int | None:
        return self._partition(partition).manifest.horizon
