"""A clock that only the test moves, for the store's `clock=` (seconds, as time.time())."""

from __future__ import annotations

T0 = 1_800_000_000.0


class FakeClock:
    def __init__(self, start: float = T0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def advance_ms(self, ms: int) -> None:
        self.now += ms / 1000

    @property
    def ms(self) -> int:
        return int(self.now * 1000)
