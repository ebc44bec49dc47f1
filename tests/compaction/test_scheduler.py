"""The compaction scheduler's rules, with a fake clock and no sleeping."""

from __future__ import annotations

import pytest

from compactlog.compaction.scheduler import (
    BusyError,
    CompactionScheduler,
    PartitionLoad,
    SchedulerPolicy,
)
from support.fakes import FakeClock

LONG_MAX = 2**63 - 1
MB = 1_000_000


def load(partition: int = 0, topic: str = "t", clean: int = 0, cleanable: int = 0,
         oldest_dirty_ms: int | None = None, tombstones_due: bool = False,
         ratio: float = 0.5, max_lag_ms: int = LONG_MAX) -> PartitionLoad:
    return PartitionLoad(topic, partition, clean, cleanable, oldest_dirty_ms, tombstones_due,
                         ratio, max_lag_ms)


def scheduler(clock: FakeClock, **policy: float) -> CompactionScheduler:
    return CompactionScheduler(SchedulerPolicy(**policy), clock)  # type: ignore[arg-type]


# -- triggers -------------------------------------------------------------------------------


def test_dirty_ratio_trigger_fires_above_the_topic_ratio(clock: FakeClock) -> None:
    s = scheduler(clock)
    assert s.pick([load(clean=60, cleanable=40)]) == []  # 0.4 < 0.5
    # Kafka's LogCleanerManager: cleanableRatio > minCleanableRatio, strictly.
    assert s.pick([load(clean=50, cleanable=50)]) == []  # 0.5 = 0.5
    (job,) = s.pick([load(clean=49, cleanable=51)])
    assert job.reasons == {0: ["ratio"]}
    # A topic's own ratio counts: 0.4 is due under min.cleanable.dirty.ratio=0.3.
    s.finished(job, 100)
    assert s.pick([load(1, clean=60, cleanable=40, ratio=0.3)])[0].partitions == [1]


def test_never_compacted_partition_is_fully_dirty(clock: FakeClock) -> None:
    (job,) = scheduler(clock).pick([load(cleanable=1)])
    assert job.reasons[0] == ["ratio"]
    # With min.cleanable.dirty.ratio=1.0 the ratio never triggers, as in Kafka (a
    # setting people use to turn ratio-triggered cleaning off).
    assert scheduler(clock).pick([load(cleanable=1, ratio=1.0)]) == []


def test_nothing_cleanable_is_never_due(clock: FakeClock) -> None:
    s = scheduler(clock, threshold_bytes=1)
    assert s.pick([load(clean=100, cleanable=0, oldest_dirty_ms=0, ratio=0.0,
                        max_lag_ms=1)]) == []


def test_dirty_bytes_trigger_is_off_by_default_and_fires_at_the_threshold(
        clock: FakeClock) -> None:
    low_ratio = load(clean=100 * MB, cleanable=10 * MB)  # ratio 0.09
    assert scheduler(clock).pick([low_ratio]) == []
    assert scheduler(clock, threshold_bytes=11 * MB).pick([low_ratio]) == []
    (job,) = scheduler(clock, threshold_bytes=10 * MB).pick([low_ratio])
    assert job.reasons == {0: ["bytes"]}


def test_max_compaction_lag_trigger(clock: FakeClock) -> None:
    s = scheduler(clock)
    old = clock.ms - 60_000
    assert s.pick([load(clean=100, cleanable=1, oldest_dirty_ms=old, max_lag_ms=60_000)]) == []
    clock.advance(0.001)
    (job,) = s.pick([load(clean=100, cleanable=1, oldest_dirty_ms=old, max_lag_ms=60_000)])
    assert job.reasons == {0: ["lag"]}


def test_expired_tombstones_make_a_partition_due(clock: FakeClock) -> None:
    (job,) = scheduler(clock).pick([load(clean=100, tombstones_due=True)])
    assert job.reasons == {0: ["tombstones"]}


def test_every_trigger_that_holds_is_reported(clock: FakeClock) -> None:
    s = scheduler(clock, threshold_bytes=10)
    (job,) = s.pick([load(cleanable=10, oldest_dirty_ms=0, max_lag_ms=1,
                          tombstones_due=True)])
    assert job.reasons == {0: ["ratio", "bytes", "lag", "tombstones"]}


# -- priority and limits ----------------------------------------------------------------------


def test_dirtiest_partition_goes_first_within_the_run_limit(clock: FakeClock) -> None:
    s = scheduler(clock, max_concurrent_runs=2)
    loads = [load(0, "a", clean=40, cleanable=60), load(0, "b", clean=10, cleanable=90),
             load(0, "c", clean=20, cleanable=80)]
    jobs = s.pick(loads)
    assert [job.topic for job in jobs] == ["b", "c"]
    assert s.pick(loads) == []  # both run slots are taken
    s.finished(jobs[1], bytes_read=100)
    # c is compacted (no longer dirty), b still runs.
    assert [job.topic for job in s.pick(loads[:2])] == ["a"]


def test_one_run_takes_every_due_partition_of_its_topic(clock: FakeClock) -> None:
    s = scheduler(clock)
    loads = [load(0, clean=10, cleanable=90), load(1, clean=90, cleanable=10),
             load(2, clean=40, cleanable=60), load(0, "other", cleanable=100)]
    (job,) = s.pick(loads)
    assert job.topic == "other"  # ratio 1.0 beats 0.9
    s.finished(job, 100)
    (job,) = s.pick(loads[:3])
    assert (job.topic, job.partitions) == ("t", [0, 2])  # partition 1 is not due


