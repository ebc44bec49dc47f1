"""Applying compaction strategies to records (the grammar of strategy strings, and the
`Strategy` value, are in compactlog/strategy.py: see there for what each one keeps)."""

from __future__ import annotations

from collections.abc import Callable

from compactlog.storage import Record
from compactlog.strategy import (
    ALLOWED,
    Kind,
    Strategy,
    StrategyError,
    parse_strategy,
    validate_strategy,
)

__all__ = [
    "ALLOWED",
    "KeepLeft",
    "Kind",
    "Strategy",
    "StrategyError",
    "parse_strategy",
    "surviving_record",
    "validate_strategy",
]

KeepLeft = Callable[[Record, Record], bool]


def surviving_record(
    records: list[Record], keep_left: KeepLeft, is_tombstone: Callable[[Record], bool]
) -> Record:
    """The survivor among one key's records in offset order, by a user function.

    A tombstone deletes the key: the record after it is kept without asking.
    """
    kept = records[0]
    for current in records[1:]:
        if is_tombstone(current) or is_tombstone(kept) or not keep_left(kept, current):
            kept = current
    return kept
