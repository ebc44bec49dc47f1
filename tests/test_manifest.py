"""Versioned documents: atomic optimistic commits, conflicts, corruption, pruning, recovery."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
import threading
import zlib
from pathlib import Path
from typing import Any

import pytest

from compactlog.errors import ConflictError, CorruptionError
from compactlog.storage.fsutil import TEMP_PREFIX
from compactlog.storage.manifest import PartitionManifest, SegmentInfo, VersionedDocument


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_commit_and_load(tmp_path: Path) -> None:
    doc = VersionedDocument(tmp_path / "doc")
    assert doc.load() is None
    assert doc.latest_version() == 0
    assert doc.versions() == []
    assert doc.commit(0, {"a": 1}) == 1
    assert doc.load() == (1, {"a": 1})
    body: dict[str, Any] = {"nested": {"list": [1, 2, None], "s": "ü"}, "n": None}
    assert doc.commit(1, body) == 2
    assert doc.load() == (2, body)
    assert doc.load_version(1) == {"a": 1}
    assert doc.versions() == [1, 2]
    # Another instance on the same directory sees the same.
    assert VersionedDocument(tmp_path / "doc").load() == (2, body)
    assert doc.path_of(2).name == "00000000000000000002.json"


def test_stale_commit_conflicts_and_changes_nothing(tmp_path: Path) -> None:
    doc = VersionedDocument(tmp_path / "doc")
    doc.commit(0, {"v": 1})
    doc.commit(1, {"v": 2})
    before = snapshot(doc.directory)
    for expected in (0, 1, 3, 10):
        with pytest.raises(ConflictError):
            doc.commit(expected, {"v": "stale"})
    assert snapshot(doc.directory) == before
    assert doc.load() == (2, {"v": 2})


def test_lost_race_at_publish_conflicts_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that read the version before another committed loses at the put-if-absent."""
    doc = VersionedDocument(tmp_path / "doc")
    doc.commit(0, {"v": 1})
    doc.commit(1, {"v": 2, "winner": True})
    before = snapshot(doc.directory)
    monkeypatch.setattr(doc, "latest_version", lambda: 1)  # its listing predates version 2
    with pytest.raises(ConflictError):
        doc.commit(1, {"v": 2, "winner": False})
    monkeypatch.undo()
    assert snapshot(doc.directory) == before
    assert doc.load() == (2, {"v": 2, "winner": True})


def test_concurrent_thread_commits_one_winner_per_version(tmp_path: Path) -> None:
    doc_dir = tmp_path / "doc"
    threads_count = 6
    versions = 15
    barrier = threading.Barrier(threads_count)
    wins: list[list[int]] = [[] for _ in range(threads_count)]
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        doc = VersionedDocument(doc_dir, keep=1000)
        try:
            for version in range(versions):
                barrier.wait(timeout=30)
                with contextlib.suppress(ConflictError):
                    wins[index].append(doc.commit(version, {"writer": index, "v": version + 1}))
                barrier.wait(timeout=30)
        except BaseException as error:  # surfaced in the main thread
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    won = sorted(v for w in wins for v in w)
    assert won == list(range(1, versions + 1)), "exactly one winner per version"
    doc = VersionedDocument(doc_dir)
    for index, versions_won in enumerate(wins):
        for version in versions_won:
            assert doc.load_version(version) == {"writer": index, "v": version}
    assert not [p for p in doc_dir.iterdir() if p.name.startswith(TEMP_PREFIX)]


