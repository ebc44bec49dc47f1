"""The request memory budget (server/network/request_budget.py), in process: who waits, who may
go past the limit, and that the bound `limit + overdraft` holds."""

from __future__ import annotations

import asyncio
import time

from compactlog.log_throttle import Throttle, held_back
from compactlog.server.network.request_budget import RequestBudget
from support.fakes import FakeClock


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_the_oldest_frame_goes_past_the_limit_and_the_others_wait() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        budget = RequestBudget(limit=100, overdraft=50, clock=clock)
        old, young = object(), object()
        budget.begin_frame(old)
        budget.begin_frame(young)
        await budget.acquire(young, 90)
        # Over the limit: the young frame waits, the oldest frame may use the overdraft.
        waiting = asyncio.ensure_future(budget.acquire(young, 20))
        await settle()
        assert not waiting.done()
        await budget.acquire(old, 40)
        assert budget.in_use == 130
        # Not past limit + overdraft, even for the oldest.
        too_much = asyncio.ensure_future(budget.acquire(old, 30))
        await settle()
        assert not too_much.done()
        clock.advance(2.0)
        assert budget.paused_s == 2.0
        budget.release(90)  # the young frame's first request was answered
        await settle()
        assert too_much.done() and waiting.done()
        assert budget.in_use == 40 + 30 + 20
        assert budget.paused_s == 2.0  # nobody waits any more
        budget.end_frame(old)
        budget.end_frame(young)
        budget.release(90)
        assert budget.in_use == 0

    asyncio.run(scenario())


def test_the_next_oldest_frame_takes_over_when_the_oldest_is_whole() -> None:
    async def scenario() -> None:
        budget = RequestBudget(limit=100, overdraft=100)
        first, second, third = object(), object(), object()
        for owner in (first, second, third):
            budget.begin_frame(owner)
        await budget.acquire(first, 100)
        second_waits = asyncio.ensure_future(budget.acquire(second, 10))
        third_waits = asyncio.ensure_future(budget.acquire(third, 10))
        await settle()
        assert not second_waits.done() and not third_waits.done()
        budget.end_frame(first)  # whole; its bytes are held until it is answered
        await settle()
        assert second_waits.done() and not third_waits.done()
        assert budget.in_use == 110
        budget.end_frame(second)
        budget.release(100)
        await settle()
        assert third_waits.done()

    asyncio.run(scenario())


def test_a_cancelled_wait_takes_nothing() -> None:
    async def scenario() -> None:
        budget = RequestBudget(limit=10, overdraft=10)
        owner, other = object(), object()
        budget.begin_frame(other)
        budget.begin_frame(owner)
        await budget.acquire(other, 10)
        waiting = asyncio.ensure_future(budget.acquire(owner, 5))
        await settle()
        waiting.cancel()
        await settle()
        assert budget.in_use == 10
        budget.release(10)
        assert budget.in_use == 0

    asyncio.run(scenario())


def test_throttle_lets_one_event_per_key_through_per_interval() -> None:
    clock = FakeClock()
    throttle = Throttle(60.0, clock=clock)
    assert throttle.allow("a") == 0
    assert [throttle.allow("a") for _ in range(5)] == [None] * 5
    assert throttle.allow("b") == 0
    clock.advance(60.0)
    held = throttle.allow("a")
    assert held == 5 and held_back(held) == " (5 more since the last such line)"
    assert held_back(0) == ""


def test_throttle_costs_the_same_per_call_whatever_the_number_of_keys() -> None:
    """Issue 25, item 5: past 10,000 keys `allow` rebuilt its dict on every call, so a
    client naming 25,000 made-up topics froze the event loop for over a minute. Each
    call now costs O(1) amortised, and the keys kept stay bounded."""
    clock = FakeClock()
    throttle = Throttle(60.0, clock=clock)
    keys = 30_000
    started = time.process_time()
    for n in range(keys):
        assert throttle.allow(("denied", n)) == 0
        if n % 1000 == 999:  # fail as soon as the bound is passed, not minutes later
            spent = time.process_time() - started
            # About 20 ms for all of them here; the rebuilding throttle took minutes.
            assert spent < 1.0, f"the first {n + 1} new keys took {spent:.2f} s of CPU"
    assert len(throttle) <= 10_000
    # What is kept still throttles, and an interval later lets through again.
    assert throttle.allow(("denied", keys - 1)) is None
    clock.advance(60.0)
    assert throttle.allow(("denied", keys - 1)) == 1
    assert len(throttle) <= 10_000
