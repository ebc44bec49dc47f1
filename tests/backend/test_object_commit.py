"""The commit primitive's contract on both backends: LocalDocument (backend/local/document.py) on a
local directory and ObjectDocument (backend/s3/document.py) on a real S3 API server (moto, on
loopback). Tests named in backend/s3/document.py's protocol docstring are here; the S3-only
ones cover steps that exist only there (conditional PUTs, lost answers).
tests/backend/test_commit.py keeps the local-only ones (the lock, fsyncs, processes)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

from compactlog import faults
from compactlog.backend import Document, Snapshot, load_or_create, update_document
from compactlog.backend.envelope import CURRENT
from compactlog.backend.local.document import LocalDocument
from compactlog.backend.s3.document import ObjectCommitOutcomeUnknown, ObjectDocument
from compactlog.backend.s3.error_mapping import ObjectStoreSetupError
from compactlog.errors import ConflictError, CorruptionError, StorageError
from support.s3_support import (
    ACCESS_KEY_ID,
    SECRET_ACCESS_KEY,
    SESSION_TOKEN,
    FaultyClient,
    LockedConditionalPuts,
    S3Server,
    client_error,
)


@dataclass
class Backend:
    """One document on one backend: `open` gives another handle on the same document
    (another writer), `files` every stored name and its bytes, `put_raw` damages one."""

    name: str
    open: Callable[..., Document]
    files: Callable[[], dict[str, bytes]]
    put_raw: Callable[[str, bytes], None]


def local_backend(tmp_path: Path) -> Backend:
    directory = tmp_path / "doc"

    def files() -> dict[str, bytes]:
        if not directory.is_dir():
            return {}
        return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != ".lock"}

    def put_raw(name: str, data: bytes) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)

    def open_(keep: int = 8, client: Any = None) -> Document:
        return LocalDocument(directory, keep=keep)

    return Backend("local", open_, files, put_raw)


def s3_backend(server: S3Server) -> Backend:
    location = server.location("doc")
    assert location.bucket is not None
    client = server.client()
    prefix = location.path + "/"

    def files() -> dict[str, bytes]:
        listed = client.list_objects_v2(Bucket=location.bucket, Prefix=prefix)
        return {item["Key"][len(prefix):]: client.get_object(
            Bucket=location.bucket, Key=item["Key"])["Body"].read()
            for item in listed.get("Contents", [])}

    def put_raw(name: str, data: bytes) -> None:
        client.put_object(Bucket=location.bucket, Key=prefix + name, Body=data)

    def open_(keep: int = 8, client: Any = None) -> Document:
        return ObjectDocument(client or server.client(), location.bucket or "",
                              location.path, keep=keep)

    return Backend("s3", open_, files, put_raw)


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "local":
        return local_backend(tmp_path)
    return s3_backend(request.getfixturevalue("s3"))


@pytest.fixture
def s3_only(s3: S3Server) -> Backend:
    return s3_backend(s3)


def body_of(doc: Document) -> tuple[int, dict[str, Any]] | None:
    snapshot = doc.load()
    return None if snapshot is None else (snapshot.version, snapshot.body)


def audit_name(version: int) -> str:
    return f"{version:020d}.json"


def test_commit_and_load(backend: Backend) -> None:
    doc = backend.open()
    assert doc.load() is None
    assert doc.history() == []
    assert doc.commit(0, {"a": 1}).version == 1
    assert body_of(doc) == (1, {"a": 1})
    body: dict[str, Any] = {"nested": {"list": [1, 2, None], "s": "ü"}, "n": None}
    second = doc.commit(1, body)
    assert second.version == 2 and second.proven
    assert body_of(doc) == (2, body)
    assert doc.load_version(1) == {"a": 1}
    assert doc.history() == [1, 2]
    assert body_of(backend.open()) == (2, body)
    assert set(backend.files()) == {CURRENT, audit_name(1), audit_name(2)}


def test_a_stale_commit_conflicts_and_changes_nothing(backend: Backend) -> None:
    """Step 2: the compare."""
    doc = backend.open()
    doc.commit(0, {"v": 1})
    doc.commit(1, {"v": 2})
    before = backend.files()
    for expected in (0, 1, 3, 10):
        with pytest.raises(ConflictError):
            doc.commit(expected, {"v": "stale"})
    assert backend.files() == before
    assert body_of(doc) == (2, {"v": 2})


def test_a_commit_stalled_before_its_compare_conflicts(backend: Backend) -> None:
    """Step 2: a commit that read version N, then stalled while more commits landed
    than audit copies are kept, loses however long it stalled."""
    doc = backend.open(keep=3)
    doc.commit(0, {"v": 1})
    other = backend.open(keep=3)
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


@pytest.mark.parametrize("landed", [1, 9])
def test_a_commit_stalled_after_its_compare_conflicts_at_the_store(
    s3_only: Backend, landed: int
) -> None:
    """Steps 3-4 on S3, where no lock holds the others off: a commit that compared,
    then stalled while others landed, fails at the store. With one landed, its audit
    PUT (If-None-Match) finds that version claimed; with more than `keep` landed, that
    audit copy was pruned, so its audit PUT succeeds but its If-Match PUT of
    current.json fails, and it removes the audit copy it resurrected."""
    doc = s3_only.open(keep=3)
    doc.commit(0, {"v": 1})
    other = s3_only.open(keep=3)
    stalled = [True]

    def land_others(point: str, path: str) -> None:
        if point == "commit.compared" and stalled[0]:
            stalled[0] = False
            for version in range(1, 1 + landed):
                other.commit(version, {"v": version + 1, "by": "other"})

    with faults.injected(land_others), pytest.raises(ConflictError):
        doc.commit(1, {"v": 2, "by": "stalled"})
    assert body_of(doc) == (1 + landed, {"v": 1 + landed, "by": "other"})
    assert doc.history() == list(range(max(1, landed - 1), landed + 2))
    assert all(doc.load_version(v)["by"] == "other" for v in doc.history() if v > 1)


def test_racing_writers_never_lose_a_commit(backend: Backend) -> None:
    """Steps 2-4 under contention (threads, each its own handle): every commit that
    reported success is in the chain, exactly once, one winner per version, and each
    audit copy holds its version's winner. On S3 the conditional PUTs go through
    LockedConditionalPuts: moto checks a condition and then writes without a lock, so
    it cannot show that the store decides races atomically (that is S3's guarantee,
    not something this test proves); what it proves is that the protocol, with reads,
    compares and both PUTs interleaving freely, loses nothing given that guarantee."""
    target = 40
    shared = None if backend.name == "local" else LockedConditionalPuts(
        backend.open().client)  # type: ignore[attr-defined]
    backend.open().commit(0, {"writers": []})
    wins: dict[str, list[int]] = {}
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        doc = backend.open(client=shared)
        mine: list[int] = []
        try:
            while True:
                current = doc.load()
                assert current is not None
                if current.version >= target:
                    break
                try:
                    body = {"writers": [*current.body["writers"], name]}
                    mine.append(doc.commit(current.version, body).version)
                except ConflictError:
                    pass
        except BaseException as error:
            errors.append(error)
        wins[name] = mine

    threads = [threading.Thread(target=worker, args=(n,)) for n in "ABC"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors
    won = sorted(v for versions in wins.values() for v in versions)
    assert won == list(range(2, target + 1)), "exactly one winner per version"
    final = backend.open().load()
    assert final is not None and final.version == target
    by_version = {v: name for name, versions in wins.items() for v in versions}
    assert final.body["writers"] == [by_version[v] for v in range(2, target + 1)]
    doc = backend.open()
    for version in doc.history():
        if version > 1:
            assert doc.load_version(version)["writers"][-1] == by_version[version]


def test_a_torn_current_falls_back_to_the_newest_copy_only(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    doc = backend.open()
    for version in range(3):
        doc.commit(version, {"v": version + 1})
    backend.put_raw(CURRENT, backend.files()[CURRENT][:20])
    loaded = doc.load()
    assert loaded is not None and (loaded.version, loaded.body) == (3, {"v": 3})
    assert not loaded.proven
    assert CURRENT in caplog.text
    assert not doc.purge_uncommitted(), "an unproven version must not allow orphan sweeps"
    assert doc.commit(3, {"v": "repaired"}).version == 4  # replaces the damaged one
    assert body_of(doc) == (4, {"v": "repaired"})
    backend.put_raw(CURRENT, b"{")
    backend.put_raw(audit_name(4), b"{")
    with pytest.raises(CorruptionError, match="older version might lack a commit"):
        doc.load()


def test_a_committer_that_died_between_its_audit_copy_and_its_commit(
    backend: Backend
) -> None:
    """An audit copy of a version never committed (a death between steps 3 and 4) is
    ignored while current.json is intact and purged by purge_uncommitted. On S3 it
    also blocks commits of that version until then (nothing tells a dead committer
    from a stalled one there); locally the lock tells, and the next commit replaces it."""
    doc = backend.open()
    doc.commit(0, {"v": 1})
    leftover = backend.files()[audit_name(1)].replace(b'"version": 1', b'"version": 2')
    backend.put_raw(audit_name(2), leftover)
    assert body_of(doc) == (1, {"v": 1})
    if backend.name == "s3":
        with pytest.raises(ConflictError, match="purge_uncommitted"):
            doc.commit(1, {"v": 2})
    assert doc.purge_uncommitted()
    assert doc.history() == [1]
    assert doc.commit(1, {"v": 2}).version == 2
    assert doc.history() == [1, 2]


def test_update_document_goes_past_a_dead_claim(backend: Backend) -> None:
    """update_document, the one read-modify-write loop: `change` applied to what is
    current, None commits nothing, and a dead committer's claim on the next version
    (which refuses every commit of it on S3) is cleared on the way, so the update
    lands instead of giving up as "kept changing" (found by the S3 fault steps: a lost
    hold commit left the Iceberg sync of that topic failing at every later run)."""
    doc = backend.open()
    assert update_document(doc, lambda snapshot: None) is None
    assert doc.load() is None
    first = update_document(doc, lambda snapshot: {"n": 1 if snapshot is None else 0})
    assert first is not None and first.version == 1
    leftover = backend.files()[audit_name(1)].replace(b'"version": 1', b'"version": 2')
    backend.put_raw(audit_name(2), leftover)
    seen: list[int] = []

    def increment(snapshot: Snapshot | None) -> dict[str, Any]:
        assert snapshot is not None
        seen.append(snapshot.version)
        return {"n": snapshot.body["n"] + 1}

    second = update_document(doc, increment, attempts=3)
    assert second is not None and second.version == 2
    assert body_of(doc) == (2, {"n": 2})
    assert seen == ([1, 1] if backend.name == "s3" else [1])
    assert update_document(doc, lambda snapshot: None) is None
    assert body_of(doc) == (2, {"n": 2})


def test_update_document_starts_from_what_the_caller_read(backend: Backend) -> None:
    """`loaded`: the first attempt starts from the caller's read, without reading again;
    a stale one conflicts, and the change is applied again to what is current."""
    doc = backend.open()
    first = doc.commit(0, {"n": 1})
    backend.open().commit(1, {"n": 2})  # the caller's read is stale now
    seen: list[int] = []

    def increment(snapshot: Snapshot | None) -> dict[str, Any]:
        assert snapshot is not None
        seen.append(snapshot.version)
        return {"n": snapshot.body["n"] + 1}

    committed = update_document(doc, increment, loaded=first)
    assert committed is not None and committed.version == 3
    assert body_of(doc) == (3, {"n": 3}) and seen == [1, 2]
    assert update_document(backend.open(), lambda snapshot: None, loaded=None) is None


def test_update_document_gives_up_naming_the_document(backend: Backend) -> None:
    """A document that changes under every attempt: ConflictError naming where it is."""
    doc = backend.open()
    other = backend.open()
    doc.commit(0, {"n": 0})

    def racing(snapshot: Snapshot | None) -> dict[str, Any]:
        assert snapshot is not None
        other.commit(snapshot.version, {"n": snapshot.version})  # lands first
        return {"n": -1}

    with pytest.raises(ConflictError, match="kept changing under 2 attempts"):
        update_document(doc, racing, attempts=2)
    assert body_of(doc) == (3, {"n": 2})


def test_load_or_create_makes_once_and_every_server_reads_the_same(
        backend: Backend, tmp_path: Path) -> None:
    """load_or_create (the cluster id, the decoy secret): made by the first caller,
    read by every later one. A first commit killed after its audit copy, before its
    commit point: the audit copy is what a load falls back to when there is no
    current.json (on both backends), so it counts as made, and every server reads it."""
    scratch = LocalDocument(tmp_path / "scratch")
    scratch.commit(0, {"made": "by a server killed before its commit point"})
    doc = backend.open()
    backend.put_raw(audit_name(1), (tmp_path / "scratch" / audit_name(1)).read_bytes())
    made = load_or_create(doc, lambda: {"made": "first"})
    assert (made.version, made.body) == (1, {"made": "by a server killed before its "
                                                     "commit point"})
    fresh = load_or_create(LocalDocument(tmp_path / "fresh"), lambda: {"made": "first"})
    assert (fresh.version, fresh.body) == (1, {"made": "first"})

    def never() -> dict[str, Any]:
        raise AssertionError("made again")

    for _ in range(2):
        again = load_or_create(backend.open(), never)
        assert (again.version, again.body) == (1, made.body)


def test_audit_copies_are_pruned(backend: Backend) -> None:
    """Step 5."""
    doc = backend.open(keep=3)
    for version in range(10):
        doc.commit(version, {"v": version + 1})
    assert doc.history() == [8, 9, 10]
    assert doc.load_version(9) == {"v": 9}
    assert set(backend.files()) == {CURRENT, *(audit_name(v) for v in (8, 9, 10))}


def test_a_failed_prune_is_made_up_by_the_next_commit(s3_only: Backend) -> None:
    """Step 5 on S3 deletes the one copy that became too old, by name (no LIST); after a
    failed delete the next commit lists and deletes every leftover."""
    calls: list[str] = []
    fail = {"on": False}

    def before(operation: str, kwargs: dict[str, Any]) -> None:
        calls.append(operation)
        if fail["on"] and operation == "delete_object":
            raise client_error(500, "InternalError", "DeleteObject")

    doc = s3_only.open(keep=2)
    assert isinstance(doc, ObjectDocument)
    doc.client = FaultyClient(doc.client, before)  # type: ignore[assignment]
    for version in range(4):
        doc.commit(version, {"v": version + 1})
    assert "list_objects_v2" not in calls  # pruned by name
    fail["on"] = True
    doc.commit(4, {"v": 5})  # committed; its prune failed
    fail["on"] = False
    assert doc.history() == [3, 4, 5]
    doc.commit(5, {"v": 6})
    assert doc.history() == [5, 6]


def test_damage_to_every_copy_raises_corruption_naming_it(backend: Backend) -> None:
    doc = backend.open(keep=1)
    doc.commit(0, {"count": 1})
    doc.commit(1, {"count": 12345})
    for name in (CURRENT, audit_name(2)):
        backend.put_raw(name, backend.files()[name].replace(b"12345", b"12346"))
    with pytest.raises(CorruptionError, match="checksum") as error:
        doc.load()
    assert CURRENT in str(error.value) and audit_name(2) in str(error.value)


def test_changed_since(backend: Backend) -> None:
    doc = backend.open()
    first = doc.commit(0, {"v": 1})
    assert not doc.changed_since(first)
    assert not doc.changed_since(doc.load())
    second = backend.open().commit(1, {"v": 2})
    assert doc.changed_since(first)
    assert not doc.changed_since(second)
    assert doc.changed_since(None)


def test_recover_leaves_committed_versions(backend: Backend) -> None:
    doc = backend.open()
    doc.commit(0, {"v": 1})
    before = backend.files()
    assert list(doc.recover()) == []
    assert backend.files() == before


# -- S3 only: faults in front of the server ---------------------------------------------


def faulty_doc(s3_only: Backend, before: Any = None, after: Any = None) -> ObjectDocument:
    doc = s3_only.open()
    assert isinstance(doc, ObjectDocument)
    doc.client = FaultyClient(doc.client, before, after)  # type: ignore[assignment]
    return doc


def is_audit_put(op: str, kwargs: dict[str, Any]) -> bool:
    return op == "put_object" and kwargs["Key"].endswith(audit_name(2))


def is_current_put(op: str, kwargs: dict[str, Any]) -> bool:
    return op == "put_object" and kwargs["Key"].endswith(CURRENT)


@pytest.mark.parametrize("fault", ["500", "403", "unreachable"])
def test_a_failed_audit_put_leaves_the_old_version(s3_only: Backend, fault: str) -> None:
    """Step 3: the audit copy's PUT fails; the old version stays, nothing else changed,
    and the error names the key and the cause."""
    doc = faulty_doc(s3_only)
    doc.commit(0, {"v": 1})
    before = s3_only.files()

    def fail(op: str, kwargs: dict[str, Any]) -> None:
        if is_audit_put(op, kwargs):
            if fault == "unreachable":
                raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
            raise client_error(int(fault), "InternalError" if fault == "500" else "AccessDenied")

    doc.client.before = fail  # type: ignore[attr-defined]
    # A 403 is a setup error (backend/s3/error_mapping.py): retrying does not help.
    with pytest.raises(ObjectStoreSetupError if fault == "403" else StorageError) as error:
        doc.commit(1, {"v": 2})
    assert audit_name(2) in str(error.value) and "PUT" in str(error.value)
    assert s3_only.files() == before
    assert body_of(doc) == (1, {"v": 1})
    doc.client.before = None  # type: ignore[attr-defined]
    assert doc.commit(1, {"v": 2}).version == 2


@pytest.mark.parametrize("fault", ["403", "unreachable"])
def test_a_refused_commit_put_leaves_the_old_version(s3_only: Backend, fault: str) -> None:
    """Step 4 refused (a 4xx, or never sent): not written; the audit copy of step 3 is
    removed, so the next commit of that version is not blocked."""
    doc = faulty_doc(s3_only)
    doc.commit(0, {"v": 1})
    before = s3_only.files()

    def fail(op: str, kwargs: dict[str, Any]) -> None:
        if is_current_put(op, kwargs):
            if fault == "unreachable":
                raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
            raise client_error(403, "AccessDenied")

    doc.client.before = fail  # type: ignore[attr-defined]
    with pytest.raises(ObjectStoreSetupError if fault == "403" else StorageError,
                       match=CURRENT):
        doc.commit(1, {"v": 2})
    doc.client.before = None  # type: ignore[attr-defined]
    assert s3_only.files() == before
    assert doc.commit(1, {"v": 2}).version == 2


def test_a_lost_answer_is_resolved_by_rereading(s3_only: Backend) -> None:
    """Step 4's answer lost. Sent and landed: the re-read finds this commit's own
    current.json, so the commit succeeds. Not landed: CommitOutcomeUnknown, and
    resolve() re-sends the same conditional PUT: it lands once, and a second resolve
    (or a late duplicate) finds it landed instead of committing twice."""
    doc = faulty_doc(s3_only)
    doc.commit(0, {"v": 1})

    def lose_answer(op: str, kwargs: dict[str, Any]) -> None:
        if is_current_put(op, kwargs):
            raise ReadTimeoutError(endpoint_url="http://127.0.0.1")

    doc.client.after = lose_answer  # type: ignore[attr-defined]
    landed = doc.commit(1, {"v": 2})
    assert landed.version == 2 and landed.proven
    doc.client.after = None  # type: ignore[attr-defined]
    assert body_of(doc) == (2, {"v": 2})

    failing = [True]

    def lose_request(op: str, kwargs: dict[str, Any]) -> None:
        if is_current_put(op, kwargs) and failing[0]:
            failing[0] = False
            raise ReadTimeoutError(endpoint_url="http://127.0.0.1")

    doc.client.before = lose_request  # type: ignore[attr-defined]
    with pytest.raises(ObjectCommitOutcomeUnknown) as unknown:
        doc.commit(2, {"v": 3})
    assert body_of(doc) == (2, {"v": 2})
    resolved = doc.resolve(unknown.value)
    assert resolved is not None and resolved.version == 3
    assert body_of(doc) == (3, {"v": 3})
    again = doc.resolve(unknown.value)
    assert again is not None and again.version == 3
    assert doc.commit(3, {"v": 4}).version == 4
    superseded = doc.resolve(unknown.value)
    assert superseded is not None and superseded.version == 3
    assert doc.history() == [1, 2, 3, 4]


@pytest.mark.parametrize("how", ["timeout-after-sending", "retry-finds-its-own"])
def test_a_lost_answer_to_the_audit_put_is_settled_by_reading_it_back(
    s3_only: Backend, how: str
) -> None:
    """Step 3's answer lost after the audit copy landed, or botocore's retry of that
    PUT answered 412 because its own first attempt landed: the commit reads the audit
    copy back, finds its own commit_id, and goes on."""
    doc = faulty_doc(s3_only)
    doc.commit(0, {"v": 1})
    real = doc.client._client  # type: ignore[attr-defined]

    def after(op: str, kwargs: dict[str, Any]) -> None:
        if is_audit_put(op, kwargs):
            raise ReadTimeoutError(endpoint_url="http://127.0.0.1")

    def before(op: str, kwargs: dict[str, Any]) -> None:
        if is_audit_put(op, kwargs):
            real.put_object(**kwargs)  # the first attempt, whose answer was lost

    if how == "timeout-after-sending":
        doc.client.after = after  # type: ignore[attr-defined]
    else:
        doc.client.before = before  # type: ignore[attr-defined]
    assert doc.commit(1, {"v": 2}).version == 2
    assert body_of(doc) == (2, {"v": 2})
    assert doc.history() == [1, 2]


def test_a_lost_audit_put_of_someone_elses_version_conflicts(s3_only: Backend) -> None:
    doc = s3_only.open()
    doc.commit(0, {"v": 1})
    s3_only.put_raw(audit_name(2), b"another writer's claim")
    with pytest.raises(ConflictError, match="being committed by another writer"):
        doc.commit(1, {"v": 2})
    assert s3_only.files()[audit_name(2)] == b"another writer's claim"


@pytest.mark.parametrize("owner_purges", [False, True])
def test_an_unknown_outcome_blocks_its_version_until_resolved(
    s3_only: Backend, owner_purges: bool
) -> None:
    """While an outcome is unknown, the commit's audit copy keeps others from landing
    that version. resolve() then lands it; or, once the owner purged that audit copy
    and another commit landed, says None: the lost PUT was based on an ETag that is
    gone, so it can never land."""
    doc = faulty_doc(s3_only)
    doc.commit(0, {"v": 1})
    other = s3_only.open()

    def lose_request(op: str, kwargs: dict[str, Any]) -> None:
        if is_current_put(op, kwargs):
            doc.client.before = None  # type: ignore[attr-defined]
            raise ReadTimeoutError(endpoint_url="http://127.0.0.1")

    doc.client.before = lose_request  # type: ignore[attr-defined]
    with pytest.raises(ObjectCommitOutcomeUnknown) as unknown:
        doc.commit(1, {"v": 2, "by": "lost"})
    with pytest.raises(ConflictError):
        other.commit(1, {"v": 2, "by": "other"})
    if owner_purges:
        assert other.purge_uncommitted()
        with pytest.raises(ObjectCommitOutcomeUnknown):
            doc.resolve(unknown.value)  # its audit copy is gone: re-sending is unsafe
        other.commit(1, {"v": 2, "by": "other"})
        assert doc.resolve(unknown.value) is None
        assert body_of(doc) == (2, {"v": 2, "by": "other"})
    else:
        resolved = doc.resolve(unknown.value)
        assert resolved is not None and resolved.version == 2
        assert body_of(doc) == (2, {"v": 2, "by": "lost"})
    assert doc.history() == [1, 2]


def test_errors_and_logs_never_show_credentials(
    s3: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    doc = ObjectDocument(s3.client(), "no-such-bucket-here", "x/doc")
    with pytest.raises(ObjectStoreSetupError, match="does not exist") as error:
        doc.commit(0, {"v": 1})
    message = str(error.value)
    assert "s3://no-such-bucket-here/x/doc/" in message
    backend = s3_backend(s3)
    good = backend.open()
    good.commit(0, {"v": 1})
    backend.put_raw(CURRENT, b"{")
    good.load()
    shown = [message, repr(doc), repr(good), caplog.text]
    for text in shown:
        assert SECRET_ACCESS_KEY not in text
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("compactlog")]
    assert ours, "the fallback warning was logged"
    for text in [message, repr(doc), *ours]:
        for secret in (ACCESS_KEY_ID, SESSION_TOKEN):
            assert secret not in text


def test_object_document_at_a_location(s3: S3Server) -> None:
    doc = ObjectDocument.at(s3.location("meta"), env=s3.env)
    assert doc.commit(0, {"v": 1}).version == 1
    assert json.loads(json.dumps(body_of(doc))) == [1, {"v": 1}]
