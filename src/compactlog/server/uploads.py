"""Acknowledgement after upload (`ack_after_upload`): a produce with acks=1 or acks=-1 is
answered only once its records are in a sealed segment that a committed manifest in the
object store lists, so that a server whose local disk is lost (or that is replaced by
another) has lost nothing it acknowledged.

Invariant: a partition's response says NONE only if, when it was decided, the committed
manifest's sealed segments covered the batch's last offset; otherwise (the wait passed
the request's timeout_ms, or the partition failed) it says REQUEST_TIMED_OUT, as Kafka
answers an acks=all produce whose replicas did not catch up in time, and the producer
retries (the records may then be stored twice; idempotent producers' retries are
answered with the first offsets, server/producers.py).

Uploads are batched: produce requests register the partitions they wait for, and one
loop rolls and seals those partitions every `upload_interval_s`, so a busy partition
gets one Parquet object per interval, not one per request (the cost: latency of up to
one interval plus an upload; docs/benchmarks.md). tests/test_failover_s3.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from compactlog.server.broker import Broker
    from compactlog.storage.partition import Partition

log = logging.getLogger("compactlog.server")
POLL_S = 0.01


class Uploads:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._wanted: dict[int, Partition] = {}

    async def wait(self, partition: Partition, last_offset: int, timeout_s: float) -> bool:
        """Whether the committed manifest covers `last_offset` within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while partition.manifest.sealed_end_offset <= last_offset:
            if partition.failed is not None or time.monotonic() >= deadline:
                return False
            self._wanted[id(partition)] = partition
            await asyncio.sleep(POLL_S)
        return True

    async def run(self, broker: Broker) -> None:
        """Roll and seal the partitions that produce requests wait for, every interval."""
        while True:
            await asyncio.sleep(self.interval_s)
            wanted, self._wanted = list(self._wanted.values()), {}
            for partition in wanted:
                try:
                    await broker.run_io(_upload, partition)
                except Exception as error:  # the waiters time out; the next round retries
                    log.warning("%s: uploading for acknowledgement failed: %s",
                                partition.name, error)


def _upload(partition: Partition) -> None:
    if partition.failed is None and partition.logs and not partition.active.is_empty:
        partition.roll()
    partition.seal_rolled()
