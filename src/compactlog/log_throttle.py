"""Rate limits for log lines that a fast-retrying client or a broken disk would repeat:
the one throttle of every such line, the server's and the log store's upkeep alike (on
the ground floor, so that storage/ may use it; it imports nothing of compactlog).

A consumer retries a failing fetch within milliseconds and thousands of connections can
be refused in a second: one line per event would bury everything else in the log. A
`Throttle` lets one event per key through per interval and counts the ones it held
back, so that the next line can say how many it stands for.

Invariant: the throttle holds at most `max_keys` keys, in the order in which each was
last let through, so that the keys whose interval has passed are always at the front.
A new key that finds the throttle full forgets those first (each key once), and
otherwise every call does O(1) work, whatever the number of keys: `allow` costs O(1)
amortised. Keys should be what a client cannot
choose freely (a partition that exists, a principal, an address), or a client could
make one line per event anyway by varying the key; when more than `max_keys` keys are
live at once, the one let through longest ago is forgotten with its count, and its next
event gets a line early.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

# Keys are partitions, steps, principals and refusal reasons: few. More than this many
# live at once is a flood; the oldest are forgotten.
MAX_KEYS = 10_000


class Throttle:
    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = MAX_KEYS) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self.max_keys = max_keys
        # key -> [last let through, held back since], oldest let-through first.
        self._seen: OrderedDict[Hashable, list[float]] = OrderedDict()
        self._lock = threading.Lock()  # fetches log from the I/O threads

    def __len__(self) -> int:
        return len(self._seen)

    def allow(self, key: Hashable) -> int | None:
        """None: hold this event back. Otherwise let it through; the number is how many
        events of this key were held back since the last one let through."""
        now = self.clock()
        with self._lock:
            seen = self._seen
            entry = seen.get(key)
            if entry is not None:
                if now - entry[0] < self.interval_s:
                    entry[1] += 1
                    return None
                held = int(entry[1])
                entry[0], entry[1] = now, 0
                seen.move_to_end(key)
                return held
            if len(seen) >= self.max_keys:
                self._forget_expired(now)
                if len(seen) >= self.max_keys:
                    seen.popitem(last=False)
            seen[key] = [now, 0]
            return 0

    def _forget_expired(self, now: float) -> None:
        """Forget the keys whose interval has passed (at the front), with their counts:
        each key is forgotten once, so this is O(1) amortised per key let in."""
        seen = self._seen
        while seen:
            oldest = next(iter(seen.values()))
            if now - oldest[0] < self.interval_s:
                return
            seen.popitem(last=False)


def held_back(count: int) -> str:
    """The tail of a log line let through by a Throttle."""
    return f" ({count} more since the last such line)" if count else ""
