"""The request memory budget: request bytes received and not yet answered (Kafka's
queued.max.request.bytes).

Invariant: `in_use` never exceeds `limit + overdraft`, and only one connection at a time
may take bytes past `limit`: the one that has been receiving its current frame the
longest. Every other connection waits, reading nothing more from its socket, until
bytes are given back. That exception keeps the server deadlock-free: when every
connection is mid-frame and the budget is spent, the oldest frame still completes, is
answered, and frees its bytes. With `overdraft` set to the largest request allowed, the
oldest frame always fits once the answered requests have given their bytes back.

Bytes are counted as they arrive, not as a frame's length prefix declares them, so a
client that declares 100 MiB and sends a byte a second holds a byte a second.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable


class RequestBudget:
    def __init__(self, limit: int, overdraft: int,
                 clock: Callable[[], float] = time.monotonic,
                 setting: str = "queued_max_request_bytes") -> None:
        self.limit = limit
        self.overdraft = overdraft
        self.clock = clock
        self.setting = setting  # the setting that sets `limit`, for messages
        self.in_use = 0
        # Connections receiving a frame, oldest first (dicts keep insertion order).
        self._receiving: dict[Hashable, None] = {}
        self._changed = asyncio.Event()
        self._waiting = 0
        self._paused_since: float | None = None
        self._paused_total = 0.0

    def begin_frame(self, owner: Hashable) -> None:
        self._receiving[owner] = None

    def end_frame(self, owner: Hashable) -> None:
        """The frame is whole (or abandoned); the next oldest may take the overdraft."""
        if owner in self._receiving:
            del self._receiving[owner]
            self._notify()

    async def acquire(self, owner: Hashable, size: int) -> None:
        """Take `size` bytes, waiting while they do not fit."""
        if not self._fits(owner, size):
            self._waiting += 1
            if self._waiting == 1:
                self._paused_since = self.clock()
            try:
                while not self._fits(owner, size):
                    await self._changed.wait()
            finally:
                self._waiting -= 1
                if self._waiting == 0 and self._paused_since is not None:
                    self._paused_total += self.clock() - self._paused_since
                    self._paused_since = None
        self.in_use += size

    def release(self, size: int) -> None:
        if size:
            self.in_use -= size
            self._notify()

    @property
    def paused_s(self) -> float:
        """Seconds during which at least one connection waited for the budget."""
        ongoing = 0.0 if self._paused_since is None else self.clock() - self._paused_since
        return self._paused_total + ongoing

    def fits(self, owner: Hashable, size: int) -> bool:
        """Whether `acquire(owner, size)` would take the bytes without waiting."""
        return self._fits(owner, size)

    def _fits(self, owner: Hashable, size: int) -> bool:
        if self.in_use + size <= self.limit:
            return True
        oldest = next(iter(self._receiving), None)
        return oldest is owner and self.in_use + size <= self.limit + self.overdraft

    def _notify(self) -> None:
        # Every waiter re-checks; there are waiters only while the budget is spent.
        if self._waiting:
            self._changed.set()
            self._changed = asyncio.Event()
