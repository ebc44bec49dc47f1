"""Per-entry work of a request, in slices that give the event loop its turns.

Invariant: a handler that builds one answer per entry of a request (DescribeGroups'
groups, FindCoordinator's keys, OffsetFetch's groups and partitions) hands the event
loop back at least every SLICE entries, so a request of a million entries, within
max_request_bytes, delays another connection's request by one slice's work (about a
millisecond), not by the whole request's seconds (issue 25: the hostile-client fuzzer
held another client for 1-3 s with one 1 MiB DescribeGroups). The entries are still
answered in order, each from the state when its turn comes, as Kafka's handlers read
their state entry by entry. Test: tests/server/test_hostile_requests.py,
test_a_request_of_many_entries_gives_other_clients_their_turns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import TypeVar

SLICE = 256

T = TypeVar("T")
R = TypeVar("R")


async def mapped(items: Iterable[T], build: Callable[[T], R], every: int = SLICE) -> list[R]:
    """`[build(item) for item in items]`, yielding to the event loop every `every`."""
    answers: list[R] = []
    for count, item in enumerate(items, 1):
        answers.append(build(item))
        if count % every == 0:
            await asyncio.sleep(0)
    return answers
