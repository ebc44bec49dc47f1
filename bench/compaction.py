"""Compaction throughput: compactlog's compaction service, against DuckDB and Polars.

What is measured, on one generated compacted topic (N records over K keys, uniform or
bounded-Zipf, V-byte random values, a share of tombstones, P partitions), every record
sealed into Parquet before anything is timed:

- full compaction through the product's own service: `load_factory()` (the Spark
  factory unless `--service` names another) -> `new_service(store, topic, settings)`
  -> `compact()`. The JVM and SparkSession start-up is timed separately, before any
  run. The first run in a new JVM pays one-off costs (class loading, JIT compilation
  at this data size, query code generation, starting Python workers): measured at
  2 M records it took about three times as long as a warm run. So the full compaction runs
  `--full-runs` times (default 2), each on a fresh clone of the topic, all in the same
  session: the first run is what a fresh `compactlog compact` process pays, the best
  of the others is the steady state of a long-lived compactor. Each run is split into
  its phases (plan, phase 1, phase 2, commit) with the service's `progress` hook;
  `--spark-stages` also prints Spark's own stage timings from its REST API.
- baselines on the same sealed Parquet files, in the same process run, as many times:
  DuckDB and Polars doing the same job (the latest record of every (partition, key),
  all columns, tombstones kept, in offset order, written as zstd Parquet). Both are
  two-phase, like the product: the latest offset per key from (key, offset) alone,
  then the surviving rows; this was the fastest formulation of both here
  (shared/notes/spark.md; `--duckdb-variant` runs the others).
- incremental compaction: after the last full run, 1% more records of the same key
  distribution appended and sealed, then `compact()` again in the same session; its
  time against that full run's (warm against warm).
- peak RSS of the driver (this Python process), the Spark JVM and its Python workers,
  per phase, sampled every 100 ms by a background thread.

Records/s counts the records the run reads (the sealed records for a full run); MB/s is
the size on disk of the Parquet files it reads, over the same time. Generation is timed
and printed, but it is not part of any measurement.

Every result is checked against an independent computation: the latest offset of each
key, per partition, computed with pyarrow straight from the sealed files, and the rows
at those offsets (offset, timestamp, key, value, headers). The compaction's ledger files
(as listed by each partition's manifest) must hold exactly those rows, the horizon must
be the last sealed offset, the report's totals must agree, and the DuckDB and Polars
outputs must hold exactly the same offsets. delete.retention.ms is one day, so every
latest tombstone is kept (compaction/ledger.py), and the check expects them. Any
difference stops the run with exit status 1.

The generated data directory is never changed by a run: each run works on a clone of
it (sealed Parquet files hard-linked, since they are immutable; the rest copied), so a
kept `--data-dir` can be measured again and again with `--skip-generate`.

    .venv/bin/python bench/compaction.py                        # 10 M records, 1 M keys
    .venv/bin/python bench/compaction.py --records 200000 --keys 20000   # a quick check
    .venv/bin/python bench/compaction.py --data-dir /scratch/topic      # keep the topic
    .venv/bin/python bench/compaction.py --data-dir /scratch/topic --skip-generate \\
        --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import numpy.typing as npt
import polars as pl
import psutil  # type: ignore[import-untyped]  # psutil ships no type information
import pyarrow as pa
import pyarrow.parquet as pq

from compactlog import LogStore, ProducerRecord
from compactlog.compaction import (
    CompactionReport,
    CompactionServiceFactory,
    TopicCompactionService,
    load_factory,
)
from compactlog.compaction.spark_service import SparkCompactionService
from compactlog.storage.deletion import drop_deleted, read_deletion_vector
from compactlog.storage.manifest import LEDGER_DIR
from compactlog.storage.partition import Partition
from machine_info import machine_info

TOPIC = "bench"
BATCH = 1000  # records per store.append call
CHUNK = 100_000  # records drawn per numpy call: amortises numpy, bounds memory
SEGMENT_BYTES = 64 * 1024 * 1024
DELETE_RETENTION_MS = 24 * 3600 * 1000  # far longer than a run: every tombstone stays
NO_FSYNC = str(2**63 - 1)  # flush.messages: durability is not what is measured
DEFAULT_MAX_MESSAGE_BYTES = 1048588
PARAMS_FILE = "compaction-bench.json"
COMPARED = ["offset", "timestamp", "key", "value", "headers"]
# --verify offsets: which rows survived and which are tombstones, not their bytes. Keeps the
# checker's memory small next to what is measured (50M keys would hold ~7 GB of rows).
COMPARED_LIGHT = ["offset", "value_size"]
compared = COMPARED
Offsets = npt.NDArray[np.int64]


class VerificationError(Exception):
    """A result differs from the independent computation."""


# -- the workload -------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    records: int
    keys: int
    value_bytes: int
    tombstone_pct: float
    distribution: str
    zipf_exponent: float
    partitions: int
    seed: int

    def describe(self) -> str:
        shape = self.distribution
        if shape == "zipf":
            shape += f" s={self.zipf_exponent:g}"
        return (f"{self.records:,} records, {self.keys:,} keys ({shape}), "
                f"{self.value_bytes}-byte values, {self.tombstone_pct:g}% tombstones, "
                f"{self.partitions} partition{'s' if self.partitions != 1 else ''}")


class Draws:
    """Keys and values drawn with numpy. `stream` picks an independent random stream, and
    the key distribution (Zipf's rank-to-key mapping) depends on the seed alone, so the
    incremental records follow the same distribution as the generated ones."""

    def __init__(self, workload: Workload, stream: int) -> None:
        self.workload = workload
        self.rng = np.random.default_rng([workload.seed, stream])
        self.width = max(8, len(str(workload.keys - 1)))
        self.cdf: npt.NDArray[np.float64] | None = None
        self.unique: Offsets | None = None  # "unique": every key once, in random order
        self.drawn = 0
        if workload.distribution == "unique" and stream == 1:
            self.unique = np.random.default_rng([workload.seed, 0]).permutation(workload.keys)
        if workload.distribution == "zipf":
            ranks = np.arange(1, workload.keys + 1, dtype=np.float64)
            cdf = np.cumsum(ranks ** -workload.zipf_exponent)
            self.cdf = cdf / cdf[-1]
            # Without this the hot keys would be key-00000000, -1, -2..., all close together.
            self.rank_to_key = np.random.default_rng([workload.seed, 0]).permutation(
                workload.keys
            )

    def key_ids(self, count: int) -> Offsets:
        if self.unique is not None:
            # Past the last key, draws wrap around: --records above --keys rewrites keys.
            ids = self.unique[np.arange(self.drawn, self.drawn + count) % len(self.unique)]
            self.drawn += count
            return ids.astype(np.int64)
        if self.cdf is None:
            return self.rng.integers(0, self.workload.keys, count, dtype=np.int64)
        ranks = np.searchsorted(self.cdf, self.rng.random(count), side="right")
        return self.rank_to_key[np.minimum(ranks, self.workload.keys - 1)].astype(np.int64)

    def key_bytes(self, ids: Offsets) -> list[bytes]:
        # b"key-%08d" % id for every id at once: the decimal digits as a byte matrix,
        # viewed as fixed-width strings (no NUL bytes, so nothing is stripped).
        powers = 10 ** np.arange(self.width - 1, -1, -1, dtype=np.int64)
        matrix = np.empty((len(ids), 4 + self.width), dtype=np.uint8)
        matrix[:, :4] = np.frombuffer(b"key-", dtype=np.uint8)
        matrix[:, 4:] = (ids[:, None] // powers) % 10 + ord("0")
        keys: list[bytes] = matrix.view(f"S{4 + self.width}").ravel().tolist()
        return keys

    def records(self, count: int) -> list[ProducerRecord]:
        size = self.workload.value_bytes
        keys = self.key_bytes(self.key_ids(count))
        # Random, incompressible values; a void dtype keeps trailing zero bytes.
        raw = self.rng.integers(0, 256, (count, size), dtype=np.uint8)
        values: list[bytes | None] = raw.view(f"V{size}").ravel().tolist()
        for index in np.flatnonzero(
            self.rng.random(count) < self.workload.tombstone_pct / 100
        ).tolist():
            values[index] = None  # a null value is a tombstone
        return list(map(ProducerRecord, keys, values))


def topic_config(workload: Workload) -> dict[str, str]:
    config = {
        "cleanup.policy": "compact",
        "min.compaction.lag.ms": "0",
        "segment.bytes": str(SEGMENT_BYTES),
        "delete.retention.ms": str(DELETE_RETENTION_MS),
        "flush.messages": NO_FSYNC,
    }
    # One partition's share of a 1000-record batch must fit max.message.bytes.
    batch_bytes = BATCH * (workload.value_bytes + 40) + 4096
    if batch_bytes > DEFAULT_MAX_MESSAGE_BYTES:
        config["max.message.bytes"] = str(batch_bytes)
    return config


@dataclass
class Appended:
    records: int
    draw_s: float = 0.0  # numpy draws and ProducerRecord objects
    append_s: float = 0.0  # store.append, sealing of segments rolled on the way included
    roll_s: float = 0.0  # the final roll and seal of every partition

    @property
    def seconds(self) -> float:
        return self.draw_s + self.append_s + self.roll_s


def append_records(store: LogStore, draws: Draws, count: int, topic: str = TOPIC) -> Appended:
    result = Appended(count)
    for start in range(0, count, CHUNK):
        began = time.perf_counter()
        records = draws.records(min(CHUNK, count - start))
        drawn = time.perf_counter()
        for low in range(0, len(records), BATCH):
            store.append(topic, records[low:low + BATCH])
        result.draw_s += drawn - began
        result.append_s += time.perf_counter() - drawn
    began = time.perf_counter()
    for partition in store.topic(topic).partitions:
        partition.roll()  # seal everything: only sealed segments are compacted
    result.roll_s = time.perf_counter() - began
    return result


def generate(data_dir: Path, workload: Workload) -> Appended:
    with LogStore.open(data_dir) as store:
        store.create_topic(TOPIC, partitions=workload.partitions, config=topic_config(workload))
        appended = append_records(store, Draws(workload, stream=1), workload.records)
    (data_dir / PARAMS_FILE).write_text(json.dumps(
        {"workload": asdict(workload), "generation": asdict(appended)}, indent=2))
    return appended


def load_workload(data_dir: Path) -> tuple[Workload, dict[str, Any]]:
    path = data_dir / PARAMS_FILE
    if not path.is_file():
        raise SystemExit(f"--skip-generate: {path} is missing; generate into "
                         f"{data_dir} first (run without --skip-generate)")
    body = json.loads(path.read_text())
    return Workload(**body["workload"]), body["generation"]


def clone(source: Path, target: Path) -> None:
    """Copy a data directory for one run. Sealed Parquet files are hard-linked: nothing
    ever writes to one after it is published, so the source stays pristine."""
    for root, _, files in os.walk(source):
        relative = Path(root).relative_to(source)
        (target / relative).mkdir(parents=True, exist_ok=True)
        for name in files:
            origin, copy = Path(root) / name, target / relative / name
            if name.endswith(".parquet"):
                try:
                    os.link(origin, copy)
                    continue
                except OSError:
                    pass  # another file system: copy instead
            shutil.copy2(origin, copy)


def partition_dirs(data_dir: Path, partitions: int) -> list[Path]:
    return [data_dir / "topics" / TOPIC / str(index) for index in range(partitions)]


def sealed_files(partition_dir: Path) -> list[Path]:
    # Named <base offset, 20 digits>-<id>.parquet (storage/partition.py), so by name is
    # by offset.
    return sorted((partition_dir / "segments").glob("*.parquet"))


# -- memory -------------------------------------------------------------------------------


class RssSampler:
    """Peak RSS per phase: this process, the Spark JVM, and the JVM's Python workers."""

    KINDS = ("driver", "jvm", "workers", "total")

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.phase = "setup"
        self.peaks: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._process = psutil.Process()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def set_phase(self, phase: str) -> None:
        self.sample()  # close the previous phase with a last sample
        with self._lock:
            self.phase = phase
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        driver = int(self._process.memory_info().rss)
        jvm = workers = 0
        for child in self._process.children(recursive=True):
            try:
                rss = int(child.memory_info().rss)
                name = str(child.name())
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue  # a worker that exited between listing and reading
            if name == "java":
                jvm += rss
            else:
                workers += rss
        with self._lock:
            peaks = self.peaks.setdefault(self.phase, dict.fromkeys(self.KINDS, 0))
            for kind, value in zip(self.KINDS, (driver, jvm, workers, driver + jvm + workers),
                                   strict=True):
                peaks[kind] = max(peaks[kind], value)

    def overall(self) -> dict[str, int]:
        with self._lock:
            return {kind: max((p[kind] for p in self.peaks.values()), default=0)
                    for kind in self.KINDS}


# -- compaction through the service -------------------------------------------------------


class PhaseClock:
    """The service's `progress` hook: stamps each (stage, done) the runner reports."""

    def __init__(self) -> None:
        self.stamps: dict[tuple[str, int], float] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        self.stamps.setdefault((stage, done), time.perf_counter())

    def phases(self, started: float, finished: float) -> dict[str, float]:
        marks = [
            ("lock and plan", ("phase 1: find survivors", 0)),
            ("phase 1: find survivors", ("phase 1: find survivors", 1)),
            ("between phases", ("phase 2: write ledgers", 0)),
            ("phase 2: write ledgers", ("phase 2: write ledgers", 1)),
            ("commit and status", ("done", 1)),
        ]
        if not all(mark in self.stamps for _, mark in marks):
            return {}  # a service that reports no progress
        result, previous = {}, started
        for name, mark in marks:
            result[name] = self.stamps[mark] - previous
            previous = self.stamps[mark]
        result["return"] = finished - previous
        return result


@dataclass
class Run:
    """One compact() call."""

    name: str
    seconds: float
    phases: dict[str, float]
    report: CompactionReport
    stages: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "seconds": self.seconds, "phases": self.phases,
                "totals": self.totals(), "stages": self.stages, "report": asdict(self.report)}

    def totals(self) -> dict[str, int]:
        names = ("records_in", "bytes_in", "records_out", "bytes_out", "keys",
                 "tombstones_kept", "tombstones_removed", "dirty_segments", "segments_adopted")
        return {name: self.report.total(name) for name in names}


