"""A warm compaction worker that the CLI leaves running (`compactlog worker start`).

Invariant: while `<data dir>/compaction-worker.json` names a live process, that process
listens on the Unix socket the file names and runs one compaction at a time for
whoever connects, with its engine (Spark's JVM and session) kept warm between runs.
The socket lives in a directory only its user can enter (0700), so only that user can
ask. The worker removes the file and the socket before it exits: after `idle_timeout_s`
without a request, on a `stop` request, or on SIGTERM. A file whose process is gone is
ignored by readers and replaced by the next worker.

A compaction it runs is the same as `compactlog compact` in its own process: the
store is opened read-only per run (topics created since are seen) and the compaction
lock keeps it apart from the server's cleaner and other `compact` commands.

The conversation, one JSON line each way per connection:
  {"op": "compact", "topic": T, "partitions": [..] | null, "roll": bool}
      ->  {"report": {..}} | {"error": ".."}   ("roll": a manual run, rolled.py)
  {"op": "status"}  ->  {"pid", "runs", "idle_timeout_s", "idle_s", "started_ms",
                         "last_run_ms", "spark_master", "warm_up_s"}
  {"op": "stop"}  ->  {"stopping": true}, then the worker exits
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from compactlog import fsutil
from compactlog.compaction import CompactionReport
from compactlog.compaction.worker import CompactionWorker
from compactlog.errors import CompactlogError
from compactlog.pids import is_alive

WORKER_FILE = "compaction-worker.json"
SOCKET_NAME = "worker.sock"
DEFAULT_IDLE_TIMEOUT_S = 600.0
MAX_REQUEST_BYTES = 1 << 16
log = logging.getLogger(__name__)


class WorkerGone(CompactlogError):
    """The worker named by compaction-worker.json did not answer."""


@dataclass(frozen=True)
class WorkerInfo:
    pid: int
    socket: str
    idle_timeout_s: float
    spark_master: str
    started_ms: int

    def write(self, data_dir: Path) -> None:
        temp = fsutil.temp_path(data_dir, "worker")
        fsutil.write_file_durably(temp, json.dumps(asdict(self)).encode())
        fsutil.publish_replace(temp, data_dir / WORKER_FILE)


def running_worker(data_dir: Path) -> WorkerInfo | None:
    """The worker of `data_dir`, if its process is alive and its socket exists."""
    try:
        body = json.loads((data_dir / WORKER_FILE).read_bytes())
        info = WorkerInfo(int(body["pid"]), str(body["socket"]), float(body["idle_timeout_s"]),
                          str(body["spark_master"]), int(body["started_ms"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    # Another user's process holding the pid is not our worker.
    if not is_alive(info.pid, other_users=False) or not Path(info.socket).exists():
        return None
    return info


def ask(info: WorkerInfo, request: dict[str, Any], timeout_s: float | None = None
        ) -> dict[str, Any]:
    """Send one request to the worker and return its answer. WorkerGone if it cannot be
    reached or hangs up without answering (it died, or is stopping)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(info.socket)
            sock.sendall(json.dumps(request).encode() + b"\n")
            with sock.makefile("rb") as answers:
                line = answers.readline()
        except OSError as error:
            raise WorkerGone(f"the compaction worker (pid {info.pid}) did not answer: "
                             f"{error}") from None
    if not line:
        raise WorkerGone(f"the compaction worker (pid {info.pid}) closed the connection "
                         "without answering")
    answer: dict[str, Any] = json.loads(line)
    return answer


class _Stop(BaseException):
    """SIGTERM while waiting for a request: leave the loop and clean up. (A BaseException,
    so that no handler of a run's errors swallows it.)"""


class _Lifecycle:
    """SIGTERM during a run lets the run finish (its commit is the user's data); while
    waiting, it stops the worker at once."""

    def __init__(self) -> None:
        self.running = False
        self.stop_requested = False

    def on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.stop_requested = True
        if not self.running:
            raise _Stop


