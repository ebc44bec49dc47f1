"""The server's upkeep of the state tables (the package's "Who syncs").

Invariant: a compacted topic whose partitions' state changed since this process last
synced its table gets a sync in the next round, so a snapshot that a compaction did
not make (DeleteRecords under the horizon, a compaction whose own sync failed or died,
the first round after a restart) follows within a round; a `compact,delete` topic is
also synced every RETENTION_SYNC_S, since retention.ms takes records out of the state
as time passes. Every EXPIRY_INTERVAL_S (and at the first round) the table's old
snapshots expire (expiry.py). What decides "changed" is read from the manifests this process holds
(no I/O): each partition's run id, horizon, deleted_below within the ledger and ledger
files with their deletion vectors. A failed sync is retried after FAILURE_BACKOFF_S.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from compactlog.iceberg import available, expire_snapshots, sync_state_table
from compactlog.storage.store import LogStore, Topic
from compactlog.storage.view_rows import retention_ms

RETENTION_SYNC_S = 60.0
EXPIRY_INTERVAL_S = 300.0  # snapshot expiry (expiry.py), and at the first round
FAILURE_BACKOFF_S = 10.0


def state_key(topic: Topic) -> tuple[Any, ...]:
    """What the topic's state table is made from, as far as this process knows."""
    parts: list[Any] = [topic.config["empty.value.is.tombstone"]]
    for partition in topic.partitions:
        manifest = partition.manifest
        compaction = manifest.compaction
        if compaction is None:
            parts.append(None)
            continue
        parts.append((compaction.run_id, compaction.horizon,
                      min(manifest.deleted_below, compaction.horizon + 1),
                      tuple((info.file, info.dv_file) for info in compaction.ledger)))
    return tuple(parts)


class StateTableUpkeep:
    def __init__(self, store: LogStore, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self.synced: dict[str, tuple[Any, ...]] = {}
        self.synced_at: dict[str, float] = {}
        self.retry_at: dict[str, float] = {}
        self.expired_at: dict[str, float] = {}

    def run(self, name: str) -> bool:
        """Sync `name`'s state table if due (see the module); True when it synced."""
        if not available():
            return False
        topic = self.store.topic(name)
        if not topic.config.compacted and not any(p.manifest.compaction
                                                  for p in topic.partitions):
            return False
        now = self.clock()
        if now < self.retry_at.get(name, 0.0):
            return False
        key = state_key(topic)
        timed = retention_ms(topic.config) >= 0 and (
            now - self.synced_at.get(name, -1e18) >= RETENTION_SYNC_S)
        synced = key != self.synced.get(name) or timed
        try:
            if synced:
                sync_state_table(self.store, name, cause="upkeep")
                self.synced[name] = key
                self.synced_at[name] = now
            if now - self.expired_at.get(name, -1e18) >= EXPIRY_INTERVAL_S:
                expire_snapshots(self.store, name)
                self.expired_at[name] = now
        except Exception:
            self.retry_at[name] = now + FAILURE_BACKOFF_S
            raise
        return synced
