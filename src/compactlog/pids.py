"""Whether a process id, read from a file another process wrote, names a live process.

Invariant: answers from one `kill(pid, 0)`, never signalling anything; a pid held by
another user's process counts as alive only when the caller says so (a server of
another user may write a shared data directory; a worker's socket must be our own).
"""

from __future__ import annotations

import os


def is_alive(pid: int, *, other_users: bool = True) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return other_users
    return True
