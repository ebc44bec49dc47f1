"""A compaction run's Spark jobs: their tasks' progress while they run, and what ran.

Invariant: every Spark job the engine starts for a run runs in the run's job group (set
on the calling thread for the job and cleared after), so Spark's status
tracker finds exactly that run's jobs: their tasks for the progress callback while they
run (polled from a thread, as Spark's own console progress bar polls its status store),
and their ids, stages and task counts for the report afterwards.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

from compactlog.compaction.runner import Progress

if TYPE_CHECKING:
    from pyspark import SparkContext

# The progress stage under which the engine reports (completed tasks, tasks) of the run's
# Spark jobs so far; the runner's own stages name the phase they belong to.
SPARK_TASKS = "spark tasks"
# The progress stage heard while the service starts a Spark session (a JVM): (stage, 0, 0).
SPARK_START = "spark start-up"
POLL_INTERVAL_S = 0.2
SETTLE_S = 2.0
SETTLE_NO_JOB_S = 0.25


class RunJobs:
    def __init__(self, context: SparkContext, progress: Progress | None = None) -> None:
        self.context = context
        self.group = f"compaction-{uuid.uuid4().hex[:12]}"
        self.progress = progress

    @contextlib.contextmanager
    def job(self, description: str) -> Iterator[None]:
        """Run the block's Spark jobs in the run's group, reporting their tasks."""
        self.context.setJobGroup(self.group, description)
        stop = threading.Event()
        poller = None
        if self.progress is not None:
            poller = threading.Thread(target=self._poll, args=(stop,), daemon=True,
                                      name="spark-task-progress")
            poller.start()
        try:
            yield
            self._settle()
        finally:
            stop.set()
            if poller is not None:
                poller.join()
            # None removes the property (SparkContext.setLocalProperty hands it to the
            # JVM as null): later jobs on this thread are not this run's.
            self.context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]

    def _settle(self) -> None:
        """Wait (up to SETTLE_S) until the status tracker has seen the group's jobs end:
        Spark's listener bus updates it after the job's result is back, so without this
        the last progress report and the summary could miss the last tasks. A block that
        started no job (nothing to do) is waited for SETTLE_NO_JOB_S at most."""
        tracker = self.context.statusTracker()
        started = time.monotonic()
        while time.monotonic() < started + SETTLE_S:
            jobs = [tracker.getJobInfo(job_id)
                    for job_id in tracker.getJobIdsForGroup(self.group)]
            if jobs and all(job is not None and job.status in ("SUCCEEDED", "FAILED")
                            for job in jobs):
                return
            if not jobs and time.monotonic() >= started + SETTLE_NO_JOB_S:
                return
            time.sleep(0.01)

    def tasks(self) -> tuple[int, int]:
        """(completed, all) tasks of the run's jobs so far."""
        tracker = self.context.statusTracker()
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else []:
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    total += stage.numTasks
        return done, total

    def _poll(self, stop: threading.Event) -> None:
        assert self.progress is not None
        last = (-1, -1)
        while True:
            stopping = stop.wait(POLL_INTERVAL_S)
            try:
                counts = self.tasks()
            except Exception:  # the session stopping under us ends the progress, not the run
                return
            if counts != last and counts[1]:
                self.progress(SPARK_TASKS, *counts)
                last = counts
            if stopping:
                return

    def summary(self) -> str:
        """The run's jobs, e.g. `job 7 (1 stage, 2 tasks)`; empty when there were none."""
        tracker = self.context.statusTracker()
        parts = []
        for job_id in sorted(tracker.getJobIdsForGroup(self.group)):
            job = tracker.getJobInfo(job_id)
            stages = [stage for stage_id in (job.stageIds if job is not None else [])
                      if (stage := tracker.getStageInfo(stage_id)) is not None]
            tasks = sum(stage.numTasks for stage in stages)
            parts.append(f"job {job_id} ({len(stages)} stage{'' if len(stages) == 1 else 's'}"
                         f", {tasks} task{'' if tasks == 1 else 's'})")
        return ", ".join(parts)
