"""Versioned metadata documents with atomic, optimistic-concurrency commits.

A document lives in its own directory as numbered files, `00000000000000000007.json`,
each holding one whole version and a checksum of it. The highest number is current.

Commit protocol (one version, N = expected + 1):
  1. write the new document to a temporary file and fsync it;
  2. publish it as version N with put-if-absent (hard link): if version N exists,
     another writer won, the temporary file is removed and ConflictError is raised;
  3. fsync the directory, so the new name survives power loss;
  4. prune versions older than the last `keep`.
A crash before step 2 leaves a temporary file (removed on the next open); after it,
version N is complete and current. A commit based on a stale version changes nothing.

The same put-if-absent step maps onto object stores with conditional writes
(If-None-Match: *), so this layout can move there unchanged.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from compactlog.errors import ConflictError, CorruptionError
from compactlog.storage import fsutil

SUFFIX = ".json"
FORMAT = 1


def _version_of(name: str) -> int | None:
    if not name.endswith(SUFFIX) or name.startswith("."):
        return None
    stem = name[: -len(SUFFIX)]
    return int(stem) if stem.isdigit() else None


class VersionedDocument:
    """A JSON document in `directory`, committed version by version."""

    def __init__(self, directory: Path, keep: int = 8) -> None:
        self.directory = directory
        self.keep = keep

    def path_of(self, version: int) -> Path:
        return self.directory / f"{version:020d}{SUFFIX}"

    def versions(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        found = (_version_of(entry.name) for entry in self.directory.iterdir())
        return sorted(v for v in found if v is not None)

    def latest_version(self) -> int:
        versions = self.versions()
        return versions[-1] if versions else 0

    def load(self) -> tuple[int, dict[str, Any]] | None:
        """The current (version, body), or None when nothing was ever committed."""
        for _ in range(10):
            version = self.latest_version()
            if version == 0:
                return None
            try:
                return version, self.load_version(version)
            except FileNotFoundError:
                continue  # pruned by a concurrent commit between listing and reading
        raise ConflictError(f"{self.directory}: versions kept changing while reading")

    def load_version(self, version: int) -> dict[str, Any]:
        path = self.path_of(version)
        raw = path.read_bytes()
        try:
            envelope = json.loads(raw)
            body = envelope["body"]
            stored = envelope["crc32"]
        except (ValueError, KeyError, TypeError) as error:
            raise CorruptionError(path, f"unreadable metadata version {version}: {error}") from None
        if _checksum(body) != stored or envelope.get("version") != version:
            raise CorruptionError(path, f"metadata version {version} fails its checksum")
        if not isinstance(body, dict):
            raise CorruptionError(path, f"metadata version {version} is not an object")
        return body

    def commit(self, expected_version: int, body: dict[str, Any]) -> int:
        """Publish `body` as version expected_version + 1, or raise ConflictError."""
        self.directory.mkdir(parents=True, exist_ok=True)
        current = self.latest_version()
        if current != expected_version:
            raise ConflictError(
                f"{self.directory}: commit based on version {expected_version}, "
                f"but version {current} is current"
            )
        version = expected_version + 1
        envelope = {"format": FORMAT, "version": version, "crc32": _checksum(body), "body": body}
        temp = fsutil.temp_path(self.directory, f"v{version}")
        fsutil.write_file_durably(temp, json.dumps(envelope, sort_keys=True).encode())
        if not fsutil.publish_exclusive(temp, self.path_of(version)):
            raise ConflictError(
                f"{self.directory}: version {version} was committed by another writer"
            )
        self._prune(version)
        return version

    def _prune(self, current: int) -> None:
        for version in self.versions():
            if version <= current - self.keep:
                self.path_of(version).unlink(missing_ok=True)

    def recover(self) -> list[Path]:
        return fsutil.remove_temp_files(self.directory)


def _checksum(body: Any) -> int:
    return zlib.crc32(json.dumps(body, sort_keys=True).encode())


@dataclass(frozen=True)
class SegmentInfo:
    """One sealed segment: a Parquet file holding offsets base_offset..last_offset."""

    file: str
    base_offset: int
    last_offset: int
    record_count: int
    size_bytes: int
    min_timestamp: int
    max_timestamp: int
    sealed_at_ms: int
    # CRC32C of the whole file, checked before the Parquet reader sees it: a damaged
    # footer can crash the reader rather than fail it. None in hand-made infos.
    crc32c: int | None = None
    # Offset ranges (first, last) that a corrupt range in the log hid when it was sealed.
    # Reads of them fail with CorruptionError rather than skip them silently.
    missing: tuple[tuple[int, int], ...] = ()

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> SegmentInfo:
        fields = dict(body)
        fields["missing"] = tuple(
            (int(first), int(last)) for first, last in fields.get("missing") or ()
        )
        return cls(**fields)

    def missing_range_at(self, offset: int) -> tuple[int, int] | None:
        for first, last in self.missing:
            if first <= offset <= last:
                return first, last
        return None


@dataclass(frozen=True)
class PartitionManifest:
    """What a partition holds besides its active log: committed as one document.

    `compaction` will carry the (horizon, ledger) pair of the compaction pipeline; the
    pair and the segment list are committed together, so they never drift apart.
    """

    log_start_offset: int = 0
    segments: tuple[SegmentInfo, ...] = ()
    compaction: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "log_start_offset": self.log_start_offset,
            "segments": [asdict(segment) for segment in self.segments],
            "compaction": self.compaction,
            "extra": self.extra,
        }

    @classmethod
    def from_json(cls, body: dict[str, Any], path: Path) -> PartitionManifest:
        try:
            return cls(
                log_start_offset=int(body["log_start_offset"]),
                segments=tuple(SegmentInfo.from_json(segment) for segment in body["segments"]),
                compaction=body.get("compaction"),
                extra=dict(body.get("extra") or {}),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise CorruptionError(path, f"malformed partition manifest: {error}") from None

    @property
    def sealed_end_offset(self) -> int:
        """One past the last sealed offset (log_start_offset when nothing is sealed)."""
        return self.segments[-1].last_offset + 1 if self.segments else self.log_start_offset
