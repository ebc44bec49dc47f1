"""The encoding of a committed metadata document, the same in every backend: what
LocalDocument (local/document.py) writes to files and ObjectDocument (s3/document.py) to
objects.

Invariant: the format never changes under a document that was written: data directories
and buckets written by earlier builds open as they are. A document is
  current.json                the committed version: {"format", "version", "crc32",
                              "body"} (on S3 also "commit_id")
  <20-digit version>.json     audit copies of the last `keep` versions
and a copy whose body fails its CRC32 (of the body's sorted-key JSON) is CorruptionError,
never read as a version.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

from compactlog.errors import CorruptionError

CURRENT = "current.json"
SUFFIX = ".json"
FORMAT = 2
DEFAULT_KEEP = 8


def version_of(name: str) -> int | None:
    if not name.endswith(SUFFIX) or name.startswith("."):
        return None
    stem = name[: -len(SUFFIX)]
    return int(stem) if stem.isdigit() else None


def checksum(body: Any) -> int:
    return zlib.crc32(json.dumps(body, sort_keys=True).encode())


def encode(version: int, body: dict[str, Any]) -> bytes:
    envelope = {"format": FORMAT, "version": version, "crc32": checksum(body), "body": body}
    return json.dumps(envelope, sort_keys=True).encode()


def decode(path: Path | str, raw: bytes) -> tuple[int, dict[str, Any]]:
    try:
        envelope = json.loads(raw)
        body = envelope["body"]
        version = int(envelope["version"])
        stored = envelope["crc32"]
    except (ValueError, KeyError, TypeError) as error:
        raise CorruptionError(path, f"unreadable metadata: {error}") from None
    if checksum(body) != stored:
        raise CorruptionError(path, f"metadata version {version} fails its checksum")
    if not isinstance(body, dict):
        raise CorruptionError(path, f"metadata version {version} is not an object")
    return version, body