def compact(service: TopicCompactionService, clock: PhaseClock, name: str) -> Run:
    clock.stamps.clear()
    started = time.perf_counter()
    report = service.compact()
    finished = time.perf_counter()
    return Run(name, finished - started, clock.phases(started, finished), report)


class SparkStages:
    """Stage timings from the Spark UI's REST API (only with --spark-stages)."""

    def __init__(self, service: TopicCompactionService) -> None:
        self.url: str | None = None
        self.app = ""
        self.seen: set[tuple[int, int]] = set()
        if isinstance(service, SparkCompactionService):
            context = service.session().sparkContext
            self.url, self.app = context.uiWebUrl, context.applicationId

    def new_stages(self) -> list[dict[str, Any]]:
        if not self.url:
            return []
        address = f"{self.url}/api/v1/applications/{self.app}/stages?status=complete"
        with urllib.request.urlopen(address, timeout=30) as response:
            stages: list[dict[str, Any]] = json.load(response)
        found = []
        for stage in sorted(stages, key=lambda s: (s["stageId"], s["attemptId"])):
            ident = (stage["stageId"], stage["attemptId"])
            if ident in self.seen:
                continue
            self.seen.add(ident)
            found.append({
                "stage": stage["stageId"],
                "name": stage.get("name", ""),
                "wall_s": _spark_time(stage["completionTime"])
                - _spark_time(stage["submissionTime"]),
                "tasks": stage["numTasks"],
                "executor_run_s": stage["executorRunTime"] / 1000,
                "executor_cpu_s": stage["executorCpuTime"] / 1e9,
                "gc_s": stage.get("jvmGcTime", 0) / 1000,
                "shuffle_read_mb": stage["shuffleReadBytes"] / 1e6,
                "shuffle_write_mb": stage["shuffleWriteBytes"] / 1e6,
            })
        return found


