"""`<data dir>/server.json`: where the server that writes a data directory listens.

Invariant: while `compactlog serve` holds a data directory's writer lock, server.json
names its pid and its Kafka listener (and its admin listener, if any); the CLI trusts
it only when that pid is alive and is the one holding the writer lock, so a file left
by a server that was killed is ignored. The CLI's write commands use it to go through
the running server instead of failing on the lock (cli/writer.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from compactlog import fsutil
from compactlog.pids import is_alive

FILE = "server.json"
LOCK_FILE = ".writer.lock"


@dataclass(frozen=True)
class ServerInfo:
    pid: int
    kafka: str  # host:port a client on this machine can reach (a PLAINTEXT one if any)
    admin: str | None  # the admin API's URL, when the server has one
    # Every Kafka listener: name -> {"protocol": ..., "address": "host:port"}, with the
    # ports bound (port 0 asks for an ephemeral one).
    listeners: dict[str, dict[str, str]] | None = None

    def write(self, data_dir: Path) -> None:
        temp = fsutil.temp_path(data_dir, "server")
        fsutil.write_file_durably(temp, json.dumps(asdict(self)).encode())
        fsutil.publish_replace(temp, data_dir / FILE)


def reachable_host(host: str) -> str:
    """A listener bound to every address is reached on this machine by loopback."""
    if host in ("0.0.0.0", "", "::"):
        return "127.0.0.1"
    return host


def running_server(data_dir: Path) -> ServerInfo | None:
    """The server that writes `data_dir` now, or None."""
    try:
        body = json.loads((data_dir / FILE).read_bytes())
        info = ServerInfo(int(body["pid"]), str(body["kafka"]), body.get("admin"),
                          body.get("listeners"))
        holder = (data_dir / LOCK_FILE).read_text().strip()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if holder != f"pid {info.pid}" or not is_alive(info.pid):
        return None
    return info


def remove(data_dir: Path) -> None:
    (data_dir / FILE).unlink(missing_ok=True)
