"""Write the old-data fixture: a data directory and a bucket as compactlog wrote them
before the storage backend moved to compactlog/backend/ (commit 738e3b6), and what
that code read from them (expected.json), for tests/contract/test_old_data.py.

Why: the formats on disk and in buckets are meant to be unchanged, so a data directory
or a bucket that a deployed server wrote must open with newer code and read the same.
This script is run with the OLD code on the path (a worktree of 738e3b6, any venv with
the project's dependencies), never by the tests; from the repository's root:

    git worktree add /tmp/old 738e3b6
    PYTHONPATH=/tmp/old/src .venv/bin/python tests/contract/old_data/make.py \
        --out tests/contract/old_data

It replaces local/, bucket/ and expected.json (about 20 s; no JVM). Record timestamps
are fixed, but topic ids, run ids, producer ids' files and wall-clock fields differ
from one run to the next, so regenerating changes most files.

It uses the old code as a user would: LogStore's Python API for topics, records, seals,
merges of small segments (the writer's upkeep, `tick`) and in-process compactions (no
Spark: each run is far below compaction.inline.max.bytes; the second one incremental,
so the first run's ledger files get deletion vectors), the `compactlog` CLI for SCRAM
users, ACLs and compaction status, and `compactlog serve` with confluent-kafka for an
idempotent producer (lz4 batches), a plain one (zstd), consumer groups' committed
offsets, DeleteRecords and the cluster id. Topics: `prices` (compact, 3 partitions,
null keys kept, headers, tombstones, an empty key and value), `events` (delete, 2
partitions, null keys, DeleteRecords on partition 0) and `sessions` (compact,delete,
with compaction.inline.max.bytes, a key later builds retired).

The same scenario is written twice: into a local data directory (`local/`, kept whole;
its unsealed tail stays in log segments), and into a moto S3 server's bucket (`bucket/`,
one file per object, named by its key; the writer seals everything when it closes, so
the bucket holds all records, and what expected.json says of it was read from the
bucket alone, with an empty local directory).

Every time-dependent setting is turned off (retention.ms=-1, delete.retention.ms=max,
explicit record timestamps), so that the fixture reads the same whenever the test runs.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from compactlog import LogStore, ProducerRecord
from compactlog.client import Reader
from compactlog.compaction import load_factory
from compactlog.storage.records import Record

BUCKET = "compactlog-old-data"
PREFIX = "deployed"
ACCESS_KEY_ID = "AKIAOLDDATAFIXTURE01"
SECRET_ACCESS_KEY = "old-data-fixture-secret"
PASSWORD = "alice-old-secret"
LONG_MAX = 9223372036854775807
# 2026-01-01T00:00:00Z: every record's timestamp counts from here, one ms apart.
BASE_TS = 1767225600000

COMPACTED = {"cleanup.policy": "compact", "segment.bytes": "65536",
             "delete.retention.ms": str(LONG_MAX), "null.key.policy": "keep"}
TOPICS: dict[str, tuple[int, dict[str, str]]] = {
    # Compacted, with null keys kept in the view, tombstones kept forever.
    "prices": (3, COMPACTED),
    # Deleted by retention only (here never): DeleteRecords moves a log start.
    "events": (2, {"cleanup.policy": "delete", "segment.bytes": "65536",
                   "retention.ms": "-1"}),
    # Both policies: compacted, and retention would apply too (here never). It also
    # sets compaction.inline.max.bytes, a key that later builds retired.
    "sessions": (1, {"cleanup.policy": "compact,delete", "segment.bytes": "65536",
                     "retention.ms": "-1", "delete.retention.ms": str(LONG_MAX),
                     "compaction.inline.max.bytes": "1048576"}),
}
# Consumer groups and what each commits: (topic, partition) -> offset.
GROUPS = {"readers": {("prices", 0): 3, ("prices", 1): 5, ("prices", 2): 1,
                      ("events", 1): 7},
          "auditors": {("sessions", 0): 4}}
DELETE_RECORDS = ("events", 0, 4)  # DeleteRecords: events/0 starts at offset 4
ACLS = [("User:alice", ("READ", "WRITE"), "--topic", "prices"),
        ("User:alice", ("READ",), "--group", "readers")]


class Stamps:
    """Timestamps one ms apart, the same on every run (fixed, not the clock's)."""

    def __init__(self, start: int = BASE_TS) -> None:
        self.next_ts = start

    def __call__(self) -> int:
        self.next_ts += 1
        return self.next_ts


def seal_all(store: LogStore, topic: str) -> None:
    """Roll and seal every partition's active segment (what segment.ms would do)."""
    for partition in store.topic(topic).partitions:
        if partition.roll():
            partition.seal_rolled()


def compact(target: str, local_dir: Path | None, topic: str) -> None:
    """One compaction run, beside the writer (closed meanwhile) as `compactlog compact`
    runs it: the default service, in this process (below compaction.inline.max.bytes)."""
    with LogStore.open(target, read_only=True, local_dir=local_dir) as store:
        service = load_factory().new_service(store, topic, {"spark.master": "local[2]"})
        try:
            report = service.compact()
        finally:
            service.stop()
        print(f"compacted {topic}: {report.total('records_in')} -> "
              f"{report.total('records_out')}", file=sys.stderr)


def write_records(target: str, local_dir: Path | None) -> None:
    """Topics, three rounds of records with seals, merges and two compactions of each
    compacted topic (the second incremental: deletion vectors), and an unsealed tail."""
    stamp = Stamps()
    with LogStore.open(target, local_dir=local_dir) as store:
        for name, (partitions, config) in TOPICS.items():
            store.create_topic(name, partitions=partitions, config=config)
        # Round 1: every key once, with headers (one with a null header value), an empty
        # key, a null key (kept by null.key.policy=keep), an empty value.
        first = [ProducerRecord(f"k{i:02d}".encode(), f"v1-{i}".encode(),
                                (("src", b"gen"), ("round", b"1")), stamp())
                 for i in range(18)]
        first += [ProducerRecord(b"", b"empty-key", (("nothing", None),), stamp()),
                  ProducerRecord(None, b"no-key-1", (), stamp()),
                  ProducerRecord(b"k-empty-value", b"", (), stamp())]
        store.append("prices", first)
        store.append("events", [ProducerRecord(None if i % 3 == 0 else f"e{i % 5}".encode(),
                                               f"event-{i}".encode(), (("n", str(i).encode()),),
                                               stamp()) for i in range(40)])
        store.append("sessions", [ProducerRecord(f"s{i % 6}".encode(), f"login-{i}".encode(),
                                                 (), stamp()) for i in range(12)])
        for name in TOPICS:
            seal_all(store, name)
        # Eight tiny sealed segments in prices/0: the upkeep merges them into one.
        for i in range(8):
            store.append("prices", [ProducerRecord(b"k00", f"tiny-{i}".encode(),
                                                   (("round", b"tiny"),), stamp())], partition=0)
            seal_all(store, "prices")
        store.tick()
    compact(target, local_dir, "prices")
    compact(target, local_dir, "sessions")
    with LogStore.open(target, local_dir=local_dir) as store:
        # Round 2: updates of half the keys, tombstones, a second null key; sealed and
        # compacted again (incremental: the first run's ledger files get deletion vectors).
        second = [ProducerRecord(f"k{i:02d}".encode(), f"v2-{i}".encode(),
                                 (("round", b"2"),), stamp()) for i in range(0, 18, 2)]
        second += [ProducerRecord(b"k03", None, (("why", b"delisted"),), stamp()),
                   ProducerRecord(b"k07", None, (), stamp()),
                   ProducerRecord(b"", None, (), stamp()),
                   ProducerRecord(None, b"no-key-2", (), stamp())]
        store.append("prices", second)
        store.append("sessions", [ProducerRecord(b"s1", None, (), stamp()),
                                  ProducerRecord(b"s2", b"login-again", (), stamp())])
        store.append("events", [ProducerRecord(f"e{i}".encode(), f"event-late-{i}".encode(),
                                               (), stamp()) for i in range(10)])
        for name in TOPICS:
            seal_all(store, name)
    compact(target, local_dir, "prices")
    compact(target, local_dir, "sessions")
    with LogStore.open(target, local_dir=local_dir) as store:
        # Round 3: sealed segments above the horizon, not compacted yet...
        store.append("prices", [ProducerRecord(f"k{i:02d}".encode(), f"v3-{i}".encode(),
                                               (("round", b"3"),), stamp())
                                for i in (1, 3, 4, 5, 9, 12)])
        store.append("sessions", [ProducerRecord(b"s4", b"login-sealed", (), stamp())])
        for name in TOPICS:
            seal_all(store, name)
        # ...and the live tail, never sealed (on S3 the writer seals it when it closes).
        store.append("prices", [ProducerRecord(f"k{i:02d}".encode(), f"v4-{i}".encode(),
                                               (("round", b"4"),), stamp())
                                for i in (2, 5, 11)] + [ProducerRecord(b"k01", None, (), stamp())])
        store.append("sessions", [ProducerRecord(b"s3", b"login-tail", (), stamp())])
        store.append("events", [ProducerRecord(None, b"event-tail", (), stamp()),
                                ProducerRecord(b"e1", b"event-tail-keyed", (), stamp())])


def cli(target: str, env: Mapping[str, str], *args: str, stdin: str = "") -> str:
    done = subprocess.run([sys.executable, "-m", "compactlog", "--data-dir", target, *args],
                          input=stdin, capture_output=True, text=True, env=dict(env),
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"compactlog {' '.join(args)}: {done.stderr}")
    return done.stdout


@contextmanager
def server(target: str, env: Mapping[str, str]) -> Iterator[str]:
    """`compactlog serve` on an ephemeral port (no automatic compaction); stopped with
    SIGTERM, as an operator stops it."""
    process = subprocess.Popen(
        [sys.executable, "-m", "compactlog", "--data-dir", target, "serve",
         "--listen", "127.0.0.1:0", "--no-auto-compaction"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**env, "PYTHONUNBUFFERED": "1"})
    try:
        assert process.stdout is not None
        match = re.search(r"serving on ([\d.]+):(\d+)", process.stdout.readline())
        if match is None:
            raise RuntimeError("the server did not start")
        yield f"{match.group(1)}:{match.group(2)}"
    finally:
        process.send_signal(signal.SIGTERM)
        if process.wait(60) != 0:
            raise RuntimeError(f"the server exited with {process.returncode}")


def use_server(target: str, env: Mapping[str, str]) -> dict[str, Any]:
    """Users and ACLs by the CLI; then through the server: an idempotent producer,
    committed offsets, DeleteRecords. What the server gives back: the groups' offsets
    and the cluster id."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

    cli(target, env, "users", "add", "alice", "--password-stdin", stdin=PASSWORD + "\n")
    for principal, operations, kind, name in ACLS:
        cli(target, env, "acls", "add", "--principal", principal,
            *(arg for op in operations for arg in ("--operation", op)), kind, name)
    with server(target, env) as bootstrap:
        # Compressed batches as producers send them, stored as sent: lz4 from an
        # idempotent producer (producer ids and sequences in the batches), zstd from
        # a plain one.
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                             "compression.type": "lz4", "linger.ms": 50})
        for i in range(4):
            producer.produce("prices", key=f"p{i}".encode(), value=f"idem-{i}".encode() * 8,
                             headers=[("via", b"server")], timestamp=BASE_TS + 10_000 + i)
        if producer.flush(30) != 0:
            raise RuntimeError("the idempotent producer did not deliver")
        plain = Producer({"bootstrap.servers": bootstrap, "compression.type": "zstd",
                          "linger.ms": 50, "enable.idempotence": False, "acks": "all"})
        for i in range(3):
            plain.produce("events", key=b"z%d" % i, value=b"zstd-%d" % i * 8,
                          timestamp=BASE_TS + 20_000 + i)
        if plain.flush(30) != 0:
            raise RuntimeError("the zstd producer did not deliver")
        for group, offsets in GROUPS.items():
            consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                 "enable.auto.commit": False})
            consumer.commit(offsets=[TopicPartition(topic, partition, offset)
                                     for (topic, partition), offset in offsets.items()],
                            asynchronous=False)
            consumer.close()
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topic, partition, before = DELETE_RECORDS
        for future in admin.delete_records([TopicPartition(topic, partition, before)]).values():
            future.result(30)
        committed: dict[str, dict[str, int]] = {}
        for group, offsets in GROUPS.items():
            consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                 "enable.auto.commit": False})
            found = consumer.committed([TopicPartition(t, p) for t, p in offsets], timeout=30)
            consumer.close()
            committed[group] = {f"{tp.topic}/{tp.partition}": tp.offset for tp in found}
        cluster_id = admin.list_topics(timeout=30).cluster_id
        # Gone before the server stops, so that none of them retries a closed port.
        del producer, plain, admin
        return {"groups": committed, "cluster_id": cluster_id}


def encode(data: bytes | None) -> str | None:
    return None if data is None else data.hex()


def record_json(record: Record) -> dict[str, Any]:
    return {"offset": record.offset, "timestamp": record.timestamp, "key": encode(record.key),
            "value": encode(record.value),
            "headers": [[name, encode(value)] for name, value in record.headers]}


def read_all(store: LogStore, topic: str, partition: int, compacted: bool) -> list[Record]:
    reader = Reader(store, topic, partition, start="earliest", read_compacted=compacted)
    records: list[Record] = []
    while batch := reader.poll(max_records=1000):
        records += batch
    return records


def expected_of(target: str, local_dir: Path | None,
                declared: Mapping[str, tuple[int, dict[str, str]]] = TOPICS) -> dict[str, Any]:
    """What the old code reads: each partition's records from offset 0, its compacted
    view, offsets, manifest summary; each topic's config and sealed datasets."""
    from compactlog.tables import view_dataset

    topics: dict[str, Any] = {}
    with LogStore.open(target, read_only=True, local_dir=local_dir) as store:
        for name in store.list_topics():
            topic = store.topic(name)
            entry: dict[str, Any] = {"config": {key: str(topic.config[key])
                                                for key in declared[name][1]},
                                     "partitions": {}}
            for partition in topic.partitions:
                manifest = partition.manifest
                found = {
                    "log_start_offset": partition.log_start_offset,
                    "log_end_offset": partition.log_end_offset,
                    "sealed_end_offset": manifest.sealed_end_offset,
                    "sealed_segments": len(manifest.segments),
                    "horizon": None if manifest.compaction is None
                    else manifest.compaction.horizon,
                    "records": [record_json(r) for r in read_all(store, name, partition.index,
                                                                 False)],
                }
                if "compact" in declared[name][1]["cleanup.policy"]:
                    found["compacted"] = [record_json(r) for r in read_all(
                        store, name, partition.index, True)]
                entry["partitions"][str(partition.index)] = found
            for view in ("raw", "compacted"):
                table = view_dataset(target, name, view).to_table()
                entry[f"{view}_dataset"] = sorted(
                    [p, o] for p, o in zip(table.column("partition").to_pylist(),
                                           table.column("offset").to_pylist(), strict=True))
            topics[name] = entry
    return topics


def generate(target: str, local_dir: Path | None, env: Mapping[str, str]) -> dict[str, Any]:
    """The whole scenario on `target`; what the old code read back (from the bucket
    alone, on S3: a fresh local directory, as a new machine's)."""
    write_records(target, local_dir)
    served = use_server(target, env)
    reader_env = dict(env)
    if local_dir is not None:
        reader_env["COMPACTLOG_LOCAL_DIR"] = str(local_dir.parent / "reader")
    return {"topics": expected_of(target, None if local_dir is None
                                  else local_dir.parent / "reader"),
            **served,
            "compaction_status": {
                topic: json.loads(cli(target, reader_env, "compaction-status", topic, "--json"))
                for topic, (_, config) in TOPICS.items() if "compact" in config["cleanup.policy"]},
            "users": {"alice": PASSWORD},
            "acls": [[p, list(ops), kind.lstrip("-"), name] for p, ops, kind, name in ACLS]}


# A writer killed with records in its local log segments (never sealed into the bucket),
# under a prefix of its own: the bucket and that writer's local directory together.
CRASH_PREFIX = "crashed"
CRASH_TOPICS: dict[str, tuple[int, dict[str, str]]] = {
    "orders": (2, {"cleanup.policy": "compact", "segment.bytes": "65536",
                   "delete.retention.ms": str(LONG_MAX)})}


def crash_writer(target: str, local_dir: Path, phase: str) -> None:
    """Run in a child process. `create`: the topic and a first round, sealed, then a
    clean close. `crash`: a second round sealed, a third left in the log segments, and
    the process ends at once, as kill -9 would end it (each append was fsynced:
    flush.messages=1). Its lease lasts 2 s, so it has long expired when a test opens
    the bucket."""
    stamp = Stamps(BASE_TS + (50_000 if phase == "crash" else 40_000))
    store = LogStore.open(target, local_dir=local_dir, lease_ttl_s=2)
    if phase == "create":
        for name, (partitions, config) in CRASH_TOPICS.items():
            store.create_topic(name, partitions=partitions, config=config)
        store.append("orders", [ProducerRecord(b"o%d" % (i % 7), b"placed-%d" % i,
                                               (("step", b"1"),), stamp()) for i in range(14)])
        seal_all(store, "orders")
        store.close()
        return
    store.append("orders", [ProducerRecord(b"o%d" % (i % 7), b"paid-%d" % i, (), stamp())
                            for i in range(0, 14, 2)] + [ProducerRecord(b"o3", None, (), stamp())])
    seal_all(store, "orders")
    store.append("orders", [ProducerRecord(b"o%d" % i, b"shipped-%d" % i, (), stamp())
                            for i in (1, 2, 5)])
    os._exit(0)


def write_crashed(target: str, local_dir: Path, compactor_dir: Path,
                  env: Mapping[str, str]) -> None:
    """A clean writer, a compaction, then a writer that crashes (crash_writer)."""
    for phase in ("create", "crash"):
        subprocess.run([sys.executable, __file__, "--crash-writer", target, str(local_dir),
                        phase], env=dict(env), check=True)
        if phase == "create":
            compact(target, compactor_dir, "orders")


def dump_bucket(client: Any, out: Path) -> int:
    """Every object of the bucket, as a file named by its key; the number of objects."""
    count = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for item in page.get("Contents", []):
            path = out / item["Key"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(client.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read())
            count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path,
                        help="where local/, bucket/, crashed-local/ and expected.json go "
                             "(replaced)")
    parser.add_argument("--crash-writer", nargs=3, metavar=("TARGET", "LOCAL_DIR", "PHASE"),
                        help=argparse.SUPPRESS)  # the child process of write_crashed
    args = parser.parse_args()
    if args.crash_writer:
        target, local_dir, phase = args.crash_writer
        crash_writer(target, Path(local_dir), phase)
        return
    out: Path = args.out
    if out is None:
        parser.error("--out is required")
    for name in ("local", "bucket", "crashed-local", "expected.json"):
        shutil.rmtree(out / name, ignore_errors=True)
        (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    # The CLI and the server run as subprocesses with this environment, so with the
    # same (old) code on PYTHONPATH.
    base_env = dict(os.environ)
    import compactlog
    print(f"old code: {compactlog.__file__}", file=sys.stderr)

    local_expected = generate(str(out / "local"), None, base_env)
    local_expected["producer_ids_next_unreserved"] = json.loads(
        (out / "local" / "producer-ids.json").read_text())["next_unreserved"]
    # The writer's lock file is no part of the state (and a checkout has no flock).
    (out / "local" / ".writer.lock").unlink(missing_ok=True)

    from moto.server import ThreadedMotoServer

    # moto's server logs every request; the objects are dumped below instead.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    try:
        host, port = moto.get_host_and_port()
        s3_env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}",
                  "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
                  "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY, "AWS_REGION": "us-east-1"}
        os.environ.update(s3_env)
        from compactlog.storage.location import S3Settings

        client = S3Settings.from_env().boto3_client()
        client.create_bucket(Bucket=BUCKET)
        with tempfile.TemporaryDirectory() as scratch:
            writer_dir = Path(scratch) / "writer"
            bucket_expected = generate(f"s3://{BUCKET}/{PREFIX}", writer_dir,
                                       {**base_env, **s3_env,
                                        "COMPACTLOG_LOCAL_DIR": str(writer_dir)})
            crashed_dir = out / "crashed-local"
            crashed_target = f"s3://{BUCKET}/{CRASH_PREFIX}"
            write_crashed(crashed_target, crashed_dir, Path(scratch) / "compactor",
                          {**base_env, **s3_env})
            (crashed_dir / ".writer.lock").unlink()
            # Read as the old code would after the crash, on this machine: the bucket and
            # the crashed writer's log segments (from a copy: a reader adds to its cache).
            reader_copy = Path(scratch) / "crashed-reader"
            shutil.copytree(crashed_dir, reader_copy)
            crashed_expected = {"topics": expected_of(crashed_target, reader_copy,
                                                      CRASH_TOPICS),
                                "prefix": CRASH_PREFIX}
        body = client.get_object(Bucket=BUCKET, Key=f"{PREFIX}/producer-ids/current.json")
        bucket_expected["producer_ids_next_unreserved"] = json.loads(
            body["Body"].read())["body"]["next_unreserved"]
        objects = dump_bucket(client, out / "bucket")
    finally:
        moto.stop()
    expected = {"generated_by": "compactlog 738e3b6 (tests/contract/old_data/make.py)",
                "generated_at_ms": int(time.time() * 1000),
                "local": local_expected,
                "bucket": {**bucket_expected, "bucket": BUCKET, "prefix": PREFIX,
                           "objects": objects},
                "crashed": crashed_expected}
    (out / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}: {objects} objects in the bucket", file=sys.stderr)


if __name__ == "__main__":
    main()
