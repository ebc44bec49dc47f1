"""The two-phase compaction pipeline on Spark.

Phase 1 reads only (key, offset, tombstone flag, ordering value) of every input file
of every partition in the run, in one Spark job, and finds each key's surviving
offset among the rows in the view (not a deletion vector's rows, not below
DeleteRecords' deleted_below: phase 2 would drop them, and choosing one would lose its
key's live rows). Keys are grouped by their bytes, never by a hash alone. The surviving
offsets come back to the driver (8 bytes per live key) as sorted arrays.

Phase 2 runs one Spark task per ledger piece (plan.split_pieces). Each task gets its
piece's input file paths and surviving offsets, and copies the surviving rows with
pyarrow straight from the input files into a new ledger file (ledger.write_ledger_piece).
Values are never shuffled: they are read once, next to where they are written.

This formulation ("sql_hybrid" in shared/notes/spark.md) was the fastest of those
measured on Spark: it shuffles about 20 bytes per record instead of whole records.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from compactlog.compaction.ledger import (
    PieceInput,
    PieceResult,
    TombstoneRules,
    ledger_file_name,
    write_ledger_piece,
)
from compactlog.compaction.plan import PartitionPlan, Piece, deleted_offsets, split_pieces
from compactlog.compaction.strategies import Strategy, parse_strategy, surviving_record
from compactlog.storage import Record, table_to_records

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

PARTITION_OF_PATH = r"/(\d+)/(?:segments|ledger)/[^/]+$"
PIECE_SCHEMA = "result string"
# The columns phase 1 may read, common to sealed segments and ledger files. Given up
# front, Spark skips a job per scan that would read file footers to infer it.
INPUT_SCHEMA = (
    "offset BIGINT, timestamp BIGINT, key BINARY, value BINARY, "
    "headers ARRAY<STRUCT<key: STRING, value: BINARY>>, value_size INT"
)
UNION_LIMIT = 64  # partitions per run up to which phase 1 unions one scan per partition


def find_survivors(spark: SparkSession, plans: list[PartitionPlan]) -> None:
    """Phase 1: set each plan's `survivors` to its sorted surviving offsets."""
    working = [plan for plan in plans if plan.inputs]
    if not working:
        return
    strategy = working[0].strategy
    empty_is_tombstone = working[0].rules.empty_value_is_tombstone
    frame = _input_frame(spark, working, strategy)
    survivors = _survivor_offsets(frame, strategy, empty_is_tombstone)
    table = survivors.toArrow()
    by_partition = _split_by_partition(table)
    for plan in working:
        plan.survivors = by_partition.get(plan.partition, np.empty(0, np.int64))


def _input_frame(spark: SparkSession, plans: list[PartitionPlan], strategy: Strategy) -> DataFrame:
    from pyspark.sql import functions as F

    columns: list[Column | str] = ["key", "offset", "value_size"]
    if strategy.kind == "order":
        columns.append(_order_column(strategy).alias("order"))
    elif strategy.kind == "function":
        columns += ["timestamp", "value", "headers"]
    if len(plans) <= UNION_LIMIT:
        # One scan per partition, its number a constant: a regex over every row's file
        # path cost about a third of phase 1 (bench/compaction.py, 2M records).
        frames = [
            _scan(spark, whole, plan.rules.deleted_below)
            .select(F.lit(plan.partition).alias("p"), *columns)
            for plan in plans
            if (whole := [str(item.path) for item in plan.inputs if not item.from_offset])
        ]
    else:
        # Thousands of scans would swamp the planner: find each row's partition from its
        # file's path instead.
        paths = [str(item.path) for plan in plans for item in plan.inputs
                 if not item.from_offset]
        frames = [_scan_by_path(spark, plans, paths, columns)] if paths else []
    # A segment across the old horizon (plan.InputFile.from_offset; none is ever
    # committed) is scanned on its own, from its first row above the horizon.
    frames += [
        _scan(spark, [str(item.path)], max(plan.rules.deleted_below, item.from_offset))
        .select(F.lit(plan.partition).alias("p"), *columns)
        for plan in plans for item in plan.inputs if item.from_offset
    ]
    frame = frames[0]  # every plan here has inputs, so some scan has files
    for other in frames[1:]:
        frame = frame.unionAll(other)
    frame = frame.where(F.col("key").isNotNull())
    deleted = [(plan.partition, offsets) for plan in plans
               if len(offsets := deleted_offsets(plan.clean))]
    if deleted:
        # Ledger rows that deletion vectors removed are not input (storage/deletion.py).
        table = pa.table({
            "p": pa.array(np.concatenate([np.full(len(o), p, np.int32) for p, o in deleted])),
            "offset": pa.array(np.concatenate([o for _, o in deleted])),
        })
        gone = spark.createDataFrame(table)
        frame = frame.join(F.broadcast(gone), on=["p", "offset"], how="left_anti")
    return frame


