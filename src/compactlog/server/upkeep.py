"""The broker's periodic upkeep of every partition, one failure at a time.

Every round (storage/upkeep.py's `run_round`, the loop `LogStore.tick` runs too) runs,
for every partition, the steps of `LogStore.upkeep_steps`: reopen a
partition that failed, flush by flush.ms, roll by segment.ms, seal rolled segments into
Parquet, apply retention, sweep unreachable files, and pick up manifests committed by
other processes (a compaction by `compactlog compact`); then, for each compacted topic,
sync its Iceberg state table when its state changed (compactlog/iceberg/upkeep.py). A
step that fails for one partition (a damaged file, EIO, EMFILE) is logged and the round
goes on with the next step and the other partitions, which must not stop being flushed,
sealed or cleaned because one disk file is bad. The failure is logged once per partition
and step per minute, as the round repeats every second.
"""

from __future__ import annotations

import logging

from compactlog.errors import CompactlogError
from compactlog.iceberg.upkeep import StateTableUpkeep
from compactlog.log_throttle import Throttle, held_back
from compactlog.server.protocol.error_codes import error_message
from compactlog.storage import LogStore, run_round

log = logging.getLogger("compactlog.server")


class Upkeep:
    def __init__(self, store: LogStore, log_interval_s: float = 60.0) -> None:
        self.store = store
        self.failures = Throttle(log_interval_s)
        self.tables = StateTableUpkeep(store)

    def run_once(self) -> None:
        run_round(self.store, self._failed,
                  ("syncing the Iceberg state table", self.tables.run))

    def _failed(self, where: str, step: str, error: Exception) -> None:
        held = self.failures.allow((where, step))
        if held is None:
            return
        expected = isinstance(error, OSError | CompactlogError)
        log.error("upkeep of %s: %s failed: %s%s", where,
                  step, error_message(error), held_back(held),
                  exc_info=None if expected else error)
