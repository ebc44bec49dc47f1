"""What a partition's manifest holds: its sealed segments, its compaction pair and the
files it has retired, as typed values. (How a manifest is committed: backend/local/document.py.)

Invariant: a manifest is one value, committed whole. The sealed segments, the
(horizon, ledger) pair and the retired files change together in one commit, so a
reader that loaded one version sees a consistent partition: every file it lists is
there until a later version retires it and `file.delete.delay.ms` has passed
(storage/sweep.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from compactlog.errors import CorruptionError


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
    # Ledger files only: the current deletion vector (storage/deletion.py), its size,
    # CRC32C and how many of the file's record_count rows it deletes. None: no DV.
    dv_file: str | None = None
    dv_size_bytes: int = 0
    dv_crc32c: int | None = None
    dv_count: int = 0
    # Ledger files only: set on a sealed segment that a compaction adopted into the
    # ledger as it is (compaction/adoption.py), at that run's now. Such a file has no
    # tombstone_since_ms column: each of its tombstones was kept from this instant.
    adopted_at_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        """As a manifest stores it: the DV and adoption fields only when set, so that a
        manifest without them reads the same to builds that predate them."""
        body = asdict(self)
        if self.dv_file is None:
            for name in ("dv_file", "dv_size_bytes", "dv_crc32c", "dv_count"):
                del body[name]
        if self.adopted_at_ms is None:
            del body["adopted_at_ms"]
        return body

    @property
    def live_count(self) -> int:
        """Rows of the file still in the view: record_count minus its DV's offsets."""
        return self.record_count - self.dv_count

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


LEDGER_DIR = "ledger"
SEGMENT_DIR = "segments"


@dataclass(frozen=True)
class CompactionState:
    """The (horizon, ledger) pair of the last compaction that committed, and what it
    recorded about itself. `ledger` holds the surviving records of offsets <= horizon,
    in offset order, as Parquet files in ledger/."""

    horizon: int
    ledger: tuple[SegmentInfo, ...] = ()
    # When the oldest tombstone kept in the ledger was first kept (delete.retention.ms
    # counts from there); None when the ledger holds no tombstone.
    oldest_tombstone_ms: int | None = None
    run_id: str = ""
    compacted_at_ms: int = 0
    strategy: str = "latest"
    # The manifest's deleted_below (DeleteRecords) when the run planned: the ledger holds
    # no live record below it. A later DeleteRecords past it makes a run due
    # (compaction/plan.py, PartitionPlan.deletion_due), which makes that one final.
    deleted_below: int = 0

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["ledger"] = [info.to_json() for info in self.ledger]
        return body

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> CompactionState:
        return cls(
            horizon=int(body["horizon"]),
            ledger=tuple(SegmentInfo.from_json(info) for info in body.get("ledger") or ()),
            oldest_tombstone_ms=body.get("oldest_tombstone_ms"),
            run_id=str(body.get("run_id") or ""),
            compacted_at_ms=int(body.get("compacted_at_ms") or 0),
            strategy=str(body.get("strategy") or "latest"),
            deleted_below=int(body.get("deleted_below") or 0),
        )

    @property
    def ledger_files(self) -> list[str]:
        return [info.file for info in self.ledger]


@dataclass(frozen=True)
class RetiredFile:
    """A data file that a commit stopped listing. It stays on disk for readers that
    loaded an older manifest until `retired_ms` + file.delete.delay.ms; then the sweep
    deletes it, and a later commit forgets it."""

    path: str  # relative to the partition directory: "segments/…" or "ledger/…"
    retired_ms: int


@dataclass(frozen=True)
class PartitionManifest:
    """What a partition holds besides its active log: committed as one document."""

    log_start_offset: int = 0
    segments: tuple[SegmentInfo, ...] = ()
    compaction: CompactionState | None = None
    retired: tuple[RetiredFile, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    # Kafka's DeleteRecords: no view (raw or compacted) serves offsets below this. (The
    # raw log's start, which retention also moves, is never below it; the compacted
    # view may start below the raw log's start, but never below this.)
    deleted_below: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "log_start_offset": self.log_start_offset,
            "segments": [segment.to_json() for segment in self.segments],
            "compaction": None if self.compaction is None else self.compaction.to_json(),
            "retired": [asdict(item) for item in self.retired],
            "extra": self.extra,
            "deleted_below": self.deleted_below,
        }

    @classmethod
    def from_json(cls, body: dict[str, Any], path: Path | str) -> PartitionManifest:
        try:
            compaction = body.get("compaction")
            return cls(
                log_start_offset=int(body["log_start_offset"]),
                segments=tuple(SegmentInfo.from_json(segment) for segment in body["segments"]),
                compaction=None if compaction is None else CompactionState.from_json(compaction),
                retired=tuple(RetiredFile(str(item["path"]), int(item["retired_ms"]))
                              for item in body.get("retired") or ()),
                extra=dict(body.get("extra") or {}),
                deleted_below=int(body.get("deleted_below") or 0),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise CorruptionError(path, f"malformed partition manifest: {error}") from None

    @property
    def sealed_end_offset(self) -> int:
        """One past the last sealed offset (log_start_offset when nothing is sealed)."""
        return self.segments[-1].last_offset + 1 if self.segments else self.log_start_offset

    @property
    def horizon(self) -> int | None:
        return None if self.compaction is None else self.compaction.horizon

    @property
    def ledger(self) -> tuple[SegmentInfo, ...]:
        return () if self.compaction is None else self.compaction.ledger

    def live_files(self) -> set[str]:
        """The data files this version lists, relative to the partition directory."""
        files = {f"{SEGMENT_DIR}/{info.file}" for info in self.segments}
        files.update(f"{LEDGER_DIR}/{info.file}" for info in self.ledger)
        files.update(f"{LEDGER_DIR}/{info.dv_file}" for info in self.ledger if info.dv_file)
        return files

    def retiring(self, dropped: set[str], now_ms: int, delay_ms: int) -> PartitionManifest:
        """This manifest with `dropped` (relative paths it listed, now unlisted by the
        caller's change) added to the retired files, and retired files whose delay has
        passed forgotten (the sweep deletes them before or after; either is safe: a file
        no manifest mentions is an orphan, and orphans are deleted too)."""
        kept = tuple(item for item in self.retired
                     if now_ms - item.retired_ms < delay_ms and item.path not in dropped)
        added = tuple(RetiredFile(path, now_ms) for path in sorted(dropped))
        return replace(self, retired=kept + added)
