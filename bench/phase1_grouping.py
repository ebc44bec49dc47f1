"""Phase 1's grouping kernel on one thread: each key's greatest offset, for one
partition's worth of rows (the issue-26 workload: 10M records over 4 partitions, so
2.5M rows, 250k distinct keys per partition by default).

Rows, each on one thread (two Spark tasks share the two cores of local[2]):
- `arrow group_by` (the product, `arrow_survivors.latest_per_key`): Arrow's hash
  group-by, `use_threads=False`;
- `arrow dictionary_encode + numpy maximum.at`: the product's kernel before;
- `DuckDB group by`: `select max("offset") from t group by key`, `threads=1`: the
  baseline, the same in-memory Arrow table.

Each row is timed `--runs` times after one untimed run (the first call of a process
pays imports and first allocations); the table gives the median and the minimum and
the ratio of medians to DuckDB's, and checks that every kernel finds the same offsets.

    .venv/bin/python bench/phase1_grouping.py
    .venv/bin/python bench/phase1_grouping.py --rows 2500000 --keys 250000 --runs 15
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compactlog.compaction.arrow_survivors import latest_per_key

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_info import commit, machine_info


def workload(rows: int, keys: int, seed: int) -> pa.Table:
    """Keys as the bench's generator makes them (b"key-" and a zero-padded number),
    uniform, in offset order."""
    rng = np.random.default_rng(seed)
    numbers = rng.integers(0, keys, rows)
    key_bytes = np.char.add(b"key-", np.char.zfill(numbers.astype("S12"), 12))
    return pa.table({"key": pa.array(key_bytes.tolist(), pa.binary()),
                     "offset": pa.array(np.arange(rows, dtype=np.int64))})


def arrow_group_by(table: pa.Table) -> np.ndarray:
    return np.sort(latest_per_key(table).column("offset_max").to_numpy())


def dictionary_then_numpy(table: pa.Table) -> np.ndarray:
    encoded = pc.dictionary_encode(table.column("key").combine_chunks())
    latest = np.full(len(encoded.dictionary), -1, np.int64)
    np.maximum.at(latest, encoded.indices.to_numpy(), table.column("offset").to_numpy())
    return np.sort(latest)


def duckdb_group_by(connection: duckdb.DuckDBPyConnection) -> Callable[[pa.Table], np.ndarray]:
    def run(table: pa.Table) -> np.ndarray:
        connection.register("t", table)
        query = 'select max("offset") as m from t group by key'
        found = connection.execute(query).to_arrow_table()
        connection.unregister("t")
        return np.sort(found.column("m").to_numpy())
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_500_000)
    parser.add_argument("--keys", type=int, default=250_000)
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    info = machine_info()
    print(f"phase 1 grouping bench, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
          f"commit {commit()}; {info['cpu']}, {info['cores']} cores, {info['memory']}; "
          f"pyarrow {pa.__version__}, DuckDB {duckdb.__version__}; {args.rows:,} rows, "
          f"{args.keys:,} keys, {args.runs} runs per row", flush=True)
    table = workload(args.rows, args.keys, args.seed)
    connection = duckdb.connect()
    connection.execute("set threads=1")
    kernels = {"arrow group_by (the product)": arrow_group_by,
               "arrow dictionary_encode + numpy maximum.at": dictionary_then_numpy,
               "DuckDB group by": duckdb_group_by(connection)}
    expected = None
    times: dict[str, list[float]] = {name: [] for name in kernels}
    for name, kernel in kernels.items():
        found = kernel(table)  # untimed: imports, first allocations
        if expected is None:
            expected = found
        assert np.array_equal(found, expected), f"{name} found other offsets"
    for _ in range(args.runs):  # the kernels take turns, so a busy moment falls on all
        for name, kernel in kernels.items():
            began = time.perf_counter()
            kernel(table)
            times[name].append(time.perf_counter() - began)
    baseline = statistics.median(times["DuckDB group by"])
    print(f"{'kernel (one thread)':45} {'median ms':>10} {'min ms':>8} {'x DuckDB':>9}")
    for name, found_times in times.items():
        median = statistics.median(found_times)
        print(f"{name:45} {median * 1000:10.1f} {min(found_times) * 1000:8.1f} "
              f"{median / baseline:9.2f}")
    print(f"(every kernel found the same {0 if expected is None else len(expected):,} offsets)")


if __name__ == "__main__":
    main()
