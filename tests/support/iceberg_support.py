"""What the Iceberg tests share: the topic they make, how they produce and compact, the
state the table must show (`expected_state`: the compacted view as the Reader serves
it, up to each horizon, less tombstones), and the real engines' readers set up for
the S3 server on loopback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import duckdb
import duckdb_extension_httpfs

from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from local_engine import LocalCompactionService
from support.iceberg_readers import ENGINES, StateRow, duckdb_connection, extension_path, read_state
from support.s3_support import S3Server

TOPIC = "prices"
# Retired ledger files stay for an hour (retained snapshots keep theirs whatever the
# delay: tests/iceberg/test_iceberg_expiry.py).
CONFIG = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
          "compaction.deletion.vectors": "true",
          "compaction.ledger.rewrite.live.fraction": "0",
          "file.delete.delay.ms": "3600000"}


def compact(store: LogStore, topic: str = TOPIC, clock: Callable[[], float] | None = None,
            engine: str = "arrow") -> None:
    options: dict[str, Any] = {"engine": engine}
    if clock is not None:
        options["clock"] = clock
    LocalCompactionService(store, topic, options).compact()


def produce(store: LogStore, records: list[ProducerRecord], topic: str = TOPIC) -> None:
    store.append(topic, records)
    for partition in store.topic(topic).partitions:
        partition.roll()


def expected_state(store: LogStore, topic: str = TOPIC) -> list[StateRow]:
    """The compacted view as the Reader serves it, up to each horizon, less tombstones."""
    rows: list[StateRow] = []
    empty_is_tombstone = bool(store.topic(topic).config["empty.value.is.tombstone"])
    for partition in store.topic(topic).partitions:
        horizon = partition.manifest.horizon
        if horizon is None:
            continue
        offset = 0
        while batch := partition.read_compacted(offset, 500):
            for record in batch:
                tombstone = record.value is None or (empty_is_tombstone and not record.value)
                if record.offset <= horizon and not tombstone:
                    rows.append((partition.index, record.offset, record.key, record.value,
                                 tuple(record.headers)))
            offset = batch[-1].offset + 1
            if offset > horizon:
                break
    return sorted(rows)


def updates(start: int, count: int, keys: int, tombstone_every: int = 0) -> list[ProducerRecord]:
    return [ProducerRecord(b"sym%d" % ((start + i) % keys),
                           None if tombstone_every and i % tombstone_every == 3
                           else b"%d.%d" % (start + i, i % 100),
                           (("source", b"feed-%d" % (i % 3)),) if i % 4 == 0 else ())
            for i in range(count)]


def assert_engines_read(table: str, expected: list[StateRow],
                        snapshot_id: int | None = None) -> None:
    for engine in ENGINES:
        assert read_state(engine, table, snapshot_id) == expected, engine


def pyiceberg_properties(s3: S3Server) -> dict[str, str]:
    return {"s3.endpoint": s3.endpoint_url, "s3.access-key-id": s3.env["AWS_ACCESS_KEY_ID"],
            "s3.secret-access-key": s3.env["AWS_SECRET_ACCESS_KEY"],
            "s3.session-token": s3.env["AWS_SESSION_TOKEN"], "s3.region": "us-east-1"}


def duckdb_on_s3(s3: S3Server) -> duckdb.DuckDBPyConnection:
    """DuckDB with its iceberg and httpfs extensions and a secret for moto's server."""
    con = duckdb_connection()
    con.execute(f"LOAD '{extension_path(duckdb_extension_httpfs)}'")
    host = s3.endpoint_url.removeprefix("http://")
    con.execute(f"""CREATE SECRET moto (TYPE s3, KEY_ID '{s3.env["AWS_ACCESS_KEY_ID"]}',
                    SECRET '{s3.env["AWS_SECRET_ACCESS_KEY"]}',
                    SESSION_TOKEN '{s3.env["AWS_SESSION_TOKEN"]}', REGION 'us-east-1',
                    ENDPOINT '{host}', URL_STYLE 'path', USE_SSL false)""")
    return con
