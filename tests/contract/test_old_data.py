"""Data written by an older compactlog opens with this code and reads the same (issue
22): a data directory and a bucket that the code of commit 738e3b6 wrote, before the
storage backend moved to compactlog/backend/, kept in tests/contract/old_data/ with what that
code read from them (expected.json). tests/contract/old_data/make.py wrote them; its docstring
says how to write them again.

Why: the formats on disk and in buckets are meant to be unchanged across that move, and
a deployed server's data must outlive an upgrade. Each test works on a copy (tmp_path,
or a fresh prefix of the moto bucket), never on the checked-in files, and checks:
- reads: every partition's records from offset 0, its compacted view, log start, end and
  sealed end offsets, horizon, and the sealed part as `view_dataset` gives it;
- a bucket whose writer was killed with records in its local log segments, opened on
  its machine (with its local directory): the records are recovered, and reach the
  bucket;
- the server's state: the cluster id, the groups' committed offsets, SCRAM credentials
  (a login over SASL_PLAINTEXT), ACLs (enforced with authorization on, and listed by
  `compactlog acls list`), and producer ids (an idempotent producer gets an id above
  the old counter's);
- `compactlog compaction-status` and `topics list` on the old status files;
- then this code's upkeep, one more write and a compaction: the compacted view is the
  old one with the new records folded in, and the Iceberg state table, which the old
  code never wrote, reads as the compacted view in pyiceberg (and DuckDB), both over
  the old ledger files and deletion vectors and after the new run.
Compaction runs without Spark (`compaction.without.spark`), as the old runs did, so the
module needs no JVM.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from pyiceberg.table import StaticTable

from compactlog.cli import cli
from compactlog.client import Reader
from compactlog.compaction import load_factory
from compactlog.config import RETIRED_TOPIC_KEYS
from compactlog.iceberg import state_table_location, sync_state_table
from compactlog.server.producer_ids import ID_DOCUMENT, ID_FILE
from compactlog.server.security.credentials import DIRECTORY as SCRAM_DIRECTORY
from compactlog.server.security.credentials import CredentialStore
from compactlog.storage.records import ProducerRecord, Record
from compactlog.storage.store import LogStore
from compactlog.tables import view_dataset
from support.iceberg_readers import duckdb_rows
from support.iceberg_support import pyiceberg_properties
from support.kafka_server import logged_server
from support.s3_support import S3Server

FIXTURE = Path(__file__).parent / "old_data"
EXPECTED: dict[str, Any] = json.loads((FIXTURE / "expected.json").read_text())
SIDES = ("local", "bucket")

# A record as expected.json holds it: offset, timestamp, key, value (hex or null),
# headers ([name, hex or null] pairs).
RecordJson = dict[str, Any]
# A row of the Iceberg state table: partition, offset, key, value, headers.
StateRow = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]


@dataclass
class OldData:
    """A copy of one side of the fixture, where this code opens it."""

    side: str
    target: str  # what LogStore.open and --data-dir take
    local_dir: Path | None  # the s3:// store's local directory; None for a directory
    env: dict[str, str]  # the environment of the server and CLI this test starts
    server_dir: Path  # where the server writes server.json
    expected: dict[str, Any]
    s3: S3Server | None

    def open(self) -> LogStore:
        return LogStore.open(self.target, local_dir=self.local_dir)


def copy_local(tmp_path: Path) -> OldData:
    data = tmp_path / "data"
    shutil.copytree(FIXTURE / "local", data)
    return OldData("local", str(data), None, dict(os.environ), data, EXPECTED["local"], None)


def upload_bucket(side: str, tmp_path: Path, s3: S3Server,
                  monkeypatch: pytest.MonkeyPatch) -> OldData:
    """Every object of the dump under a fresh prefix of the test bucket (the objects name
    no bucket or prefix, so where they go changes nothing); for the crashed writer's
    side, its local directory too, where it was."""
    expected = EXPECTED[side]
    root = f"old-{uuid.uuid4().hex[:12]}"
    client = s3.client()
    dump = FIXTURE / "bucket"
    for path in sorted((dump / expected["prefix"]).rglob("*")):  # this side's prefix
        if path.is_file():
            client.put_object(Bucket=s3.bucket, Key=f"{root}/{path.relative_to(dump)}",
                              Body=path.read_bytes())
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    local_dir = tmp_path / "local"
    if side == "crashed":
        shutil.copytree(FIXTURE / "crashed-local", local_dir)
    env = {**os.environ, **s3.env, "COMPACTLOG_LOCAL_DIR": str(local_dir)}
    return OldData(side, f"s3://{s3.bucket}/{root}/{expected['prefix']}", local_dir, env,
                   local_dir, expected, s3)


def prepare(side: str, request: pytest.FixtureRequest, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> OldData:
    if side == "local":
        return copy_local(tmp_path)
    return upload_bucket(side, tmp_path, request.getfixturevalue("s3"), monkeypatch)


@pytest.fixture(params=SIDES)
def old_data(request: pytest.FixtureRequest, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> OldData:
    """The data directory, then the bucket."""
    return prepare(request.param, request, tmp_path, monkeypatch)


def test_the_fixture_is_whole() -> None:
    """The dump has every object the old code left in the bucket (a file lost from the
    checkout would otherwise show as a confusing read error)."""
    files = [path for path in (FIXTURE / "bucket").rglob("*") if path.is_file()]
    assert len(files) == EXPECTED["bucket"]["objects"]


# -- records as expected.json holds them ------------------------------------------------

def hex_of(data: bytes | None) -> str | None:
    return None if data is None else data.hex()


def bytes_of(text: str | None) -> bytes | None:
    return None if text is None else bytes.fromhex(text)


def record_json(record: Record) -> RecordJson:
    return {"offset": record.offset, "timestamp": record.timestamp, "key": hex_of(record.key),
            "value": hex_of(record.value),
            "headers": [[name, hex_of(value)] for name, value in record.headers]}


def read_all(store: LogStore, topic: str, partition: int, compacted: bool,
             start: int | str = "earliest") -> list[RecordJson]:
    reader = Reader(store, topic, partition, start=start, read_compacted=compacted)
    records: list[RecordJson] = []
    while batch := reader.poll(max_records=1000):
        records += [record_json(record) for record in batch]
    return records


def sealed_rows(target: str, topic: str, view: str) -> list[list[int]]:
    table = view_dataset(target, topic, view).to_table()
    return sorted([p, o] for p, o in zip(table.column("partition").to_pylist(),
                                         table.column("offset").to_pylist(), strict=True))


# -- reads --------------------------------------------------------------------------------

def test_reads_match_what_the_old_code_read(old_data: OldData) -> None:
    with old_data.open() as store:  # as the writer, as a server opens it
        assert sorted(store.list_topics()) == sorted(old_data.expected["topics"])
        for name, expected in old_data.expected["topics"].items():
            topic = store.topic(name)
            # A key that this build retired (compaction.inline.max.bytes) is dropped:
            # the topic opens, with the others as they were set.
            kept = {key: value for key, value in expected["config"].items()
                    if key not in RETIRED_TOPIC_KEYS}
            assert {key: str(topic.config[key]) for key in kept} == kept, name
            assert not set(topic.config.overrides) & set(RETIRED_TOPIC_KEYS), name
            assert sorted(str(p.index) for p in topic.partitions) \
                == sorted(expected["partitions"])
            for partition in topic.partitions:
                want = expected["partitions"][str(partition.index)]
                where = f"{name}/{partition.index}"
                manifest = partition.manifest
                assert (partition.log_start_offset, partition.log_end_offset,
                        manifest.sealed_end_offset, len(manifest.segments), manifest.horizon) \
                    == (want["log_start_offset"], want["log_end_offset"],
                        want["sealed_end_offset"], want["sealed_segments"], want["horizon"]), \
                    where
                assert read_all(store, name, partition.index, False) == want["records"], where
                if "compacted" in want:
                    assert read_all(store, name, partition.index, True) \
                        == want["compacted"], where
            for view in ("raw", "compacted"):
                assert sealed_rows(old_data.target, name, view) == expected[f"{view}_dataset"], \
                    f"{name} {view}"


def test_a_crashed_writers_tail_reaches_the_bucket(request: pytest.FixtureRequest,
                                                   tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A bucket whose old writer was killed with records in its local log segments
    (acknowledged from that disk, as that build did), and that writer's local directory:
    this code, as the next writer on that machine, recovers them rather than setting
    them aside as superseded, and seals them when it closes; then the bucket alone reads
    as the old code read the bucket and those segments together."""
    old_data = prepare("crashed", request, tmp_path, monkeypatch)
    assert old_data.local_dir is not None
    with old_data.open() as store:
        for name, expected in old_data.expected["topics"].items():
            for index, want in expected["partitions"].items():
                partition = store.topic(name).partition(int(index))
                assert (partition.log_end_offset, partition.manifest.horizon) \
                    == (want["log_end_offset"], want["horizon"]), f"{name}/{index}"
                assert not (partition.directory / "superseded").exists(), f"{name}/{index}"
    with LogStore.open(old_data.target, read_only=True, local_dir=tmp_path / "new") as store:
        for name, expected in old_data.expected["topics"].items():
            for index, want in expected["partitions"].items():
                partition = store.topic(name).partition(int(index))
                assert partition.manifest.sealed_end_offset == want["log_end_offset"]
                assert read_all(store, name, int(index), False) == want["records"]
                assert read_all(store, name, int(index), True) == want["compacted"]


