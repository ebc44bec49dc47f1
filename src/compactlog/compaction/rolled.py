"""Before a run plans: every rolled log segment sealed, so the run covers it.

Invariant: a compaction run covers every segment but the active one as of when it
started, as Kafka's cleaner does, whether or not the rolled segments had been sealed
into Parquet yet (only sealed segments are compaction input). So before planning, the
run gets the rolled segments of its partitions sealed:

  1. this process is the data directory's writer: it seals them itself;
  2. no process is the writer: it opens the store as the writer for the moment it takes
     to seal them (the seal is the writer's job, and nobody else is doing it);
  3. another process is the writer (`compactlog serve`): its upkeep seals rolled
     segments every upkeep_interval_s, so the run waits for the manifests to show them
     sealed, up to `timeout_s`; what is still unsealed then waits for the next run, and
     the run's summary says so.

A manual compaction (`compactlog compact`, the admin API, `TopicCompactionService.
trigger`) covers the active segment too, as Pulsar's compaction covers every message
up to the moment it is asked for: `roll_active_segments` rolls it first, by the same
three cases (in case 3 only if the writer can be asked: the CLI asks a server through
its admin API). min.compaction.lag.ms still applies: the plan leaves out segments
whose newest record is younger (plan.py). The server's automatic cleaner never rolls,
as Kafka's does not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from compactlog.errors import DataDirLockedError
from compactlog.storage import LogStore, Partition, log_files

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0

# Asks the writer of the data directory (a server) to roll the active segments of
# (topic, partitions); False when there is no writer it can ask.
RollThrough = Callable[[str, list[int]], bool]


def rolled_end(partition: Partition) -> int:
    """The base offset of the active segment on disk: everything below it has rolled
    (sealed or not). The sealed end reaches it once every rolled segment is sealed."""
    found = log_files(partition.log_dir)
    return found[-1][0] if found else partition.manifest.sealed_end_offset


def unsealed(partitions: Sequence[Partition], targets: dict[int, int]) -> list[Partition]:
    waiting = []
    for partition in partitions:
        partition.refresh()
        if partition.manifest.sealed_end_offset < targets[partition.index]:
            waiting.append(partition)
    return waiting


def seal_rolled_segments(store: LogStore, topic: str, partitions: Sequence[Partition],
                         timeout_s: float = DEFAULT_TIMEOUT_S) -> list[int]:
    """Get the rolled segments of `partitions` sealed (see the module's steps); returns
    the partitions whose rolled segments are still unsealed when it gives up."""
    targets = {p.index: rolled_end(p) for p in partitions}
    waiting = unsealed(partitions, targets)
    if not waiting:
        return []
    if not store.read_only:  # 1.
        for partition in waiting:
            partition.seal_rolled()
        return [p.index for p in unsealed(waiting, targets)]
    try:  # 2.
        with LogStore.open(store.target, clock=store.clock,
                           local_dir=store.data_dir) as writer:
            for partition in waiting:
                writer.topic(topic).partition(partition.index).seal_rolled()
        log.info("%s: sealed the rolled segments of partitions %s before compacting", topic,
                 [p.index for p in waiting])
    except DataDirLockedError:  # 3.
        log.info("%s: waiting up to %.0f s for the writer to seal the rolled segments of "
                 "partitions %s", topic, timeout_s, [p.index for p in waiting])
        deadline = time.monotonic() + timeout_s
        while waiting and time.monotonic() < deadline:
            time.sleep(0.05)
            waiting = unsealed(waiting, targets)
    return [p.index for p in unsealed(waiting, targets)]


def roll_active_segments(store: LogStore, topic: str, partitions: Sequence[int] | None,
                         through: RollThrough | None = None) -> list[int]:
    """Roll (and seal) the active segment of each partition, so that a run covers every
    record appended before it was asked for (see the module's doc); returns the
    partitions whose active segment stays, because another process writes them and
    `through` could not ask it."""
    indexes = (list(partitions) if partitions is not None
               else list(range(len(store.topic(topic).partitions))))
    if not store.read_only:  # 1.
        for index in indexes:
            store.topic(topic).partition(index).roll()
        return []
    try:  # 2.
        with LogStore.open(store.target, clock=store.clock,
                           local_dir=store.data_dir) as writer:
            for index in indexes:
                writer.topic(topic).partition(index).roll()
        return []
    except DataDirLockedError:  # 3.
        if through is not None and through(topic, indexes):
            return []
        log.warning("%s: partitions %s are written by another process; their active "
                    "segments stay out of this run", topic, indexes)
        return indexes
