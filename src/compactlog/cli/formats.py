"""Turning text lines into records (produce) and records into text lines (consume)."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Literal

from compactlog.errors import UserError
from compactlog.storage import Headers, ProducerRecord, Record

Encoding = Literal["utf8", "base64"]
InputFormat = Literal["auto", "tsv", "json"]


class LineError(UserError):
    def __init__(self, line_number: int, detail: str) -> None:
        super().__init__(f"input line {line_number}: {detail}")


def _decode(text: object, encoding: Encoding, what: str, line_number: int) -> bytes | None:
    if text is None:
        return None
    if not isinstance(text, str):
        raise LineError(line_number, f"{what} must be a string or null, got {type(text).__name__}")
    if encoding == "base64":
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise LineError(line_number, f"{what} is not valid base64: {text[:40]!r}") from None
    return text.encode()


def _headers(raw: object, encoding: Encoding, line_number: int) -> Headers:
    if raw is None:
        return ()
    pairs: list[tuple[object, object]]
    if isinstance(raw, dict):
        pairs = list(raw.items())
    elif isinstance(raw, list) and all(isinstance(p, list | tuple) and len(p) == 2 for p in raw):
        pairs = [(p[0], p[1]) for p in raw]
    else:
        raise LineError(
            line_number, 'headers must be an object {"name": "value"} or a list of [name, value]'
        )
    result = []
    for name, value in pairs:
        if not isinstance(name, str):
            raise LineError(line_number, f"header name must be a string, got {name!r}")
        result.append((name, _decode(value, encoding, f"header {name!r}", line_number)))
    return tuple(result)


def parse_line(
    line: str, line_number: int, input_format: InputFormat, encoding: Encoding
) -> ProducerRecord:
    """One input line as a record: `key<TAB>value`, or a JSON object."""
    text = line.rstrip("\n").rstrip("\r")
    use_json = input_format == "json" or (input_format == "auto" and text.lstrip().startswith("{"))
    if use_json:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as error:
            detail = f"invalid JSON: {error.msg} at column {error.colno}"
            raise LineError(line_number, detail) from None
        if not isinstance(obj, dict):
            raise LineError(line_number, "a JSON line must be an object with key and value")
        unknown = set(obj) - {"key", "value", "headers", "timestamp"}
        if unknown:
            raise LineError(line_number, f"unknown fields {sorted(unknown)}; "
                            "expected key, value, headers, timestamp")
        timestamp = obj.get("timestamp")
        if timestamp is not None and (not isinstance(timestamp, int) or timestamp < 0):
            raise LineError(line_number, f"timestamp must be milliseconds >= 0, got {timestamp!r}")
        return ProducerRecord(
            key=_decode(obj.get("key"), encoding, "key", line_number),
            value=_decode(obj.get("value"), encoding, "value", line_number),
            headers=_headers(obj.get("headers"), encoding, line_number),
            timestamp=timestamp,
        )
    key, sep, value = text.partition("\t")
    if not sep:
        raise LineError(
            line_number,
            "expected key<TAB>value (no tab found); use a JSON line for a record without a value",
        )
    return ProducerRecord(
        key=_decode(key, encoding, "key", line_number),
        value=_decode(value, encoding, "value", line_number),
    )


def _encode(data: bytes | None, encoding: Encoding) -> str | None:
    if data is None:
        return None
    if encoding == "base64":
        return base64.b64encode(data).decode()
    return data.decode(errors="backslashreplace")


def record_json(partition: int, record: Record, encoding: Encoding) -> str:
    obj: dict[str, Any] = {
        "partition": partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": _encode(record.key, encoding),
        "value": _encode(record.value, encoding),
        "headers": [[name, _encode(value, encoding)] for name, value in record.headers],
    }
    return json.dumps(obj, ensure_ascii=False)


def record_text(record: Record, encoding: Encoding) -> str:
    """`key<TAB>value`, the format produce reads; a null key prints as an empty field.
    A tombstone (null value) prints as the JSON line that produces one,
    `{"key": "K", "value": null}`, so that it differs from an empty value (`K<TAB>`)
    and `consume | produce` copies it as a tombstone."""
    key = _encode(record.key, encoding)
    if record.value is None:
        return json.dumps({"key": key, "value": None}, ensure_ascii=False)
    return f"{key or ''}\t{_encode(record.value, encoding)}"
