"""docs/querying.md's DuckDB and Polars examples of the compacted view, run as written
against a topic whose ledger has deletion vectors, and compared with the Reader.

Each Python block of the page that builds the compacted view (DuckDB's `compacted`
view, Polars' `compacted_view`) is run in a directory holding `compactlog-data`, so
the paths in the page are the ones used.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compactlog.client.reader import Reader
from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from fakes import FakeClock
from local_engine import LocalCompactionService

DOC = Path(__file__).resolve().parent.parent / "docs" / "querying.md"

PARTITIONS = 4


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


@pytest.fixture(scope="module", params=[True, False], ids=["with-dvs", "without-dvs"])
def data_root(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    with_dvs: bool = request.param
    root = tmp_path_factory.mktemp("querying")
    clock = FakeClock()
    with LogStore.open(root / "compactlog-data", clock=clock) as store:
        store.create_topic("prices", PARTITIONS, {
            "cleanup.policy": "compact", "min.compaction.lag.ms": "0",
            "compaction.deletion.vectors": str(with_dvs).lower(),
            "compaction.ledger.rewrite.live.fraction": "0"})
        compactor = LocalCompactionService(store, "prices", {"clock": clock, "engine": "arrow"})
        for run, count in enumerate((2000, 150, 90)):
            store.append("prices", [
                ProducerRecord(b"SYM%d" % ((i * 7 + run) % 300),
                               None if i % 41 == 3 else b"%d" % i) for i in range(count)])
            for partition in store.topic("prices").partitions:
                partition.roll()
            compactor.compact()
            clock.advance_ms(1000)
        store.append("prices", [ProducerRecord(b"SYM%d" % i, b"late") for i in range(40)])
        for partition in store.topic("prices").partitions:
            partition.roll()  # sealed above the horizon
        assert with_dvs == any(info.dv_file for p in store.topic("prices").partitions
                               for info in p.manifest.ledger)
    return root


@contextlib.contextmanager
def inside(directory: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(before)


def expected_counts(root: Path) -> dict[int, tuple[int, int]]:
    """Per partition: (records, distinct keys) of the Reader's compacted view up to the
    last sealed offset (the part the examples read)."""
    counts = {}
    with LogStore.open(root / "compactlog-data", read_only=True) as store:
        for index in range(PARTITIONS):
            end = store.topic("prices").partition(index).manifest.sealed_end_offset
            reader = Reader(store, "prices", index, read_compacted=True)
            records = []
            while chunk := reader.poll(max_records=500):
                records += [r for r in chunk if r.offset < end]
            counts[index] = (len(records), len({r.key for r in records}))
    return counts


def run_block(marker: str, root: Path) -> dict[str, Any]:
    (code,) = [block for block in blocks() if marker in block]
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    with inside(root), contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, str(DOC), "exec"), namespace)
    return namespace


def test_the_duckdb_view_applies_deletion_vectors(data_root: Path) -> None:
    namespace = run_block("CREATE TEMP VIEW compacted", data_root)
    with inside(data_root):  # the view reads relative paths when queried
        rows = namespace["con"].sql(
            "SELECT partition, count(*), count(DISTINCT key) FROM compacted "
            "GROUP BY ALL ORDER BY partition").fetchall()
    assert {p: (n, k) for p, n, k in rows} == expected_counts(data_root)


def test_the_polars_function_applies_deletion_vectors(data_root: Path) -> None:
    namespace = run_block("def compacted_view", data_root)
    import polars as pl

    with inside(data_root):  # the lazy frame reads relative paths when collected
        frame = namespace["view"].group_by("partition").agg(
            pl.len().alias("records"), pl.col("key").n_unique().alias("keys")).collect()
    got = {row["partition"]: (row["records"], row["keys"]) for row in frame.to_dicts()}
    assert got == expected_counts(data_root)