def test_a_partition_is_never_in_two_runs(clock: FakeClock) -> None:
    s = scheduler(clock, max_concurrent_runs=4)
    (job,) = s.pick([load(0, cleanable=1)])
    assert s.pick([load(0, cleanable=1), load(1, cleanable=1)])[0].partitions == [1]
    with pytest.raises(BusyError, match=r"partition\(s\) 0"):
        s.request("t", [0, 5])
    s.finished(job, 1)
    assert s.request("t", [0, 5]).requested


def test_requested_runs_skip_triggers_backoff_and_pacing(clock: FakeClock) -> None:
    s = scheduler(clock, io_max_bytes_per_s=1.0)
    job = s.request("t", [3])
    s.finished(job, bytes_read=10**9, error=None)
    assert s.pick([load(0, cleanable=1)]) == []  # paced for 10^9 s
    assert s.request("t", [0]).partitions == [0]


# -- failures and backoff --------------------------------------------------------------------


def test_failed_partition_backs_off_exponentially_and_others_carry_on(clock: FakeClock) -> None:
    s = scheduler(clock, backoff_initial_s=30, backoff_max_s=100)
    bad, good = load(0, cleanable=1), load(0, "good", cleanable=1)
    (job,) = s.pick([bad])
    s.finished(job, 0, error="CorruptionError: segment 42")
    failure = s.uncleanable()[("t", 0)]
    assert (failure.count, failure.error, failure.retry_at_s) == (
        1, "CorruptionError: segment 42", clock.now + 30)
    assert [j.topic for j in s.pick([bad, good])] == ["good"]
    s.finished(s.state.running[max(s.state.running)], 1)
    clock.advance(29.9)
    assert s.pick([bad]) == []
    clock.advance(0.1)
    (job,) = s.pick([bad])
    s.finished(job, 0, error="again")
    assert s.uncleanable()[("t", 0)].retry_at_s == clock.now + 60  # doubled
    clock.advance(60)
    s.finished(s.pick([bad])[0], 0, error="again")
    assert s.uncleanable()[("t", 0)].retry_at_s == clock.now + 100  # capped
    clock.advance(100)
    (job,) = s.pick([bad])
    s.finished(job, 1)
    assert s.uncleanable() == {}


def test_failed_partition_is_retried_when_due_even_if_no_trigger_holds_now(
        clock: FakeClock) -> None:
    s = scheduler(clock, backoff_initial_s=1)
    s.finished(s.pick([load(cleanable=60, clean=40)])[0], 0, error="boom")
    clock.advance(1)
    # Phase 1 failed, so nothing changed; but a ratio below the trigger (say the topic's
    # ratio was raised) must not leave it marked uncleanable forever.
    (job,) = s.pick([load(cleanable=60, clean=40, ratio=0.9)])
    assert job.reasons == {0: ["retry"]}


def test_failed_run_of_several_partitions_retries_each_alone(clock: FakeClock) -> None:
    s = scheduler(clock, max_concurrent_runs=3)
    loads = [load(0, cleanable=1), load(1, cleanable=1), load(2, cleanable=1)]
    (job,) = s.pick(loads)
    assert job.partitions == [0, 1, 2]
    s.finished(job, 0, error="partition 1 is corrupt")
    assert s.uncleanable() == {}  # not yet known which
    jobs = s.pick(loads)
    assert sorted(j.partitions[0] for j in jobs) == [0, 1, 2]
    assert all(len(j.partitions) == 1 for j in jobs)
    for j in jobs:
        s.finished(j, 1, error="corrupt" if j.partitions == [1] else None)
    assert list(s.uncleanable()) == [("t", 1)]
    (job,) = s.pick(loads)
    assert job.partitions == [0, 2]  # together again; 1 backs off


def test_failure_restored_after_restart_keeps_its_backoff(clock: FakeClock) -> None:
    s = scheduler(clock, backoff_initial_s=10)
    s.restore_failure(("t", 0), count=2, error="old", at_s=clock.now - 5)
    assert s.pick([load(cleanable=1)]) == []  # 20 s backoff, 5 s gone
    clock.advance(15)
    assert s.pick([load(cleanable=1)])[0].partitions == [0]


# -- pacing ---------------------------------------------------------------------------------------


def test_io_limit_spaces_runs_by_the_bytes_they_read(clock: FakeClock) -> None:
    s = scheduler(clock, io_max_bytes_per_s=10 * MB, max_concurrent_runs=2)
    started = clock.now
    (job,) = s.pick([load(0, cleanable=1)])
    clock.advance(2)
    s.finished(job, bytes_read=50 * MB)  # 5 s of budget
    assert s.pick([load(1, cleanable=1)]) == []
    clock.now = started + 4.99
    assert s.pick([load(1, cleanable=1)]) == []
    clock.now = started + 5
    assert s.pick([load(1, cleanable=1)])[0].partitions == [1]


def test_no_io_limit_means_no_pacing(clock: FakeClock) -> None:
    s = scheduler(clock)
    s.finished(s.pick([load(0, cleanable=1)])[0], bytes_read=10**12)
    assert s.pick([load(1, cleanable=1)])[0].partitions == [1]
