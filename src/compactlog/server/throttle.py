"""Rate limits for log lines that a fast-retrying client or a broken disk would repeat.

A consumer retries a failing fetch within milliseconds and thousands of connections can
be refused in a second: one line per event would bury everything else in the log. A
`Throttle` lets one event per key through per interval and counts the ones it held
back, so that the next line can say how many it stands for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable

# Keys are partitions, steps and refusal reasons: few. Past this many, keys not seen
# for an interval are forgotten (their held-back counts with them).
_PRUNE_AT = 10_000


class Throttle:
    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._seen: dict[Hashable, list[float]] = {}  # key -> [last let through, held back]
        self._lock = threading.Lock()  # fetches log from the I/O threads

    def allow(self, key: Hashable) -> int | None:
        """None: hold this event back. Otherwise let it through; the number is how many
        events of this key were held back since the last one let through."""
        now = self.clock()
        with self._lock:
            entry = self._seen.get(key)
            if entry is not None and now - entry[0] < self.interval_s:
                entry[1] += 1
                return None
            if len(self._seen) >= _PRUNE_AT:
                self._seen = {k: v for k, v in self._seen.items()
                              if now - v[0] < self.interval_s}
            self._seen[key] = [now, 0]
            return 0 if entry is None else int(entry[1])


def held_back(count: int) -> str:
    """The tail of a log line let through by a Throttle."""
    return f" ({count} more since the last such line)" if count else ""
