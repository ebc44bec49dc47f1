"""The main job on the embedded default: a stock-ticker topic in ./compactlog-data.

It produces a realistic topic (price updates over a few thousand symbols, some
delisted through tombstones) through the Python API, seals it into Parquet segments,
reads it all back and checks it, and prints what the store holds.

    scripts/demo.sh [--symbols 3000] [--updates 300000] [--data-dir ./compactlog-data]
"""

from __future__ import annotations

import argparse
import json
import random
import string
import time
from pathlib import Path

import pyarrow.parquet as pq
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from compactlog import LogStore, ProducerRecord

TOPIC = "demo-ticks"
console = Console()


def ticker_updates(symbol_count: int, updates: int, seed: int) -> list[ProducerRecord]:
    rng = random.Random(seed)
    names: set[str] = set()
    while len(names) < symbol_count:
        names.add("".join(rng.choices(string.ascii_uppercase, k=rng.randint(2, 5))))
    symbols = sorted(names)
    prices = {s: rng.uniform(5, 500) for s in symbols}
    delisted = set(rng.sample(symbols, symbol_count // 50))
    records = []
    start_ms = int(time.time() * 1000) - updates
    for step, symbol in enumerate(rng.choices(symbols, k=updates)):
        prices[symbol] *= 1 + rng.gauss(0, 0.002)
        value = json.dumps({"symbol": symbol, "price": round(prices[symbol], 2), "seq": step})
        records.append(ProducerRecord(symbol.encode(), value.encode(), (("source", b"demo"),),
                                      start_ms + step))
    for symbol in sorted(delisted):
        records.append(ProducerRecord(symbol.encode(), None, (), start_ms + updates))
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("compactlog-data"))
    parser.add_argument("--symbols", type=int, default=3000)
    parser.add_argument("--updates", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()

    records = ticker_updates(args.symbols, args.updates, seed=7)
    with LogStore.open(args.data_dir) as store:
        if TOPIC in store.list_topics():
            store.delete_topic(TOPIC)
        store.create_topic(TOPIC, args.partitions, {
            "cleanup.policy": "compact",
            "segment.bytes": str(4 * 1024 * 1024),
            "flush.messages": str(2**63 - 1),
        })
        console.print(f"[bold]Producing[/] {len(records):,} ticker updates for {args.symbols:,} "
                      f"symbols to [cyan]{TOPIC}[/] in {args.data_dir}/")
        started = time.perf_counter()
        batch = 1000
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("producing", total=len(records))
            for i in range(0, len(records), batch):
                store.append(TOPIC, records[i:i + batch])
                progress.advance(task, min(batch, len(records) - i))
        store.flush()
        produce_s = time.perf_counter() - started

        topic = store.topic(TOPIC)
        for partition in topic.partitions:
            partition.roll_if_due()
        started = time.perf_counter()
        read_back = 0
        latest: dict[bytes, bytes | None] = {}
        for partition in topic.partitions:
            offset = partition.log_start_offset
            while True:
                chunk = partition.read(offset, max_records=10_000, max_bytes=16 << 20)
                if not chunk:
                    break
                for record in chunk:
                    latest[record.key or b""] = record.value
                read_back += len(chunk)
                offset = chunk[-1].offset + 1
        read_s = time.perf_counter() - started
        assert read_back == len(records), f"read {read_back} of {len(records)} records"

        table = Table("partition", "offsets", "sealed segments", "sealed bytes",
                      "active log bytes", title=f"{TOPIC}: what the store holds")
        parquet_files: list[Path] = []
        for partition in topic.partitions:
            stats = partition.stats()
            table.add_row(str(partition.index),
                          f"{stats['log_start_offset']}..{stats['log_end_offset'] - 1}",
                          str(stats["sealed_segments"]), f"{stats['sealed_bytes']:,}",
                          f"{stats['log_bytes']:,}")
            parquet_files += sorted(partition.segment_dir.glob("*.parquet"))
        console.print(table)
        live_keys = sum(1 for value in latest.values() if value is not None)
        console.print(
            f"produced {len(records):,} records in {produce_s:.2f} s "
            f"({len(records) / produce_s:,.0f} records/s); read them all back in {read_s:.2f} s "
            f"({read_back / read_s:,.0f} records/s)"
        )
        console.print(f"{len(latest):,} keys seen, {live_keys:,} live, "
                      f"{len(latest) - live_keys:,} deleted by tombstones")
        if parquet_files:
            sample = parquet_files[0]
            rows = pq.ParquetFile(sample).metadata.num_rows
            console.print(f"sealed segments are Parquet: e.g. {sample} ({rows:,} rows); "
                          f"try: duckdb -c \"select key, count(*) from '{sample.parent}/*.parquet' "
                          "group by key order by 2 desc limit 5\"")


if __name__ == "__main__":
    main()
