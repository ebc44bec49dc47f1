"""Which partitions to compact next: triggers, priority, limits, backoff and pacing.

The scheduler is pure bookkeeping over `PartitionLoad` snapshots and a clock, so every
rule is tested without sleeping (tests/compaction/test_scheduler.py). The server's cleaner
(server/cleaner.py) measures the loads, starts the runs it is given and reports back.

A partition is due when any trigger holds (and a run would have something to do):
  - ratio:     cleanable dirty bytes / (clean + cleanable dirty bytes) is above the
               topic's min.cleanable.dirty.ratio (Kafka's log cleaner; 1.0 never fires);
  - bytes:     cleanable dirty bytes reach `threshold_bytes` (Pulsar's compaction threshold;
               0 turns it off, Pulsar's default);
  - lag:       the oldest uncompacted sealed record is older than max.compaction.lag.ms
               (Kafka, KIP-354);
  - tombstones: tombstones kept in the ledger have outlived delete.retention.ms and a run
               would drop them;
  - retention: on a compact,delete topic, a ledger file wholly older than retention.ms, or
               a dirty record older than it (Kafka deletes such records on time alone);
  - delete_records: DeleteRecords cut into the ledger since its last run; reads hide the
               records at once, and the run erases them from the ledger for good.
Due partitions go dirtiest first. A run covers one topic: the dirtiest due partition's,
with every other due partition of that topic, so Spark starts once for them all. A
partition is never in two runs at once, and at most `max_concurrent_runs` runs go at once.

A run that fails marks its partitions. A partition that failed alone is uncleanable (as
in Kafka) and waits `backoff_initial_s`, doubling per failure in a row up to
`backoff_max_s`, before it is tried again; the others carry on. A failed run of several
partitions does not say which one broke it, so each of them is retried at once on its own.

Pacing: with `io_max_bytes_per_s` set, a run reads at full speed but the next one may not
start before the bytes read so far divided by the limit have passed since the first run,
so the average compaction read rate stays within the limit (Kafka's
log.cleaner.io.max.bytes.per.second holds an average rate the same way, by sleeping).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

Key = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True)
class PartitionLoad:
    """What the scheduler needs to know of one partition at one moment."""

    topic: str
    partition: int
    clean_bytes: int  # the current ledger
    cleanable_bytes: int  # sealed bytes above the horizon that a run may read now
    oldest_dirty_ms: int | None  # earliest timestamp above the horizon, in sealed data
    tombstones_due: bool  # kept tombstones past delete.retention.ms
    min_cleanable_ratio: float  # min.cleanable.dirty.ratio
    max_lag_ms: int  # max.compaction.lag.ms
    # compact,delete: a ledger file, or a dirty record, past retention.ms (cleaner.py)
    retention_due: bool = False
    # DeleteRecords cut into the ledger since its last run (PartitionPlan.deletion_due)
    deletion_due: bool = False

    @property
    def key(self) -> Key:
        return (self.topic, self.partition)

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.cleanable_bytes
        return self.cleanable_bytes / total if total else 0.0


@dataclass(frozen=True)
class SchedulerPolicy:
    threshold_bytes: int = 0
    max_concurrent_runs: int = 1
    backoff_initial_s: float = 30.0
    backoff_max_s: float = 1800.0
    io_max_bytes_per_s: float | None = None

    def backoff_s(self, failures: int) -> float:
        return float(min(self.backoff_initial_s * 2 ** max(failures - 1, 0), self.backoff_max_s))


@dataclass
class Job:
    id: int
    topic: str
    partitions: list[int]
    reasons: dict[int, list[str]]  # why each partition is in the run
    requested: bool = False  # asked for through the admin API, not by a trigger
    # A manual run: the writer rolls the active segments first (compaction/rolled.py).
    roll_active: bool = False
    started_s: float = 0.0

    @property
    def keys(self) -> list[Key]:
        return [(self.topic, p) for p in self.partitions]


@dataclass
class Failure:
    count: int  # failures in a row
    error: str
    at_s: float
    retry_at_s: float
    uncleanable: bool  # failed alone: backing off; else waiting to be retried alone


@dataclass
class SchedulerState:
    running: dict[int, Job] = field(default_factory=dict)
    failures: dict[Key, Failure] = field(default_factory=dict)
    last_finished_s: float | None = None
    paced_since_s: float | None = None  # when the first paced run started
    bytes_read: int = 0  # by every finished run since paced_since_s


class CompactionScheduler:
    def __init__(self, policy: SchedulerPolicy, clock: Callable[[], float]) -> None:
        self.policy = policy
        self.clock = clock
        self.state = SchedulerState()
        self._ids = itertools.count(1)

    # -- what is due ----------------------------------------------------------------------

    def reasons(self, load: PartitionLoad, now_ms: int) -> list[str]:
        """The triggers that hold for `load` (empty: not due)."""
        found = []
        if load.cleanable_bytes:
            # Strictly above, as Kafka's LogCleanerManager (cleanableRatio >
            # minCleanableRatio): 1.0 turns the ratio trigger off.
            if load.dirty_ratio > load.min_cleanable_ratio:
                found.append("ratio")
            if self.policy.threshold_bytes and load.cleanable_bytes >= self.policy.threshold_bytes:
                found.append("bytes")
            if load.oldest_dirty_ms is not None and now_ms - load.oldest_dirty_ms > load.max_lag_ms:
                found.append("lag")
        if load.tombstones_due:
            found.append("tombstones")
        if load.retention_due:
            found.append("retention")
        if load.deletion_due:
            found.append("delete_records")
        return found

    def running_keys(self) -> set[Key]:
        return {key for job in self.state.running.values() for key in job.keys}

    def next_start_s(self) -> float:
        """The earliest time pacing lets a run start."""
        limit = self.policy.io_max_bytes_per_s
        if not limit or self.state.paced_since_s is None:
            return float("-inf")
        return self.state.paced_since_s + self.state.bytes_read / limit

    def pick(self, loads: Iterable[PartitionLoad]) -> list[Job]:
        """Start the runs that are due now, within the limits; the caller runs them."""
        now = self.clock()
        now_ms = int(now * 1000)
        free = self.policy.max_concurrent_runs - len(self.state.running)
        if free <= 0 or now < self.next_start_s():
            return []
        busy = self.running_keys()
        due: list[tuple[PartitionLoad, list[str]]] = []
        for load in loads:
            if load.key in busy:
                continue
            failure = self.state.failures.get(load.key)
            if failure is not None and now < failure.retry_at_s:
                continue
            reasons = self.reasons(load, now_ms)
            if failure is not None and not reasons and (
                    load.cleanable_bytes or load.tombstones_due or load.retention_due
                    or load.deletion_due):
                reasons = ["retry"]  # it was due when it failed
            if reasons:
                due.append((load, reasons))
        due.sort(key=lambda item: (-item[0].dirty_ratio, -item[0].cleanable_bytes,
                                   item[0].key))
        jobs: list[Job] = []
        taken: set[Key] = set()
        for load, reasons in due:
            if len(jobs) == free:
                break
            if load.key in taken:
                continue
            failure = self.state.failures.get(load.key)
            if failure is not None and not failure.uncleanable:
                group = [(load, reasons)]
            else:
                # The rest of the topic's due partitions join, except ones that must run
                # alone (a multi-partition run that failed hides which one broke it).
                group = [
                    (other, reasons) for other, reasons in due
                    if other.topic == load.topic and other.key not in taken
                    and (other.key not in self.state.failures
                         or self.state.failures[other.key].uncleanable)
                ]
            job = Job(next(self._ids), load.topic, sorted(o.partition for o, _ in group),
                      {o.partition: r for o, r in group}, started_s=now)
            taken.update(job.keys)
            jobs.append(job)
        for job in jobs:
            self._start(job)
        return jobs

    def request(self, topic: str, partitions: list[int]) -> Job:
        """A run asked for by a user: no trigger, backoff or pacing applies.
        Raises BusyError if any of the partitions is in a run now."""
        clash = sorted(p for t, p in self.running_keys() if t == topic and p in partitions)
        if clash:
            raise BusyError(topic, clash)
        job = Job(next(self._ids), topic, sorted(partitions),
                  {p: ["requested"] for p in partitions}, requested=True, started_s=self.clock())
        self._start(job)
        return job

    def _start(self, job: Job) -> None:
        self.state.running[job.id] = job
        if self.policy.io_max_bytes_per_s and self.state.paced_since_s is None:
            self.state.paced_since_s = job.started_s

    # -- what happened --------------------------------------------------------------------

    def finished(self, job: Job, bytes_read: int, error: str | None = None) -> None:
        now = self.clock()
        self.state.running.pop(job.id, None)
        self.state.last_finished_s = now
        self.state.bytes_read += bytes_read
        if error is None:
            for key in job.keys:
                self.state.failures.pop(key, None)
            return
        alone = len(job.partitions) == 1
        for key in job.keys:
            previous = self.state.failures.get(key)
            count = (previous.count if previous else 0) + 1
            retry_at = now + self.policy.backoff_s(count) if alone else now
            self.state.failures[key] = Failure(count, error, now, retry_at, uncleanable=alone)

    def restore_failure(self, key: Key, count: int, error: str, at_s: float) -> None:
        """A failure recorded before a restart (from the partition's status file)."""
        self.state.failures[key] = Failure(count, error, at_s,
                                           at_s + self.policy.backoff_s(count), True)

    def uncleanable(self) -> dict[Key, Failure]:
        return {key: f for key, f in self.state.failures.items() if f.uncleanable}


class BusyError(Exception):
    """A compaction of some of the partitions asked for is already running."""

    def __init__(self, topic: str, partitions: list[int]) -> None:
        super().__init__(f"{topic}: a compaction is already running on partition(s) "
                         f"{', '.join(map(str, partitions))}")
        self.topic = topic
        self.partitions = partitions