def _spark_time(text: str) -> float:
    # The REST API's format: 2026-05-09T10:33:27.123GMT
    parsed = datetime.datetime.strptime(text.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
    return parsed.timestamp()


# -- the independent check ----------------------------------------------------------------


def read_files(files: list[Path], columns: list[str]) -> pa.Table:
    tables = [pq.ParquetFile(path).read(columns=columns) for path in files]
    return pa.concat_tables(tables) if tables else pa.table({c: [] for c in columns})


def expected_view(files: list[Path]) -> pa.Table:
    """The latest record of every key in `files`, in offset order, tombstones included,
    computed with pyarrow alone (no compactlog code)."""
    key_offsets = read_files(files, ["key", "offset"])
    latest = key_offsets.group_by("key").aggregate([("offset", "max")])
    keep = np.sort(latest.column("offset_max").to_numpy())
    parts = []
    for path in files:
        table = pq.ParquetFile(path).read(columns=compared)
        chosen = np.isin(table.column("offset").to_numpy(), keep, assume_unique=True)
        parts.append(table.filter(pa.array(chosen)))
    view = pa.concat_tables(parts)
    if view.num_rows != len(keep):
        raise VerificationError(f"expected view: {view.num_rows} rows for {len(keep)} keys")
    return view


def ledger_table(partition: Partition) -> pa.Table:
    """The ledger's live rows: each file's rows minus its deletion vector's offsets."""
    partition.refresh()
    tables = []
    for info in partition.manifest.ledger:
        table = read_files([partition.directory / LEDGER_DIR / info.file], compared)
        if info.dv_file:
            table = drop_deleted(table, read_deletion_vector(
                partition.directory / LEDGER_DIR / info.dv_file))
        tables.append(table)
    return pa.concat_tables(tables) if tables else read_files([], compared)


def compare_tables(what: str, expected: pa.Table, actual: pa.Table,
                   columns: list[str] | None = None) -> None:
    want = expected.column("offset").to_numpy()
    got = actual.column("offset").to_numpy()
    if not np.array_equal(want, got):
        missing = np.setdiff1d(want, got)[:5].tolist()
        extra = np.setdiff1d(got, want)[:5].tolist()
        raise VerificationError(
            f"{what}: {len(got):,} rows, expected {len(want):,}; offsets missing (first 5) "
            f"{missing}, unexpected {extra}, or out of order")
    for column in compared[1:] if columns is None else columns:
        if not expected.column(column).combine_chunks().equals(
                actual.column(column).combine_chunks()):
            raise VerificationError(f"{what}: column {column!r} differs from the expected rows")


def verify_run(store: LogStore, service: TopicCompactionService, run: Run,
               expected: list[pa.Table], records_in: int) -> None:
    """The ledger of every partition against `expected`, and the report's totals."""
    topic = store.topic(TOPIC)
    for index, want in enumerate(expected):
        partition = topic.partition(index)
        compare_tables(f"{run.name}, partition {index} ledger", want, ledger_table(partition))
        last_sealed = partition.manifest.segments[-1].last_offset
        horizon = service.get_last_compacted_position(index)
        if horizon != last_sealed or partition.manifest.horizon != last_sealed:
            raise VerificationError(f"{run.name}, partition {index}: horizon {horizon}, "
                                    f"last sealed offset {last_sealed}")
        # The compacted view as a reader gets it, through the public read path.
        head = partition.compacted.read_table(0, 1000, 1 << 30)
        compare_tables(f"{run.name}, partition {index} compacted view (first rows)",
                       want.slice(0, head.num_rows), head,
                       [c for c in compared[1:] if c in head.column_names])
        last = service.read_last_compacted_entry(index)
        if want.num_rows and (last is None or last.offset != want.column("offset")[-1].as_py()):
            raise VerificationError(f"{run.name}, partition {index}: last ledger entry "
                                    f"{last}")
    totals = run.totals()
    rows = sum(t.num_rows for t in expected)
    tombstones = sum(t.column(compared[-1] if compared is COMPARED_LIGHT else "value").null_count
                     for t in expected)
    wanted = {"records_in": records_in, "records_out": rows, "keys": rows,
              "tombstones_kept": tombstones, "tombstones_removed": 0}
    wrong = {name: (totals[name], value) for name, value in wanted.items()
             if totals[name] != value}
    if wrong:
        raise VerificationError(f"{run.name}: report totals (got, expected): {wrong}")


def verify_baseline(engine: str, output: Path, expected: list[pa.Table], columns: int) -> None:
    table = pq.read_table(output)
    if table.num_columns != columns:
        raise VerificationError(f"{engine}: output has columns {table.column_names}")
    partitions = table.column("partition").to_numpy()
    offsets = table.column("offset").to_numpy()
    for index, want in enumerate(expected):
        got = offsets[partitions == index]
        if not np.array_equal(got, want.column("offset").to_numpy()):
            raise VerificationError(f"{engine}: partition {index} holds {len(got):,} rows, "
                                    f"expected {want.num_rows:,}, or other offsets")


# -- baselines ----------------------------------------------------------------------------


def _sql_list(paths: list[Path]) -> str:
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"


def duckdb_query(inputs: Mapping[int, list[Path]], variant: str) -> str:
    def source(columns: str) -> str:
        return " UNION ALL ".join(
            f"SELECT {index} AS partition, {columns} FROM read_parquet({_sql_list(files)})"
            for index, files in inputs.items())

    if variant == "twophase":
        # Phase 1 reads only (key, offset); the semi join then keeps whole rows.
        keys_and_offsets = source('key, "offset"')
        return (
            f"SELECT s.* FROM ({source('*')}) s SEMI JOIN ("
            f'SELECT partition, max("offset") AS "offset" FROM ({keys_and_offsets}) '
            "GROUP BY partition, key) l "
            'ON s.partition = l.partition AND s."offset" = l."offset" '
            'ORDER BY s.partition, s."offset"'
        )
    if variant == "qualify":
        return (
            f"SELECT * FROM ({source('*')}) QUALIFY row_number() OVER "
            '(PARTITION BY partition, key ORDER BY "offset" DESC) = 1 '
            'ORDER BY partition, "offset"'
        )
    return (  # argmax
        f'SELECT * FROM (SELECT unnest(arg_max(s, s."offset")) FROM ({source("*")}) s '
        'GROUP BY s.partition, s.key) ORDER BY partition, "offset"'
    )


def run_duckdb(inputs: Mapping[int, list[Path]], output: Path, variant: str,
               scratch: Path) -> None:
    with duckdb.connect() as connection:
        connection.execute(f"SET temp_directory = '{scratch}'")
        target = str(output).replace("'", "''")
        connection.execute(f"COPY ({duckdb_query(inputs, variant)}) TO '{target}' "
                           "(FORMAT parquet, COMPRESSION zstd)")


def run_polars(inputs: Mapping[int, list[Path]], output: Path) -> None:
    source = pl.concat([
        pl.scan_parquet([str(p) for p in files]).with_columns(
            pl.lit(index, dtype=pl.Int32).alias("partition"))
        for index, files in inputs.items()
    ])
    latest = source.select("partition", "key", "offset").group_by("partition", "key").agg(
        pl.col("offset").max())
    (source.join(latest, on=["partition", "offset"], how="semi")
        .sort("partition", "offset")
        .sink_parquet(output, compression="zstd", engine="streaming"))


# -- reporting ----------------------------------------------------------------------------


@dataclass
class Row:
    engine: str
    seconds: float
    records: int
    bytes_in: int
    ratio_vs_duckdb: float | None = None
    ratio_vs_polars: float | None = None
    times: list[float] = field(default_factory=list)  # every run, for best-of rows
    # What ran the row's runs, from their reports (CompactionReport.engine), or the
    # baseline's library: never the label's word for it.
    ran_on: str = ""

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.bytes_in / 1e6 / self.seconds

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "records_per_s": self.records_per_s, "mb_per_s": self.mb_per_s}


