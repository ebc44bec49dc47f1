"""Compaction strategies: which record of a key survives.

Every strategy shares one rule for tombstones: a tombstone deletes its key, so only the
records after a key's last tombstone compete; when none follows it, the tombstone itself
survives (and is kept until delete.retention.ms has passed). Within the competing
records:

- `latest` (the default, Kafka's and Pulsar's): the greatest offset wins.
- `first` (Pulsar's PIP-215): the smallest offset wins; later updates are ignored.
- `order:timestamp`, `order:header:NAME` or `order:header:NAME:long`: the greatest
  ordering value wins, ties broken by the greater offset. A header value is compared as
  bytes, or as a decimal integer with `:long`; a record without the header (or with one
  that does not parse) loses to any record that has it.
- `function:MODULE:NAME`: the slow path. `NAME(previous, current) -> bool` is called in
  offset order with two records and returns True to keep `previous`. It sees whole
  records, so the pipeline must move values across the cluster; the other strategies
  move only (key, offset, ordering value). MODULE must be importable where Spark runs
  its Python workers.

A strategy is named in the topic config `compaction.strategy` by one of these strings.

This module is the grammar of those strings and imports nothing of compactlog, so that
config.py (the ground floor) can validate the setting; compaction/strategies.py applies
strategies to records.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["latest", "first", "order", "function"]


class StrategyError(ValueError):
    """A strategy string that does not parse; the message says what is allowed."""


@dataclass(frozen=True)
class Strategy:
    kind: Kind
    # For "order": "timestamp" or a header name; header values parse as long when set.
    order_field: str | None = None
    order_header: str | None = None
    order_as_long: bool = False
    # For "function": "module:name".
    function: str | None = None

    @property
    def spec(self) -> str:
        if self.kind == "order":
            if self.order_header is None:
                return "order:timestamp"
            suffix = ":long" if self.order_as_long else ""
            return f"order:header:{self.order_header}{suffix}"
        if self.kind == "function":
            return f"function:{self.function}"
        return self.kind

    def load_function(self) -> Callable[[Any, Any], bool]:
        assert self.function is not None
        module_name, _, attribute = self.function.partition(":")
        try:
            found: Any = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as error:
            raise StrategyError(
                f"compaction strategy function {self.function!r} cannot be loaded: {error}"
            ) from None
        if not callable(found):
            raise StrategyError(f"compaction strategy function {self.function!r} is not callable")
        keep_left: Callable[[Any, Any], bool] = found
        return keep_left


ALLOWED = (
    "latest, first, order:timestamp, order:header:NAME, order:header:NAME:long "
    "or function:MODULE:NAME"
)


def parse_strategy(spec: str) -> Strategy:
    text = spec.strip()
    if text in ("latest", "first"):
        return Strategy(text)  # type: ignore[arg-type]
    if text == "order:timestamp":
        return Strategy("order", order_field="timestamp")
    if text.startswith("order:header:"):
        rest = text[len("order:header:") :]
        as_long = rest.endswith(":long")
        name = rest[: -len(":long")] if as_long else rest
        if name:
            return Strategy("order", order_field="header", order_header=name, order_as_long=as_long)
    if text.startswith("function:"):
        target = text[len("function:") :]
        module_name, sep, attribute = target.partition(":")
        if sep and module_name and attribute.isidentifier():
            return Strategy("function", function=target)
    raise StrategyError(f"unknown compaction strategy {spec!r}: use {ALLOWED}")


def validate_strategy(spec: str) -> str | None:
    """None when `spec` parses, else what is wrong (for the config layer)."""
    try:
        parse_strategy(spec)
    except StrategyError:
        return "must be " + ALLOWED
    return None
