"""Client-side APIs over a LogStore: readers that track a position."""

from compactlog.client.reader import Reader

__all__ = ["Reader"]
