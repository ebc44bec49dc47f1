"""A long-lived compaction process: runs one compaction per request, keeping its engine
(for Spark: the JVM and the SparkSession) warm between runs.

The server's cleaner starts it as `python -m compactlog compact-worker ...` and speaks
JSON lines: it writes {"id": N, "topic": T, "partitions": [...] | null} to the worker's
stdin and reads {"id": N, "report": {...}} or {"id": N, "error": "..."} from its stdout.
End of input ends the worker. Everything else the process or its children print (Spark's
JVM included) goes to stderr, so stdout carries nothing but answers.

A cold JVM runs the first compaction about 2.4 times slower than a warm one and costs
7-9 s to start (docs/benchmarks.md); a warm worker pays both once.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from compactlog.compaction import CompactionReport, CompactionServiceFactory
from compactlog.errors import CompactlogError
from compactlog.storage import LogStore

log = logging.getLogger(__name__)


class CompactionWorker:
    def __init__(self, data_dir: Path, factory: CompactionServiceFactory,
                 settings: dict[str, Any], target: str | Path | None = None) -> None:
        # The store: `target` (a directory or s3:// URL) with `data_dir` as its local
        # directory; without a target, data_dir is the store's directory.
        self.data_dir = data_dir
        self.target = target if target is not None else data_dir
        self.factory = factory
        self.settings = dict(settings)
        self._kept: Any = None  # the engine session kept between runs, if any

    def compact(self, topic: str, partitions: list[int] | None,
                roll: bool = False) -> CompactionReport:
        """One run; with `roll`, a manual one (`trigger`: the active segments rolled
        first). The server's runs never roll here: the server is the writer, and rolls
        a requested run's segments itself before asking."""
        # A store opened per run: topics created since the last run are seen.
        with LogStore.open(self.target, read_only=True, local_dir=self.data_dir) as store:
            service = self.factory.new_service(store, topic, self.settings)
            try:
                return service.trigger(partitions) if roll else service.compact(partitions)
            finally:
                started = getattr(service, "started_session", None)
                if started is not None:
                    self._kept = started
                    self.settings["spark.session"] = started

    def warm_up(self) -> float:
        """Start the engine's session now (Spark: the JVM, and one small job), so that
        the first run is as warm as the next; the seconds it took. An engine without a
        session to keep (its factory has no `start_session`) has nothing to warm."""
        start = getattr(self.factory, "start_session", None)
        if start is None or self._kept is not None:
            return 0.0
        began = time.monotonic()
        self._kept = start(self.settings)
        self.settings["spark.session"] = self._kept
        return time.monotonic() - began

    def close(self) -> None:
        if self._kept is not None:
            self._kept.stop()
            self._kept = None


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
