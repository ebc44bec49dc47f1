"""What the Iceberg state table costs (issue 23, "Cost"): the share of a compaction run
that its snapshot takes, and DuckDB reading the state table against DuckDB reading the
same ledger files as plain Parquet.

1. A topic of N records over K keys (100-byte values, 1% tombstones) is written with the
   store API and sealed, then compacted with the product's compaction service (the
   default settings: the report says which engine ran each run), every run in one warm
   Spark session, as the server's cleaner and `compactlog worker` run them (the session
   starts, with its warming job, before the first timed run, and is timed apart); then
   1% and 10% more records, each sealed and compacted incrementally. For each run: its
   time, the
   "iceberg" stage's (step 5b: the sync and the expiry check), their ratio, and the
   files the snapshot wrote (on S3, one PUT each, plus the hint's and the holds').
2. The same query (`count(*)`, `sum(octet_length(value))`, `max("offset")`) by DuckDB 1.5.5,
   from the state table (`iceberg_scan`, its position deletes applied) and from the
   ledger files the manifests list (`read_parquet` of that list: the baseline, which
   counts the rows the deletes take out, so its answer differs), and, as a diagnostic of
   what the position deletes cost, the state table's current snapshot with its delete
   manifests left out of a copy of its manifest list (the same data files; its answer is
   the baseline's); median and minimum of --repeat, the sources taking turns.
3. Two more diagnostics (bench/iceberg_v3_copy.py): the same snapshot as a v3 table
   whose deletes are deletion vectors (a Puffin file; its answer is the state table's),
   and the same again with each file's deleted positions moved to its first rows (as
   many, so a different answer): whether DuckDB pays per deleted row, per 2,048-row
   vector that holds one, or per delete file.

    .venv/bin/python bench/iceberg_tables.py
    .venv/bin/python bench/iceberg_tables.py --records 200000 --keys 20000   # quick
    .venv/bin/python bench/iceberg_tables.py --topic-config delete.retention.ms=0
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import duckdb_extension_avro  # type: ignore[import-untyped]
import duckdb_extension_iceberg  # type: ignore[import-untyped]
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import ManifestContent, read_manifest_list, write_manifest_list

from compactlog.compaction import load_factory
from compactlog.compaction.spark_service import SparkCompactionServiceFactory
from compactlog.iceberg import state_table_location
from compactlog.iceberg.files import table_files
from compactlog.iceberg.state import load_current
from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iceberg_v3_copy import current_snapshot, v3_copy
from machine_info import machine_info

TOPIC = "t"
QUERY = 'SELECT count(*), sum(octet_length(value)), max("offset") FROM {source}'


def produce(store: LogStore, start: int, count: int, keys: int) -> None:
    for first in range(start, start + count, 5000):
        store.append(TOPIC, [
            ProducerRecord(b"k%08d" % (i * 7919 % keys), None if i % 100 == 7 else b"x" * 100)
            for i in range(first, min(first + 5000, start + count))])
    for partition in store.topic(TOPIC).partitions:
        partition.roll()


def table_file_count(store: LogStore) -> int:
    return sum(1 for path in Path(state_table_location(store, TOPIC)).rglob("*")
               if path.is_file())


def compact(store: LogStore, settings: dict[str, Any]) -> dict[str, Any]:
    files = table_files(store, TOPIC, "state")
    before, count_before = load_current(files).version, table_file_count(store)
    service = load_factory().new_service(store, TOPIC, settings)
    started = time.perf_counter()
    report = service.compact()  # the session is the caller's: not stopped here
    wall = time.perf_counter() - started
    return {"seconds": wall, "iceberg": report.stages.get("iceberg", 0.0),
            "engine": getattr(report, "engine", "?"),
            "snapshots": load_current(files).version - before,
            "files_written": table_file_count(store) - count_before,
            "records_in": report.total("records_in")}


def extension(module: Any) -> str:
    folder = os.path.join(os.path.dirname(module.__file__), "extensions")
    return glob.glob(os.path.join(folder, "**", "*.duckdb_extension"), recursive=True)[0]


def without_deletes(table: str, scratch: Path) -> str:
    """A metadata file for the state table's current snapshot whose manifest list names
    only its data manifests (written under `scratch`, the table left as it is)."""
    # (By the hint: a name sort puts v9 after v10.)
    metadata, snapshot = current_snapshot(Path(table))
    table_io = PyArrowFileIO()
    data_only = [manifest for manifest in read_manifest_list(
        table_io.new_input(snapshot["manifest-list"])) if manifest.content == ManifestContent.DATA]
    manifest_list = str(scratch / "data-manifests-only.avro")
    with write_manifest_list(2, table_io.new_output(manifest_list), snapshot["snapshot-id"],
                             snapshot.get("parent-snapshot-id"), snapshot["sequence-number"],
                             "deflate") as writer:
        writer.add_manifests(data_only)
    snapshot["manifest-list"] = manifest_list
    copy = scratch / "without-deletes.metadata.json"
    copy.write_text(json.dumps(metadata))
    return str(copy)


def iceberg_duckdb() -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the pip packages' avro and iceberg extensions loaded from
    their folders (nothing fetched: autoinstall off)."""
    con = duckdb.connect(config={"allow_unsigned_extensions": "true",
                                 "autoinstall_known_extensions": "false"})
    con.execute(f"LOAD '{extension(duckdb_extension_avro)}'")
    con.execute(f"LOAD '{extension(duckdb_extension_iceberg)}'")
    return con


