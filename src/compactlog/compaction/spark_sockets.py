"""Unix-domain sockets between a local Spark master's JVM and its Python workers, in a
directory only this user can enter, and the sweep of directories their processes left.

Over loopback TCP, each task's input reached its Python worker about 40 ms after the
task's header: the JVM's second small write waited on the worker's delayed ACK (Nagle's
algorithm), a stall the product's job paid on every task; a Unix-domain socket has no
such algorithm (docs/benchmarks.md, "A warm Spark job's fixed cost"). Spark skips its
shared-secret handshake on those sockets, so the directory's permissions are what keep
another user of the machine from handing a worker a task. A cluster master keeps TCP:
its executors run on other hosts (or as another user), which could not enter a
directory made here.

Invariant: a socket directory is removed only once no process owns it. The protocol:
  1. `unix_socket_conf` makes the directory with `tempfile.mkdtemp` (mode 0700, a
     `compactlog-sockets-` name), then its owner file: created under a temporary name,
     locked (flock, exclusive) and only then renamed to OWNER_FILE, so that a file
     under that name is always locked while its process lives. The descriptor is kept
     open (and not inherited by children) until the process ends, which releases the
     lock however it ends, SIGKILL included.
  2. At exit, the directory is removed (atexit); a process killed first leaves it.
  3. Each new directory first sweeps the temporary directory: a `compactlog-sockets-`
     directory of this user whose OWNER_FILE this process can lock (without waiting)
     has no owner left, and is removed while locked. One with no OWNER_FILE (being made
     now, or left by a version before this protocol) is left alone. A lock is seen
     across PID namespaces sharing the directory, where a pid would not be.
Tests: tests/compaction/test_spark_sockets.py.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping

log = logging.getLogger(__name__)

UNIX_SOCKET_ENABLED = "spark.python.unix.domain.socket.enabled"
UNIX_SOCKET_DIR = "spark.python.unix.domain.socket.dir"
PREFIX = "compactlog-sockets-"
OWNER_FILE = "owner.lock"
# Spark's own limit for spark.python.unix.domain.socket.dir: a socket's path must stay
# within 104 bytes, and Spark adds a separator, a dot, a UUID and ".sock" (43).
UNIX_SOCKET_DIR_MAX = 104 - (36 + 1 + 5 + 1)

_owned: list[int] = []  # the owner files' descriptors, open until this process ends


def unix_socket_conf(master: str, conf: Mapping[str, str]) -> dict[str, str]:
    """The settings that put a local master's JVM-to-Python traffic on Unix-domain
    sockets in a new directory of mode 0700 (see the module), removed at exit; none for
    another master, when `conf` (every setting the session will have) holds either
    setting, or when the temporary directory's path is too long for a socket's or a
    directory cannot be made there."""
    if not master.startswith("local") or UNIX_SOCKET_ENABLED in conf or UNIX_SOCKET_DIR in conf:
        return {}
    if len(tempfile.gettempdir()) + len(f"/{PREFIX}xxxxxxxx") > UNIX_SOCKET_DIR_MAX:
        return {}
    sweep_abandoned(tempfile.gettempdir())
    try:
        directory = tempfile.mkdtemp(prefix=PREFIX)  # mode 0700
        _own(directory)
    except OSError as error:  # no writable temporary directory: TCP, as Spark's default
        log.warning("Spark's Python workers keep TCP sockets: no directory for Unix-domain "
                    "ones in %s (%s)", tempfile.gettempdir(), error)
        return {}
    atexit.register(shutil.rmtree, directory, True)
    return {UNIX_SOCKET_ENABLED: "true", UNIX_SOCKET_DIR: directory}


def _own(directory: str) -> None:
    """Step 1: the directory's owner file, locked before it takes its name."""
    temporary = os.path.join(directory, f".{OWNER_FILE}.{os.getpid()}")
    handle = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        os.rename(temporary, os.path.join(directory, OWNER_FILE))
    except OSError:
        os.close(handle)
        shutil.rmtree(directory, ignore_errors=True)
        raise
    _owned.append(handle)


def sweep_abandoned(parent: str) -> list[str]:
    """Step 3: remove the socket directories in `parent` that no process owns; the
    paths removed. Never raises: a directory it cannot judge or remove is left."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        try:
            if not (entry.name.startswith(PREFIX) and entry.is_dir(follow_symlinks=False)
                    and entry.stat(follow_symlinks=False).st_uid == os.getuid()):
                continue
            handle = os.open(os.path.join(entry.path, OWNER_FILE), os.O_RDWR | os.O_NOFOLLOW)
        except OSError:  # gone, not ours, or no owner file (being made, or older)
            continue
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # owned (BlockingIOError), or the lock cannot be judged
            os.close(handle)
            continue
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
        finally:
            os.close(handle)
    if removed:
        log.info("removed %d socket directories of Spark sessions that ended without "
                 "removing them: %s", len(removed), ", ".join(removed))
    return removed
