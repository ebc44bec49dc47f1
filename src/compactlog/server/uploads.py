"""Uploads on an object store: what moves the durable high watermark, and what acks=all
waits for.

Invariant: a partition's produce response with acks=all (-1) says NONE only if, when it
was decided, (a) a manifest that this server committed itself lists the batch's last
offset in a sealed segment (`Partition.high_watermark`, never a manifest another writer
committed: tests/faults/test_failover_steps_s3.py, test_a_fenced_writer_acknowledges_nothing),
and (b) this server's writer lease was still valid (lease.py step 4). Otherwise (the
wait passed the request's timeout_ms, the partition failed, or the lease lapsed) it
says REQUEST_TIMED_OUT or NOT_LEADER_OR_FOLLOWER, as Kafka answers an acks=all produce
whose replicas did not catch up in time, and the producer retries (the records may then
be stored twice; idempotent producers' retries are answered with the first offsets,
server/producers.py). acks=1 is answered once the records are on this server's disk.

Consumers are served only below the high watermark, so every partition with records
not yet in the bucket is uploaded every `upload_interval_s`, whatever acks its
producers asked for: one Parquet object per busy partition per interval, not one per
request (the cost: up to one interval plus an upload of latency; docs/server.md,
"Acknowledgements"). Small segments are merged later (storage/merging.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from compactlog.log_throttle import Throttle, held_back

if TYPE_CHECKING:
    from compactlog.server.broker import Broker
    from compactlog.storage import Partition

log = logging.getLogger("compactlog.server")
POLL_S = 0.01


class Uploads:
    def __init__(self, interval_s: float, acks_all_waits: bool) -> None:
        self.interval_s = interval_s
        # ack_after_upload: acks=all waits for the bucket (the default); else it is
        # answered from the local disk, as acks=1 is.
        self.acks_all_waits = acks_all_waits
        self.failures = Throttle(60.0)  # a failing bucket: one line a minute per partition

    async def wait(self, partition: Partition, last_offset: int, timeout_s: float) -> bool:
        """Whether this server's own commits put `last_offset` below the high watermark
        within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while partition.high_watermark <= last_offset:
            if partition.failed is not None or time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL_S)
        return True

    async def run(self, broker: Broker) -> None:
        """Roll and seal, every interval, each partition holding records above its high
        watermark."""
        while True:
            await asyncio.sleep(self.interval_s)
            if broker.store.lease_lost is not None:
                continue  # another server owns these partitions now
            moved = False
            for partition in broker.store.open_partitions():
                if partition.failed is not None or \
                        partition.high_watermark >= partition.log_end_offset:
                    continue
                try:
                    await broker.run_io(_upload, partition)
                    moved = True
                except Exception as error:  # waiters time out; the next round retries
                    held = self.failures.allow(partition.name)
                    if held is not None:
                        log.warning("%s: uploading failed (retried every %.2fs): %s%s",
                                    partition.name, self.interval_s, error, held_back(held))
            if moved:
                broker.notify_data()  # long-polling fetches may now read further


def _upload(partition: Partition) -> None:
    if partition.failed is None and partition.logs and not partition.active.is_empty:
        partition.roll()
    partition.seal_rolled()