def _scan_by_path(spark: SparkSession, plans: list[PartitionPlan], paths: list[str],
                  columns: list[Column | str]) -> DataFrame:
    """One scan of `paths` (files of many partitions), each row's partition taken from its
    file's path, without the rows below its partition's deleted_below."""
    from pyspark.sql import functions as F

    frame = _scan(spark, paths).select(
        F.regexp_extract(F.col("_metadata.file_path"), PARTITION_OF_PATH, 1)
        .cast("int")
        .alias("p"),
        *columns,
    )
    starts = [(plan.partition, plan.rules.deleted_below) for plan in plans
              if plan.rules.deleted_below]
    if not starts:
        return frame
    bounds = spark.createDataFrame(starts, "p int, deleted_below long")
    return (frame.join(F.broadcast(bounds), on="p", how="left")
            .where(F.col("offset") >= F.coalesce("deleted_below", F.lit(0)))
            .drop("deleted_below"))


def _scan(spark: SparkSession, paths: list[str], start: int = 0) -> DataFrame:
    """The rows of the Parquet files `paths` from offset `start` on (DeleteRecords' cut,
    or a file's from_offset): the filter reaches the scan, whose row-group statistics
    skip what lies below."""
    from pyspark.sql import functions as F

    frame = spark.read.schema(INPUT_SCHEMA).parquet(*paths)
    return frame.where(F.col("offset") >= start) if start else frame


def _order_column(strategy: Strategy) -> Column:
    from pyspark.sql import functions as F

    if strategy.order_header is None:
        return F.col("timestamp")
    name = strategy.order_header
    # try_element_at: under ANSI mode element_at fails on a record without the header
    # (found by tests/compaction/test_arrow_phase1.py); such a record orders as null, lowest.
    value = F.try_element_at(
        F.filter(F.col("headers"), lambda header: header["key"] == F.lit(name)), F.lit(1)
    )["value"]
    if strategy.order_as_long:
        # try_cast: a header that is not a decimal integer orders as null (lowest).
        return value.cast("string").try_cast("long")
    return value


def _survivor_offsets(frame: DataFrame, strategy: Strategy, empty_is_tombstone: bool) -> DataFrame:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    tombstone = F.col("value_size").isNull()
    if empty_is_tombstone:
        tombstone = tombstone | (F.col("value_size") == 0)
    if strategy.kind == "latest":
        return frame.groupBy("p", "key").agg(F.max("offset").alias("offset")).select("p", "offset")
    if strategy.kind == "function":
        return _survivors_by_function(frame, strategy, empty_is_tombstone)
    # Only records after the key's last tombstone compete; with none, the tombstone stays.
    by_key = Window.partitionBy("p", "key")
    last_tombstone = F.max(F.when(tombstone, F.col("offset"))).over(by_key)
    competing = frame.withColumn("tomb", tombstone).withColumn("last_tomb", last_tombstone)
    competing = competing.where(F.col("offset") >= F.coalesce("last_tomb", F.lit(-1)))
    if strategy.kind == "first":
        chosen = F.min(F.when(~F.col("tomb"), F.col("offset")))
    else:
        chosen = F.max(
            F.when(~F.col("tomb"), F.struct(F.col("order"), F.col("offset")))
        )["offset"]
    return (
        competing.groupBy("p", "key")
        .agg(F.coalesce(chosen, F.max("last_tomb")).alias("offset"))
        .select("p", "offset")
    )


