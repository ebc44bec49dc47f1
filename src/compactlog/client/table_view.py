"""A table view: key -> latest value of a topic, kept current by following its log.

Built from the compacted view by default, which holds one record per key up to the
horizon, so start-up reads far fewer records than a rewind through the raw log. Then
it follows every partition and applies each new record: a value sets its key, a
tombstone deletes it. Listeners hear every change, as Pulsar's TableView listeners do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from compactlog.client.reader import Reader
from compactlog.storage import LogStore

Listener = Callable[[bytes, bytes | None], None]  # (key, new value or None when deleted)


class TableView:
    def __init__(self, store: LogStore, topic: str, read_compacted: bool = True) -> None:
        self.topic = topic
        partitions = len(store.topic(topic).partitions)
        self._readers = [
            Reader(store, topic, index, "earliest", read_compacted=read_compacted)
            for index in range(partitions)
        ]
        empty_is_tombstone = bool(store.topic(topic).config["empty.value.is.tombstone"])
        self._empty_is_tombstone = empty_is_tombstone
        self._data: dict[bytes, bytes] = {}
        self._listeners: list[Listener] = []
        self.records_read = 0
        self.catch_up()

    def add_listener(self, listener: Listener, replay: bool = False) -> None:
        """Call `listener` on every change from now on (and once per key now, if replay)."""
        self._listeners.append(listener)
        if replay:
            for key, value in list(self._data.items()):
                listener(key, value)

    def catch_up(self, max_records: int = 10_000) -> int:
        """Apply every record available now; returns how many were read."""
        total = 0
        for reader in self._readers:
            while records := reader.poll(max_records, max_bytes=64 * 1024 * 1024):
                total += len(records)
                for record in records:
                    if record.key is None:
                        continue
                    value = record.value
                    if value is None or (self._empty_is_tombstone and not value):
                        if self._data.pop(record.key, None) is not None:
                            self._notify(record.key, None)
                    else:
                        self._data[record.key] = value
                        self._notify(record.key, value)
        self.records_read += total
        return total

    def follow(self, timeout: float, poll_interval: float = 0.05) -> int:
        """Keep applying new records for `timeout` seconds; returns how many were read."""
        deadline = time.monotonic() + timeout
        total = 0
        while time.monotonic() < deadline:
            read = self.catch_up()
            total += read
            if not read:
                time.sleep(min(poll_interval, max(deadline - time.monotonic(), 0)))
        return total

    def _notify(self, key: bytes, value: bytes | None) -> None:
        for listener in self._listeners:
            listener(key, value)

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        return self._data.get(key, default)

    def __getitem__(self, key: bytes) -> bytes:
        return self._data[key]

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._data)

    def items(self) -> list[tuple[bytes, bytes]]:
        return list(self._data.items())

    def snapshot(self) -> dict[bytes, bytes]:
        return dict(self._data)
