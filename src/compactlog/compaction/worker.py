"""A long-lived compaction process: runs one compaction per request, keeping its engine
(for Spark: the JVM and the SparkSession) warm between runs.

The server's cleaner starts it as `python -m compactlog compact-worker ...` and speaks
JSON lines: it writes {"id": N, "topic": T, "partitions": [...] | null} to the worker's
stdin and reads {"id": N, "report": {...}} or {"id": N, "error": "..."} from its stdout.
End of input ends the worker. Everything else the process or its children print (Spark's
JVM included) goes to stderr, so stdout carries nothing but answers.

A cold JVM runs the first compaction about 2.4 times slower than a warm one and costs
7-9 s to start (docs/benchmarks.md); a warm worker pays both once.

Spark's Python workers go cold on their own: Spark closes those idle for a minute
(PythonWorkerFactory's IDLE_WORKER_TIMEOUT, not a setting), and the next run's tasks
then wait for new ones to import pyarrow and the pipeline (a 4-task job took 1.03 s
after 75 s idle, against 0.10 s after 30 s). So while a session is kept, a thread
touches its workers (the factory's `keep_warm`: one small task per core) once nothing
has run on them for KEEP_WARM_S; never during a run (`_busy`), and not after `close`
(tests/compaction/test_worker_keep_warm.py).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from compactlog.compaction import CompactionReport, CompactionServiceFactory
from compactlog.errors import CompactlogError
from compactlog.storage import LogStore

log = logging.getLogger(__name__)


# Seconds without a run or a touch after which a kept session's Python workers are
# touched: within Spark's one idle minute, with its 10 s check to spare.
KEEP_WARM_S = 40.0


class CompactionWorker:
    def __init__(self, data_dir: Path, factory: CompactionServiceFactory,
                 settings: dict[str, Any], target: str | Path | None = None,
                 keep_warm_s: float = KEEP_WARM_S) -> None:
        # The store: `target` (a directory or s3:// URL) with `data_dir` as its local
        # directory; without a target, data_dir is the store's directory.
        self.data_dir = data_dir
        self.target = target if target is not None else data_dir
        self.factory = factory
        self.settings = dict(settings)
        self._kept: Any = None  # the engine session kept between runs, if any
        self.keep_warm_s = keep_warm_s  # 0: never touched
        self.touches = 0  # how many times the kept session's workers were touched
        self._busy = threading.Lock()  # held by a run, a touch, and close
        self._last_active = time.monotonic()
        self._closing = threading.Event()
        self._keeper: threading.Thread | None = None

    def compact(self, topic: str, partitions: list[int] | None,
                roll: bool = False) -> CompactionReport:
        """One run; with `roll`, a manual one (`trigger`: the active segments rolled
        first). The server's runs never roll here: the server is the writer, and rolls
        a requested run's segments itself before asking."""
        # A store opened per run: topics created since the last run are seen.
        with self._busy, LogStore.open(self.target, read_only=True,
                                       local_dir=self.data_dir) as store:
            service = self.factory.new_service(store, topic, self.settings)
            try:
                return service.trigger(partitions) if roll else service.compact(partitions)
            finally:
                self._last_active = time.monotonic()
                started = getattr(service, "started_session", None)
                if started is not None:
                    self._kept = started
                    self.settings["spark.session"] = started
                self._start_keeper()

    def warm_up(self) -> float:
        """Start the engine's session now (Spark: the JVM, and one small job), so that
        the first run is as warm as the next; the seconds it took. An engine without a
        session to keep (its factory has no `start_session`) has nothing to warm."""
        start = getattr(self.factory, "start_session", None)
        if start is None or self._kept is not None:
            return 0.0
        began = time.monotonic()
        with self._busy:
            self._kept = start(self.settings)
            self.settings["spark.session"] = self._kept
            self._last_active = time.monotonic()
        self._start_keeper()
        return time.monotonic() - began

    def close(self) -> None:
        self._closing.set()
        with self._busy:  # after a touch in flight, and before the next
            if self._kept is not None:
                self._kept.stop()
                self._kept = None
        if self._keeper is not None:
            self._keeper.join()

    def _start_keeper(self) -> None:
        """Start the thread that keeps a kept session's workers warm (see the module),
        once, when there is a session and the factory can touch it."""
        touch = getattr(self.factory, "keep_warm", None)
        if (self._keeper is not None or self._kept is None or touch is None
                or self.keep_warm_s <= 0 or self._closing.is_set()):
            return
        self._keeper = threading.Thread(target=self._keep_warm, args=(touch,),
                                        name="compaction-keep-warm", daemon=True)
        self._keeper.start()

    def _keep_warm(self, touch: Callable[[Any], None]) -> None:
        while not self._closing.wait(min(self.keep_warm_s / 4, 5.0)):
            if time.monotonic() - self._last_active < self.keep_warm_s:
                continue
            if not self._busy.acquire(blocking=False):
                continue  # a run is on: it keeps the workers busy itself
            try:
                if self._kept is not None and not self._closing.is_set():
                    touch(self._kept)
                    self.touches += 1
            except Exception as error:  # the next run starts its workers as it can
                log.warning("could not keep the Spark session's Python workers warm: %s",
                            error)
            finally:
                self._last_active = time.monotonic()
                self._busy.release()


def serve(worker: CompactionWorker, requests: IO[str], answers: IO[str],
          to_json: Callable[[CompactionReport], dict[str, Any]]) -> None:
    """Answer requests until the end of input."""
    try:
        for line in requests:
            if not line.strip():
                continue
            answer: dict[str, Any] = {"id": None}
            try:
                request = json.loads(line)
                answer["id"] = request["id"]
                report = worker.compact(request["topic"], request.get("partitions"))
                answer["report"] = to_json(report)
            except CompactlogError as error:
                answer["error"] = str(error)
            except Exception as error:  # one bad run must not end the worker
                log.exception("compaction failed")
                answer["error"] = f"unexpected {type(error).__name__}: {error}"
            answers.write(json.dumps(answer) + "\n")
            answers.flush()
    finally:
        worker.close()


def protocol_stdout() -> IO[str]:
    """The original stdout, for answers; fd 1 then points at stderr, so that children
    (Spark's JVM, its Python workers) cannot mix their output into the answers."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return answers