def java_version() -> str:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else "java"  # as Spark's launcher picks
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except OSError as error:
        return f"unavailable ({error})"
    return (done.stderr or done.stdout).splitlines()[0] if (done.stderr or done.stdout) else "?"


def machine() -> dict[str, str]:
    import pyspark

    return {
        **machine_info(),
        "spark": pyspark.__version__,
        "java": java_version(),
        "pyarrow": pa.__version__,
        "duckdb": duckdb.__version__,
        "polars": pl.__version__,
    }


def ran_on(reports: list[CompactionReport]) -> str:
    """What ran these runs, without job ids: `Spark local[2]`, `in this process`, both
    (a run of some partitions in each), or `none`; several runs' kinds joined by ` / `."""
    kinds: list[str] = []
    for report in reports:
        parts = [part.split(":")[0].split(",")[0].strip()
                 for part in (report.engine or "unknown").split(";")]
        kind = " + ".join(parts)
        if kind not in kinds:
            kinds.append(kind)
    return " / ".join(kinds)


def all_on_spark(reports: list[CompactionReport]) -> bool:
    """Whether every run was wholly Spark jobs (no partition run in this process)."""
    return bool(reports) and all(
        report.engine.startswith("Spark ") and "in this process" not in report.engine
        for report in reports)


def labelled_spark(label: str) -> bool:
    return "Spark" in label


