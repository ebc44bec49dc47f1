"""The one bounded, least-recently-used cache of the process: decoded row groups, files
proven whole, positions and columns of ledger files, manifest entries and downloaded
objects are each kept in one (on the ground floor, so that every layer may use it; it
imports nothing of compactlog).

Invariant: after every `put`, the cache holds at most `max_entries` entries and at most
`max_weight` in total weight (each entry weighs `weigh(value)`, 1 by default), unless
the only entry left is the one just put, which is kept whatever it weighs so that a
caller that asked for it gets it back once. Entries leave least recently used first
(a `get` or a `put` makes an entry the most recent), and `on_evict(key, value)` is
called for each entry that a limit pushed out, outside the lock, so that it may do I/O
(delete a downloaded copy). Every method holds one lock for its whole change: the cache
is shared by the threads of a server.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def _one(_value: object) -> int:
    return 1


class BoundedCache(Generic[K, V]):
    """Entries by key, least recently used out first, within a count and a weight."""

    def __init__(self, max_entries: int | None = None, max_weight: int | None = None,
                 weigh: Callable[[V], int] = _one,
                 on_evict: Callable[[K, V], None] | None = None) -> None:
        if max_entries is not None and max_entries < 1:
            raise ValueError(f"a bounded cache needs max_entries >= 1, got {max_entries}")
        self.max_entries = max_entries
        self.max_weight = max_weight
        self._weigh = weigh
        self._on_evict = on_evict
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value kept for `key` (now the most recently used), or None."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            self._entries.move_to_end(key)
            return found[0]

    def __contains__(self, key: K) -> bool:
        """Whether `key` is kept (now the most recently used if so)."""
        with self._lock:
            if key not in self._entries:
                return False
            self._entries.move_to_end(key)
            return True

    def put(self, key: K, value: V) -> None:
        """Keep `value` for `key`, then evict down to the limits (see the module)."""
        weight = self._weigh(value)
        with self._lock:
            previous = self._entries.pop(key, None)
            if previous is not None:
                self._weight -= previous[1]
            self._entries[key] = (value, weight)
            self._weight += weight
            evicted = []
            while len(self._entries) > 1 and self._over():
                old_key, (old_value, old_weight) = self._entries.popitem(last=False)
                self._weight -= old_weight
                evicted.append((old_key, old_value))
        if self._on_evict is not None:
            for old_key, old_value in evicted:
                self._on_evict(old_key, old_value)

    def pop(self, key: K) -> V | None:
        """Forget `key` (no on_evict: the caller chose it); its value, or None."""
        with self._lock:
            found = self._entries.pop(key, None)
            if found is None:
                return None
            self._weight -= found[1]
            return found[0]

    def drop_where(self, doomed: Callable[[K], bool]) -> None:
        """Forget every key for which `doomed(key)` holds (no on_evict)."""
        with self._lock:
            for key in [key for key in self._entries if doomed(key)]:
                self._weight -= self._entries.pop(key)[1]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._weight = 0

    @property
    def weight(self) -> int:
        return self._weight

    def __len__(self) -> int:
        return len(self._entries)

    def _over(self) -> bool:
        return ((self.max_entries is not None and len(self._entries) > self.max_entries)
                or (self.max_weight is not None and self._weight > self.max_weight))
