"""DeleteRecords on the wire, every served version, against a real server: Kafka's
answers per partition (offset -1 is the high watermark; OFFSET_OUT_OF_RANGE past it or
below 0; POLICY_VIOLATION on a topic that is compacted only), and the low watermark it
answers is where Fetch and ListOffsets(earliest) now start, durably."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from support.admin_wire import DELETE_RECORDS, serve
from support.kafka_server import LoggedServer
from support.wire import Wire

VERSIONS = [0, 1, 2]
LIST_OFFSETS, FETCH = 2, 1
EARLIEST = -2


def fill(store: LogStore, name: str, count: int, config: dict[str, str] | None = None,
         partitions: int = 1) -> None:
    store.create_topic(name, partitions, config or {})
    store.append(name, [ProducerRecord(b"k%d" % i, b"v%d" % i) for i in range(count)],
                 partition=0)


def prepare(store: LogStore) -> None:
    for version in VERSIONS:
        fill(store, f"plain{version}", 10, partitions=2)
        fill(store, f"table{version}", 10, {"cleanup.policy": "compact"})
        fill(store, f"both{version}", 10, {"cleanup.policy": "compact,delete"})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoggedServer]:
    with serve(tmp_path_factory.mktemp("delete-records"), prepare) as running:
        yield running


def delete(wire: Wire, version: int, wanted: dict[str, list[tuple[int, int]]]
           ) -> dict[tuple[str, int], tuple[int, ErrorCode]]:
    body = wire.call(DELETE_RECORDS, version, {
        "topics": [{"name": name, "partitions": [
            {"partition_index": index, "offset": offset} for index, offset in parts]}
            for name, parts in wanted.items()],
        "timeout": datetime.timedelta(seconds=5)})
    return {(t.name, p.partition_index): (p.low_watermark, p.error_code)
            for t in body.topics for p in t.partitions}


def earliest(wire: Wire, topic: str) -> int:
    body = wire.call(LIST_OFFSETS, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": topic, "partitions": [
            {"partition_index": 0, "current_leader_epoch": -1, "timestamp": EARLIEST}]}]})
    return int(body.topics[0].partitions[0].offset)


def fetch_from(wire: Wire, topic: str, offset: int) -> Any:
    body = wire.call(FETCH, 12, {
        "replica_id": -1, "max_wait": datetime.timedelta(0), "min_bytes": 1,
        "max_bytes": 1 << 20, "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": topic, "partitions": [
            {"partition": 0, "fetch_offset": offset, "partition_max_bytes": 1 << 20,
             "current_leader_epoch": -1, "log_start_offset": -1}]}],
        "forgotten_topics_data": [], "rack_id": ""})
    return body.responses[0].partitions[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_delete_records_answers_each_partition_as_kafka_does(server: LoggedServer,
                                                             version: int) -> None:
    plain, table, both = f"plain{version}", f"table{version}", f"both{version}"
    with Wire(server.address) as wire:
        assert delete(wire, version, {
            plain: [(0, 3), (1, 0), (5, 1)], "missing": [(0, 1)], table: [(0, 1)],
            both: [(0, 4)],
        }) == {
            (plain, 0): (3, ErrorCode.none),
            (plain, 1): (0, ErrorCode.none),  # an empty partition, deleted up to its end
            (plain, 5): (-1, ErrorCode.unknown_topic_or_partition),
            ("missing", 0): (-1, ErrorCode.unknown_topic_or_partition),
            # compact alone: records leave only when superseded (Kafka refuses too)
            (table, 0): (-1, ErrorCode.policy_violation),
            (both, 0): (4, ErrorCode.none),
        }
        assert earliest(wire, plain) == 3 and earliest(wire, table) == 0
        assert earliest(wire, both) == 4
        # Below the start changes nothing; -1 is the high watermark; past it or below 0
        # is out of range and changes nothing either.
        assert delete(wire, version, {plain: [(0, 2)]}) == {(plain, 0): (3, ErrorCode.none)}
        assert delete(wire, version, {plain: [(0, 11)]}) == {
            (plain, 0): (-1, ErrorCode.offset_out_of_range)}
        assert delete(wire, version, {plain: [(0, -2)]}) == {
            (plain, 0): (-1, ErrorCode.offset_out_of_range)}
        assert earliest(wire, plain) == 3
        assert delete(wire, version, {plain: [(0, -1)]}) == {(plain, 0): (10, ErrorCode.none)}
        assert earliest(wire, plain) == 10
        gone = fetch_from(wire, plain, 0)
        assert (gone.error_code, gone.log_start_offset) == (ErrorCode.offset_out_of_range, 10)
        kept = fetch_from(wire, both, 4)
        assert (kept.error_code, kept.log_start_offset) == (ErrorCode.none, 4)
        assert kept.records  # offsets 4..9 are still served
        assert delete(wire, version, {}) == {}


def test_deleted_records_stay_deleted_after_the_server_stops(tmp_path: Path) -> None:
    def one_topic(store: LogStore) -> None:
        fill(store, "t", 10)

    with serve(tmp_path, one_topic) as server, Wire(server.address) as wire:
        assert delete(wire, 2, {"t": [(0, 6)]}) == {("t", 0): (6, ErrorCode.none)}
    with LogStore.open(tmp_path / "data", read_only=True) as store:
        partition = store.topic("t").partition(0)
        assert partition.log_start_offset == 6
        assert [r.offset for r in partition.read(0, 100)] == [6, 7, 8, 9]
