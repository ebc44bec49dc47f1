"""The default compaction service: the two-phase pipeline on Spark.

One Spark application per run compacts every partition asked for, so the JVM start-up
(5 to 10 s on a small machine) is paid once per run, not once per partition. The
session is started on first use and kept by the service, so a caller that compacts
again (tests, a long-lived compactor) reuses it.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from compactlog.compaction import CompactionReport, TopicCompactionService
from compactlog.compaction.arrow_pipeline import (
    compact_inline,
    compact_partitions,
    runs_without_spark,
    uses_arrow,
)
from compactlog.compaction.io_throttle import IO_CAP_SPARK_CONF
from compactlog.compaction.ledger import PieceResult
from compactlog.compaction.ledger_reads import LedgerReads
from compactlog.compaction.plan import PartitionPlan
from compactlog.compaction.runner import Progress, run_compaction
from compactlog.compaction.spark_jobs import SPARK_START, RunJobs
from compactlog.compaction.spark_pipeline import find_survivors, write_ledgers
from compactlog.compaction.spark_session import default_master, start_session
from compactlog.errors import UserError
from compactlog.storage import LogStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class SparkEngine:
    """Partitions whose phase 1 runs in Arrow tasks (arrow_pipeline.uses_arrow) are done
    whole in `write_ledgers`, one task each: as one Spark job, or in this process when
    the topic asks for a run without Spark (arrow_pipeline.runs_without_spark; then no
    session is started, and the tasks run on as many threads as the master has cores:
    `local_cores`, 0 for a master that is not local, then this machine's). The others take the SQL
    pipeline's two phases. `stages` collects the Arrow tasks' seconds per stage;
    `ran` says what ran them (`description`), and `progress` hears of the Spark jobs'
    tasks while they run (spark_jobs.SPARK_TASKS). The Arrow tasks' reads and writes
    are held to `io_max_bytes_per_s` over the run (0: unlimited; io_throttle.py), and
    `io` sums their counters."""

    def __init__(self, session: Callable[[], SparkSession],
                 local_cores: Callable[[], int] = lambda: 0,
                 progress: Progress | None = None, without_spark: bool = False,
                 io_max_bytes_per_s: float = 0.0) -> None:
        self._session = session
        self._without_spark = without_spark
        self._local_cores = local_cores
        self._progress = progress
        self._jobs: RunJobs | None = None
        self.stages: dict[str, float] = {}
        self.inline_tasks = 0
        self.io_max_bytes_per_s = io_max_bytes_per_s
        self.io: dict[str, float] = {}
        # Whether this run's Arrow tasks run in this process: decided once, in
        # find_survivors (the runner's step 3), for the plans write_ledgers then takes.
        self._in_process: bool | None = None

    def _spark(self) -> tuple[SparkSession, RunJobs]:
        session = self._session()
        if self._jobs is None:
            self._jobs = RunJobs(session.sparkContext, self._progress)
        return session, self._jobs

    def find_survivors(self, plans: list[PartitionPlan]) -> None:
        # A run asked to go without Spark fails here, before any work, if it cannot.
        self._in_process = runs_without_spark(plans, self._without_spark)
        # Only plans with input: phase 1 of the others starts no job.
        sql = [plan for plan in plans if not uses_arrow(plan) and plan.inputs]
        if sql:
            session, jobs = self._spark()
            with jobs.job("compaction phase 1: find survivors"):
                find_survivors(session, sql)

    def write_ledgers(
        self, plans: list[PartitionPlan], run_id: str
    ) -> dict[int, list[PieceResult]]:
        results: dict[int, list[PieceResult]] = {}
        sql = [plan for plan in plans if not uses_arrow(plan)]
        arrow = [plan for plan in plans if uses_arrow(plan)]
        if sql:
            session, jobs = self._spark()
            with jobs.job(f"compaction run {run_id}, phase 2: write ledgers"):
                results.update(write_ledgers(session, sql, run_id))
        cores = self._local_cores() if arrow else 0
        if self._in_process is None:  # called without find_survivors
            self._in_process = runs_without_spark(plans, self._without_spark)
        if arrow and self._in_process:
            self.inline_tasks += len(arrow)
            results.update(compact_inline(arrow, run_id, self.stages,
                                          threads=cores or os.cpu_count() or 1,
                                          io_max_bytes_per_s=self.io_max_bytes_per_s,
                                          io=self.io))
        elif arrow:
            session, jobs = self._spark()
            with jobs.job(f"compaction run {run_id}: {len(arrow)} partition(s)"):
                # One Spark task per core: on a local master, its cores.
                results.update(compact_partitions(
                    session, arrow, run_id, self.stages, slots=cores or None,
                    io_max_bytes_per_s=self.io_max_bytes_per_s, io=self.io))
        return results

    def description(self) -> str:
        """What ran the run's tasks: its Spark jobs (master, job ids, stages and tasks),
        and the partitions run in this process instead; "none" if nothing ran."""
        ran = []
        if self._jobs is not None and (jobs := self._jobs.summary()):
            ran.append(f"Spark {self._jobs.context.master}: {jobs}")
        if self.inline_tasks:
            ran.append(f"in this process, no Spark job: {self.inline_tasks} "
                       f"partition{'' if self.inline_tasks == 1 else 's'}")
        return "; ".join(ran) or "none"


class SparkCompactionService(LedgerReads, TopicCompactionService):
    """Settings: `spark.master` (default: spark.master of the user's spark-defaults.conf,
    else local[*]; spark_session.default_master), `spark.conf` (a mapping of Spark
    settings), `spark.session` (an existing SparkSession to use),
    `compaction.without.spark` (true: every topic's tasks run in this process, as the
    topic config of that name asks for one topic), `spark.log.file` (a Path: where the
    JVM this service starts, its Python workers and py4j write their output; by default
    this process' stdout and stderr), `clock`, `progress`. The Spark setting
    `spark.compactlog.log.cleaner.io.max.bytes.per.second` caps each run's compaction
    I/O (compaction/io_throttle.py; the server's cleaner sets it from its
    `io_max_bytes_per_s`)."""

    def __init__(self, store: LogStore, topic: str, settings: Mapping[str, Any]) -> None:
        super().__init__(store, topic)
        self.settings = dict(settings)
        self._spark: SparkSession | None = settings.get("spark.session")
        self.clock: Callable[[], float] = settings.get("clock", time.time)
        self.progress: Progress | None = settings.get("progress")
        self._startup_s = 0.0

    def session(self) -> SparkSession:
        if self._spark is None:
            if self.progress is not None:
                self.progress(SPARK_START, 0, 0)
            started = time.monotonic()
            self._spark = start_session(
                self.settings.get("spark.master") or None,
                self.settings.get("spark.conf") or {},
                log_file=self.settings.get("spark.log.file"),
            )
            self._startup_s += time.monotonic() - started
        return self._spark

    def local_cores(self) -> int:
        """How many cores a local master (`local`, `local[N]`, `local[*]`...) runs tasks
        on, 0 when the master is not local: of the session given, else of the settings;
        never starts a session."""
        given = self.settings.get("spark.session")
        master = (given.sparkContext.master if given is not None
                  else self.settings.get("spark.master") or default_master())
        return local_master_cores(str(master))

    def compact(self, partitions: Sequence[int] | None = None) -> CompactionReport:
        engine = SparkEngine(self.session, self.local_cores, self.progress,
                             bool(self.settings.get("compaction.without.spark")),
                             self.io_max_bytes_per_s())
        self._startup_s = 0.0
        if self.progress is None:
            report = run_compaction(self.store, self.topic, engine, partitions, self.clock)
        else:
            report = run_compaction(
                self.store, self.topic, engine, partitions, self.clock, self.progress
            )
        # The session starts lazily, inside phase 1, so that a run with nothing to do
        # never starts a JVM; its cost is reported apart from the work.
        if self._startup_s:
            report.startup_s = self._startup_s
            report.stages = {"spark start-up": self._startup_s, **report.stages}
            for stage in ("phase 1", "phase 2"):  # whichever started the session
                if report.stages.get(stage, 0.0) >= self._startup_s:
                    report.stages[stage] -= self._startup_s
                    break
        # The Arrow tasks' own seconds (summed over tasks, so over the cores): what the
        # rest of phase 2's wall time is not is Spark's scheduling and fixed costs.
        report.stages.update(engine.stages)
        report.engine = engine.description()
        report.io_read_bytes = int(engine.io.get("read_bytes", 0))
        report.io_written_bytes = int(engine.io.get("written_bytes", 0))
        report.throttled_s = float(engine.io.get("throttled_s", 0.0))
        return report

    def io_max_bytes_per_s(self) -> float:
        """The run's I/O cap from the Spark settings (0: unlimited)."""
        text = (self.settings.get("spark.conf") or {}).get(IO_CAP_SPARK_CONF, "0")
        try:
            cap = float(text)
        except ValueError:
            raise UserError(f"{IO_CAP_SPARK_CONF} must be a number, got {text!r}") from None
        if cap < 0:
            raise UserError(f"{IO_CAP_SPARK_CONF} must be 0 (unlimited) or above, got {text}")
        return cap

    @property
    def started_session(self) -> SparkSession | None:
        """The session this service started, if it did; a caller that keeps it for later
        services (settings["spark.session"]) stops it itself."""
        return self._spark if "spark.session" not in self.settings else None

    def stop(self) -> None:
        """Stop the Spark session this service started (not one it was given)."""
        if self._spark is not None and "spark.session" not in self.settings:
            self._spark.stop()
        self._spark = None


_LOCAL_MASTER = re.compile(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?")


def local_master_cores(master: str) -> int:
    """The task slots of a local Spark master (`local`: 1, `local[N]` and
    `local[N,F]`: N, `local[*]`: this machine's cores); 0 for any other master."""
    match = _LOCAL_MASTER.fullmatch(master.strip())
    if match is None:
        return 0
    slots = match.group(1)
    if slots is None:
        return 1
    return (os.cpu_count() or 1) if slots == "*" else max(1, int(slots))


class SparkCompactionServiceFactory:
    def new_service(
        self, store: LogStore, topic: str, settings: Mapping[str, Any]
    ) -> SparkCompactionService:
        return SparkCompactionService(store, topic, settings)

    def start_session(self, settings: Mapping[str, Any]) -> SparkSession:
        """A session for a long-lived worker to keep (settings["spark.session"]), warmed
        by one small job so that the first run does not pay the JVM's first-job costs."""
        session = start_session(settings.get("spark.master") or None,
                                settings.get("spark.conf") or {})
        # One task per core imports the Arrow pipeline's modules (pyarrow, Parquet,
        # numpy) in Spark's Python workers, which Spark reuses between tasks
        # (spark.python.worker.reuse). An RDD job, as arrow_pipeline.task_job's: Spark
        # keeps the workers of RDD jobs and of SQL's Arrow UDFs in separate pools.
        self.keep_warm(session)
        return session

    def keep_warm(self, session: SparkSession) -> None:
        """One task per core that imports the pipeline (a no-op in a worker that has):
        a warm-up, and, from a long-lived worker (worker.py, KEEP_WARM_S), a touch that
        keeps Spark from closing its idle Python workers."""
        slots = max(1, session.sparkContext.defaultParallelism)
        session.sparkContext.parallelize(range(slots), slots).foreach(_preload_python_worker)


def _preload_python_worker(_: int) -> None:
    import gc

    import compactlog.compaction.arrow_pipeline  # noqa: F401  (imported for its cost)

    # Spark's worker loop runs gc.collect() after every task (pyspark/daemon.py), which
    # walked the ~100,000 objects these imports made, 50-116 ms of a core each time, just
    # as the driver commits the run. Frozen once, they are skipped (0-0.4 ms).
    if not gc.get_freeze_count():
        gc.collect()
        gc.freeze()
