"""User compaction functions for the tests (strategy `function:user_strategies:NAME`).

Spark's Python workers import this module by name: the tests put this folder on
PYTHONPATH before Spark starts (conftest.py).
"""

from __future__ import annotations

from compactlog.storage.records import Record


def keep_larger_value(previous: Record, current: Record) -> bool:
    """Keep the record with the larger value, bytewise; on a tie keep the earlier one."""
    return (previous.value or b"") >= (current.value or b"")
