"""One topic config key: its name, type, default, allowed range and doc, and how a value
given as a string (CLI, Kafka's CreateTopics and AlterConfigs) or typed becomes a value
of that type.

Invariant: `ConfigKey.parse` returns a value of the key's type within its declared range
or raises InvalidConfigError naming the key, the value and what is allowed; nothing
else turns user input into a config value. Where a key is Kafka's, type, range and
default follow Kafka's ConfigDef declaration (storage/.../log/LogConfig.java).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compactlog.errors import InvalidConfigError

LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1


@dataclass(frozen=True)
class ConfigKey:
    name: str
    type: str  # "long", "int", "double", "boolean", "string", "list"
    default: Any
    doc: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    # -1 is Kafka's "unlimited" for retention settings (and the codec's own default
    # for compression.gzip.level); allowed besides the range.
    allow_minus_one: bool = False
    minus_one_means: str = "unlimited"
    kafka_default: Any = None
    # For strings with a grammar: returns what is wrong with a value, or None.
    validator: Callable[[str], str | None] | None = None
    allowed_text: str | None = None
    # For a Kafka config that a single compactlog server stores and describes but does
    # not act on: why it has no effect here (docs/configuration.md's Kafka table).
    no_effect: str | None = None

    def allowed(self) -> str:
        if self.allowed_text is not None:
            return self.allowed_text
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.type == "boolean":
            return "true or false"
        article = "an" if self.type[0] in "aeiou" else "a"
        parts = [f"{article} {self.type}"]
        if self.minimum is not None and self.maximum is not None:
            parts.append(f"in [{_fmt(self.minimum)}, {_fmt(self.maximum)}]")
        elif self.minimum is not None:
            parts.append(f">= {_fmt(self.minimum)}")
        if self.allow_minus_one:
            parts.append(f"or -1 for {self.minus_one_means}")
        return " ".join(parts)

    def parse(self, raw: object) -> Any:
        """Turn a string (CLI, Kafka CreateTopics) or a typed value into the key's type."""
        value = _convert(self, raw)
        if self.choices is not None and value not in self.choices:
            raise InvalidConfigError(self.name, raw, "must be " + self.allowed())
        if self.validator is not None:
            problem = self.validator(value)
            if problem is not None:
                raise InvalidConfigError(self.name, raw, problem)
        if self.type in ("long", "int", "double"):
            if self.allow_minus_one and value == -1:
                return value
            if (self.minimum is not None and value < self.minimum) or (
                self.maximum is not None and value > self.maximum
            ):
                raise InvalidConfigError(self.name, raw, "must be " + self.allowed())
        return value


def _fmt(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


def _convert(key: ConfigKey, raw: object) -> Any:
    if key.type in ("long", "int"):
        if isinstance(raw, bool):
            raise InvalidConfigError(key.name, raw, "must be " + key.allowed())
        if isinstance(raw, int):
            return raw
        try:
            return int(str(raw).strip())
        except ValueError:
            raise InvalidConfigError(key.name, raw, "must be " + key.allowed()) from None
    if key.type == "double":
        if isinstance(raw, bool):
            raise InvalidConfigError(key.name, raw, "must be " + key.allowed())
        try:
            number = float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise InvalidConfigError(key.name, raw, "must be " + key.allowed()) from None
        if not math.isfinite(number):  # NaN passes every range comparison
            raise InvalidConfigError(key.name, raw, "must be " + key.allowed())
        return number
    if key.type == "boolean":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("true", "false"):
            return text == "true"
        raise InvalidConfigError(key.name, raw, "must be true or false")
    if key.type == "list":
        # Kafka lists are comma-separated; normalise spacing and order for cleanup.policy.
        items = [part.strip() for part in str(raw).split(",") if part.strip()]
        return ",".join(sorted(set(items)))
    return str(raw)
