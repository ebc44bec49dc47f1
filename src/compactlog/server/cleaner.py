"""The server's cleaner: automatic compaction, in compaction processes of its own.

Every `check_interval_s` the cleaner measures each compacted partition (a plan from its
manifest: no data is read), asks the scheduler (compaction/scheduler.py) what is due and
hands each run to a compaction process (server/compaction_processes.py): a warm worker
kept between runs, or a new `compactlog compact` process per run. Spark never runs inside
the server's process, a run that crashes or hangs takes nothing else with it, and the
run's own crash safety (compaction/runner.py) covers a kill at any point. A run's report
feeds the metrics and the admin API; its error goes into the partition's failure.

Runs asked for through the admin API go through the same path, past the triggers but
not past `max_concurrent_runs`: one asked for while that many runs go is refused
(RunsFullError, the admin API's 429), so that a principal with ALTER on a topic of many
partitions cannot start a compaction process (a JVM with Spark) per partition. The
warm pool never holds more processes than `max_concurrent_runs` either.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from compactlog.compaction.io_throttle import IO_CAP_SPARK_CONF
from compactlog.compaction.plan import PartitionPlan, plan_partition
from compactlog.compaction.runner import chosen_partitions
from compactlog.compaction.scheduler import (
    BusyError,
    CompactionScheduler,
    Job,
    PartitionLoad,
    SchedulerPolicy,
)
from compactlog.compaction.status import is_locked, read_status
from compactlog.errors import CompactlogError, InvalidConfigError, UserError
from compactlog.server.compaction_processes import (
    Outcome,
    ProcessSettings,
    Runner,
    make_runner,
)
from compactlog.server.metrics import ServerMetrics
from compactlog.server.security.code_allowlist import check_strategy
from compactlog.storage import LogStore, Partition, Topic

log = logging.getLogger("compactlog.cleaner")
RunIo = Callable[..., Awaitable[Any]]
KEPT_RUNS = 200  # finished runs the admin API can still show
ERROR_PREFIX = "error: "


@dataclass
class CleanerConfig:
    # Off: the server never compacts on its own; runs asked for over the admin API still go.
    enabled: bool = True
    # How often partitions are measured for due compactions (Kafka's log.cleaner.backoff.ms
    # is 15 s).
    check_interval_s: float = 15.0
    # Pulsar's compaction threshold: cleanable dirty bytes that make a partition due
    # whatever its dirty ratio. 0 turns this trigger off.
    threshold_bytes: int = 0
    max_concurrent_runs: int = 1
    backoff_initial_s: float = 30.0
    backoff_max_s: float = 1800.0
    # Kafka's log.cleaner.io.max.bytes.per.second: the bytes per second a run's tasks read
    # and write (compaction/io_throttle.py), and the average the runs keep; 0 = unlimited.
    io_max_bytes_per_s: float = 0.0
    # A run still going after this long is killed (and counts as a failure).
    run_timeout_s: float = 3600.0
    # Keep a compaction process (its JVM and SparkSession) this long after a run, for the
    # next one; 0: a new process per run. A warm process holds about 1-2 GiB.
    keep_warm_s: float = 300.0
    # Where compaction runs; empty: spark.master of the user's spark-defaults.conf, else
    # local[*] (spark_session.default_master).
    spark_master: str = ""
    spark_conf: dict[str, str] = field(default_factory=dict)
    # Every run a Spark job unless set: then the Spark service runs its tasks inside the
    # compaction process, with no JVM (compaction.without.spark, for every topic).
    without_spark: bool = False
    service: str | None = None  # compaction service factory, MODULE:NAME (PIP-278)
    # `function:MODULE:NAME` compaction strategies that a Kafka client may set on a
    # topic, as "MODULE:NAME" (server/security/code_allowlist.py); none by default.
    allowed_strategy_functions: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        positive = {"check_interval_s": self.check_interval_s,
                    "max_concurrent_runs": self.max_concurrent_runs,
                    "backoff_initial_s": self.backoff_initial_s,
                    "backoff_max_s": self.backoff_max_s, "run_timeout_s": self.run_timeout_s}
        for name, value in positive.items():
            if value <= 0:
                raise UserError(f"compaction.{name} must be above 0, got {value}")
        for name, value in {"threshold_bytes": self.threshold_bytes,
                            "io_max_bytes_per_s": self.io_max_bytes_per_s,
                            "keep_warm_s": self.keep_warm_s}.items():
            if value < 0:
                raise UserError(f"compaction.{name} must be 0 (off) or above, got {value}")

    def run_spark_conf(self) -> dict[str, str]:
        """spark_conf for the compaction processes, with the I/O cap the service reads."""
        if not self.io_max_bytes_per_s:
            return dict(self.spark_conf)
        return {**self.spark_conf, IO_CAP_SPARK_CONF: repr(float(self.io_max_bytes_per_s))}

    def policy(self) -> SchedulerPolicy:
        return SchedulerPolicy(
            threshold_bytes=self.threshold_bytes,
            max_concurrent_runs=self.max_concurrent_runs,
            backoff_initial_s=self.backoff_initial_s,
            backoff_max_s=self.backoff_max_s,
            io_max_bytes_per_s=self.io_max_bytes_per_s or None,
        )


@dataclass
class RunRecord:
    """One compaction run the cleaner started, for the admin API."""

    job: Job
    state: Literal["RUNNING", "SUCCESS", "ERROR"] = "RUNNING"
    started_ms: int = 0
    finished_ms: int | None = None
    report: dict[str, Any] | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.job.id, "topic": self.job.topic, "partitions": self.job.partitions,
            "trigger": "request" if self.job.requested else "scheduler",
            "reasons": {str(p): r for p, r in self.job.reasons.items()},
            "state": self.state, "started_ms": self.started_ms,
            "finished_ms": self.finished_ms, "report": self.report, "error": self.error,
        }


def partition_load(topic: str, partition: Partition, now_ms: int) -> PartitionLoad:
    """Measure one partition for the scheduler, from its manifest alone."""
    manifest, version = partition.manifest, partition.manifest_version
    config = partition.config
    plan = plan_partition(topic, partition.index, partition.directory, manifest, version,
                          config, now_ms)
    above = [s for s in manifest.segments
             if plan.old_horizon is None or s.last_offset > plan.old_horizon]
    return PartitionLoad(
        topic=topic,
        partition=partition.index,
        clean_bytes=sum(item.info.size_bytes for item in plan.clean),
        cleanable_bytes=sum(item.info.size_bytes for item in plan.dirty),
        oldest_dirty_ms=min((s.min_timestamp for s in above), default=None),
        tombstones_due=plan.tombstones_due,
        retention_due=_retention_due(plan, [s.min_timestamp for s in above]),
        deletion_due=plan.deletion_due,
        min_cleanable_ratio=config["min.cleanable.dirty.ratio"],
        max_lag_ms=config["max.compaction.lag.ms"],
    )


def _retention_due(plan: PartitionPlan, dirty_min_timestamps: list[int]) -> bool:
    """compact,delete: records older than retention.ms must leave the view in bounded
    time whether or not new records arrive. Reads hide the ledger's at once
    (storage/reads.py); a run is due for a ledger file wholly past retention (Kafka deletes
    a segment once its newest record is past it), and for dirty records past it, which
    only a run takes out of the raw part of the view."""
    cutoff = plan.expiry_cutoff_ms
    if cutoff is None:
        return False
    return plan.ledger_file_expired or any(ts < cutoff for ts in dirty_min_timestamps)


class RunsFullError(Exception):
    """A run asked for while `max_concurrent_runs` runs are going."""

    def __init__(self, topic: str, partitions: list[int], limit: int,
                 running: list[int]) -> None:
        super().__init__(
            f"not compacting {topic} partition(s) {', '.join(map(str, partitions))}: "
            f"max_concurrent_runs ({limit}) compaction(s) are running (run "
            f"{', '.join(map(str, running))}); ask again once one has finished")
        self.running = running


class Cleaner:
    def __init__(self, store: LogStore, config: CleanerConfig, metrics: ServerMetrics,
                 run_io: RunIo, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.config = config
        self.metrics = metrics
        self.run_io = run_io
        self.clock = clock
        self.scheduler = CompactionScheduler(config.policy(), clock)
        self.runs: collections.OrderedDict[int, RunRecord] = collections.OrderedDict()
        self.last_check_s: float | None = None
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self.runner: Runner = make_runner(ProcessSettings(
            store.data_dir, config.spark_master, config.run_spark_conf(), config.service,
            config.run_timeout_s, str(store.location) if store.location.is_s3 else None,
            config.without_spark),
            config.keep_warm_s, config.max_concurrent_runs)
        self._next_check = 0.0
        self._restore_failures()

    def _restore_failures(self) -> None:
        """Failures recorded in status files before a restart keep their backoff."""
        for name in self.store.list_topics():
            topic = self._topic(name)
            if topic is None or not topic.config.compacted:
                continue
            for partition in topic.partitions:
                status = read_status(partition.directory)
                if status.state == "ERROR" and status.failures_in_a_row:
                    at = (status.finished_ms or int(self.clock() * 1000)) / 1000
                    self.scheduler.restore_failure((name, partition.index),
                                                   status.failures_in_a_row,
                                                   status.error or "unknown error", at)

    # -- choosing runs ------------------------------------------------------------------

    def measure(self) -> list[PartitionLoad]:
        """Every compacted partition's load (blocking: run it off the event loop)."""
        now_ms = int(self.clock() * 1000)
        loads = []
        for name in self.store.list_topics():
            topic = self._topic(name)
            if topic is None or not topic.config.compacted:
                continue
            for partition in topic.partitions:
                if is_locked(partition.directory):
                    # Being compacted (by this server's run, or by `compactlog compact` in
                    # another process): not due, and not a failure to back off from.
                    continue
                try:
                    loads.append(partition_load(name, partition, now_ms))
                except Exception:
                    log.exception("%s: could not measure for compaction", partition.name)
        return loads

    def _topic(self, name: str) -> Topic | None:
        """The topic, or None when it cannot be opened (a damaged file, the open-file
        limit): upkeep logs that once a minute, and the other topics go on."""
        try:
            return self.store.topic(name)
        except (OSError, CompactlogError) as error:
            log.debug("compaction: topic %s cannot be opened: %s", name, error)
            return None

    async def tick(self) -> None:
        """Start the runs that are due; called by the server's upkeep loop."""
        self.runner.expire_idle()
        now = time.monotonic()
        if not self.config.enabled or now < self._next_check:
            return
        self._next_check = now + self.config.check_interval_s
        loads = await self.run_io(self.measure)
        self.last_check_s = self.clock()
        for job in self.scheduler.pick(loads):
            reasons = "; ".join(f"{p}: {', '.join(r)}" for p, r in job.reasons.items())
            log.info("compacting %s partition(s) %s (due by %s)", job.topic, job.partitions,
                     reasons)
            self._launch(job)

    async def request(self, topic_name: str, partitions: list[int] | None,
                      roll: bool = True) -> RunRecord:
        """A run asked for by a user. UserError for a bad topic or partition; BusyError
        when a run of any of them is going on, here or in another process;
        RunsFullError when `max_concurrent_runs` runs are going. With `roll`
        (the default) it covers every record appended until now, as Pulsar's manual
        compaction: the active segments are rolled before the run starts."""
        chosen, locked = await self.run_io(self._chosen_and_locked, topic_name, partitions)
        indexes = [p.index for p in chosen]
        if locked:
            raise BusyError(topic_name, locked)
        clash = sorted(p for t, p in self.scheduler.running_keys()
                       if t == topic_name and p in indexes)
        if clash:  # before the limit: a client waits for the run in the way (409)
            raise BusyError(topic_name, clash)
        running = sorted(self.scheduler.state.running)
        if len(running) >= self.config.max_concurrent_runs:
            raise RunsFullError(topic_name, indexes, self.config.max_concurrent_runs,
                                running)
        job = self.scheduler.request(topic_name, indexes)
        job.roll_active = roll
        log.info("compacting %s partition(s) %s (asked for over the admin API)", topic_name,
                 indexes)
        return self._launch(job)

    def _chosen_and_locked(self, topic_name: str, partitions: list[int] | None
                           ) -> tuple[list[Partition], list[int]]:
        # File opens and flocks: off the event loop, like every other store call.
        chosen = chosen_partitions(self.store, topic_name, partitions)
        return chosen, [p.index for p in chosen if is_locked(p.directory)]

    # -- running --------------------------------------------------------------------------

    def _launch(self, job: Job) -> RunRecord:
        record = RunRecord(job, started_ms=int(self.clock() * 1000))
        self.runs[job.id] = record
        while len(self.runs) > KEPT_RUNS:
            oldest = next(iter(self.runs))
            if self.runs[oldest].state == "RUNNING":
                break
            del self.runs[oldest]
        self._tasks[job.id] = asyncio.create_task(self._run(record))
        return record

    async def _run(self, record: RunRecord) -> None:
        job = record.job
        began = time.monotonic()
        try:
            refused = await self.run_io(self._code_refused, job)
            if refused is not None:
                # The topic names code the server's config does not allow (set before
                # the allow-list, or by a local CLI): no process, nothing imported.
                outcome = Outcome(None, refused)
            else:
                # The run covers every rolled segment (compaction/rolled.py); the server
                # is the writer, so it seals them now rather than have the run wait.
                await self.run_io(self._seal_rolled, job)
                outcome = await self.runner.run(job)
        except asyncio.CancelledError:
            outcome = Outcome(None, "the server stopped while the run was going")
            raise
        except Exception as error:  # launching failed: no process, nothing written
            log.exception("could not start a compaction of %s", job.topic)
            outcome = Outcome(None, f"could not start the compaction process: {error}")
        finally:
            self._tasks.pop(job.id, None)
            self._finish(record, outcome, time.monotonic() - began)
        await self.run_io(self._refresh, job)

    def _code_refused(self, job: Job) -> str | None:
        strategy = self.store.topic(job.topic).config["compaction.strategy"]
        try:
            check_strategy(str(strategy), self.config.allowed_strategy_functions)
        except InvalidConfigError as error:
            return f"not started: {error}"
        return None

    def _seal_rolled(self, job: Job) -> None:
        topic = self.store.topic(job.topic)
        for index in job.partitions:
            if job.roll_active:  # a manual run; the cleaner's own leave it (Kafka's rule)
                topic.partition(index).roll()
            topic.partition(index).seal_rolled_quietly()

    def roll(self, topic_name: str, partitions: list[int] | None) -> list[dict[str, Any]]:
        """Roll the active segments of `partitions` (None: all) of a compacted topic and
        seal them (blocking: run it off the event loop): what a manual compaction in
        another process asks of the server first (compaction/rolled.py)."""
        rolled = []
        for partition in chosen_partitions(self.store, topic_name, partitions):
            done = partition.roll()
            partition.seal_rolled_quietly()
            rolled.append({"partition": partition.index, "rolled": done,
                           "log_end_offset": partition.log_end_offset})
        return rolled

    def _refresh(self, job: Job) -> None:
        # Reads use the new (horizon, ledger) pair now, not at the next upkeep.
        topic = self.store.topic(job.topic)
        for index in job.partitions:
            topic.partition(index).refresh()

    def _finish(self, record: RunRecord, outcome: Outcome, seconds: float) -> None:
        job = record.job
        record.finished_ms = int(self.clock() * 1000)
        record.report, record.error = outcome.report, outcome.error
        record.state = "ERROR" if outcome.error else "SUCCESS"
        partitions = (outcome.report or {}).get("partitions", [])
        bytes_in = sum(p["bytes_in"] for p in partitions)
        self.scheduler.finished(job, bytes_in, outcome.error)
        trigger = "request" if job.requested else "scheduler"
        m = self.metrics
        m.compaction_runs.labels(job.topic, record.state.lower(), trigger).inc()
        m.compaction_duration.labels(job.topic).observe(seconds)
        if outcome.error:
            log.error("compaction of %s partition(s) %s failed after %.1fs: %s", job.topic,
                      job.partitions, seconds, outcome.error)
            return
        records_in = sum(p["records_in"] for p in partitions)
        records_out = sum(p["records_out"] for p in partitions)
        m.compaction_records_in.labels(job.topic).inc(records_in)
        m.compaction_records_out.labels(job.topic).inc(records_out)
        m.compaction_records_removed.labels(job.topic).inc(records_in - records_out)
        m.compaction_bytes_in.labels(job.topic).inc(bytes_in)
        # A successful run's report comes from this build's worker (CompactionReport's
        # fields): a missing field is a bug to see, not a 0 to count.
        report = outcome.report or {}
        m.compaction_io_bytes.labels(job.topic, "read").inc(report["io_read_bytes"])
        m.compaction_io_bytes.labels(job.topic, "written").inc(report["io_written_bytes"])
        m.compaction_throttled.labels(job.topic).inc(report["throttled_s"])
        log.info("compacted %s partition(s) %s in %.1fs: %d records in, %d out",
                 job.topic, job.partitions, seconds, records_in, records_out)

    async def stop(self) -> None:
        """Stop runs in flight (their partitions keep the old ledger), wait for them, and
        stop the warm workers."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self.runner.close()

    def running(self) -> list[RunRecord]:
        return [r for r in self.runs.values() if r.state == "RUNNING"]
