"""Per-partition answers grouped back under their topics, as Kafka's responses nest them.

Invariant: topics appear in the order of their first partition in the request, and each
topic's partitions in request order, so a response lines up with the request it answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def by_topic(wanted: Sequence[tuple[Any, ...]], results: Sequence[dict[str, Any]],
             index_field: str) -> dict[str, list[dict[str, Any]]]:
    """`wanted[i]` starts with (topic, partition index); `results[i]` is its answer.
    Topic -> its partitions' answers, each with its index under `index_field`."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for (name, index, *_), result in zip(wanted, results, strict=True):
        grouped.setdefault(name, []).append({index_field: index, **result})
    return grouped
