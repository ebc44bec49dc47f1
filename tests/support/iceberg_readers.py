"""Real Iceberg readers, which import nothing of compactlog: DuckDB's iceberg extension
(from its pip package, loaded with auto-install off, as docs/querying.md says), pyiceberg
and Polars' scan_iceberg. Each reads a table (its directory, or a metadata file) at its
current snapshot or at `snapshot_id`, and returns sorted rows
(partition, offset, key, value, headers), headers as a tuple of (key, value) pairs (an
empty tuple for none: pyiceberg returns [] where the others return null).
"""

from __future__ import annotations

import glob
import os
from typing import Any

import duckdb
import duckdb_extension_avro
import duckdb_extension_iceberg
import polars as pl
from pyiceberg.table import StaticTable

StateRow = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]
ENGINES = ("duckdb", "pyiceberg", "polars")


def extension_path(module: Any) -> str:
    found = glob.glob(os.path.join(os.path.dirname(module.__file__), "extensions", "**",
                                   "*.duckdb_extension"), recursive=True)
    return found[0]


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(config={"allow_unsigned_extensions": "true",
                                 "autoinstall_known_extensions": "false"})
    con.execute(f"LOAD '{extension_path(duckdb_extension_avro)}'")
    con.execute(f"LOAD '{extension_path(duckdb_extension_iceberg)}'")
    return con


def _row(partition: int, offset: int, key: bytes | None, value: bytes | None,
         headers: list[dict[str, Any]] | None) -> StateRow:
    pairs = tuple((h["key"], h["value"]) for h in headers or ())
    return (int(partition), int(offset), key, value, pairs)


def duckdb_rows(table: str, snapshot_id: int | None = None) -> list[StateRow]:
    con = duckdb_connection()
    travel = "" if snapshot_id is None else f", snapshot_from_id={int(snapshot_id)}"
    found = con.execute(f"""SELECT partition, "offset", key, value, headers
                            FROM iceberg_scan('{table}'{travel})""").fetchall()
    return sorted(_row(*row) for row in found)


def pyiceberg_rows(table: str, snapshot_id: int | None = None) -> list[StateRow]:
    scan = StaticTable.from_metadata(table).scan(snapshot_id=snapshot_id)
    found = scan.to_arrow().select(["partition", "offset", "key", "value", "headers"])
    return sorted(_row(**row) for row in found.to_pylist())


def polars_rows(table: str, snapshot_id: int | None = None) -> list[StateRow]:
    frame = pl.scan_iceberg(table, snapshot_id=snapshot_id).select(
        "partition", "offset", "key", "value", "headers").collect()
    return sorted(_row(*row) for row in frame.rows())


READERS = {"duckdb": duckdb_rows, "pyiceberg": pyiceberg_rows, "polars": polars_rows}


def read_state(engine: str, table: str, snapshot_id: int | None = None) -> list[StateRow]:
    return READERS[engine](table, snapshot_id)


def data_files(table: str) -> list[tuple[str, int, int]]:
    """(path, content, file_size_in_bytes) of every live file of the current snapshot,
    as pyiceberg plans them (content 0: data, 1: position deletes)."""
    found = []
    for task in StaticTable.from_metadata(table).scan().plan_files():
        found.append((task.file.file_path, int(task.file.content), task.file.file_size_in_bytes))
        found += [(d.file_path, int(d.content), d.file_size_in_bytes) for d in task.delete_files]
    return sorted(set(found))


def snapshots(table: str) -> list[dict[str, Any]]:
    """The table's snapshots, oldest first: id, timestamp and summary."""
    metadata = StaticTable.from_metadata(table).metadata
    return [{"id": s.snapshot_id, "timestamp_ms": s.timestamp_ms,
             "operation": s.summary.operation.value if s.summary else None,
             "summary": dict(s.summary.additional_properties) if s.summary else {}}
            for s in sorted(metadata.snapshots, key=lambda s: s.sequence_number or 0)]
