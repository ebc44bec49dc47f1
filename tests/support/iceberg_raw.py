"""The raw topic's sealed part as the Reader serves it, the rows its Iceberg table must
hold."""

from __future__ import annotations

from compactlog.storage.store import LogStore
from support.iceberg_readers import StateRow

TOPIC = "events"


def raw_rows(store: LogStore, topic: str = TOPIC) -> list[StateRow]:
    """The raw view's sealed part, as the Reader serves it."""
    rows: list[StateRow] = []
    for partition in store.topic(topic).partitions:
        end = partition.manifest.sealed_end_offset
        for record in partition.read(0, 100_000, 1 << 30):
            if record.offset < end:
                rows.append((partition.index, record.offset, record.key, record.value,
                             tuple(record.headers)))
    return sorted(rows)