def duckdb_times(store: LogStore, repeat: int, scratch: Path) -> dict[str, Any]:
    con = iceberg_duckdb()
    table = state_table_location(store, TOPIC)
    ledger = [str(p.ledger_dir / info.file) for p in store.topic(TOPIC).partitions
              for info in p.manifest.ledger]
    sources = {"state table (iceberg_scan)": f"iceberg_scan('{table}')",
               "ledger files (read_parquet)": f"read_parquet({json.dumps(ledger)})",
               "diagnostic: no delete manifests":
                   f"iceberg_scan('{without_deletes(table, scratch)}')",
               "diagnostic: v3 deletion vectors":
                   f"iceberg_scan('{v3_copy(Path(table), scratch / 'v3')}')",
               "diagnostic: v3, deletes at file starts":
                   f"iceberg_scan('{v3_copy(Path(table), scratch / 'v3-first', True)}')"}
    times: dict[str, list[float]] = {name: [] for name in sources}
    answers: dict[str, Any] = {}
    for source in sources.values():
        con.execute(QUERY.format(source=source)).fetchall()  # warm the page cache
    for _ in range(repeat):  # the sources take turns, so that load hits both alike
        for name, source in sources.items():
            started = time.perf_counter()
            answers[name] = con.execute(QUERY.format(source=source)).fetchall()[0]
            times[name].append(time.perf_counter() - started)
    return {name: {"median_s": statistics.median(found), "min_s": min(found),
                   "answer": answers[name]} for name, found in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--spark-master", default="local[2]")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--topic-config", action="append", default=[], metavar="KEY=VALUE",
                        help="topic config set when the topic is created (repeatable), "
                        "e.g. delete.retention.ms=0")
    args = parser.parse_args()
    if any("=" not in item for item in args.topic_config):
        parser.error("--topic-config takes KEY=VALUE")

    with tempfile.TemporaryDirectory(prefix="iceberg-bench-") as scratch:
        data = Path(scratch) / "data"
        with LogStore.open(data) as store:
            store.create_topic(TOPIC, args.partitions, {
                "cleanup.policy": "compact", "min.compaction.lag.ms": "0",
                "segment.bytes": str(8 << 20),
                **dict(item.split("=", 1) for item in args.topic_config)})
            produce(store, 0, args.records, args.keys)
        # One warm session for every run (spark.session: the services use it and leave
        # it running), started and warmed before the first timed run.
        started = time.perf_counter()
        factory = SparkCompactionServiceFactory()
        session = factory.start_session({"spark.master": args.spark_master})
        startup_s = time.perf_counter() - started
        settings: dict[str, Any] = {"spark.master": args.spark_master, "spark.session": session}
        runs = []
        done = args.records
        for label, percent in (("full", 100), ("incremental 1%", 1), ("incremental 10%", 10)):
            if label != "full":
                count = args.records * percent // 100
                with LogStore.open(data) as store:
                    produce(store, done, count, args.keys)
                done += count
            with LogStore.open(data, read_only=True) as store:
                runs.append({"run": label, **compact(store, settings)})
        session.stop()
        with LogStore.open(data, read_only=True) as store:
            reads = duckdb_times(store, args.repeat, Path(scratch))

    print(f"{args.records:,} records, {args.keys:,} keys, {args.partitions} partitions; "
          f"Spark session start-up (not in the runs) {startup_s:.2f} s")
    print(f"{'run':<17}{'engine':<40}{'run s':>7}{'snapshot s':>11}{'share':>7}{'files':>6}")
    for run in runs:
        share = run["iceberg"] / run["seconds"] if run["seconds"] else 0.0
        print(f"{run['run']:<17}{str(run['engine'])[:39]:<40}{run['seconds']:>7.2f}"
              f"{run['iceberg']:>11.3f}{share:>7.1%}{run['files_written']:>6}")
    base = reads["ledger files (read_parquet)"]["median_s"]
    least = reads["ledger files (read_parquet)"]["min_s"]
    print(f"\n{'DuckDB 1.5.5 reads':<40}{'median s':>10}{'ratio':>7}{'min s':>9}{'ratio':>7}"
          "  answer")
    for name, found in reads.items():
        print(f"{name:<40}{found['median_s']:>10.4f}{found['median_s'] / base:>7.2f}"
              f"{found['min_s']:>9.4f}{found['min_s'] / least:>7.2f}  {found['answer']}")
    if args.json:
        args.json.write_text(json.dumps({
            "date": datetime.datetime.now(datetime.UTC).isoformat(), "args": vars(args) | {
                "json": str(args.json)}, "machine": machine_info(), "runs": runs,
            "startup_s": startup_s, "reads": reads}, indent=2, default=str))


if __name__ == "__main__":
    main()
