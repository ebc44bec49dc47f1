"""The processes the cleaner runs compactions in: one per run, or warm workers kept
between runs.

- `OneShot` starts `python -m compactlog compact TOPIC -p N... --json` per run: each run
  pays Spark's start-up (7-9 s here) and runs on a cold JVM (about 2.4 times slower).
- `WarmPool` keeps `python -m compactlog compact-worker` processes (compaction/worker.py)
  and sends each run to an idle one over a pipe: Spark starts once, and a worker idle for
  `keep_warm_s` exits, giving its memory back (a warm worker holds about 1-2 GiB: JVM and
  Spark's Python workers). The pool holds at most `max_workers` processes, busy and idle
  together (the cleaner's max_concurrent_runs, which also bounds the runs it starts).

Either way Spark never runs inside the server, every process has a process group of its
own (so that stopping it stops Spark's JVM and Python workers too), a run going on past
`run_timeout_s` is stopped, and a process that dies mid-run is a failed run, which the
compaction's own crash safety makes harmless (the old ledger stays in force).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from compactlog.compaction.scheduler import Job

log = logging.getLogger("compactlog.cleaner")
ERROR_PREFIX = "error: "
STDERR_TAIL = 50  # lines of a worker's stderr kept for error messages


@dataclass
class Outcome:
    report: dict[str, Any] | None
    error: str | None


@dataclass(frozen=True)
class ProcessSettings:
    data_dir: Path
    spark_master: str
    spark_conf: dict[str, str]
    service: str | None
    run_timeout_s: float
    # The store's s3:// URL when data_dir is only its local directory (None: local).
    target: str | None = None
    without_spark: bool = False  # CleanerConfig.without_spark

    def env(self) -> dict[str, str]:
        """The child's environment: ours, and for an S3 store its local directory."""
        env = dict(os.environ)
        if self.target is not None:
            env["COMPACTLOG_LOCAL_DIR"] = str(self.data_dir)
        return env

    def engine_args(self) -> list[str]:
        # Empty: the child takes spark.master of spark-defaults.conf, else local[*].
        args = ["--spark-master", self.spark_master] if self.spark_master else []
        for key, value in self.spark_conf.items():
            args += ["--spark-conf", f"{key}={value}"]
        if self.service:
            args += ["--service", self.service]
        if self.without_spark:
            args.append("--without-spark")
        return args

    def base(self) -> list[str]:
        return [sys.executable, "-m", "compactlog", "--data-dir",
                self.target or str(self.data_dir),
                "--log-level", "info"]


class Runner(Protocol):
    async def run(self, job: Job) -> Outcome: ...

    def expire_idle(self) -> None: ...

    async def close(self) -> None: ...


class OneShot:
    def __init__(self, settings: ProcessSettings) -> None:
        self.settings = settings

    def command(self, job: Job) -> list[str]:
        # --no-roll: the server is the writer; it rolled a requested run's active
        # segments before starting it, and the cleaner's runs leave them (Kafka's rule).
        command = [*self.settings.base(), "compact", job.topic, "--json", "--no-roll"]
        for index in job.partitions:
            command += ["--partition", str(index)]
        return command + self.settings.engine_args()

    async def run(self, job: Job) -> Outcome:
        process = await _start(self.command(job), stdin=False, env=self.settings.env())
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(),
                                                    self.settings.run_timeout_s)
        except TimeoutError:
            await stop_group(process)
            return _timed_out(self.settings.run_timeout_s)
        except asyncio.CancelledError:
            await stop_group(process)
            raise
        lines = stderr.decode(errors="replace").splitlines()
        for line in lines:
            log.debug("compaction %d: %s", job.id, line)
        if process.returncode != 0:
            return Outcome(None, _error_line(lines, process.returncode))
        try:
            return Outcome(json.loads(stdout), None)
        except ValueError:
            return Outcome(None, f"the compaction process printed no report: {stdout[:200]!r}")

    def expire_idle(self) -> None:
        pass

    async def close(self) -> None:
        pass


