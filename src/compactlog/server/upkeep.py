"""The broker's periodic upkeep of every partition, one failure at a time.

Every round (storage/upkeep_round.py's `run_round`, the loop `LogStore.tick` runs too) runs,
for every partition, the steps of `LogStore.upkeep_steps`: reopen a
partition that failed, flush by flush.ms, roll by segment.ms, seal rolled segments into
Parquet, apply retention, sweep unreachable files, and pick up manifests committed by
other processes (a compaction by `compactlog compact`); then, for each compacted topic,
sync its Iceberg state table when its state changed (compactlog/iceberg/table_upkeep.py). A
step that fails for one partition (a damaged file, EIO, EMFILE) is logged and the round
goes on with the next step and the other partitions, which must not stop being flushed,
sealed or cleaned because one disk file is bad. The failure is logged once per partition
and step per minute, as the round repeats every second.

On an object store the writer also aborts, once an hour, the multipart uploads that have
stayed incomplete for a day (backend/s3/abandoned_uploads.py): a seal or compaction
whose upload failed leaves its parts behind, stored and billed until aborted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from compactlog.errors import CompactlogError
from compactlog.iceberg.table_upkeep import StateTableUpkeep
from compactlog.log_throttle import Throttle, held_back
from compactlog.server.protocol.error_codes import error_message
from compactlog.storage import LogStore, run_round

log = logging.getLogger("compactlog.server")


ABANDONED_UPLOAD_AGE_S = 24 * 3600.0  # an upload incomplete this long is abandoned
UPLOAD_SWEEP_INTERVAL_S = 3600.0


class Upkeep:
    def __init__(self, store: LogStore, log_interval_s: float = 60.0,
                 abandoned_upload_age_s: float = ABANDONED_UPLOAD_AGE_S,
                 upload_sweep_interval_s: float = UPLOAD_SWEEP_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.failures = Throttle(log_interval_s)
        self.tables = StateTableUpkeep(store)
        self.uploads = store.layout.upload_sweeper(abandoned_upload_age_s)
        self.upload_sweep_interval_s = upload_sweep_interval_s
        self.clock = clock
        self._next_upload_sweep = clock()

    def run_once(self) -> None:
        run_round(self.store, self._failed,
                  ("syncing the Iceberg state table", self.tables.run))
        if self.uploads is not None and self.store.lease_lost is None \
                and self.clock() >= self._next_upload_sweep:
            now = self.clock()
            self._next_upload_sweep = now + self.upload_sweep_interval_s
            try:
                self.uploads.sweep(now)
            except Exception as error:  # the bucket was unreachable: the next hour retries
                self._failed("the data location", "aborting abandoned multipart uploads",
                             error)

    def _failed(self, where: str, step: str, error: Exception) -> None:
        held = self.failures.allow((where, step))
        if held is None:
            return
        expected = isinstance(error, OSError | CompactlogError)
        log.error("upkeep of %s: %s failed: %s%s", where,
                  step, error_message(error), held_back(held),
                  exc_info=None if expected else error)
