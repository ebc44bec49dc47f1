"""The options of the `compactlog` Spark data source, checked in one place.

Spark hands a data source its options as strings (`.option("view", "raw")`), in a
case-insensitive dict. Every read and write parses them here first, so that a wrong
option fails at `load()`/`save()` with a message that names it, not deep inside a task.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from compactlog.errors import UserError

logger = logging.getLogger(__name__)
View = Literal["raw", "compacted"]
VIEWS: tuple[View, ...] = ("raw", "compacted")
READ_OPTIONS = ("path", "topic", "view", "partitions")
# maxOffsetsPerTrigger is Kafka's Spark source's name; maxRecordsPerTrigger, this
# source's name before (it counts offsets too), is kept as a deprecated alias.
STREAM_ONLY_OPTIONS = ("startingOffsets", "maxOffsetsPerTrigger", "maxRecordsPerTrigger",
                       "failOnDataLoss")
STREAM_OPTIONS = READ_OPTIONS + STREAM_ONLY_OPTIONS
WRITE_OPTIONS = ("path", "topic")
EARLIEST, LATEST = -2, -1  # in a startingOffsets JSON object, as in Kafka's source


@dataclass(frozen=True)
class ReadOptions:
    path: str
    topic: str
    view: View
    # The partitions to read, in this order; None reads them all.
    partitions: tuple[int, ...] | None


@dataclass(frozen=True)
class StreamOptions:
    read: ReadOptions
    # "earliest", "latest", or {partition: offset} where an offset may be EARLIEST/LATEST.
    starting: str | dict[int, int]
    # At most this many records (offsets) per micro-batch; None: all that is available.
    max_records_per_trigger: int | None
    # True: fail when retention deleted records the query had not read yet (Kafka's default).
    fail_on_data_loss: bool


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
    unknown = sorted(set(options) - {name.lower() for name in known})
    streaming = [name for name in STREAM_ONLY_OPTIONS if name.lower() in unknown]
    if streaming:
        raise UserError(
            f"option {streaming[0]!r} is for streaming reads (spark.readStream), not a "
            f"compactlog {what}"
        )
    if unknown:
        raise UserError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for a compactlog {what}; "
            f"known options: {', '.join(known)}"
        )


def parse_read_options(options: Mapping[str, str], known: tuple[str, ...] = READ_OPTIONS
                       ) -> ReadOptions:
    lowered = _lowered(options)
    _check_known(lowered, known, "read")
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


def parse_stream_options(options: Mapping[str, str]) -> StreamOptions:
    read = parse_read_options(options, STREAM_OPTIONS)
    lowered = _lowered(options)
    return StreamOptions(
        read,
        _parse_starting(lowered.get("startingoffsets", "earliest")),
        _parse_max_offsets(lowered),
        _parse_bool(lowered.get("failondataloss", "true"), "failOnDataLoss"),
    )


def _parse_starting(raw: str) -> str | dict[int, int]:
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    usage = (
        "option 'startingOffsets' must be 'earliest', 'latest' or a JSON object of "
        'partition to offset such as \'{"0": 42, "1": -2}\' (-2: earliest, -1: latest)'
    )
    try:
        parsed = json.loads(text)
    except ValueError:
        raise UserError(f"{usage}, got {raw!r}") from None
    if not isinstance(parsed, dict):
        raise UserError(f"{usage}, got {raw!r}")
    starting: dict[int, int] = {}
    for key, value in parsed.items():
        if not str(key).isdigit() or isinstance(value, bool) or not isinstance(value, int) \
                or value < EARLIEST:
            raise UserError(f"{usage}; {key!r}: {value!r} is not a partition and an offset")
        starting[int(key)] = value
    return starting


def _parse_max_offsets(lowered: dict[str, str]) -> int | None:
    given = [name for name in ("maxOffsetsPerTrigger", "maxRecordsPerTrigger")
             if name.lower() in lowered]
    if len(given) > 1:
        raise UserError("options 'maxOffsetsPerTrigger' and 'maxRecordsPerTrigger' (its "
                        "deprecated alias) are both set: keep 'maxOffsetsPerTrigger'")
    if not given:
        return None
    name = given[0]
    raw = lowered[name.lower()]
    if name == "maxRecordsPerTrigger":
        logger.warning("option 'maxRecordsPerTrigger' is deprecated: use "
                       "'maxOffsetsPerTrigger', as Spark's Kafka source names it")
    if not raw.strip():
        return None
    if not raw.strip().isdigit() or int(raw) < 1:
        raise UserError(f"option {name!r} must be a whole number >= 1, got {raw!r}")
    return int(raw)


def _parse_bool(raw: str, name: str) -> bool:
    text = raw.strip().lower()
    if text not in ("true", "false"):
        raise UserError(f"option {name!r} must be 'true' or 'false', got {raw!r}")
    return text == "true"


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