def print_table(rows: list[Row]) -> None:
    width = max(len(row.engine) for row in rows)
    print(f"\n{'engine':{width}} {'seconds':>8} {'records/s':>12} {'MB/s':>8} {'x DuckDB':>9}"
          f" {'x Polars':>9}  ran on")
    for row in rows:
        ratios = ["      n/a" if ratio is None else f"{ratio:9.2f}"
                  for ratio in (row.ratio_vs_duckdb, row.ratio_vs_polars)]
        print(f"{row.engine:{width}} {row.seconds:8.2f} {row.records_per_s:12,.0f} "
              f"{row.mb_per_s:8.1f} {ratios[0]} {ratios[1]}  {row.ran_on}")
    print("(x DuckDB, x Polars: seconds / that baseline's best seconds in this run; "
          "records/s and MB/s count the sealed "
          "input; ran on: what each row's runs' reports say ran them. A row labelled "
          "Spark whose runs did not all run as Spark jobs gets no ratio: every run is one "
          "unless --topic-config compaction.without.spark=true)",
          flush=True)


def print_run(run: Run) -> None:
    t = run.totals()
    print(f"{run.name}: {run.seconds:.2f} s (engine: {run.report.engine or 'unnamed'}); "
          f"{t['records_in']:,} records "
          f"({t['bytes_in'] / 1e6:,.1f} MB) in, {t['records_out']:,} out "
          f"({t['bytes_out'] / 1e6:,.1f} MB), {t['keys']:,} keys, tombstones kept "
          f"{t['tombstones_kept']:,}, removed {t['tombstones_removed']:,}; "
          f"{t['dirty_segments']} dirty segments ({t['segments_adopted']} adopted as they "
          "are)", flush=True)
    if run.phases:
        print("  phases: " + ", ".join(f"{name} {s:.2f} s" for name, s in run.phases.items()
                                       if s >= 0.005))
    if run.report.stages:
        print("  report stages: " + ", ".join(f"{name} {s:.2f} s"
                                             for name, s in run.report.stages.items()))
    for stage in run.stages:
        print(f"  stage {stage['stage']:3} {stage['wall_s']:7.2f} s wall, {stage['tasks']:3} "
              f"tasks, run {stage['executor_run_s']:6.2f} s, cpu {stage['executor_cpu_s']:6.2f}"
              f" s, gc {stage['gc_s']:5.2f} s, shuffle "
              f"w {stage['shuffle_write_mb']:6.1f} / r {stage['shuffle_read_mb']:6.1f} MB  "
              f"{stage['name'][:50]}")


# -- the run ------------------------------------------------------------------------------


