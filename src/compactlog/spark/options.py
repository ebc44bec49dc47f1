"""The options of the `compactlog` Spark data source, checked in one place.

Spark hands a data source its options as strings (`.option("view", "raw")`), in a
case-insensitive dict. Every read and write parses them here first, so that a wrong
option fails at `load()`/`save()` with a message that names it, not deep inside a task.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from compactlog.errors import UserError

View = Literal["raw", "compacted"]
VIEWS: tuple[View, ...] = ("raw", "compacted")
READ_OPTIONS = ("path", "topic", "view", "partitions")
WRITE_OPTIONS = ("path", "topic")


@dataclass(frozen=True)
class ReadOptions:
    path: str
    topic: str
    view: View
    # The partitions to read, in this order; None reads them all.
    partitions: tuple[int, ...] | None


@dataclass(frozen=True)
class WriteOptions:
    path: str
    topic: str


def _lowered(options: Mapping[str, str]) -> dict[str, str]:
    # Spark's CaseInsensitiveDict already lowers keys; a plain dict (tests, direct use) may not.
    return {str(key).lower(): str(value) for key, value in options.items()}


def _required(options: dict[str, str], name: str, example: str) -> str:
    value = options.get(name, "").strip()
    if not value:
        raise UserError(
            f"the compactlog data source needs option {name!r}: "
            f'.option("{name}", {example})'
        )
    return value


def _check_known(options: dict[str, str], known: tuple[str, ...], what: str) -> None:
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise UserError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for a compactlog {what}; "
            f"known options: {', '.join(known)}"
        )


def parse_read_options(options: Mapping[str, str]) -> ReadOptions:
    lowered = _lowered(options)
    _check_known(lowered, READ_OPTIONS, "read")
    path = _required(lowered, "path", '"/path/to/data-dir"')
    topic = _required(lowered, "topic", '"my-topic"')
    view = lowered.get("view", "raw").strip().lower()
    if view not in VIEWS:
        raise UserError(
            f"unknown view {lowered['view']!r} for the compactlog data source: "
            "use 'raw' (every record) or 'compacted' (the compacted view)"
        )
    return ReadOptions(path, topic, "raw" if view == "raw" else "compacted",
                       _parse_partitions(lowered.get("partitions")))


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    lowered = _lowered(options)
    _check_known(lowered, WRITE_OPTIONS, "write")
    return WriteOptions(
        _required(lowered, "path", '"/path/to/data-dir"'),
        _required(lowered, "topic", '"my-topic"'),
    )


def _parse_partitions(raw: str | None) -> tuple[int, ...] | None:
    if raw is None or not raw.strip():
        return None
    chosen: list[int] = []
    for item in raw.split(","):
        text = item.strip()
        if not text.isdigit():
            raise UserError(
                f"option 'partitions' must be a comma-separated list of partition numbers "
                f"such as '0,2', got {raw!r}"
            )
        if int(text) not in chosen:
            chosen.append(int(text))
    return tuple(chosen)
