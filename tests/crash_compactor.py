"""A compaction process that kills itself (SIGKILL) at a named point of its protocol.

    python crash_compactor.py DATA_DIR TOPIC KILL_POINT

Run by test_compaction_crash.py. The kill points wrap library functions from outside
(no hooks in the product), at each step of runner.py's protocol.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import local_engine
from compactlog.compaction import ledger, runner
from compactlog.storage import fsutil, manifest
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


KILL_POINTS: dict[str, Callable[[], None]] = {
    # Phase 1 is under way: the status says RUNNING, nothing new is written yet.
    "phase-1": lambda: before(local_engine.LocalEngine, "_survivors"),
    # A ledger file is written but not yet renamed into place.
    "ledger-temp": lambda: before(ledger.fsutil, "publish_replace", is_ledger_file),
    # The first ledger file is in place; the manifest does not list it.
    "ledger-published": lambda: after(ledger.fsutil, "publish_replace", is_ledger_file),
    # All new files are written; the commit has not started.
    "before-commit": lambda: before(runner, "_commit"),
    # The new manifest version is written under a temporary name, not yet published.
    "manifest-temp": lambda: before(manifest.fsutil, "publish_exclusive"),
    # The new pair is committed; the old ledger files are not yet deleted.
    "after-commit": lambda: after(manifest.VersionedDocument, "commit"),
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
    assert fsutil is not None
    main()