@dataclass
class Bench:
    args: argparse.Namespace
    workload: Workload
    data_dir: Path  # the generated topic: read, never written
    scratch: Path
    sampler: RssSampler
    results: dict[str, Any] = field(default_factory=dict)
    last_incremental: Run | None = None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.sampler.set_phase(name)
        try:
            yield
        finally:
            self.sampler.set_phase("idle")

    def spark_settings(self, clock: PhaseClock) -> dict[str, Any]:
        conf = dict(item.split("=", 1) for item in self.args.spark_conf)
        if self.args.spark_stages:
            conf["spark.ui.enabled"] = "true"  # the REST API lives in the UI server
        return {"spark.master": self.args.spark_master, "spark.conf": conf, "progress": clock}

    def run(self) -> None:
        """Full runs, each on a fresh clone of the topic: the first in a new JVM, the
        others in the same session, warm; then the baselines, then an incremental run."""
        workload, args = self.workload, self.args
        dirs = partition_dirs(self.data_dir, workload.partitions)
        inputs = {index: sealed_files(directory) for index, directory in enumerate(dirs)}
        bytes_in = sum(p.stat().st_size for files in inputs.values() for p in files)
        with self.phase("verification"):
            expected = [expected_view(files) for files in inputs.values()]
        clock = PhaseClock()
        settings = self.spark_settings(clock)
        factory: CompactionServiceFactory = load_factory(args.service)
        owner: TopicCompactionService | None = None  # the service that started the session
        stages: SparkStages | None = None
        engine, startup_s, runs = "", 0.0, []
        rows: list[Row] = []
        incremental: dict[str, Any] = {}
        try:
            for number in range(1, args.full_runs + 1):
                work_dir = self.scratch / f"work-{number}"
                clone(self.data_dir, work_dir)
                with LogStore.open(work_dir) as store:
                    if number == 1:
                        check_clean(store, inputs)
                    if args.topic_config:
                        store.alter_topic(TOPIC, dict(item.split("=", 1)
                                                      for item in args.topic_config))
                    service = factory.new_service(store, TOPIC, settings)
                    if owner is None:
                        owner = service
                        engine, startup_s = self.start(service, settings)
                        stages = SparkStages(service) if args.spark_stages else None
                    name = ("full compaction, first run in the JVM" if number == 1
                            else f"full compaction, run {number}")
                    with self.phase("full compaction, first run" if number == 1
                                    else "full compaction, warm"):
                        run = compact(service, clock, name)
                    run.stages = stages.new_stages() if stages else []
                    print_run(run)
                    with self.phase("verification"):
                        verify_run(store, service, run, expected, workload.records)
                    print(f"verified the {name}: every partition's ledger holds exactly the latest "
                          "record of each key (pyarrow, from the sealed files); horizon, view "
                          "and report totals agree", flush=True)
                    runs.append(run)
                    if number < args.full_runs:
                        continue
                    rows = self.table(engine, startup_s, runs, inputs, expected, bytes_in)
                    if not args.no_incremental:
                        previous = runs[-1]
                        for step, percent in enumerate(args.incremental_percents):
                            incremental[f"{percent:g}%"] = self.incremental(
                                store, service, clock, stages, runs, previous, percent, step)
                            previous = self.last_incremental or previous
                shutil.rmtree(work_dir)
        finally:
            if isinstance(owner, SparkCompactionService):
                owner.stop()
        self.results.update({
            "engine": engine,
            "startup_s": startup_s,
            "full_runs": [run.to_json() for run in runs],
            "table": [row.to_json() for row in rows],
            "incremental": incremental,
            "verified": True,
        })

    def start(self, service: TopicCompactionService,
              settings: dict[str, Any]) -> tuple[str, float]:
        engine = f"compactlog {type(service).__name__}"
        with self.phase("spark start-up"):
            began = time.perf_counter()
            if isinstance(service, SparkCompactionService):
                session = service.session()  # starts the JVM and the SparkSession
                settings["spark.session"] = session  # later runs share it
                engine = f"compactlog Spark {session.sparkContext.master}"
            startup_s = time.perf_counter() - began
        print(f"\nservice: {type(service).__module__}.{type(service).__name__}; "
              f"start-up (JVM + SparkSession) {startup_s:.2f} s", flush=True)
        return engine, startup_s

    def table(self, engine: str, startup_s: float, runs: list[Run],
              inputs: Mapping[int, list[Path]], expected: list[pa.Table],
              bytes_in: int) -> list[Row]:
        records = self.workload.records
        first = runs[0]
        rows = []
        if len(runs) > 1:
            best = min(runs[1:], key=lambda run: run.seconds)
            which = f"best of {len(runs) - 1}" if len(runs) > 2 else "run 2"
            rows.append(Row(f"{engine}, warm ({which})", best.seconds, records, bytes_in,
                            times=[run.seconds for run in runs[1:]],
                            ran_on=ran_on([run.report for run in runs[1:]])))
        rows += [
            Row(f"{engine}, first run in the JVM", first.seconds, records, bytes_in,
                ran_on=ran_on([first.report])),
            Row(f"{engine}, start-up + first run", startup_s + first.seconds, records,
                bytes_in, ran_on=ran_on([first.report])),
        ]
        # Which rows' runs were wholly Spark jobs: a row labelled Spark that was not gets
        # no ratio, so that no ratio printed is an in-process run's called Spark's.
        on_spark = {rows[0].engine: all_on_spark([run.report for run in runs[1:]])} \
            if len(runs) > 1 else {}
        on_spark.update({row.engine: all_on_spark([first.report]) for row in rows[-2:]})
        rows += self.baselines(inputs, expected, bytes_in)
        duck = next((row for row in rows if row.engine.startswith("DuckDB")), None)
        polars = next((row for row in rows if row.engine.startswith("Polars")), None)
        for row in rows:
            honest = not labelled_spark(row.engine) or on_spark.get(row.engine, False)
            row.ratio_vs_duckdb = row.seconds / duck.seconds if duck and honest else None
            row.ratio_vs_polars = row.seconds / polars.seconds if polars and honest else None
        print_table(rows)
        return rows

    def baselines(self, inputs: Mapping[int, list[Path]], expected: list[pa.Table],
                  bytes_in: int) -> list[Row]:
        """DuckDB and Polars, as many times as the full compaction ran; the best counts."""
        # Every sealed column, plus the partition.
        columns = 1 + len(pq.read_schema(next(f for fs in inputs.values() for f in fs)))
        variant = self.args.duckdb_variant
        jobs: list[tuple[str, Callable[[Path], None]]] = [
            (f"DuckDB {duckdb.__version__} ({variant})",
             lambda out: run_duckdb(inputs, out, variant, self.scratch)),
            (f"Polars {pl.__version__} (two-phase, streaming)",
             lambda out: run_polars(inputs, out)),
        ][:{"all": 2, "duckdb": 1, "none": 0}[self.args.baselines]]
        if not jobs:
            return []
        rows = []
        for name, job in jobs:
            times = []
            for _ in range(self.args.full_runs):
                output = self.scratch / "baseline.parquet"
                with self.phase(name.split()[0]):
                    began = time.perf_counter()
                    job(output)
                    times.append(time.perf_counter() - began)
                verify_baseline(name, output, expected, columns)
                output.unlink()
            label = name if len(times) == 1 else f"{name}, best of {len(times)}"
            rows.append(Row(label, min(times), self.workload.records, bytes_in, times=times,
                            ran_on=f"{name.split()[0]} in this process"))
        print(f"verified: the {' and '.join(n.split()[0] for n, _ in jobs)} output(s) hold "
              "exactly the same offsets", flush=True)
        return rows

    def incremental(self, store: LogStore, service: TopicCompactionService, clock: PhaseClock,
                    stages: SparkStages | None, runs: list[Run], previous: Run,
                    percent: float, step: int) -> dict[str, Any]:
        """`percent`% more records, then an incremental run over `previous`'s ledger."""
        workload = self.workload
        count = max(1, int(workload.records * percent / 100))
        with self.phase("incremental append"):
            appended = append_records(store, Draws(workload, stream=2 + step), count)
        print(f"\nappended {count:,} more records ({percent:g}%) and sealed them in "
              f"{appended.seconds:.2f} s", flush=True)
        with self.phase("incremental compaction"):
            run = compact(service, clock, "incremental compaction")
        run.stages = stages.new_stages() if stages else []
        print_run(run)
        # Its input: the previous ledger (the previous run's output) plus the new segments.
        self.last_incremental = run
        ledger_in = previous.totals()["records_out"]
        work_dirs = partition_dirs(store.data_dir, workload.partitions)
        with self.phase("verification"):
            expected = [expected_view(sealed_files(directory)) for directory in work_dirs]
            verify_run(store, service, run, expected, ledger_in + count)
        print("verified: the incremental ledger holds exactly the latest record of each key "
              "over every sealed file", flush=True)
        full = runs[-1]
        target = 0.10 if percent <= 1 else 0.30  # issue 13's targets
        both = [run.report, full.report]
        if isinstance(service, SparkCompactionService) and not all_on_spark(both):
            # The service is Spark's: a ratio of a run that was not a Spark job would be
            # printed as Spark's. Refused, with what did run.
            print(f"incremental after {percent:g}%: no ratio, not both Spark runs (engine of "
                  f"this run: {run.report.engine or 'unnamed'}; of the full run: "
                  f"{full.report.engine or 'unnamed'}); "
                  "every run is a Spark job unless --topic-config compaction.without.spark=true",
                  flush=True)
            return {**run.to_json(), "appended": asdict(appended), "ratio_vs_full": None,
                    "ratio_vs_first_run": None}
        ratio = run.seconds / full.seconds
        verdict = "meets" if ratio <= target else "misses"
        print(f"incremental after {percent:g}% / full ({full.name}): {run.seconds:.2f} s / "
              f"{full.seconds:.2f} s = {ratio:.1%} ({verdict} the target of <= {target:.0%}); "
              f"{count:,} new records, {ledger_in + count:,} live input records; ran on "
              f"{ran_on(both)}", flush=True)
        return {**run.to_json(), "appended": asdict(appended), "ratio_vs_full": ratio,
                "ratio_vs_first_run": run.seconds / runs[0].seconds}


