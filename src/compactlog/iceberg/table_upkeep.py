"""The server's upkeep of a topic's Iceberg tables (the package's "Who syncs").

Invariant: a table whose partitions' files changed since this process last synced it
gets a sync in the next round, so a snapshot that no compaction made follows within a
round. The compacted state table of a compacted topic: DeleteRecords under the horizon,
a compaction whose own sync failed or died, the first round after a restart, and on
`compact,delete` every RETENTION_SYNC_S, since retention.ms takes records out of the
state as time passes. The raw table of a topic with `iceberg.raw.enabled`: a seal, a
merge of small segments, retention or DeleteRecords, at most once per
`iceberg.raw.target.lag.ms`, so that a busy topic makes one snapshot per interval; a topic
whose raw table is off has it dropped (drop.py) at the first round of this process and
whenever it was on in the round before, so that it stops holding segments. What decides
"changed" is read from the manifests this process holds (no I/O). Every
EXPIRY_INTERVAL_S (and at the first round) each table's old snapshots expire
(expiry.py). A failed round of a topic is retried after FAILURE_BACKOFF_S.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from compactlog.iceberg import (
    RAW_TABLE,
    STATE_TABLE,
    available,
    drop_table,
    expire_snapshots,
    sync_raw_table,
    sync_state_table,
)
from compactlog.storage import LogStore, Topic, retention_ms

RETENTION_SYNC_S = 60.0
EXPIRY_INTERVAL_S = 300.0
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


def raw_key(topic: Topic) -> tuple[Any, ...]:
    """What the topic's raw table is made from: each partition's sealed segments and
    the start of its raw view."""
    return tuple((partition.manifest.log_start_offset, partition.manifest.deleted_below,
                  tuple(info.file for info in partition.manifest.segments))
                 for partition in topic.partitions)


class StateTableUpkeep:
    def __init__(self, store: LogStore, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self.synced: dict[tuple[str, str], tuple[Any, ...]] = {}
        self.synced_at: dict[tuple[str, str], float] = {}
        self.expired_at: dict[tuple[str, str], float] = {}
        self.retry_at: dict[str, float] = {}
        # Topics whose raw table this process saw off and dropped (or found absent).
        self.raw_dropped: set[str] = set()

    def run(self, name: str) -> bool:
        """Sync `name`'s tables where due (see the module); True when one synced."""
        if not available():
            return False
        now = self.clock()
        if now < self.retry_at.get(name, 0.0):
            return False
        topic = self.store.topic(name)
        try:
            synced = self._raw(name, topic, now)
            if topic.config.compacted or any(p.manifest.compaction for p in topic.partitions):
                synced = self._state(name, topic, now) or synced
        except Exception:
            self.retry_at[name] = now + FAILURE_BACKOFF_S
            raise
        return synced

    def _raw(self, name: str, topic: Topic, now: float) -> bool:
        if not topic.config["iceberg.raw.enabled"]:
            if name not in self.raw_dropped:  # first round, or just switched off
                drop_table(self.store, name, RAW_TABLE)
                self.raw_dropped.add(name)
                self.synced.pop((name, RAW_TABLE), None)
            return False
        self.raw_dropped.discard(name)
        key = raw_key(topic)
        lag_s = int(topic.config["iceberg.raw.target.lag.ms"]) / 1000
        synced = key != self.synced.get((name, RAW_TABLE)) and (
            now - self.synced_at.get((name, RAW_TABLE), -1e18) >= lag_s)
        if synced:
            sync_raw_table(self.store, name, cause="upkeep")
            self.synced[(name, RAW_TABLE)] = key
            self.synced_at[(name, RAW_TABLE)] = now
        self._expire(name, RAW_TABLE, now)
        return synced

    def _state(self, name: str, topic: Topic, now: float) -> bool:
        key = state_key(topic)
        timed = retention_ms(topic.config) >= 0 and (
            now - self.synced_at.get((name, STATE_TABLE), -1e18) >= RETENTION_SYNC_S)
        synced = key != self.synced.get((name, STATE_TABLE)) or timed
        if synced:
            sync_state_table(self.store, name, cause="upkeep")
            self.synced[(name, STATE_TABLE)] = key
            self.synced_at[(name, STATE_TABLE)] = now
        self._expire(name, STATE_TABLE, now)
        return synced

    def _expire(self, name: str, table: str, now: float) -> None:
        if now - self.expired_at.get((name, table), -1e18) >= EXPIRY_INTERVAL_S:
            expire_snapshots(self.store, name, table=table)
            self.expired_at[(name, table)] = now
