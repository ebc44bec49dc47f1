"""A compaction process that kills itself (SIGKILL) at a named point of its protocol.

    python crash_compactor.py DATA_DIR TOPIC KILL_POINT

Run by test_compaction_crash.py. The kill points are the store's fault points
(compactlog/faults.py) or wrap functions of the runner and the engine from outside, at
each step of runner.py's protocol.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for support.*

import local_engine
from compactlog import faults
from compactlog.compaction import runner
from compactlog.storage.store import LogStore


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def before(target: Any, name: str, when: Callable[..., bool] = lambda *a, **k: True) -> None:
    real = getattr(target, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if when(*args, **kwargs):
            die()
        return real(*args, **kwargs)

    setattr(target, name, wrapper)


def after(target: Any, name: str, when: Callable[..., bool] = lambda *a, **k: True) -> None:
    real = getattr(target, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        if when(*args, **kwargs):
            die()
        return result

    setattr(target, name, wrapper)


def is_ledger_file(temp: Path, final: Path) -> bool:
    return final.parent.name == "ledger"


def kill_at(fire: Callable[[str, Path], bool]) -> None:
    """SIGKILL at the first fault point (compactlog/faults.py) that `fire` picks."""

    def injector(point: str, path: str) -> None:
        if fire(point, Path(path)):
            die()

    faults.install(injector)


def in_dir(point: str, directory: str) -> Callable[[str, Path], bool]:
    return lambda name, path: name == point and path.parent.name == directory


KILL_POINTS: dict[str, Callable[[], None]] = {
    # Phase 1 is under way: the status says RUNNING, nothing new is written yet.
    "phase-1": lambda: before(local_engine.LocalEngine, "_survivors"),
    # A ledger file is written but not yet renamed into place.
    "ledger-temp": lambda: kill_at(in_dir("rename", "ledger")),
    # The first ledger file is in place; the manifest does not list it.
    "ledger-published": lambda: kill_at(
        lambda name, path: name == "fsync_dir" and path.name == "ledger"),
    # All new files are written; the commit has not started.
    "before-commit": lambda: before(runner, "_commit"),
    # The new manifest is written under a temporary name, not yet renamed over current.json.
    "manifest-temp": lambda: kill_at(
        lambda name, path: name == "rename" and path.name == "current.json"
        and path.parent.name == "manifest"),
    # The new pair is committed (renamed and fsynced); its audit copy is not written,
    # the previous ledger's files are retired but not deleted.
    "after-commit": lambda: kill_at(
        lambda name, path: name == "write" and path.parent.name == "manifest"
        and "-a" in path.name),
    # Everything is done but the status file.
    "before-status": lambda: before(runner, "_finish"),
}


def main() -> None:
    data_dir, topic, point = sys.argv[1], sys.argv[2], sys.argv[3]
    KILL_POINTS[point]()
    with LogStore.open(data_dir, read_only=True) as store:
        factory = local_engine.LocalCompactionServiceFactory()
        factory.new_service(store, topic, {}).compact()
    print("finished without being killed", flush=True)


if __name__ == "__main__":
    main()