def check_clean(store: LogStore, inputs: Mapping[int, list[Path]]) -> None:
    topic = store.topic(TOPIC)
    for index, files in inputs.items():
        partition = topic.partition(index)
        if len(files) != len(partition.manifest.segments) or partition.manifest.compaction:
            raise SystemExit(f"partition {index}: not a freshly generated topic ({len(files)} "
                             "Parquet files, manifest "
                             f"{len(partition.manifest.segments)} segments, compaction "
                             f"{partition.manifest.compaction is not None})")


def print_memory(sampler: RssSampler) -> dict[str, Any]:
    print(f"\n{'peak RSS, MiB':28} {'driver':>8} {'JVM':>8} {'workers':>8} {'total':>8}")
    for phase, peaks in [*sampler.peaks.items(), ("whole run", sampler.overall())]:
        if phase in ("setup", "idle"):
            continue
        print(f"{phase:28} " + " ".join(f"{peaks[k] / 2**20:8.0f}" for k in RssSampler.KINDS))
    print("(driver: this Python process, which also runs generation, verification, DuckDB "
          "and Polars; workers: Spark's Python workers)")
    return {"per_phase": sampler.peaks, "overall": sampler.overall()}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--tombstones", type=float, default=5.0, metavar="PCT",
                        help="percent of records that are tombstones (null values)")
    parser.add_argument("--distribution", choices=("uniform", "zipf", "unique"),
                        default="uniform", help="unique: each of --keys keys once (then "
                        "again, in the same order); its incremental records are uniform")
    parser.add_argument("--zipf-exponent", type=float, default=1.0)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--spark-master", default="local[*]")
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark setting for the service (repeatable)")
    parser.add_argument("--spark-stages", action="store_true",
                        help="turn the Spark UI on and print each stage's timings")
    parser.add_argument("--topic-config", action="append", default=[], metavar="KEY=VALUE",
                        help="topic config set on each clone before it is compacted "
                        "(repeatable), e.g. compaction.phase1.engine=sql")
    parser.add_argument("--service", default=None, metavar="MODULE:NAME",
                        help="compaction service factory (default: the Spark one)")
    parser.add_argument("--full-runs", type=int, default=2,
                        help="full compactions, each on a fresh clone: the first in a new "
                        "JVM, the rest warm (also the number of baseline runs)")
    parser.add_argument("--duckdb-variant", choices=("twophase", "qualify", "argmax"),
                        default="twophase")
    parser.add_argument("--baselines", choices=("all", "duckdb", "none"), default="all",
                        help="which baselines to run (Polars needs ~5 GiB at 10M records)")
    parser.add_argument("--verify", choices=("rows", "offsets"), default="rows",
                        help="compare whole rows (default) or only the surviving offsets and "
                        "tombstones (for topics whose rows do not fit twice in memory)")
    parser.add_argument("--no-incremental", action="store_true",
                        help="skip the incremental runs after the full ones")
    parser.add_argument("--incremental-percents", type=lambda text: [
        float(part) for part in text.split(",")], default=[1.0], metavar="PCT[,PCT...]",
        help="incremental runs after the full ones, one after another, each after this "
             "many more records (percent of --records); e.g. 1,10")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="generate here and keep it (default: a temporary directory)")
    parser.add_argument("--skip-generate", action="store_true",
                        help="reuse the topic generated earlier in --data-dir")
    parser.add_argument("--json", type=Path, default=None, help="write all results here")
    args = parser.parse_args()
    if args.skip_generate and args.data_dir is None:
        parser.error("--skip-generate needs --data-dir")
    if min(args.records, args.keys, args.value_bytes, args.partitions, args.full_runs) < 1:
        parser.error("--records, --keys, --value-bytes, --partitions and --full-runs must be "
                     ">= 1")
    if any("=" not in item for item in [*args.spark_conf, *args.topic_config]):
        parser.error("--spark-conf and --topic-config take KEY=VALUE")
    return args


