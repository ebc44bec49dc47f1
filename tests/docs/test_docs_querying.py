"""docs/querying.md's DuckDB and Polars examples of the compacted view, run as written
against a topic whose ledger has deletion vectors, and compared with the Reader.

Each Python block of the page that builds the compacted view (DuckDB's `compacted`
view, Polars' `compacted_view`) is run in a directory holding `compactlog-data`, so
the paths in the page are the ones used. `compactlog.tables.view_dataset` is checked on
the same local topics (with and without deletion vectors). The page's S3 examples run
against moto's S3 server on loopback, with the page's URL replaced by the test's and
the AWS settings in the environment, on a topic not compacted (its compacted view is the
raw log's sealed part) and on a topic compacted in the bucket with deletion vectors.
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
from compactlog.storage.records import ProducerRecord, Record
from compactlog.storage.store import LogStore
from compactlog.tables import view_dataset
from local_engine import LocalCompactionService
from support.fakes import FakeClock
from support.paths import ROOT
from support.s3_support import S3Server

DOC = ROOT / "docs" / "querying.md"

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


def sealed_view(store: LogStore, compacted: bool = True) -> dict[int, list[Record]]:
    """Per partition: the Reader's records of the view up to the last sealed offset (the
    part the examples read)."""
    found = {}
    for index in range(len(store.topic("prices").partitions)):
        end = store.topic("prices").partition(index).manifest.sealed_end_offset
        reader = Reader(store, "prices", index, read_compacted=compacted)
        records = []
        while chunk := reader.poll(max_records=500):
            records += [r for r in chunk if r.offset < end]
        found[index] = records
    return found


def counts_of(view: dict[int, list[Record]]) -> dict[int, tuple[int, int]]:
    return {index: (len(records), len({r.key for r in records}))
            for index, records in view.items()}


def expected_counts(root: Path) -> dict[int, tuple[int, int]]:
    """Per partition: (records, distinct keys) of the Reader's compacted view up to the
    last sealed offset."""
    with LogStore.open(root / "compactlog-data", read_only=True) as store:
        return counts_of(sealed_view(store))


def run_block(marker: str, root: Path, replace: dict[str, str] | None = None
              ) -> dict[str, Any]:
    (code,) = [block for block in blocks() if marker in block]
    for old, new in (replace or {}).items():
        assert old in code
        code = code.replace(old, new)
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


def dataset_counts(dataset: Any) -> dict[int, tuple[int, int]]:
    import duckdb

    rows = duckdb.sql("SELECT partition, count(*), count(DISTINCT key) FROM dataset "
                      "GROUP BY ALL").fetchall()
    return {p: (n, k) for p, n, k in rows}


def test_view_dataset_applies_deletion_vectors(data_root: Path) -> None:
    local = data_root / "compactlog-data"
    assert dataset_counts(view_dataset(local, "prices", "compacted")) == \
        expected_counts(data_root)
    with LogStore.open(local, read_only=True) as store:
        raw = sealed_view(store, compacted=False)
        compacted = sealed_view(store)
    assert dataset_counts(view_dataset(local, "prices", "raw")) == counts_of(raw)
    rows = view_dataset(local, "prices", "compacted", partitions=[1]).to_table().to_pylist()
    assert [(r["offset"], r["key"], r["value"]) for r in sorted(
        rows, key=lambda r: r["offset"])] == [(r.offset, r.key, r.value) for r in compacted[1]]


# -- on S3 ---------------------------------------------------------------------------------

DOC_URL = "s3://my-bucket/compactlog"


@pytest.fixture
def s3_topic(s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """`prices` on S3, all sealed (the writer closed), with tombstones."""
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    url = str(s3.location("docs"))
    with LogStore.open(url, local_dir=tmp_path / "writer") as store:
        store.create_topic("prices", PARTITIONS, {"cleanup.policy": "compact",
                                                  "segment.bytes": "4096"})
        store.append("prices", [
            ProducerRecord(b"SYM%d" % (i % 60), None if i % 41 == 3 else b"%d" % i)
            for i in range(900)])
    return url


def s3_view(url: str, local_dir: Path, compacted: bool = True) -> dict[int, list[Record]]:
    with LogStore.open(url, read_only=True, local_dir=local_dir) as store:
        return sealed_view(store, compacted)


def test_the_duckdb_s3_example(s3_topic: str, tmp_path: Path) -> None:
    namespace = run_block("raw = view_dataset(url", tmp_path, {DOC_URL: s3_topic})
    compacted, raw = namespace["compacted"], namespace["raw"]  # DuckDB finds them here
    rows = namespace["con"].sql(
        "SELECT partition, count(*), count(DISTINCT key) FROM compacted "
        "GROUP BY ALL ORDER BY partition").fetchall()
    assert {p: (n, k) for p, n, k in rows} == counts_of(s3_view(s3_topic, tmp_path / "r"))
    [(records, tombstones)] = namespace["con"].sql(
        "SELECT count(*), count(*) FILTER (WHERE value IS NULL) FROM raw").fetchall()
    assert compacted is not None and raw is not None
    expected = s3_view(s3_topic, tmp_path / "r", compacted=False)
    assert records == sum(map(len, expected.values())) == 900
    assert tombstones == sum(r.value is None for rs in expected.values() for r in rs) > 0


def test_the_polars_s3_example(s3_topic: str, tmp_path: Path) -> None:
    namespace = run_block("pl.scan_pyarrow_dataset", tmp_path, {DOC_URL: s3_topic})
    state = namespace["state"].collect()
    expected = {}
    for index, records in s3_view(s3_topic, tmp_path / "r").items():
        for record in records:
            expected[(index, record.key)] = record.value
    live = {key: value for key, value in expected.items() if value is not None}
    got = {(row["partition"], row["key"]): row["value"] for row in state.to_dicts()}
    assert got == live and len(live) > 0


def test_the_s3_examples_apply_deletion_vectors(s3: S3Server, monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    """The page's S3 DuckDB example on a topic compacted in the bucket, with deletion
    vectors: equal to the Reader's compacted view."""
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    url = str(s3.location("docs-dvs"))
    clock = FakeClock()
    with LogStore.open(url, local_dir=tmp_path / "writer", clock=clock) as store:
        store.create_topic("prices", PARTITIONS, {
            "cleanup.policy": "compact", "min.compaction.lag.ms": "0",
            "compaction.deletion.vectors": "true",
            "compaction.ledger.rewrite.live.fraction": "0"})
        compactor = LocalCompactionService(store, "prices", {"clock": clock, "engine": "arrow"})
        for run, count in enumerate((600, 90)):
            store.append("prices", [
                ProducerRecord(b"SYM%d" % ((i * 7 + run) % 100),
                               None if i % 41 == 3 else b"%d" % i) for i in range(count)])
            for partition in store.topic("prices").partitions:
                partition.roll()
            compactor.compact()
            clock.advance_ms(1000)
        assert any(info.dv_file for p in store.topic("prices").partitions
                   for info in p.manifest.ledger)
    namespace = run_block("raw = view_dataset(url", tmp_path, {DOC_URL: url})
    compacted = namespace["compacted"]  # noqa: F841  (DuckDB finds it here)
    rows = namespace["con"].sql(
        "SELECT partition, count(*), count(DISTINCT key) FROM compacted "
        "GROUP BY ALL ORDER BY partition").fetchall()
    assert {p: (n, k) for p, n, k in rows} == counts_of(s3_view(url, tmp_path / "r"))
