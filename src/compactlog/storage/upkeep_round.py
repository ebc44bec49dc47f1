"""One upkeep round of a store: the one loop every long-running writer runs.

Invariant: a round runs, for every partition of every topic, each step of
`LogStore.upkeep_steps` (reopen a failed partition, flush by flush.ms, roll by
segment.ms, seal, merge, retention, sweep, pick up manifests other processes committed),
then the caller's per-topic step (the server's: its Iceberg tables); a step that fails
for one partition or topic is reported (`Failed`) and the round goes on with the next
step and the others, which must not stop being flushed, sealed or cleaned because one
disk file is bad. A writer that lost its lease does nothing: its partitions belong to
the newer writer.

Two callers: the server's upkeep (server/upkeep.py, every `upkeep_interval_s`) and
`LogStore.tick` (embedded writers and the tests); only their reporting differs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from compactlog.storage.store import LogStore

# (where, step, error): a step that failed, to be logged by the caller as it logs.
Failed = Callable[[str, str, Exception], None]
# (step name, the step for one topic by name).
TopicStep = tuple[str, Callable[[str], object]]


def run_round(store: LogStore, failed: Failed, topic_step: TopicStep | None = None) -> None:
    """One round over every partition of `store`, as the module says."""
    try:
        store.renew_lease()
    except Exception as error:  # the store was unreachable: the next round retries
        failed("the data location", "renewing the writer lease", error)
    if store.lease_lost is not None:
        return  # another writer owns these partitions now
    try:
        names = store.list_topics()
    except Exception as error:  # EMFILE: the next round tries again
        failed("the data directory", "listing topics", error)
        return
    for name in names:
        try:
            partitions = store.topic(name).partitions
        except Exception as error:  # a topic deleted meanwhile, or damaged metadata
            failed(name, "opening the topic", error)
            continue
        for partition in partitions:
            for step, call in store.upkeep_steps(partition):
                try:
                    call()
                except Exception as error:  # reported; the next round tries again
                    failed(partition.name, step, error)
        if topic_step is not None:
            step_name, run = topic_step
            try:
                run(name)
            except Exception as error:
                failed(name, step_name, error)
