"""The main job on the embedded default: compact a stock-ticker topic with Spark.

1. Produces a realistic compacted topic into ./compactlog-data: price updates over a
   few thousand symbols, popular symbols trading far more often, and some symbols
   delisted through tombstones. Full segments are sealed into Parquet as it goes.
2. Compacts it as a Spark job on local[*], with a progress bar that follows Spark's
   tasks and the summary table that `compactlog compact` prints, then says which Spark
   job ran it and how long starting the JVM took, apart from the run; on the warm
   worker of `compactlog worker start` when one runs on the data directory (no JVM to
   start). Spark's own output goes to a log file, named on screen.
3. Builds a TableView (symbol -> latest price) from the raw log and from the compacted
   view, checks that both equal the latest value per symbol computed while producing,
   and shows how much less the compacted view has to read.
4. Reads the compacted state as an Iceberg table with pyiceberg, which knows nothing of
   compactlog, and checks it against the compacted view up to the horizons.

    scripts/demo.sh [--symbols 3000] [--updates 300000] [--data-dir ./compactlog-data]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from pyiceberg.table import StaticTable
from rich import box
from rich.filesize import decimal
from rich.progress import Progress
from rich.table import Table
from stock_ticker import ticks

from compactlog import LogStore, ProducerRecord
from compactlog.cli.admin_client import report_from_json
from compactlog.cli.compact import compact_with_progress, spark_log_path
from compactlog.cli.compaction_report import summary_table
from compactlog.cli.output import stdout_console
from compactlog.client import TableView
from compactlog.compaction import CompactionReport, load_factory
from compactlog.compaction.daemon import ask, running_worker
from compactlog.iceberg import state_table_location

TOPIC = "demo-ticks"
BATCH = 1000
console = stdout_console()


def produce(store: LogStore, symbols: int, updates: int) -> dict[bytes, bytes]:
    """Produce the ticker topic; returns the expected table: symbol -> latest update."""
    expected: dict[bytes, bytes] = {}
    batch: list[ProducerRecord] = []
    headers = (("source", b"demo"),)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("producing", total=updates)
        for tick in ticks(symbols, updates):
            key, value = tick.symbol.encode(), tick.value
            batch.append(ProducerRecord(key, value, headers if value else (), tick.timestamp_ms))
            if value is None:
                expected.pop(key, None)
            else:
                expected[key] = value
                progress.advance(task)
            if len(batch) == BATCH:
                store.append(TOPIC, batch)
                batch = []
        if batch:
            store.append(TOPIC, batch)
    store.flush()
    return expected


def layout_table(store: LogStore, title: str) -> Table:
    table = Table("partition", "offsets", "sealed segments", "live tail", "horizon",
                  "ledger", "dirty ratio", title=title, box=box.SIMPLE_HEAD)
    for partition in store.topic(TOPIC).partitions:
        stats = partition.stats()
        horizon = stats["horizon"]
        table.add_row(
            str(partition.index), f"0..{stats['log_end_offset'] - 1}",
            f"{stats['sealed_segments']} ({decimal(stats['sealed_bytes'])})",
            decimal(stats["log_bytes"]), "-" if horizon is None else str(horizon),
            f"{stats['ledger_records']:,} records ({decimal(stats['ledger_bytes'])})",
            f"{stats['dirty_ratio']:.2f}",
        )
    return table


def state_at_horizons(store: LogStore) -> dict[bytes, bytes]:
    """Symbol -> latest price in the compacted view up to each partition's horizon:
    what the Iceberg state table holds (a key lives in one partition)."""
    state: dict[bytes, bytes] = {}
    for partition in store.topic(TOPIC).partitions:
        horizon = partition.manifest.horizon
        offset = 0
        while horizon is not None and offset <= horizon:
            batch = partition.read_compacted(offset, 10_000)
            if not batch:
                break
            for record in batch:
                if record.offset > horizon or record.key is None:
                    continue
                if record.value is None:
                    state.pop(record.key, None)
                else:
                    state[record.key] = record.value
            offset = batch[-1].offset + 1
    return state


def ran_on(report: CompactionReport) -> str:
    """What ran the compaction, and the JVM's start apart from the run's own time."""
    lines = []
    if report.startup_s:
        lines.append(f"   starting Spark (its JVM and session) took {report.startup_s:.1f} s: "
                     "once per process; `compactlog worker start` keeps one warm")
    lines.append(f"   the run took {report.duration_s - report.startup_s:.1f} s on "
                 f"{report.engine}")
    return "\n".join(lines)


def build_table_view(store: LogStore, read_compacted: bool) -> tuple[TableView, float]:
    started = time.perf_counter()
    view = TableView(store, TOPIC, read_compacted=read_compacted)
    return view, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("compactlog-data"))
    parser.add_argument("--symbols", type=int, default=3000)
    parser.add_argument("--updates", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--spark-master", default="local[*]")
    args = parser.parse_args()

    with LogStore.open(args.data_dir) as store:
        if TOPIC in store.list_topics():
            store.delete_topic(TOPIC)
        store.create_topic(TOPIC, args.partitions, {
            "cleanup.policy": "compact",
            # Small segments, so that most of the topic is sealed and compactable and
            # the live tail after the horizon stays short.
            "segment.bytes": str(256 * 1024),
            # The demo writes fast and can redo everything; the default fsyncs per batch.
            "flush.messages": str(2**63 - 1),
        })
        console.print(f"[bold]1. Producing[/] {args.updates:,} price updates for "
                      f"{args.symbols:,} symbols to [cyan]{TOPIC}[/] in {args.data_dir}/")
        started = time.perf_counter()
        expected = produce(store, args.symbols, args.updates)
        produce_s = time.perf_counter() - started
        total = store.topic(TOPIC).partitions
        record_count = sum(p.log_end_offset for p in total)
        console.print(f"   {record_count:,} records in {produce_s:.1f} s "
                      f"({record_count / produce_s:,.0f} records/s); "
                      f"{len(expected):,} symbols listed at the end")
        console.print(layout_table(store, f"{TOPIC} before compaction"))

    # Compaction runs beside the writer in real use; here the writer is done, so the
    # data directory is opened again, read-only, as `compactlog compact` opens it.
    worker = running_worker(args.data_dir)
    with LogStore.open(args.data_dir, read_only=True) as store:
        if worker is not None:
            # `compactlog worker start` left Spark running: no start-up to pay.
            console.print(f"[bold]2. Compacting[/] on the warm compaction worker "
                          f"(pid {worker.pid}, {worker.spark_master})")
            started = time.perf_counter()
            answer = ask(worker, {"op": "compact", "topic": TOPIC, "partitions": None})
            if "error" in answer:
                raise SystemExit(f"the compaction worker failed: {answer['error']}")
            report = report_from_json(answer["report"])
            console.print(summary_table(report))
            console.print(f"   {time.perf_counter() - started:.1f} s wall, from this "
                          "process's request to the worker's answer")
            console.print(ran_on(report), markup=False, soft_wrap=True)
        else:
            console.print(f"[bold]2. Compacting[/] with Spark on {args.spark_master}")
            spark_log = spark_log_path()
            report = compact_with_progress(store, TOPIC, load_factory(), {
                "spark.master": args.spark_master, "spark.log.file": spark_log})
            console.print(summary_table(report))
            console.print(ran_on(report), markup=False, soft_wrap=True)
            console.print(f"   Spark's own output (JVM, Python workers): {spark_log}",
                          markup=False, soft_wrap=True)
        console.print(layout_table(store, f"{TOPIC} after compaction"))

        console.print("[bold]3. Building a TableView[/] (symbol -> latest update)")
        raw, raw_s = build_table_view(store, read_compacted=False)
        compacted, compacted_s = build_table_view(store, read_compacted=True)
        for name, view in (("raw log", raw), ("compacted view", compacted)):
            if view.snapshot() != expected:
                raise SystemExit(f"the TableView built from the {name} is wrong")
        timing = Table("built from", "records read", "seconds", "records/s", box=box.SIMPLE_HEAD,
                       title="TableView start-up (both equal the expected table)")
        for name, view, seconds in (("raw log", raw, raw_s),
                                    ("compacted view", compacted, compacted_s)):
            timing.add_row(name, f"{view.records_read:,}", f"{seconds:.2f}",
                           f"{view.records_read / seconds:,.0f}")
        console.print(timing)
        console.print(f"   the compacted view reads {raw.records_read / compacted.records_read:.0f}"
                      f"x fewer records and starts {raw_s / compacted_s:.1f}x faster")

        console.print("[bold]4. Reading the state as an Iceberg table[/] (pyiceberg, no "
                      "compactlog code)")
        location = state_table_location(store, TOPIC)
        state = StaticTable.from_metadata(location).scan(
            selected_fields=("key", "value")).to_arrow()
        iceberg_state = dict(zip(state.column("key").to_pylist(),
                                 state.column("value").to_pylist(), strict=True))
        if iceberg_state != state_at_horizons(store):
            raise SystemExit("the Iceberg state table differs from the compacted view")
        console.print(f"   {len(iceberg_state):,} live symbols at the horizons, equal to the "
                      "compacted view up to them (records after a horizon join the table "
                      "with the next compaction)")

    data = args.data_dir
    cli = command_name()
    console.print("[bold]Try next:[/]")
    steps = []
    if worker is None:
        steps.append(f"{cli} --data-dir {data} worker start   # keeps Spark warm: the next "
                     "run skips the start-up")
    python = os.path.relpath(sys.executable)
    table = location if "://" in location else os.path.relpath(location)
    steps += [f"{cli} --data-dir {data} consume {TOPIC} --compacted --format json | tail -3",
              f"{cli} --data-dir {data} topics describe {TOPIC}",
              f"{cli} --data-dir {data} compaction-status {TOPIC}",
              f"{python} -c \"from pyiceberg.table import StaticTable; print(StaticTable"
              f".from_metadata('{table}').scan().to_arrow().num_rows, 'symbols')\"",
              "# DuckDB and Polars read that table too: docs/querying.md"]
    for step in steps:  # as typed: no markup, never wrapped
        console.print(f"   {step}", markup=False, soft_wrap=True)


def command_name() -> str:
    """How the user runs the CLI from here: `compactlog` when that is this install's on
    PATH, else the path to it (scripts/demo.sh does not activate .venv)."""
    installed = Path(sys.executable).parent / "compactlog"
    found = shutil.which("compactlog")
    if found is not None and Path(found).resolve() == installed.resolve():
        return "compactlog"
    return os.path.relpath(installed)

if __name__ == "__main__":
    main()
