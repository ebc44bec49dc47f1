"""compactlog.bounded_cache: the one LRU cache, against a list model (hypothesis)."""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from compactlog.bounded_cache import BoundedCache

operations = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 9), st.integers(0, 50)),
    st.tuples(st.just("get"), st.integers(0, 9), st.just(0)),
    st.tuples(st.just("pop"), st.integers(0, 9), st.just(0)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(operations, st.integers(1, 5), st.one_of(st.none(), st.integers(1, 120)))
def test_the_cache_keeps_what_a_least_recently_used_list_keeps(
        steps: list[tuple[str, int, int]], max_entries: int, max_weight: int | None) -> None:
    evicted: list[int] = []
    cache: BoundedCache[int, int] = BoundedCache(
        max_entries=max_entries, max_weight=max_weight, weigh=lambda value: value,
        on_evict=lambda key, _value: evicted.append(key))
    model: list[tuple[int, int]] = []  # least recently used first
    for action, key, value in steps:
        found = [entry for entry in model if entry[0] == key]
        if action == "get":
            assert cache.get(key) == (found[0][1] if found else None)
            if found:
                model.remove(found[0])
                model.append(found[0])
        elif action == "pop":
            assert cache.pop(key) == (found[0][1] if found else None)
            if found:
                model.remove(found[0])
        else:
            if found:
                model.remove(found[0])
            model.append((key, value))
            expected_out = []
            while len(model) > 1 and (
                    len(model) > max_entries
                    or (max_weight is not None and sum(v for _, v in model) > max_weight)):
                expected_out.append(model.pop(0)[0])
            evicted.clear()
            cache.put(key, value)
            assert evicted == expected_out
        assert len(cache) == len(model)
        assert cache.weight == sum(v for _, v in model)
        assert all(k in cache for k, _ in model)


def test_an_entry_heavier_than_the_limit_is_kept_alone_until_the_next_put() -> None:
    cache: BoundedCache[str, bytes] = BoundedCache(max_weight=10, weigh=len)
    cache.put("small", b"x")
    cache.put("huge", b"y" * 100)
    assert cache.get("huge") == b"y" * 100 and cache.get("small") is None
    cache.put("next", b"z")
    assert cache.get("huge") is None and cache.get("next") == b"z"


def test_drop_where_and_clear_keep_the_weight_right() -> None:
    cache: BoundedCache[tuple[str, int], int] = BoundedCache(weigh=lambda value: value)
    for part in range(4):
        cache.put(("a", part), 10)
        cache.put(("b", part), 1)
    cache.drop_where(lambda key: key[0] == "a")
    assert len(cache) == 4 and cache.weight == 4
    cache.clear()
    assert len(cache) == 0 and cache.weight == 0


def test_threads_sharing_a_cache_never_exceed_its_limit() -> None:
    cache: BoundedCache[int, int] = BoundedCache(max_entries=16)

    def work(base: int) -> None:
        for index in range(2000):
            cache.put(base * 10_000 + index % 40, index)
            cache.get(base * 10_000 + (index * 7) % 40)

    threads = [threading.Thread(target=work, args=(each,)) for each in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(cache) == 16