# -- the server's state -------------------------------------------------------------------

def sasl_address(server_dir: Path) -> str:
    """The SASL_PLAINTEXT listener's address, from server.json (its port is ephemeral)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            body = json.loads((server_dir / "server.json").read_text())
            return str(body["listeners"]["SASL_PLAINTEXT"]["address"])
        except (OSError, ValueError, KeyError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# Authorization on, so that the old ACLs are enforced, not only listed: the PLAINTEXT
# listener's User:ANONYMOUS is a super user (it reads everything), alice on
# SASL_PLAINTEXT only what her ACLs allow.
SERVER_CONFIG = """[authorization]
enabled = true
super_users = ["User:ANONYMOUS"]
"""


@contextmanager
def new_server(old_data: OldData, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """This code's server on the old data (PLAINTEXT and SASL_PLAINTEXT listeners); the
    two bootstrap addresses. Stopped with SIGTERM, and checked to exit 0."""
    config = tmp_path / "server.toml"
    config.write_text(SERVER_CONFIG)
    with logged_server(old_data.target, tmp_path / "server.log",
                       "--listener", "SASL_PLAINTEXT://127.0.0.1:0", "--config", str(config),
                       env=old_data.env) as server:
        yield server.bootstrap, sasl_address(old_data.server_dir)
        # Its upkeep went over every old partition meanwhile: nothing it did failed.
        complaints = [line for line in server.log().splitlines()
                      if " WARNING " in line or " ERROR " in line or "Traceback" in line]
        assert not complaints, server.log()


def committed(config: dict[str, Any], group: str, offsets: dict[str, int]) -> dict[str, int]:
    """The offsets `group` committed for the partitions named in `offsets` (topic/p), as
    the server answers OffsetFetch."""
    consumer = Consumer({**config, "group.id": group, "enable.auto.commit": False})
    try:
        asked = [TopicPartition(topic, int(index))
                 for topic, index in (where.split("/") for where in offsets)]
        found = consumer.committed(asked, timeout=30)
    finally:
        consumer.close()
    return {f"{tp.topic}/{tp.partition}": tp.offset for tp in found}


def produce_one(config: dict[str, Any], topic: str, key: bytes) -> KafkaError | None:
    """Send one record; the delivery error, or None once it is acknowledged."""
    errors: list[KafkaError | None] = []
    producer = Producer({**config, "message.timeout.ms": 10_000})
    producer.produce(topic, key=key, value=b"new-code",
                     on_delivery=lambda error, _message: errors.append(error))
    producer.flush(30)
    del producer
    assert len(errors) == 1
    return errors[0]


def test_the_server_keeps_the_old_users_groups_acls_and_producer_ids(
        old_data: OldData, tmp_path: Path) -> None:
    password = old_data.expected["users"]["alice"]
    groups: dict[str, dict[str, int]] = old_data.expected["groups"]
    alice = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
             "sasl.username": "alice", "sasl.password": password}
    with new_server(old_data, tmp_path) as (plaintext, sasl):
        admin = AdminClient({"bootstrap.servers": plaintext})
        assert admin.list_topics(timeout=30).cluster_id == old_data.expected["cluster_id"]
        del admin
        anonymous = {"bootstrap.servers": plaintext}
        for group, offsets in groups.items():
            assert committed(anonymous, group, offsets) == offsets, group
        # A SCRAM login with the old credentials; alice's ACLs let her read her group's
        # offsets of prices and write prices (so also produce idempotently: the old
        # producer-id counter hands out an id), and nothing else.
        alice["bootstrap.servers"] = sasl
        readers = {where: offset for where, offset in groups["readers"].items()
                   if where.startswith("prices/")}
        assert committed(alice, "readers", readers) == readers
        assert produce_one({**alice, "enable.idempotence": True}, "prices",
                           b"after-upgrade") is None
        refused = produce_one(alice, "events", b"not-allowed")
        assert refused is not None
        assert refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, refused
    with old_data.open() as store:
        credentials = CredentialStore(store.layout.state_document(SCRAM_DIRECTORY))
        assert sorted(credentials.users()) == ["alice"]
        assert credentials.verify_password("alice", password)
        assert not credentials.verify_password("alice", password + "-wrong")
        partitions = old_data.expected["topics"]["prices"]["partitions"]
        appended = [record for index, want in partitions.items()
                    for record in read_all(store, "prices", int(index), False,
                                           start=want["log_end_offset"])]
        assert [record["key"] for record in appended] == [b"after-upgrade".hex()]
        # The producer's id came from a block reserved above every id the old server
        # could have handed out (an id given twice would merge two producers' sequences).
        assert next_producer_id(old_data, store) > old_data.expected[
            "producer_ids_next_unreserved"]
    listed = run_cli(old_data, "acls", "list")
    for principal, operations, kind, name in old_data.expected["acls"]:
        lines = [line for line in listed.splitlines()
                 if principal in line and name in line and kind.upper() in line.upper()]
        for operation in operations:
            assert any(operation in line.upper() for line in lines), (
                principal, operation, kind, name, listed)


def run_cli(old_data: OldData, *args: str) -> str:
    """A `compactlog` command on the old data, in this process (a subprocess would pay
    Python's start-up again for each); its output."""
    env = {} if old_data.local_dir is None else {"COMPACTLOG_LOCAL_DIR": str(old_data.local_dir)}
    result = CliRunner().invoke(cli, ["--data-dir", old_data.target, *args],
                                prog_name="compactlog", env=env)
    assert result.exit_code == 0, result.output
    return result.output


def next_producer_id(old_data: OldData, store: LogStore) -> int:
    """The producer-id counter's stored bound (server/producer_ids.py)."""
    if old_data.s3 is None:
        body = json.loads((Path(old_data.target) / ID_FILE).read_text())
    else:
        snapshot = store.layout.state_document(ID_DOCUMENT).load()
        assert snapshot is not None
        body = snapshot.body
    return int(body["next_unreserved"])


def test_the_cli_reads_the_old_compaction_status(old_data: OldData) -> None:
    """`compactlog compaction-status` over the old runs' status (local files; on S3 the
    old code kept none in the bucket, so a new machine sees no run, then as now)."""
    for topic, old_status in old_data.expected["compaction_status"].items():
        shown = run_cli(old_data, "compaction-status", topic, "--json")
        assert summary(json.loads(shown), old_status) == old_status["partitions"], topic
    listed = run_cli(old_data, "topics", "list")
    assert all(topic in listed for topic in old_data.expected["topics"])


def summary(status: dict[str, Any], like: dict[str, Any]) -> list[dict[str, Any]]:
    """What `status` says of each partition's last run, in the fields `like` (the old
    code's status) has: what the old code showed, the new must still show; fields it
    added since are not compared."""
    shown = []
    for found, old in zip(status["partitions"], like["partitions"], strict=True):
        entry = {key: found.get(key) for key in old if key != "last_success"}
        entry["last_success"] = {key: (found.get("last_success") or {}).get(key)
                                 for key in old.get("last_success") or {}}
        shown.append(entry)
    return shown


# -- one more write and compaction ------------------------------------------------------

def fold(records: list[RecordJson]) -> list[RecordJson]:
    """The compacted view of `records` (offset order) under latest-wins: each key's last
    record, tombstones too (delete.retention.ms is the longest), and every keyless
    record (null.key.policy=keep), in offset order."""
    latest: dict[str, RecordJson] = {}
    keyless: list[RecordJson] = []
    for record in sorted(records, key=lambda r: r["offset"]):
        if record["key"] is None:
            keyless.append(record)
        else:
            latest[record["key"]] = record
    return sorted([*latest.values(), *keyless], key=lambda r: r["offset"])


def state_rows(partition: int, view: list[RecordJson], horizon: int) -> list[StateRow]:
    """The Iceberg state table's rows of one partition: its compacted view up to the
    horizon (what the records up to it fold to), less tombstones
    (compactlog/iceberg/__init__.py)."""
    return [(partition, r["offset"], bytes_of(r["key"]), bytes_of(r["value"]),
             tuple((name, bytes_of(value)) for name, value in r["headers"]))
            for r in fold([r for r in view if r["offset"] <= horizon])
            if r["value"] is not None]


def iceberg_properties(old_data: OldData) -> dict[str, str]:
    return {} if old_data.s3 is None else pyiceberg_properties(old_data.s3)


def pyiceberg_rows(table: str, properties: dict[str, str]) -> list[StateRow]:
    scan = StaticTable.from_metadata(table, properties).scan()
    found = scan.to_arrow().select(["partition", "offset", "key", "value", "headers"])
    return sorted((int(row["partition"]), int(row["offset"]), row["key"], row["value"],
                   tuple((h["key"], h["value"]) for h in row["headers"] or ()))
                  for row in found.to_pylist())


def test_a_write_and_a_compaction_on_the_old_data(
        old_data: OldData, caplog: pytest.LogCaptureFixture) -> None:
    topic = "prices"
    expected = old_data.expected["topics"][topic]["partitions"]
    new = [ProducerRecord(b"k%02d" % i, b"new-%d" % i, (("round", b"new"),))
           for i in range(0, 18, 3)]
    new += [ProducerRecord(b"k04", None), ProducerRecord(b"brand-new", b"x"),
            ProducerRecord(None, b"no-key-new")]
    with old_data.open() as store:
        # The upkeep a writer runs (merge, retention, the sweep of the files the old
        # code retired, refresh) on every old partition, before anything new.
        store.tick()
        # The state table of the old ledgers and deletion vectors, as they are.
        for name in ("prices", "sessions"):
            sync_state_table(store, name)
            old_rows = sorted(
                row for index, want in old_data.expected["topics"][name]["partitions"].items()
                for row in state_rows(int(index), want["compacted"], want["horizon"]))
            assert old_rows
            assert pyiceberg_rows(state_table_location(store, name),
                                  iceberg_properties(old_data)) == old_rows, name
        store.append(topic, new)
        for partition in store.topic(topic).partitions:  # sealed, as segment.ms would
            partition.roll()
            partition.seal_rolled()
        # In this process, as `compactlog compact --without-spark` runs it: the same
        # Arrow tasks a Spark job runs, without a JVM (seconds of the test's budget).
        service = load_factory().new_service(store, topic, {"compaction.without.spark": True})
        try:
            service.trigger()  # rolls what is left active, then compacts
        finally:
            service.stop()
        sync_state_table(store, topic)
        table = state_table_location(store, topic)
        rows: list[StateRow] = []
        for partition in store.topic(topic).partitions:
            want = expected[str(partition.index)]
            appended = read_all(store, topic, partition.index, False,
                                start=want["log_end_offset"])
            view = fold(want["compacted"] + appended)
            assert partition.manifest.horizon == partition.log_end_offset - 1
            assert read_all(store, topic, partition.index, True) == view, partition.index
            rows += state_rows(partition.index, view, partition.log_end_offset - 1)
        assert sum(len(read_all(store, topic, p, False, start=expected[str(p)]["log_end_offset"]))
                   for p in range(len(expected))) == len(new)
    assert rows
    assert not [r.getMessage() for r in caplog.records
                if r.name.startswith("compactlog") and r.levelno >= logging.WARNING]
    assert pyiceberg_rows(table, iceberg_properties(old_data)) == sorted(rows)
    if old_data.s3 is None:
        assert duckdb_rows(table) == sorted(rows)