PROCESS_WORKER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from compactlog.errors import ConflictError
    from compactlog.storage.manifest import VersionedDocument

    doc_dir, writer, target, go = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    while not Path(go).exists():
        time.sleep(0.001)
    doc = VersionedDocument(doc_dir, keep=100000)
    wins = []
    conflicts = 0
    while True:
        current = doc.latest_version()
        if current >= target:
            break
        try:
            wins.append(doc.commit(current, {"writer": writer, "v": current + 1}))
        except ConflictError:
            conflicts += 1
    print(json.dumps({"wins": wins, "conflicts": conflicts}))
    """
)


def test_concurrent_process_commits_one_winner_per_version(tmp_path: Path) -> None:
    doc_dir = tmp_path / "doc"
    go = tmp_path / "go"
    target = 150
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROCESS_WORKER, str(doc_dir), name, str(target), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("A", "B", "C")
    ]
    go.touch()
    results: dict[str, dict[str, Any]] = {}
    for name, proc in zip("ABC", procs, strict=True):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results[name] = json.loads(out)
    won = sorted(v for r in results.values() for v in r["wins"])
    assert won == list(range(1, target + 1)), "exactly one winner per version"
    doc = VersionedDocument(doc_dir)
    for name, result in results.items():
        for version in result["wins"]:
            assert doc.load_version(version) == {"writer": name, "v": version}
    assert doc.load() == (target, doc.load_version(target))
    assert not [p for p in doc_dir.iterdir() if p.name.startswith(TEMP_PREFIX)]


def _edit_first(path: Path, old: bytes, new: bytes) -> None:
    raw = path.read_bytes()
    assert old in raw
    path.write_bytes(raw.replace(old, new, 1))


@pytest.mark.parametrize(
    "damage",
    ["edit-body-value", "edit-version", "truncate", "not-json", "garbage-byte", "no-crc"],
)
def test_damaged_manifest_raises_corruption_naming_file(tmp_path: Path, damage: str) -> None:
    doc = VersionedDocument(tmp_path / "doc")
    doc.commit(0, {"segments": ["a"], "count": 1})
    doc.commit(1, {"segments": ["a", "b"], "count": 12345})
    path = doc.path_of(2)
    if damage == "edit-body-value":
        _edit_first(path, b"12345", b"12346")  # still valid JSON; only the CRC notices
    elif damage == "edit-version":
        _edit_first(path, b'"version": 2', b'"version": 1')
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:-7])
    elif damage == "not-json":
        path.write_bytes(b"\x00\x01not json")
    elif damage == "garbage-byte":
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0x55
        path.write_bytes(bytes(raw))
    else:
        envelope = json.loads(path.read_bytes())
        del envelope["crc32"]
        path.write_text(json.dumps(envelope))
    with pytest.raises(CorruptionError) as error:
        doc.load()
    assert error.value.path == path
    assert str(path) in str(error.value)
    # The older version is untouched and still readable on its own.
    assert doc.load_version(1) == {"segments": ["a"], "count": 1}


def test_non_object_body_is_corruption(tmp_path: Path) -> None:
    doc = VersionedDocument(tmp_path / "doc")
    doc.commit(0, {"x": 1})
    path = doc.path_of(1)
    envelope = json.loads(path.read_bytes())
    envelope["body"] = [1, 2]
    envelope["crc32"] = zlib.crc32(json.dumps([1, 2], sort_keys=True).encode())
    path.write_text(json.dumps(envelope))
    with pytest.raises(CorruptionError, match="not an object"):
        doc.load()


def test_pruning_keeps_last_versions(tmp_path: Path) -> None:
    doc = VersionedDocument(tmp_path / "doc", keep=3)
    for version in range(10):
        doc.commit(version, {"v": version + 1})
        assert doc.versions() == list(range(max(1, version - 1), version + 2))
    assert doc.versions() == [8, 9, 10]
    for version in (8, 9, 10):
        assert doc.load_version(version) == {"v": version}
    with pytest.raises(FileNotFoundError):
        doc.load_version(7)
    # Pruned versions are gone, but numbering continues: a stale commit still conflicts.
    with pytest.raises(ConflictError):
        doc.commit(5, {"v": "stale"})
    assert doc.commit(10, {"v": 11}) == 11
    assert doc.versions() == [9, 10, 11]


def test_default_keeps_eight(tmp_path: Path) -> None:
    doc = VersionedDocument(tmp_path / "doc")
    for version in range(20):
        doc.commit(version, {"v": version + 1})
    assert doc.versions() == list(range(13, 21))


def test_recover_removes_temp_files_only(tmp_path: Path) -> None:
    doc = VersionedDocument(tmp_path / "doc")
    doc.commit(0, {"v": 1})
    temp_a = doc.directory / f"{TEMP_PREFIX}v2-deadbeef0000"
    temp_b = doc.directory / f"{TEMP_PREFIX}00000000000000000002.json"
    temp_a.write_bytes(b'{"half": ')
    temp_b.write_bytes(b"")
    other = doc.directory / "README"
    other.write_text("not a version")
    # Temporary files are never taken for versions.
    assert doc.versions() == [1]
    assert doc.load() == (1, {"v": 1})
    removed = doc.recover()
    assert sorted(removed) == sorted([temp_a, temp_b])
    assert not temp_a.exists() and not temp_b.exists()
    assert other.exists()
    assert doc.load() == (1, {"v": 1})
    assert doc.recover() == []
    assert VersionedDocument(tmp_path / "missing").recover() == []


def test_partition_manifest_round_trip(tmp_path: Path) -> None:
    info = SegmentInfo("00000000000000000000-abcd.parquet", 0, 9, 10, 1234, 5, 50, 99)
    manifest = PartitionManifest(
        log_start_offset=0, segments=(info,), compaction={"horizon": 4}, extra={"x": 1}
    )
    doc = VersionedDocument(tmp_path / "manifest")
    version = doc.commit(0, manifest.to_json())
    loaded = doc.load()
    assert loaded is not None
    assert PartitionManifest.from_json(loaded[1], doc.path_of(version)) == manifest
    assert manifest.sealed_end_offset == 10
    assert PartitionManifest(log_start_offset=7).sealed_end_offset == 7


def test_malformed_partition_manifest_names_file(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000001.json"
    with pytest.raises(CorruptionError) as error:
        PartitionManifest.from_json({"segments": []}, path)
    assert error.value.path == path
    with pytest.raises(CorruptionError):
        PartitionManifest.from_json({"log_start_offset": 0, "segments": [{"file": "x"}]}, path)