def _survivors_by_function(
    frame: DataFrame, strategy: Strategy, empty_is_tombstone: bool
) -> DataFrame:
    spec = strategy.spec

    def choose(table: pa.Table) -> pa.Table:
        keep_left = parse_strategy(spec).load_function()
        table = table.sort_by("offset")
        records = table_to_records(table)
        sizes = table.column("value_size").to_pylist()
        tombstones = {
            record.offset
            for record, size in zip(records, sizes, strict=True)
            if size is None or (empty_is_tombstone and size == 0)
        }

        def is_tombstone(record: Record) -> bool:
            return record.offset in tombstones

        kept = surviving_record(records, keep_left, is_tombstone)
        partition = table.column("p")[0].as_py()
        return pa.table({"p": [partition], "offset": [kept.offset]},
                        schema=pa.schema([("p", pa.int32()), ("offset", pa.int64())]))

    return frame.groupBy("p", "key").applyInArrow(choose, "p int, offset long")


def _split_by_partition(table: pa.Table) -> dict[int, np.ndarray]:
    if not table.num_rows:
        return {}
    partitions = table.column("p").to_numpy()
    offsets = table.column("offset").to_numpy()
    order = np.lexsort((offsets, partitions))
    partitions, offsets = partitions[order], offsets[order]
    bounds = np.flatnonzero(np.diff(partitions)) + 1
    result: dict[int, np.ndarray] = {}
    for part_offsets, start in zip(
        np.split(offsets, bounds), [0, *bounds.tolist()], strict=True
    ):
        result[int(partitions[start])] = part_offsets.astype(np.int64)
    return result


def write_ledgers(
    spark: SparkSession, plans: list[PartitionPlan], run_id: str
) -> dict[int, list[PieceResult]]:
    """Phase 2: one Spark task per piece; returns each partition's piece results in order."""
    pieces = [piece for plan in plans for piece in split_pieces(plan)]
    if not pieces:
        return {plan.partition: [] for plan in plans}
    rows = [_piece_row(piece, run_id) for piece in pieces]
    rdd = spark.sparkContext.parallelize(rows, numSlices=len(rows))
    frame = spark.createDataFrame(rdd, "task string")
    collected = frame.mapInArrow(run_pieces, PIECE_SCHEMA).collect()
    results: dict[int, list[tuple[int, PieceResult]]] = {plan.partition: [] for plan in plans}
    for row in collected:
        body = json.loads(row["result"])
        results[body["partition"]].append(
            (body["sequence"], PieceResult.from_json(body["piece"]))
        )
    return {p: [result for _, result in sorted(items, key=lambda item: item[0])]
            for p, items in results.items()}


def _piece_row(piece: Piece, run_id: str) -> tuple[str]:
    plan = piece.plan
    first = piece.inputs[0].info.base_offset
    task: dict[str, Any] = {
        "partition": plan.partition,
        "sequence": piece.sequence,
        "inputs": [[item.path, item.is_ledger, item.size_bytes, item.crc32c, item.dv_path,
                    item.dv_size_bytes, item.dv_crc32c, item.from_offset, item.adopted_at_ms]
                   for item in piece.piece_inputs()],
        "survivors": base64.b64encode(piece.survivors.astype("<i8").tobytes()).decode(),
        "rules": plan.rules.__dict__,
        "out_dir": str(plan.ledger_dir),
        "file_name": ledger_file_name(run_id, piece.sequence, first),
        "compression": plan.compression,
    }
    return (json.dumps(task),)


def run_pieces(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The phase-2 task body, run by Spark's Python workers (must stay importable)."""
    from pathlib import Path

    for batch in batches:
        results = []
        for text in batch.column("task").to_pylist():
            task = json.loads(text)
            result = write_ledger_piece(
                [PieceInput(*fields) for fields in task["inputs"]],
                np.frombuffer(base64.b64decode(task["survivors"]), dtype="<i8"),
                TombstoneRules(**task["rules"]),
                Path(task["out_dir"]),
                task["file_name"],
                task["compression"],
            )
            results.append(json.dumps({
                "partition": task["partition"],
                "sequence": task["sequence"],
                "piece": result.to_json(),
            }))
        yield pa.RecordBatch.from_pydict({"result": results})
