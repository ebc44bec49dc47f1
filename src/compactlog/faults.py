"""Named fault points: where tests inject failures, stalls and kills, step by step.

Invariant: with no injector installed (always, outside tests), `point` does nothing but
one global lookup, and no code path depends on it.

Every step of every commit protocol that touches the disk passes through a point named
by its kind and the path it touches: `write` (before bytes go to a file), `fsync` (before
a file's fsync), `rename` (before a file is published under its final name), `fsync_dir`
(before a directory's fsync), `unlink` (before a file is deleted), and the protocol
points `commit.compared` (a manifest commit has compared versions and holds the commit
lock, just before it writes) and `seal.written` / `compaction.written` (a Parquet file
is whole, before its commit). An injector sees each call and may raise (an OSError
with ENOSPC or EIO: a failed write or fsync), block (a stalled commit, while a test
lands others), or kill the process (a crash at exactly that step). A test that first
records the points an operation passes, then re-runs it with a fault at each one in
turn, covers every step deterministically (tests/support/faultkit.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

Injector = Callable[[str, str], None]  # (point, path)

_injector: Injector | None = None


def point(name: str, path: object = "") -> None:
    """Pass a fault point: `name` is the step's kind, `path` what it touches."""
    if _injector is not None:
        _injector(name, str(path))


def install(injector: Injector | None) -> None:
    """Install `injector` for the rest of the process (a crash test's child process)."""
    global _injector
    _injector = injector


@contextmanager
def injected(injector: Injector) -> Iterator[None]:
    """Install `injector` for the duration of the block (tests only; not thread-local)."""
    global _injector
    previous = _injector
    _injector = injector
    try:
        yield
    finally:
        _injector = previous