class WarmWorker:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        self.idle_since = time.monotonic()
        self._drain = asyncio.create_task(self._read_stderr())

    async def _read_stderr(self) -> None:
        # Read continuously: a full pipe would block the worker.
        assert self.process.stderr is not None
        while line := await self.process.stderr.readline():
            text = line.decode(errors="replace").rstrip()
            self.stderr_tail.append(text)
            log.debug("compaction worker %d: %s", self.process.pid, text)

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    async def run(self, job: Job, timeout_s: float) -> Outcome:
        assert self.process.stdin is not None and self.process.stdout is not None
        request = {"id": job.id, "topic": job.topic, "partitions": job.partitions}
        self.process.stdin.write((json.dumps(request) + "\n").encode())
        await self.process.stdin.drain()
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout_s)
        if not line:  # the worker died mid-run
            code = await self.process.wait()
            await self._drain
            return Outcome(None, _error_line(list(self.stderr_tail), code))
        answer = json.loads(line)
        if answer.get("id") != job.id:
            raise RuntimeError(f"compaction worker answered run {answer.get('id')} for "
                               f"run {job.id}")
        self.idle_since = time.monotonic()
        if "error" in answer:
            return Outcome(None, str(answer["error"]))
        return Outcome(answer["report"], None)

    async def close(self) -> None:
        """End of input: the worker stops Spark and exits; stopped by force if it hangs."""
        if self.process.stdin is not None and not self.process.stdin.is_closing():
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 30)
        except TimeoutError:
            await stop_group(self.process)
        with contextlib.suppress(Exception):
            await self._drain


class WarmPool:
    def __init__(self, settings: ProcessSettings, keep_warm_s: float,
                 max_workers: int = 1) -> None:
        self.settings = settings
        self.keep_warm_s = keep_warm_s
        self.max_workers = max_workers
        self.idle: list[WarmWorker] = []
        self.busy: set[WarmWorker] = set()
        self._closing: set[asyncio.Task[None]] = set()

    async def run(self, job: Job) -> Outcome:
        worker = self.idle.pop() if self.idle else None
        if worker is None or not worker.alive:
            if len(self.busy) + len(self.idle) >= self.max_workers:
                # The cleaner starts no more runs than this; a bug if it did.
                return Outcome(None, f"not started: {self.max_workers} compaction "
                                     f"process(es) are busy (max_concurrent_runs)")
            command = [*self.settings.base(), "compact-worker", *self.settings.engine_args()]
            worker = WarmWorker(await _start(command, stdin=True, env=self.settings.env()))
            log.info("started compaction worker %d", worker.process.pid)
        self.busy.add(worker)
        healthy = False
        try:
            outcome = await worker.run(job, self.settings.run_timeout_s)
            healthy = worker.alive
            return outcome
        except TimeoutError:
            return _timed_out(self.settings.run_timeout_s)
        except (ValueError, RuntimeError, ConnectionError) as error:
            return Outcome(None, f"the compaction worker broke its protocol: {error}")
        finally:
            self.busy.discard(worker)
            if healthy:
                self.idle.append(worker)
            else:  # timed out, cancelled (server stopping), died or confused: stop it
                await asyncio.shield(stop_group(worker.process))

    def expire_idle(self) -> None:
        now = time.monotonic()
        for worker in [w for w in self.idle if now - w.idle_since >= self.keep_warm_s]:
            self.idle.remove(worker)
            log.info("stopping compaction worker %d, idle for %.0fs", worker.process.pid,
                     now - worker.idle_since)
            task = asyncio.create_task(worker.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        workers, self.idle = self.idle, []
        await asyncio.gather(*(w.close() for w in workers), *self._closing,
                             return_exceptions=True)


def make_runner(settings: ProcessSettings, keep_warm_s: float,
                max_workers: int = 1) -> Runner:
    return (WarmPool(settings, keep_warm_s, max_workers) if keep_warm_s > 0
            else OneShot(settings))


async def _start(command: list[str], stdin: bool,
                 env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *command, env=env,
        stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )


def _timed_out(timeout_s: float) -> Outcome:
    return Outcome(None, f"the run took longer than {timeout_s:g}s (run_timeout_s) and was "
                         "stopped")


def _error_line(lines: list[str], code: int | None) -> str:
    for line in reversed(lines):
        if line.startswith(ERROR_PREFIX):
            return line[len(ERROR_PREFIX):]
    tail = next((line for line in reversed(lines) if line.strip()), "")
    return f"the compaction process exited with code {code}: {tail}"


async def stop_group(process: asyncio.subprocess.Process, grace_s: float = 5.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), grace_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
