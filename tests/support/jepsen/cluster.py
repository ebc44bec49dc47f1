"""The nodes: `compactlog serve` processes on one s3:// URL, each with its own port and
local directory, and what their logs say about the writer lease.

A node keeps its port and local directory across restarts (a restart is "on the old
directory"); each start writes a new log file. With `disk` on, each local directory is
a small tmpfs of its own, so that a full disk can be made by a ballast file and undone
by deleting it; mounting needs root, and `mount_tmpfs` says why when it cannot.

Ownership: every log line starts with a timestamp (compactlog.cli's logging format,
local time, milliseconds). A node took the writer lease at the lines "took the writer
lease, epoch N" and "took over the writer lease from ... epoch N"; it owns the lease
from then until another node (or another process, such as `compactlog compact`) takes
it. The intervals are widened by a millisecond at each end (the log's resolution), so
a check against them never blames a node wrongly.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from support.paths import ROOT

SRC = ROOT / "src"
COMPACTLOG = shutil.which("compactlog", path=str(Path(sys.executable).parent)) or "compactlog"

STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
TAKE = re.compile(STAMP + r" .*(?:took the writer lease, epoch (\d+)"
                  r"|took over the writer lease from .* epoch (\d+))")
STEPPED_DOWN = re.compile(STAMP + r" .*stepped down")
SERVING = re.compile(r"compactlog serving on")
RESOLUTION_S = 0.001


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_time(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def child_env(env: dict[str, str]) -> dict[str, str]:
    """Our environment with `env` over it; compactlog imported from this tree's src."""
    path = os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))
    return {**os.environ, **env, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def server_config(ttl_s: float) -> str:
    return (f"lease_ttl_s = {ttl_s}\n"
            "upload_interval_s = 0.1\n"
            "upkeep_interval_s = 0.2\n"
            "group_initial_rebalance_delay_s = 0.3\n"
            "shutdown_grace_s = 1.0\n"
            "[compaction]\n"
            "enabled = true\n"
            "check_interval_s = 2.0\n"
            "backoff_initial_s = 2.0\n"
            "backoff_max_s = 10.0\n"
            "run_timeout_s = 60.0\n"
            "keep_warm_s = 30.0\n"
            'spark_master = "local[1]"\n')


def mount_tmpfs(path: Path, size_bytes: int) -> str | None:
    """Mount a tmpfs of `size_bytes` at `path`; None, or why it could not."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs",
                           str(path)], capture_output=True, text=True, check=False)
    return None if done.returncode == 0 else f"mount failed: {done.stderr.strip()}"


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


@dataclass(frozen=True)
class Take:
    """A process took the writer lease: when (its log line), who, with which epoch."""

    time: float
    who: str
    epoch: int


def takes_in(text: str, who: str) -> list[Take]:
    found = []
    for line in text.splitlines():
        match = TAKE.match(line)
        if match:
            found.append(Take(log_time(match.group(1)), who,
                              int(match.group(2) or match.group(3))))
    return found


class Ownership:
    """Who held the writer lease when, from every take in the logs."""

    def __init__(self, takes: list[Take]) -> None:
        self.takes = sorted(takes, key=lambda take: (take.time, take.epoch))
        # who -> [(from, to)]: from its take until the next take by anyone else.
        self.intervals: dict[str, list[tuple[float, float]]] = {}
        for index, take in enumerate(self.takes):
            end = float("inf")
            for later in self.takes[index + 1:]:
                if later.who != take.who:
                    end = later.time + RESOLUTION_S
                    break
            self.intervals.setdefault(take.who, []).append((take.time, end))

    def owned_between(self, who: str, start: float, end: float) -> bool:
        """Whether `who` may have held the lease at some instant of [start, end]."""
        return any(begin <= end and start <= until
                   for begin, until in self.intervals.get(who, []))

    def taken_from_after(self, who: str, moment: float) -> bool:
        """Whether another process took the lease after `moment` (so what `who`
        acknowledged before and had not uploaded could be lost in that fail-over)."""
        return any(take.who != who and take.time + RESOLUTION_S >= moment
                   for take in self.takes)

    def owner_at_end(self) -> str | None:
        return self.takes[-1].who if self.takes else None


class Node:
    """One `compactlog serve` process at a time, on its own port and local directory."""

    def __init__(self, name: str, where: str, port: int, local_dir: Path, config: Path,
                 log_dir: Path, env: dict[str, str], fs: Path | None = None) -> None:
        self.name = name
        self.where = where
        self.port = port
        self.local_dir = local_dir
        self.config = config
        self.log_dir = log_dir
        self.env = env
        self.fs = fs  # the tmpfs holding local_dir, when there is one
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.logs: list[Path] = []
        self.exits: list[str] = []  # exits that no nemesis caused, with their code

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        assert not self.alive, f"{self.name} is running"
        self.local_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{self.name}.{len(self.logs) + 1}.log"
        self.logs.append(log_path)
        with log_path.open("wb") as handle:
            self.process = subprocess.Popen(
                [COMPACTLOG, "--data-dir", self.where, "--log-level", "info", "serve",
                 "--listen", self.bootstrap, "--config", str(self.config)],
                stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
                env=child_env({**self.env, "COMPACTLOG_LOCAL_DIR": str(self.local_dir)}),
                start_new_session=True)
        self.paused = False

    def note_exit(self) -> str | None:
        """If the process ended by itself (no nemesis, no stop), say how, once."""
        if self.process is not None and self.process.poll() is not None:
            code = self.process.returncode
            self.process = None
            text = f"{self.name} exited by itself with code {code}"
            self.exits.append(text)
            return text
        return None

    def kill(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)
            self.process = None
        self.paused = False

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGCONT)
        self.paused = False

    def terminate(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM (after SIGCONT if paused), then SIGKILL past `timeout_s`; the code."""
        if self.process is None:
            return None
        process = self.process
        self.resume()
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
        self.process = None
        return process.returncode

    def log_text(self) -> str:
        return "".join(path.read_text(errors="replace") for path in self.logs
                       if path.exists())

    def serving_since(self, start: int) -> bool:
        """Whether the log of the current start says it serves."""
        if not self.logs:
            return False
        return SERVING.search(self.logs[-1].read_text(errors="replace")[start:]) is not None

    def takes(self) -> list[Take]:
        return takes_in(self.log_text(), self.name)

    def step_downs(self) -> int:
        return len(STEPPED_DOWN.findall(self.log_text()))

    # -- a full disk -------------------------------------------------------------------

    @property
    def ballast(self) -> Path:
        assert self.fs is not None
        return self.fs / "ballast"

    def fill_disk(self) -> int:
        """Fill the node's tmpfs with a ballast file; the bytes it took."""
        assert self.fs is not None
        stats = os.statvfs(self.fs)
        free = stats.f_bavail * stats.f_frsize
        taken = 0
        chunk = b"\0" * (1 << 20)
        try:
            with self.ballast.open("ab", buffering=0) as out:
                while taken < free:
                    taken += out.write(chunk) or 0
        except OSError:
            pass  # full: what it holds now is what it took
        with contextlib.suppress(OSError):
            taken = self.ballast.stat().st_size
        return taken

    def free_disk(self) -> None:
        if self.fs is not None:
            self.ballast.unlink(missing_ok=True)


def wait_for(predicate: object, timeout_s: float, step_s: float = 0.1) -> bool:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return bool(predicate())