def serve(worker: CompactionWorker, data_dir: Path, idle_timeout_s: float,
          spark_master: str, to_json: Callable[[CompactionReport], dict[str, Any]],
          warm_up: bool = True) -> None:
    """Run the worker until it is idle for `idle_timeout_s`, stopped, or SIGTERM'd.
    Steps (tests/cli/test_cli_worker.py):
      1. bind the socket in a fresh 0700 directory;
      2. warm the engine up (start Spark), so that the first request is warm too;
      3. publish compaction-worker.json: from here `compact` uses this worker;
      4. answer requests one at a time; each resets the idle clock;
      5. on leaving, remove compaction-worker.json first (no new client finds it),
         then the socket, then stop the engine."""
    private = Path(tempfile.mkdtemp(prefix="compactlog-worker-"))  # 0700
    path = private / SOCKET_NAME
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lifecycle = _Lifecycle()
    previous = signal.signal(signal.SIGTERM, lifecycle.on_sigterm)
    published = False
    try:
        server.bind(str(path))
        server.listen(8)
        warm_up_s = worker.warm_up() if warm_up else 0.0
        started_ms = int(time.time() * 1000)
        WorkerInfo(os.getpid(), str(path), idle_timeout_s, spark_master,
                   started_ms).write(data_dir)
        published = True
        log.info("compaction worker %d ready on %s (warm-up %.1f s, idle timeout %g s)",
                 os.getpid(), path, warm_up_s, idle_timeout_s)
        state = {"runs": 0, "last_run_ms": None, "warm_up_s": round(warm_up_s, 3),
                 "started_ms": started_ms}
        last_request = time.monotonic()
        while True:
            remaining = idle_timeout_s - (time.monotonic() - last_request)
            if remaining <= 0:
                log.info("compaction worker %d idle for %g s: exiting", os.getpid(),
                         idle_timeout_s)
                return
            server.settimeout(remaining)
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            lifecycle.running = True
            try:
                with connection:
                    stop = _answer(connection, worker, to_json, state, idle_timeout_s,
                                   last_request, spark_master)
            finally:
                lifecycle.running = False
            last_request = time.monotonic()
            if stop or lifecycle.stop_requested:
                log.info("compaction worker %d stopped on request", os.getpid())
                return
    except _Stop:
        log.info("compaction worker %d: SIGTERM, exiting", os.getpid())
    finally:
        signal.signal(signal.SIGTERM, previous)
        if published:
            _remove_own_file(data_dir)
        server.close()
        path.unlink(missing_ok=True)
        private.rmdir()
        worker.close()


def _answer(connection: socket.socket, worker: CompactionWorker,
            to_json: Callable[[CompactionReport], dict[str, Any]], state: dict[str, Any],
            idle_timeout_s: float, last_request: float, spark_master: str) -> bool:
    """Answer one connection's request; True if it asked the worker to stop."""
    connection.settimeout(30)  # for the request line; the run itself takes what it takes
    answer: dict[str, Any]
    stop = False
    try:
        with connection.makefile("rb") as lines:
            line = lines.readline(MAX_REQUEST_BYTES)
        request = json.loads(line)
        op = request.get("op")
        if op == "compact":
            try:
                report = worker.compact(str(request["topic"]), request.get("partitions"),
                                        roll=bool(request.get("roll", False)))
                answer = {"report": to_json(report)}
            except CompactlogError as error:
                answer = {"error": str(error)}
            except Exception as error:  # one bad run must not end the worker
                log.exception("compaction failed")
                answer = {"error": f"unexpected {type(error).__name__}: {error}"}
            state["runs"] += 1
            state["last_run_ms"] = int(time.time() * 1000)
        elif op == "status":
            answer = {"pid": os.getpid(), "idle_timeout_s": idle_timeout_s,
                      "idle_s": round(time.monotonic() - last_request, 3),
                      "spark_master": spark_master, **state}
        elif op == "stop":
            answer, stop = {"stopping": True}, True
        else:
            answer = {"error": f"unknown op {op!r} (compact, status or stop)"}
    except (OSError, ValueError, AttributeError, KeyError) as error:
        answer = {"error": f"a bad request: {error}"}
    try:
        connection.settimeout(30)
        connection.sendall(json.dumps(answer).encode() + b"\n")
    except OSError as error:  # the client went away; the run's result stands
        log.info("could not answer a compaction worker client: %s", error)
    return stop


def _remove_own_file(data_dir: Path) -> None:
    """Remove compaction-worker.json if it still names this process (a worker started
    after this one may have replaced it)."""
    try:
        body = json.loads((data_dir / WORKER_FILE).read_bytes())
    except (OSError, ValueError):
        return
    if body.get("pid") == os.getpid():
        (data_dir / WORKER_FILE).unlink(missing_ok=True)
