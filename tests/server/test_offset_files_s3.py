"""The server's own state on an object store, against moto on loopback: committed
offsets (server/coordinator/offset_files.py, one object per group fenced by the writer's epoch),
the producer-id counter (DocumentIdAllocator), and the credentials and ACLs the CLI
writes beside the topics, which a server on another machine then finds.

Each test of offset_files.py's protocol is named in its docstring. Clocks are the tests'
own; the epoch, not the clock, decides who may write."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kio.schema.errors import ErrorCode

from compactlog import LogStore
from compactlog.backend import Location, state_document
from compactlog.backend.lease import EPOCH_KEY
from compactlog.backend.s3.document import ObjectDocument
from compactlog.cli import cli
from compactlog.errors import FencedError
from compactlog.server.coordinator.group_coordinator import GroupCoordinator
from compactlog.server.coordinator.group_model import GroupError
from compactlog.server.coordinator.offset_files import ObjectOffsetFiles, offset_files_of
from compactlog.server.producer_ids import ID_DOCUMENT, DocumentIdAllocator
from compactlog.server.security.acl_model import Operation, Permission, new_binding
from compactlog.server.security.authorizer import ACL_DIR, AuthorizationConfig, Authorizer
from compactlog.server.security.credentials import DIRECTORY, CredentialStore, make_credential
from support.fakes import FakeClock
from support.s3_support import (
    FaultyClient,
    S3Server,
)

TTL_S = 10.0


@pytest.fixture
def where(s3_env: S3Server) -> Location:
    return s3_env.location("state")


def offsets(value: int) -> dict[str, Any]:
    return {"group_id": "g", "offsets": [
        {"topic": "t", "partition": 0, "offset": value, "leader_epoch": -1,
         "metadata": None, "commit_ms": 0}]}


def stored(s3: S3Server, where: Location, group: str = "g") -> dict[str, Any]:
    raw = s3.client().get_object(Bucket=where.bucket,
                                 Key=where.key(f"groups/{group}.json"))["Body"].read()
    body: dict[str, Any] = json.loads(raw)
    return body


def test_a_newer_owner_fences_an_older_one_at_load(where: Location) -> None:
    ObjectOffsetFiles(where, epoch=2).write("g", offsets(5))
    with pytest.raises(FencedError, match="epoch 2, newer than this writer's 1"):
        ObjectOffsetFiles(where, epoch=1).load()


def test_a_former_owner_cannot_write_after_a_takeover(s3_env: S3Server,
                                                      where: Location) -> None:
    former = ObjectOffsetFiles(where, epoch=1)
    former.write("g", offsets(5))
    owner = ObjectOffsetFiles(where, epoch=2)
    assert owner.load() == [{**offsets(5), EPOCH_KEY: 1}]
    assert stored(s3_env, where)[EPOCH_KEY] == 2  # stamped at load
    with pytest.raises(FencedError, match="writer epoch 2 replaced"):
        former.write("g", offsets(9))
    owner.write("g", offsets(7))
    assert stored(s3_env, where)["offsets"][0]["offset"] == 7


def test_a_former_owner_cannot_create_a_group_after_a_takeover(
        where: Location, tmp_path: Path) -> None:
    clock = FakeClock()
    first = LogStore.open(where, local_dir=tmp_path / "a", clock=clock, lease_ttl_s=TTL_S)
    clock.advance(TTL_S + 1)
    second = LogStore.open(where, local_dir=tmp_path / "b", clock=clock, lease_ttl_s=TTL_S)
    try:
        former = offset_files_of(first.location, first.data_dir, first.lease)
        owner = offset_files_of(second.location, second.data_dir, second.lease)
        with pytest.raises(FencedError, match="another process took the writer lease"):
            former.write("new", offsets(1))
        owner.write("new", offsets(2))
    finally:
        second.close()
        first.lease = None  # it lost the lease: its close must not release it
        first.close()


def test_a_former_owners_late_write_is_replaced(s3_env: S3Server, where: Location) -> None:
    owner = ObjectOffsetFiles(where, epoch=2)
    assert owner.load() == []
    # The former owner passed its lease check just before the takeover, then created g.
    ObjectOffsetFiles(where, epoch=1).write("g", offsets(5))
    owner.write("g", offsets(7))
    assert stored(s3_env, where) == {**offsets(7), EPOCH_KEY: 2}


def test_a_lost_answer_to_a_write_is_settled_by_rereading(s3_env: S3Server,
                                                          where: Location) -> None:
    client = s3_env.client()
    retried: list[str] = []

    def retry_once(operation: str, kwargs: dict[str, Any]) -> None:
        # The PUT landed but its answer was lost: botocore sends it again, and the
        # store refuses the repeat, whose condition names the ETag before the first.
        if operation == "put_object" and not retried:
            retried.append(operation)
            client.put_object(**kwargs)

    files = ObjectOffsetFiles(where, epoch=1, client=FaultyClient(client, after=retry_once))
    files.write("g", offsets(5))
    files.write("g", offsets(6))
    assert retried and stored(s3_env, where)["offsets"][0]["offset"] == 6


def test_a_deleted_group_stays_deleted_after_a_takeover(s3_env: S3Server,
                                                        where: Location) -> None:
    former = ObjectOffsetFiles(where, epoch=1)
    former.write("g", offsets(5))
    former.delete(["g"])
    assert ObjectOffsetFiles(where, epoch=2).load() == []
    with pytest.raises(FencedError):
        former.write("g", offsets(6))
    assert stored(s3_env, where)["deleted"] is True


def test_a_fenced_commit_answers_not_coordinator_and_changes_nothing(
        where: Location) -> None:
    async def run() -> None:
        coordinator = GroupCoordinator(ObjectOffsetFiles(where, epoch=1))
        try:
            await coordinator.commit("g", "", -1, {("t", 0): (5, -1, None)})
            ObjectOffsetFiles(where, epoch=2).load()  # another server takes over
            with pytest.raises(GroupError) as refused:
                await coordinator.commit("g", "", -1, {("t", 0): (9, -1, None),
                                                       ("t", 1): (3, -1, None)})
            assert refused.value.code == ErrorCode.not_coordinator
            # What the coordinator answers from is what is durable.
            assert {key: c.offset for key, c in coordinator.fetch_offsets("g").items()} \
                == {("t", 0): 5}
        finally:
            coordinator.close()

    asyncio.run(run())
    reloaded = GroupCoordinator(ObjectOffsetFiles(where, epoch=3))
    assert {key: c.offset for key, c in reloaded.fetch_offsets("g").items()} == {("t", 0): 5}
    reloaded.close()


def test_two_servers_in_turn_never_hand_out_one_producer_id(where: Location,
                                                            tmp_path: Path) -> None:
    document = state_document(where, tmp_path, ID_DOCUMENT)
    former = DocumentIdAllocator(document, block_size=10)
    given = [former.allocate() for _ in range(3)]  # reserved 0..9
    owner = DocumentIdAllocator(state_document(where, tmp_path, ID_DOCUMENT), block_size=10)
    given += [owner.allocate() for _ in range(15)]  # starts above the former's block
    given += [former.allocate() for _ in range(12)]  # its block runs out: goes above
    assert len(set(given)) == len(given)
    assert min(given[3:18]) == 10
    assert owner.was_issued(12) and not owner.was_issued(10_000)


def run_the_cli(where: Location) -> None:
    runner = CliRunner()
    added = runner.invoke(cli, ["--data-dir", str(where), "users", "add", "alice",
                                "--password-stdin"], input="s3cret\n")
    assert added.exit_code == 0, added.output
    granted = runner.invoke(cli, ["--data-dir", str(where), "acls", "add",
                                  "--principal", "User:alice", "--operation", "read",
                                  "--topic", "orders"])
    assert granted.exit_code == 0, granted.output


def test_users_and_acls_made_by_the_cli_are_found_from_another_machine(
        where: Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTLOG_LOCAL_DIR", str(tmp_path / "cli"))
    # The CLI sets logging up for its process; put back what it changes in this one.
    levels = {name: logging.getLogger(name).level
              for name in ("", "botocore", "boto3", "s3transfer", "urllib3")}
    try:
        run_the_cli(where)
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    # The server, on another machine: its own local directory, the same bucket.
    elsewhere = tmp_path / "server"
    credentials = CredentialStore(state_document(where, elsewhere, DIRECTORY))
    assert credentials.verify_password("alice", "s3cret")
    assert not credentials.verify_password("alice", "wrong")
    acls = Authorizer(state_document(where, elsewhere, ACL_DIR), AuthorizationConfig())
    assert [(a.principal, a.name) for a in acls.acls] == [("User:alice", "orders")]
    assert not (tmp_path / "cli" / "security").exists()  # nothing kept locally


def test_a_dead_claim_does_not_block_the_server_state_documents(
        s3_env: S3Server, where: Location, tmp_path: Path) -> None:
    """A process killed between a commit's audit copy and its PUT of current.json
    (backend/s3/document.py steps 3-4) leaves a claim on the next version of the producer-id
    counter, the credentials or the ACLs; the next change clears it and lands."""
    class Killed(BaseException):
        pass

    def kill_at_the_commit_point(operation: str, kwargs: dict[str, Any]) -> None:
        if operation == "put_object" and kwargs["Key"].endswith("/current.json"):
            raise Killed

    def claim_next(name: str) -> None:
        """A commit of `name` killed after its audit copy, before current.json."""
        document = ObjectDocument(FaultyClient(s3_env.client(), kill_at_the_commit_point),
                                  str(where.bucket), where.key(name))
        snapshot = document.load()
        with pytest.raises(Killed):
            document.commit(snapshot.version if snapshot is not None else 0, {})

    ids = DocumentIdAllocator(state_document(where, tmp_path, ID_DOCUMENT), block_size=2)
    assert [ids.allocate(), ids.allocate()] == [0, 1]
    claim_next(ID_DOCUMENT)
    assert ids.allocate() == 2  # a new block, reserved past the claim

    credentials = CredentialStore(state_document(where, tmp_path, DIRECTORY))
    credentials.upsert("alice", "SCRAM-SHA-256",
                       make_credential("SCRAM-SHA-256", "pw", 4096))
    claim_next(DIRECTORY)
    credentials.upsert("bob", "SCRAM-SHA-256", make_credential("SCRAM-SHA-256", "pw", 4096))
    assert set(credentials.users()) == {"alice", "bob"}

    acls = Authorizer(state_document(where, tmp_path, ACL_DIR), AuthorizationConfig())
    first = new_binding(2, "orders", 3, "User:alice", "*", Operation.READ, Permission.ALLOW)
    acls.create([first])
    claim_next(ACL_DIR)
    second = new_binding(2, "prices", 3, "User:bob", "*", Operation.READ, Permission.ALLOW)
    acls.create([second])  # the claim is cleared on the way (update_document)
    assert sorted(a.name for a in acls.acls) == ["orders", "prices"]


def test_a_damaged_offsets_document_loses_that_group_only(s3_env: S3Server,
                                                          where: Location) -> None:
    ObjectOffsetFiles(where, epoch=1).write("g", offsets(5))
    for name, raw in (("list", b"[]"), ("torn", b'{"group_id": "h", "off')):
        s3_env.client().put_object(Bucket=where.bucket, Key=where.key(f"groups/{name}.json"),
                                   Body=raw)
    owner = ObjectOffsetFiles(where, epoch=2)
    assert owner.load() == [{**offsets(5), EPOCH_KEY: 1}]
    owner.write("list", {"group_id": "list", "offsets": []})  # replaced, not refused
