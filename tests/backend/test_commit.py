"""The commit primitive (backend/local/document.py): compare-and-swap of a document's current
version, with audit copies and a fallback past a damaged current.json. One test per
step of the commit protocol, named in backend/local/document.py's docstring, plus concurrency,
damage, pruning and the partition manifest's types."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
import threading
import zlib
from pathlib import Path
from typing import Any

import pytest

from compactlog import faults
from compactlog.backend import CommitOutcomeUnknown
from compactlog.backend.envelope import CURRENT
from compactlog.backend.local.document import LocalDocument
from compactlog.errors import ConflictError, CorruptionError
from compactlog.fsutil import TEMP_PREFIX
from compactlog.storage.manifest import (
    CompactionState,
    PartitionManifest,
    RetiredFile,
    SegmentInfo,
)


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != ".lock"}


def body_of(doc: LocalDocument) -> tuple[int, dict[str, Any]] | None:
    snapshot = doc.load()
    return None if snapshot is None else (snapshot.version, snapshot.body)


def test_commit_and_load(tmp_path: Path) -> None:
    doc = LocalDocument(tmp_path / "doc")
    assert doc.load() is None
    assert doc.history() == []
    assert doc.commit(0, {"a": 1}).version == 1
    assert body_of(doc) == (1, {"a": 1})
    body: dict[str, Any] = {"nested": {"list": [1, 2, None], "s": "ü"}, "n": None}
    assert doc.commit(1, body).version == 2
    assert body_of(doc) == (2, body)
    assert doc.load_version(1) == {"a": 1}
    assert doc.history() == [1, 2]
    # Another instance on the same directory sees the same.
    assert body_of(LocalDocument(tmp_path / "doc")) == (2, body)
    assert doc.path_of(2).name == "00000000000000000002.json"
    assert (doc.directory / CURRENT).exists()


def test_a_stale_commit_conflicts_and_changes_nothing(tmp_path: Path) -> None:
    """Step 2: the compare."""
    doc = LocalDocument(tmp_path / "doc")
    doc.commit(0, {"v": 1})
    doc.commit(1, {"v": 2})
    before = files(doc.directory)
    for expected in (0, 1, 3, 10):
        with pytest.raises(ConflictError):
            doc.commit(expected, {"v": "stale"})
    assert files(doc.directory) == before
    assert body_of(doc) == (2, {"v": 2})


def test_a_commit_stalled_before_its_compare_conflicts(tmp_path: Path) -> None:
    """Step 2, against the old bug: a commit that read version N, then stalled while
    more commits landed than audit copies are kept, loses however long it stalled."""
    doc = LocalDocument(tmp_path / "doc", keep=3)
    doc.commit(0, {"v": 1})
    other = LocalDocument(tmp_path / "doc", keep=3)
    stalled = [True]

    def land_others(point: str, path: str) -> None:
        if point == "commit.begin" and stalled[0]:
            stalled[0] = False
            for version in range(1, 10):
                other.commit(version, {"v": version + 1, "by": "other"})

    with faults.injected(land_others), pytest.raises(ConflictError):
        doc.commit(1, {"v": 2, "by": "stalled"})
    assert body_of(doc) == (10, {"v": 10, "by": "other"})
    assert doc.history() == [8, 9, 10]


def test_a_commit_stalled_after_its_compare_makes_others_wait(tmp_path: Path) -> None:
    """Steps 1-2: between compare and replace the lock is held, so a commit that
    stalls there cannot be overtaken; the others wait and then conflict or land."""
    doc = LocalDocument(tmp_path / "doc")
    doc.commit(0, {"v": 1})
    results: list[str] = []
    started = threading.Event()

    def other_commit() -> None:
        started.set()
        try:
            LocalDocument(tmp_path / "doc").commit(1, {"v": 2, "by": "other"})
            results.append("landed")
        except ConflictError:
            results.append("conflict")

    thread = threading.Thread(target=other_commit)

    def stall(point: str, path: str) -> None:
        if point == "commit.compared" and not thread.is_alive() and not results:
            thread.start()
            started.wait()
            thread.join(timeout=0.5)
            assert thread.is_alive(), "the other commit must wait for the lock"

    with faults.injected(stall):
        doc.commit(1, {"v": 2, "by": "stalled"})
    thread.join(timeout=30)
    assert results == ["conflict"]
    assert body_of(doc) == (2, {"v": 2, "by": "stalled"})


def test_the_lock_times_out_into_a_conflict(tmp_path: Path) -> None:
    """Step 1: a committer that holds the lock too long (stopped, say) makes the others
    fail with a conflict they can retry, not hang."""
    doc = LocalDocument(tmp_path / "doc", lock_timeout_s=0.2)
    doc.commit(0, {"v": 1})
    holder = doc._lock()
    try:
        with pytest.raises(ConflictError, match="commit lock"):
            LocalDocument(tmp_path / "doc", lock_timeout_s=0.2).commit(1, {"v": 2})
    finally:
        os.close(holder)
    assert doc.commit(1, {"v": 2}).version == 2


@pytest.mark.parametrize("point", ["write", "fsync", "rename"])
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_a_failed_write_or_fsync_leaves_the_old_version(
    tmp_path: Path, point: str, code: int
) -> None:
    """Steps 3-4 before the commit point: the old version stays, no temporary file."""
    doc = LocalDocument(tmp_path / "doc")
    doc.commit(0, {"v": 1})
    before = files(doc.directory)

    def fail(name: str, path: str) -> None:
        # The first write, fsync or rename of a commit is that of the new current.json.
        if name == point and Path(path).parent == doc.directory:
            raise OSError(code, os.strerror(code), path)

    with faults.injected(fail), pytest.raises(OSError):
        doc.commit(1, {"v": 2})
    assert files(doc.directory) == before
    assert body_of(doc) == (1, {"v": 1})
    assert doc.commit(1, {"v": 2}).version == 2


def test_a_failed_directory_fsync_after_the_rename_is_an_unknown_outcome(
    tmp_path: Path
) -> None:
    """Step 4's directory fsync: the rename happened, durability is unknown; the
    caller is told so, and a reload shows what is visible."""
    doc = LocalDocument(tmp_path / "doc")
    doc.commit(0, {"v": 1})
    failed = [False]

    def fail(name: str, path: str) -> None:
        if name == "fsync_dir" and not failed[0]:
            failed[0] = True
            raise OSError(errno.EIO, "I/O error", path)

    with faults.injected(fail), pytest.raises(CommitOutcomeUnknown):
        doc.commit(1, {"v": 2})
    assert body_of(doc) == (2, {"v": 2})
    assert not [p for p in doc.directory.iterdir() if p.name.startswith(TEMP_PREFIX)]


def test_audit_copies_are_pruned(tmp_path: Path) -> None:
    """Step 5; and a failed audit copy (step 3) fails the commit, before its commit
    point: the newest audit copy must never be older than the committed version."""
    doc = LocalDocument(tmp_path / "doc", keep=3)
    for version in range(10):
        doc.commit(version, {"v": version + 1})
    assert doc.history() == [8, 9, 10]
    assert doc.load_version(9) == {"v": 9}

    def fail_audit(name: str, path: str) -> None:
        if name == "write" and "-a11-" in path:
            raise OSError(errno.ENOSPC, "No space left on device", path)

    with faults.injected(fail_audit), pytest.raises(OSError):
        doc.commit(10, {"v": 11})
    assert body_of(doc) == (10, {"v": 10})
    assert doc.history() == [8, 9, 10]
    assert doc.commit(10, {"v": 11}).version == 11
    assert doc.history() == [9, 10, 11]


def test_a_torn_current_falls_back_to_the_newest_copy_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    doc = LocalDocument(tmp_path / "doc")
    for version in range(3):
        doc.commit(version, {"v": version + 1})
    current = doc.directory / CURRENT
    current.write_bytes(current.read_bytes()[:20])
    assert body_of(doc) == (3, {"v": 3})  # the audit copy of the same version
    assert CURRENT in caplog.text
    # The next commit repairs current.json.
    assert doc.commit(3, {"v": "repaired"}).version == 4
    assert body_of(doc) == (4, {"v": "repaired"})
    # Both copies of the newest version damaged: no silent fall back to version 3,
    # which would lose version 4's commit (its files may be gone as "orphans").
    current.write_bytes(b"{")
    doc.path_of(4).write_bytes(b"{")
    with pytest.raises(CorruptionError, match="older version might lack a commit"):
        doc.load()


def test_a_committer_that_died_between_its_audit_copy_and_its_commit(
    tmp_path: Path
) -> None:
    """The audit copy of a version never committed (a kill between steps 3 and 4) is
    ignored while current.json is intact, purged before anyone deletes orphans, and
    replaced by the next commit; with current.json damaged, orphans are not swept."""
    doc = LocalDocument(tmp_path / "doc")
    doc.commit(0, {"v": 1})
    leftover = doc.path_of(1).read_bytes().replace(b'"version": 1', b'"version": 2')
    doc.path_of(2).write_bytes(leftover)  # what a kill between steps 3 and 4 leaves
    assert body_of(doc) == (1, {"v": 1})
    assert doc.purge_uncommitted()
    assert doc.history() == [1]
    assert doc.commit(1, {"v": 2}).version == 2
    (doc.directory / CURRENT).write_bytes(b"{")
    assert not doc.purge_uncommitted(), "an unproven version must not allow orphan sweeps"


def test_a_directory_without_current_json_reads_its_newest_version(tmp_path: Path) -> None:
    """Data directories written before current.json existed (numbered versions only)."""
    doc = LocalDocument(tmp_path / "doc")
    doc.commit(0, {"v": 1})
    doc.commit(1, {"v": 2})
    (doc.directory / CURRENT).unlink()
    assert body_of(doc) == (2, {"v": 2})
    assert doc.commit(2, {"v": 3}).version == 3


def test_commits_from_threads_and_processes_never_lose_one(tmp_path: Path) -> None:
    """Steps 1-4 under contention: every commit that reported success is in the chain
    of versions, exactly once, and each version has exactly one winner."""
    doc_dir = tmp_path / "doc"
    LocalDocument(doc_dir).commit(0, {"writers": []})
    target = 120
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROCESS_WORKER, str(doc_dir), name, str(target)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for name in ("A", "B")
    ]
    thread_wins: list[int] = []

    def thread_worker() -> None:
        thread_wins.extend(_commit_until(LocalDocument(doc_dir), "T", target))

    threads = [threading.Thread(target=thread_worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    wins: dict[str, list[int]] = {}
    for name, proc in zip("AB", procs, strict=True):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        wins[name] = json.loads(out)
    for thread in threads:
        thread.join(timeout=120)
    wins["T"] = thread_wins
    won = sorted(v for versions in wins.values() for v in versions)
    assert won == list(range(2, target + 1)), "exactly one winner per version"
    # Each commit appended its writer to the chain it read: the final chain lists every
    # winner in version order, so no success was lost.
    final = LocalDocument(doc_dir).load()
    assert final is not None and final.version == target
    by_version = {v: name for name, versions in wins.items() for v in versions}
    assert final.body["writers"] == [by_version[v] for v in range(2, target + 1)]
    assert not [p for p in doc_dir.iterdir() if p.name.startswith(TEMP_PREFIX)]


def _commit_until(doc: LocalDocument, name: str, target: int) -> list[int]:
    wins = []
    while True:
        current = doc.load()
        assert current is not None
        if current.version >= target:
            return wins
        try:
            body = {"writers": [*current.body["writers"], name]}
            wins.append(doc.commit(current.version, body).version)
        except ConflictError:
            pass


PROCESS_WORKER = textwrap.dedent(
    f"""
    import json, sys
    from pathlib import Path
    sys.path.insert(0, {str(Path(__file__).parent)!r})
    from test_commit import _commit_until
    from compactlog.backend.local.document import LocalDocument

    doc_dir, name, target = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    print(json.dumps(_commit_until(LocalDocument(doc_dir), name, target)))
    """
)


def _edit_first(path: Path, old: bytes, new: bytes) -> None:
    raw = path.read_bytes()
    assert old in raw
    path.write_bytes(raw.replace(old, new, 1))


@pytest.mark.parametrize(
    "damage", ["edit-body-value", "truncate", "not-json", "garbage-byte", "no-crc"],
)
def test_damage_to_every_copy_raises_corruption_naming_the_file(
    tmp_path: Path, damage: str
) -> None:
    doc = LocalDocument(tmp_path / "doc", keep=1)
    doc.commit(0, {"segments": ["a"], "count": 1})
    doc.commit(1, {"segments": ["a", "b"], "count": 12345})
    assert doc.history() == [2]
    for path in (doc.current_path, doc.path_of(2)):
        if damage == "edit-body-value":
            _edit_first(path, b"12345", b"12346")  # still valid JSON; only the CRC notices
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
    assert error.value.path == doc.current_path
    assert str(doc.current_path) in str(error.value)


def test_non_object_body_is_corruption(tmp_path: Path) -> None:
    doc = LocalDocument(tmp_path / "doc", keep=1)
    doc.commit(0, {"x": 1})
    for path in (doc.current_path, doc.path_of(1)):
        envelope = json.loads(path.read_bytes())
        envelope["body"] = [1, 2]
        envelope["crc32"] = zlib.crc32(json.dumps([1, 2], sort_keys=True).encode())
        path.write_text(json.dumps(envelope))
    with pytest.raises(CorruptionError, match="not an object"):
        doc.load()


def test_recover_removes_temp_files_only(tmp_path: Path) -> None:
    doc = LocalDocument(tmp_path / "doc")
    doc.commit(0, {"v": 1})
    temp_a = doc.directory / f"{TEMP_PREFIX}v2-deadbeef0000"
    temp_b = doc.directory / f"{TEMP_PREFIX}00000000000000000002.json"
    temp_a.write_bytes(b'{"half": ')
    temp_b.write_bytes(b"")
    other = doc.directory / "README"
    other.write_text("not a version")
    # Temporary files are never taken for versions.
    assert doc.history() == [1]
    assert body_of(doc) == (1, {"v": 1})
    removed = doc.recover()
    assert sorted(removed) == sorted([temp_a, temp_b])
    assert not temp_a.exists() and not temp_b.exists()
    assert other.exists()
    assert body_of(doc) == (1, {"v": 1})
    assert doc.recover() == []
    assert LocalDocument(tmp_path / "missing").recover() == []


def test_changed_since_is_one_stat(tmp_path: Path) -> None:
    doc = LocalDocument(tmp_path / "doc")
    assert not doc.changed_since(None) or doc.load() is None
    first = doc.commit(0, {"v": 1})
    assert not doc.changed_since(first)
    assert not doc.changed_since(doc.load())
    second = LocalDocument(tmp_path / "doc").commit(1, {"v": 2})
    assert doc.changed_since(first)
    assert not doc.changed_since(second)


def test_partition_manifest_round_trip(tmp_path: Path) -> None:
    info = SegmentInfo("00000000000000000000-abcd.parquet", 0, 9, 10, 1234, 5, 50, 99)
    ledger = SegmentInfo("00000000000000000000-run-00000.parquet", 0, 4, 3, 100, 5, 40, 99)
    manifest = PartitionManifest(
        log_start_offset=0, segments=(info,),
        compaction=CompactionState(horizon=4, ledger=(ledger,), oldest_tombstone_ms=7,
                                   run_id="run", compacted_at_ms=99, strategy="first"),
        retired=(RetiredFile("ledger/old.parquet", 5),), extra={"x": 1},
    )
    doc = LocalDocument(tmp_path / "manifest")
    doc.commit(0, manifest.to_json())
    loaded = doc.load()
    assert loaded is not None
    assert PartitionManifest.from_json(loaded.body, doc.current_path) == manifest
    assert manifest.sealed_end_offset == 10
    assert manifest.horizon == 4
    assert manifest.live_files() == {f"segments/{info.file}", f"ledger/{ledger.file}"}
    assert PartitionManifest(log_start_offset=7).sealed_end_offset == 7


def test_retiring_adds_dropped_files_and_forgets_expired_ones() -> None:
    manifest = PartitionManifest(retired=(RetiredFile("segments/a.parquet", 100),
                                          RetiredFile("ledger/b.parquet", 900)))
    after = manifest.retiring({"ledger/c.parquet"}, now_ms=1000, delay_ms=500)
    assert after.retired == (RetiredFile("ledger/b.parquet", 900),
                             RetiredFile("ledger/c.parquet", 1000))


def test_manifests_of_the_previous_format_still_load(tmp_path: Path) -> None:
    """Compaction entries were untyped dicts before; their keys are the same."""
    body = {"log_start_offset": 0, "segments": [], "extra": {},
            "compaction": {"horizon": 9, "ledger": [], "oldest_tombstone_ms": None,
                           "run_id": "r", "compacted_at_ms": 5, "strategy": "latest"}}
    manifest = PartitionManifest.from_json(body, tmp_path / "m")
    assert manifest.compaction == CompactionState(9, (), None, "r", 5, "latest")
    assert manifest.retired == ()


def test_malformed_partition_manifest_names_file(tmp_path: Path) -> None:
    path = tmp_path / "current.json"
    with pytest.raises(CorruptionError) as error:
        PartitionManifest.from_json({"segments": []}, path)
    assert error.value.path == path
    with pytest.raises(CorruptionError):
        PartitionManifest.from_json({"log_start_offset": 0, "segments": [{"file": "x"}]}, path)
    with pytest.raises(CorruptionError):
        PartitionManifest.from_json({"log_start_offset": 0, "segments": [],
                                     "compaction": {"ledger": []}}, path)
