"""What the type hints of kio's generated message classes say about their fields.

Invariant: this is the one place that reads kio's dataclasses as types: their fields
with resolved hints (`fields`), whether a hint is an array (`is_tuple`), nullable
(`is_optional`) or a nested entity (`entity_type`). Building responses (messages.py)
and checking request frames (frame_guard.py) both walk a schema through these, so the
two always see the same shape of a message.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache
from typing import Any

from kio.static.constants import EntityType


@cache
def fields(cls: type) -> list[tuple[dataclasses.Field[Any], Any]]:
    """The dataclass fields of `cls` in wire order, each with its resolved type hint."""
    hints = typing.get_type_hints(cls)
    return [(field, hints[field.name]) for field in dataclasses.fields(cls)]


def is_optional(hint: Any) -> bool:
    return type(None) in typing.get_args(hint) and typing.get_origin(hint) in (
        typing.Union, types.UnionType)


def strip_optional(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if is_optional(hint) and len(args) == 1:
        return args[0]
    return hint


def is_tuple(hint: Any) -> bool:
    return typing.get_origin(strip_optional(hint)) is tuple


def entity_type(hint: Any) -> type | None:
    """The nested kio entity a field holds (or holds an array of), else None."""
    base = strip_optional(hint)
    if typing.get_origin(base) is tuple:
        base = typing.get_args(base)[0]
    if isinstance(base, type) and getattr(base, "__type__", None) is EntityType.nested:
        return base
    return None
