"""The server's open files stay bounded, whatever the number of segments, and files of
replaced ledgers are closed (issue 11, breakages 3 and 8, with real processes).

- `compactlog serve` under `ulimit -n 256` serves topics of 2,000 sealed segments to a
  confluent-kafka consumer from offset 0, raw and compacted, without an error: the
  open-file cache keeps at most a quarter of the limit open. (Before, one scan opened
  every segment and kept it open; past the limit the Fetch responses carried a null
  record set that librdkafka could not parse.)
- Repeated compactions in another process leave no "(deleted)" file open in the server
  (read from /proc/PID/fd).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from confluent_kafka import Producer

from compactlog.compaction import load_factory
from compactlog.storage.records import ProducerRecord, encode_batch, parse_header
from compactlog.storage.sealed import WriteOptions, write_segment
from compactlog.storage.store import LogStore
from support.kafka_server import logged_server
from support.server_files import consume_from_zero, open_parquet_files

SEGMENTS = 2000
OPEN_FILES = 256


def add_sealed_segments(store: LogStore, topic: str, count: int, keys: int) -> None:
    """Append `count` sealed segments of one record each to partition 0, in one manifest
    commit (2,000 seals one by one commit 2,000 ever larger manifests: a minute here).
    The files are written by the store's own Parquet writer, as a seal writes them."""
    partition = store.topic(topic).partition(0)
    start = partition.log_end_offset
    assert partition.active.is_empty
    options = WriteOptions(65536, "zstd")
    infos = []
    for offset in range(start, start + count):
        record = ProducerRecord(b"k%d" % (offset % keys), b"value-%d" % offset)
        batch = encode_batch([record], offset, 1_700_000_000_000 + offset)
        name = f"{offset:020d}-fixture.parquet"
        infos.append(write_segment([(parse_header(batch), bytes(batch))],
                                   partition.segment_dir / name, name, options))
    partition.commit_manifest(lambda m: replace(m, segments=(*m.segments, *infos)))
    # The active log starts where the sealed segments end, as after real seals.
    active = partition.active.path
    partition.close()
    active.unlink()
    (active.parent / f"{start + count:020d}.log").touch()


def build(data: Path) -> None:
    with LogStore.open(data) as store:
        store.create_topic("raw", 1, {"retention.ms": "-1"})
        add_sealed_segments(store, "raw", SEGMENTS, keys=SEGMENTS)
    with LogStore.open(data) as store:
        store.create_topic("compacted", 1, {"cleanup.policy": "compact",
                                            "min.compaction.lag.ms": "0"})
        add_sealed_segments(store, "compacted", SEGMENTS // 2, keys=100)
    with LogStore.open(data) as store:
        factory = load_factory("local_engine:LocalCompactionServiceFactory")
        factory.new_service(store, "compacted", {}).compact()
        add_sealed_segments(store, "compacted", SEGMENTS // 2, keys=100)


def test_a_server_with_256_open_files_serves_2000_segments_raw_and_compacted(
    tmp_path: Path
) -> None:
    data = tmp_path / "data"
    build(data)
    with LogStore.open(data, read_only=True) as store:
        compacted_view_size = len({i % 100 for i in range(SEGMENTS // 2)}) + SEGMENTS // 2
        horizon = store.topic("compacted").partition(0).manifest.horizon
        assert horizon == SEGMENTS // 2 - 1
    with logged_server(data, tmp_path / "server.log", open_files=OPEN_FILES) as server:
        # The open-file cache's share, plus the two files a merge of small segments
        # (upkeep, storage/merging.py) holds beside it: its output and the input it reads.
        most = OPEN_FILES // 4 + 2
        raw = consume_from_zero(server.bootstrap, "raw", SEGMENTS)
        assert raw == list(range(SEGMENTS))
        assert len(open_parquet_files(server.process.pid)) <= most
        view = consume_from_zero(server.bootstrap, "compacted", SEGMENTS)
        assert len(view) == compacted_view_size
        assert view[-(SEGMENTS // 2):] == list(range(SEGMENTS // 2, SEGMENTS))
        assert len(open_parquet_files(server.process.pid)) <= most
        log = server.log()
        assert "max_open_data_files is 64" in log
        for trouble in ("Too many open files", "EMFILE", "Traceback", "ERROR"):
            assert trouble not in log, log


def test_repeated_compactions_leave_no_deleted_file_open_in_the_server(
    tmp_path: Path
) -> None:
    data = tmp_path / "data"
    with LogStore.open(data) as store:
        store.create_topic("t", 1, {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
                                    "segment.bytes": "4096", "file.delete.delay.ms": "0"})
    factory = load_factory("local_engine:LocalCompactionServiceFactory")
    with logged_server(data, tmp_path / "server.log") as server:
        producer = Producer({"bootstrap.servers": server.bootstrap, "linger.ms": 0})
        for run in range(5):
            for i in range(400):
                producer.produce("t", key=b"k%d" % (i % 50), value=b"run-%d-%d" % (run, i))
                if i % 100 == 99:
                    assert producer.flush(30) == 0  # one batch: the next rolls it
            wait_for_sealed(data, min_segments=run + 1)
            # A compaction process replaces the ledger; the server reads the new one.
            with LogStore.open(data, read_only=True) as reader:
                factory.new_service(reader, "t", {}).compact()
            end = latest_end(data)
            view = consume_from_zero(server.bootstrap, "t", end)
            assert view, "the compacted view is empty"
        pid = server.process.pid
        deadline = time.monotonic() + 10
        while True:
            deleted = [f for f in open_parquet_files(pid) if f.endswith("(deleted)")]
            if not deleted or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert deleted == [], "replaced ledger files still open in the server"


def wait_for_sealed(data: Path, min_segments: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with LogStore.open(data, read_only=True) as store:
            if len(store.topic("t").partition(0).manifest.segments) >= min_segments:
                return
        time.sleep(0.1)
    raise AssertionError("the server did not seal segments")


def latest_end(data: Path) -> int:
    with LogStore.open(data, read_only=True) as store:
        return store.topic("t").partition(0).log_end_offset