def main() -> None:
    global compared
    args = parse_args()
    if args.verify == "offsets":
        compared = COMPARED_LIGHT
    workload = Workload(args.records, args.keys, args.value_bytes, args.tombstones,
                        args.distribution, args.zipf_exponent, args.partitions, args.seed)
    info = machine()
    started = datetime.datetime.now(datetime.UTC)
    command = shlex.join([sys.executable, *sys.argv])
    print(f"compaction bench, {started:%Y-%m-%d %H:%M:%S} UTC\ncommand: {command}")
    print(f"machine: {info['cpu']}, {info['cores']} cores, {info['memory']}, {info['os']}")
    print(f"software: Python {info['python']}, Spark {info['spark']}, {info['java']}, "
          f"pyarrow {info['pyarrow']}, DuckDB {info['duckdb']}, Polars {info['polars']}")

    sampler = RssSampler()
    sampler.start()
    data_parent = args.data_dir.parent if args.data_dir else None
    # The work clone sits next to the data so that hard links work.
    scratch = Path(tempfile.mkdtemp(prefix="compaction-bench-", dir=data_parent))
    data_dir = args.data_dir or scratch / "data"
    generation: dict[str, Any]
    try:
        if args.skip_generate:
            stored, generation = load_workload(data_dir)
            if stored != workload:
                print(f"note: using the workload stored in {data_dir / PARAMS_FILE}, "
                      "not the command line's")
            workload = stored
            print(f"workload: {workload.describe()}; generated earlier in "
                  f"{generation['draw_s'] + generation['append_s'] + generation['roll_s']:.1f}"
                  f" s (reused)")
        else:
            if data_dir.exists() and any(data_dir.iterdir()):
                raise SystemExit(f"{data_dir} is not empty: use --skip-generate to reuse it")
            print(f"workload: {workload.describe()}", flush=True)
            sampler.set_phase("generation")
            appended = generate(data_dir, workload)
            sampler.set_phase("idle")
            generation = asdict(appended)
            print(f"generated in {appended.seconds:.1f} s (not measured): numpy draws and "
                  f"ProducerRecords {appended.draw_s:.1f} s, store.append (with sealing) "
                  f"{appended.append_s:.1f} s = "
                  f"{workload.records / max(appended.append_s, 1e-9):,.0f} records/s, final "
                  f"roll {appended.roll_s:.1f} s", flush=True)
        bench = Bench(args, workload, data_dir, scratch, sampler)
        try:
            bench.run()
        except VerificationError as error:
            print(f"\nVERIFICATION FAILED: {error}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None
        memory = print_memory(sampler)
    finally:
        sampler.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({
            "date": started.isoformat(), "command": command, "machine": info,
            "workload": asdict(workload), "generation": generation,
            **bench.results, "peak_rss_bytes": memory,
        }, indent=2, default=str))
        print(f"results written to {args.json}")


if __name__ == "__main__":
    main()
