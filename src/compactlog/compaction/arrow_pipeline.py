"""Phases 1 and 2 fused in one task per partition (compact_one), in pyarrow: run in a
Spark job that packs the partitions' tasks into one Spark task per core (task_job), or,
when the topic asks for a run without Spark (compaction.without.spark), called in the
compacting process on as many threads as the master has cores (`runs_without_spark`,
`compact_inline`; everything below holds for both).

Invariant: each task writes only files of its own partition's ledger directory, named
by the run id, the piece's sequence and its first input's base offset, through a
temporary file that is fsynced and renamed; nothing is committed by a task. So a
task that Spark retries, or that runs twice, rewrites the same names with the same
rows (an atomic replace of its own uncommitted output), and a file left by an attempt
that died is an orphan of this run, deleted by the run's closing sweep
(storage/sweep.py) unless a commit lists it. The driver still commits every
partition's (horizon, ledger) pair itself (runner.py, step 5).

A task verifies its input files against the manifest (size, CRC32C) before any
Parquet reader parses them, finds the survivors (arrow_survivors.py: exact grouping,
within the partition's memory budget), splits them into pieces as the SQL pipeline
does (plan.split_inputs) and copies each piece's surviving rows into a ledger file
(ledger.write_ledger_piece). Only the piece results (a few hundred bytes each) and the
survivor count return to the driver: no survivor list crosses the cluster. (The CRC32C
of a file this process proved before is not recomputed: compaction/verified.py.)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from compactlog.compaction.adoption import adopt, adoptable
from compactlog.compaction.arrow_survivors import (
    NotInView,
    Phase1Stats,
    latest_over_ledger,
    partition_survivors,
    supports,
)
from compactlog.compaction.incremental import Fate, decide, runs_to_write, small_runs
from compactlog.compaction.io_throttle import IoThrottle, per_task, throttled
from compactlog.compaction.ledger import (
    PieceInput,
    PieceResult,
    TombstoneRules,
    ledger_file_name,
    write_ledger_piece,
)
from compactlog.compaction.plan import InputFile, PartitionPlan, load_deleted, split_inputs
from compactlog.compaction.remote_files import compact_on_volume
from compactlog.compaction.strategies import parse_strategy
from compactlog.errors import UserError
from compactlog.storage import SegmentInfo

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Seconds summed over the tasks, per stage, as reported (CompactionReport.stages).
TASK_STAGES = ("tasks: read", "tasks: group", "tasks: write")
# The same, for tasks run in the compacting process (compact_inline).
INLINE_STAGES = ("inline: read", "inline: group", "inline: write")


def uses_arrow(plan: PartitionPlan) -> bool:
    """Whether `plan` runs in Arrow tasks (compaction.phase1.engine, and the strategy)."""
    return plan.phase1_engine != "sql" and supports(plan.strategy)


def runs_without_spark(plans: list[PartitionPlan], asked: bool = False) -> bool:
    """Whether `plans` (one run's partitions) run in this process rather than as a Spark
    job: only when asked for by name, by the topic (compaction.without.spark) or by the
    caller (`asked`: the service's `compaction.without.spark` setting, `compact --without-spark`).
    Such a run cannot take a plan whose phase 1 is Spark SQL's: it fails, naming the
    partition and why, before any work."""
    if not asked and not any(plan.without_spark for plan in plans):
        return False
    for plan in plans:
        if not uses_arrow(plan):
            reason = ("compaction.phase1.engine=sql" if plan.phase1_engine == "sql"
                      else f"strategy {plan.strategy.spec!r} runs only in Spark SQL")
            raise UserError(f"partition {plan.partition}: compaction.without.spark=true, "
                            f"but {reason}; unset compaction.without.spark")
    return True


def compact_partitions(
    spark: SparkSession, plans: list[PartitionPlan], run_id: str,
    stages: dict[str, float] | None = None, slots: int | None = None,
    io_max_bytes_per_s: float = 0.0, io: dict[str, float] | None = None,
) -> dict[int, list[PieceResult]]:
    """Run one task per plan; set each plan's survivor_count and return its pieces, in
    order. `stages`, when given, gets the tasks' seconds per stage added to it; `slots`:
    as task_job's. `io_max_bytes_per_s` caps the run's I/O (io_throttle.py), split
    between the Spark tasks that run at once; `io` gets the tasks' I/O counters added."""
    if not plans:
        return {}
    ordered = _largest_first(plans)
    slots = max(1, slots or spark.sparkContext.defaultParallelism)
    # task_job packs the items into at most `slots` Spark tasks, all running at once.
    cap = per_task(io_max_bytes_per_s, min(slots, len(ordered)))
    tasks = [{**_task(plan, run_id), "io_max_bytes_per_s": cap} for plan in ordered]
    weights = [sum(item.info.size_bytes for item in plan.inputs) for plan in ordered]
    return _results(plans, task_job(spark, tasks, weights=weights, slots=slots), stages,
                    io=io)


def task_job(spark: SparkSession, tasks: list[dict[str, Any]],
             body: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
             weights: list[int] | None = None,
             slots: int | None = None) -> list[dict[str, Any]]:
    """One Spark job that runs `body` (compact_one unless given: bench/spark_fixed_cost.py
    times this job with an empty body) on every item of `tasks`; the results, in any
    order. The items are packed into at most `slots` Spark tasks (pack_tasks, by
    `weights`), each running its items one after the other: by default as many as the
    application's default parallelism, which for a local master its caller sets to the
    master's cores.

    The job is a plain RDD job, not a DataFrame's mapInArrow: it skips SQL planning and
    the Arrow streams between the JVM and the Python worker, and a task's items travel
    in the task itself. On local[2] a warm job of empty tasks took a median of 0.15 s
    this way against 0.49 s as mapInArrow over spark.range with a task per item
    (bench/spark_fixed_cost.py, docs/benchmarks.md)."""
    run = compact_one if body is None else body
    slots = max(1, slots or spark.sparkContext.defaultParallelism)
    # Through JSON, as compact_inline sends them, so both paths see the same values.
    texts = [json.dumps(task) for task in tasks]
    groups = pack_tasks(texts, weights or [1] * len(texts), slots)
    rdd = spark.sparkContext.parallelize(groups, len(groups))
    return rdd.flatMap(partial(_run_group, run)).collect()


def pack_tasks(items: list[str], weights: list[int], slots: int) -> list[list[str]]:
    """`items` in at most `slots` groups of about equal weight: each item, heaviest first,
    joins the lightest group so far (longest processing time first). Spark runs as many
    tasks at once as it has cores, so more tasks than cores only add each task's fixed
    cost (about 0.05 s on local[2]) and waves of tasks."""
    count = max(1, min(slots, len(items)))
    groups: list[list[str]] = [[] for _ in range(count)]
    loads = [0] * count
    for index in sorted(range(len(items)), key=lambda i: -weights[i]):
        lightest = loads.index(min(loads))
        groups[lightest].append(items[index])
        loads[lightest] += weights[index]
    return [group for group in groups if group]


def _run_group(body: Callable[[dict[str, Any]], dict[str, Any]],
               texts: list[str]) -> list[dict[str, Any]]:
    """The Spark task body, run by Spark's Python workers: its items, in order."""
    return [body(json.loads(text)) for text in texts]


def compact_inline(plans: list[PartitionPlan], run_id: str,
                   stages: dict[str, float] | None = None,
                   threads: int = 1, io_max_bytes_per_s: float = 0.0,
                   io: dict[str, float] | None = None) -> dict[int, list[PieceResult]]:
    """As compact_partitions, each task run in this process (for a small run, an engine
    without Spark, and tests), on up to `threads` threads at once: the local master's
    cores, as many tasks as its Spark job would run at once. The tasks share nothing but
    the verified-file memo (locked); pyarrow's reads, writes and compute release the GIL,
    so they overlap as Spark's Python workers would (measured in docs/benchmarks.md)."""
    workers = max(1, min(threads, len(plans)))
    # One thread keeps the plans' order: the fault tests number a run's steps by it.
    ordered = plans if workers == 1 else _largest_first(plans)
    # Through JSON as a Spark task would be, so both paths run the same task body.
    cap = per_task(io_max_bytes_per_s, workers)
    tasks = [json.loads(json.dumps({**_task(plan, run_id), "io_max_bytes_per_s": cap}))
             for plan in ordered]
    if workers == 1:
        bodies = [compact_one(task) for task in tasks]
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="compaction-task") as pool:
            bodies = list(pool.map(compact_one, tasks))
    return _results(plans, bodies, stages, INLINE_STAGES, io)


def _largest_first(plans: list[PartitionPlan]) -> list[PartitionPlan]:
    """The largest partitions first, so that the last task to start is a short one."""
    return sorted(plans, key=lambda plan: -sum(item.info.size_bytes for item in plan.inputs))


def _results(plans: list[PartitionPlan], bodies: list[dict[str, Any]],
             stages: dict[str, float] | None,
             names: tuple[str, ...] = TASK_STAGES,
             io: dict[str, float] | None = None) -> dict[int, list[PieceResult]]:
    by_partition = {plan.partition: plan for plan in plans}
    results: dict[int, list[PieceResult]] = {plan.partition: [] for plan in plans}
    for body in bodies:
        plan = by_partition[body["partition"]]
        plan.survivor_count = body["keys"]
        results[plan.partition] = [PieceResult.from_json(piece) for piece in body["pieces"]]
        if stages is not None:
            for name, seconds in zip(names, body["seconds"], strict=True):
                stages[name] = stages.get(name, 0.0) + seconds
        if io is not None:
            for name, value in body.get("io", {}).items():
                io[name] = io.get(name, 0) + value
    return results


def _task(plan: PartitionPlan, run_id: str) -> dict[str, Any]:
    return {
        "partition": plan.partition,
        "inputs": [[str(item.path), item.is_ledger, asdict(item.info)] for item in plan.inputs],
        # Per input, its first offset that is input (plan.InputFile.from_offset).
        "from_offsets": [item.from_offset for item in plan.inputs],
        "strategy": plan.strategy.spec,
        "budget": plan.task_memory_bytes,
        "rules": asdict(plan.rules),
        "out_dir": str(plan.ledger_dir),
        "run_id": run_id,
        "compression": plan.compression,
        "target_file_bytes": plan.target_file_bytes,
        "deletion_vectors": plan.deletion_vectors,
        "rewrite_below": plan.rewrite_live_fraction,
        "merge_below_bytes": plan.merge_below_bytes,
        "merge_min_files": plan.merge_min_files,
        "adopt_min_bytes": plan.adopt_min_bytes,
        # Never below the rewrite fraction: the next run would rewrite the file at once.
        "adopt_above": max(plan.adopt_live_fraction, plan.rewrite_live_fraction),
        # On an object store: where the task fetches its inputs and publishes its output.
        "volume": plan.volume_spec,
        "relative": [item.relative for item in plan.inputs],
    }


def _adopted(inputs: list[InputFile], survivors: np.ndarray, rules: TombstoneRules,
             task: dict[str, Any], page_checksums: bool) -> dict[str, Fate]:
    """The dirty segments adopted into the ledger as they are (adoption.py), by path."""
    fates: dict[str, Fate] = {}
    for item in inputs:
        if not adoptable(item, survivors, int(task.get("adopt_min_bytes", -1)),
                         task["adopt_above"], rules.deleted_below):
            continue
        result = adopt(item, survivors, rules, task["adopt_above"], task["run_id"],
                       Path(task["out_dir"]), page_checksums)
        if result is not None:
            fates[str(item.path)] = Fate(item, "adopt", result)
    return fates


def _use_task_cpus() -> None:
    """Give pyarrow's thread pool the cores Spark gave this task (spark.task.cpus, 1 by
    default): Spark runs as many tasks at once as it has cores, so more threads per task
    only fight each other. Outside a Spark task, pyarrow keeps its default."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is not None:
        pa.set_cpu_count(max(1, context.cpus()))


def compact_one(task: dict[str, Any]) -> dict[str, Any]:
    """Phases 1 and 2 of one partition (a task; see the module's invariant), its reads
    and writes held to its share of the run's I/O cap (io_throttle.py) and counted in
    its result's `io`."""
    throttle = IoThrottle(float(task.get("io_max_bytes_per_s") or 0.0))
    with throttled(throttle):
        if task.get("volume") is not None:
            result = compact_on_volume(task, _compact_local)
        else:
            result = _compact_local(task)
    return {**result, "io": throttle.counters()}


def _compact_local(task: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    _use_task_cpus()
    rules = TombstoneRules(**task["rules"])
    from_offsets = task.get("from_offsets") or [0] * len(task["inputs"])
    inputs = [InputFile(SegmentInfo.from_json(info), Path(path), is_ledger, from_offset)
              for (path, is_ledger, info), from_offset
              in zip(task["inputs"], from_offsets, strict=True)]
    for item in inputs:  # before any Parquet reader parses a footer
        PieceInput.of(item.path, item.is_ledger, item.info).verify()
    # Every byte proven against the manifest's CRC32C: the pages' own CRCs add nothing.
    page_checksums = any(item.info.crc32c is None for item in inputs)
    deleted = load_deleted([item for item in inputs if item.is_ledger])
    hidden = NotInView(deleted, rules.deleted_below, {
        str(item.path): item.from_offset for item in inputs if item.from_offset})
    stats = Phase1Stats()
    strategy = parse_strategy(task["strategy"])
    ledger = [str(item.path) for item in inputs if item.is_ledger]
    survivors = None
    if task.get("deletion_vectors") and strategy.kind == "latest" and ledger:
        survivors = latest_over_ledger(
            ledger, [str(item.path) for item in inputs if not item.is_ledger],
            task["budget"], stats, page_checksums, hidden)
    if survivors is None:
        survivors = partition_survivors(
            [str(item.path) for item in inputs], strategy,
            rules.empty_value_is_tombstone, task["budget"], stats, page_checksums, hidden,
        )
    verified = time.monotonic() - started - stats.read_s - stats.group_s
    written = time.monotonic()
    pieces: list[dict[str, Any]] = []
    runs = [inputs]
    if task.get("deletion_vectors"):
        ledger_inputs = [item for item in inputs if item.is_ledger]
        merged = small_runs(ledger_inputs, int(task.get("merge_below_bytes", 0)),
                            int(task.get("merge_min_files", 5)))
        fates = {str(item.path): decide(item, deleted.get(str(item.path)), survivors, rules,
                                        task["rewrite_below"], task["run_id"], page_checksums,
                                        merge=str(item.path) in merged)
                 for item in ledger_inputs}
        fates |= _adopted(inputs, survivors, rules, task, page_checksums)
        pieces += [fate.result.to_json() for fate in fates.values() if fate.result is not None]
        runs = runs_to_write(inputs, fates)
    sequence = 0
    for run in runs:
        groups = split_inputs(run, survivors, task["target_file_bytes"],
                              rules.null_key_policy == "keep", rules.deleted_below)
        for files, piece_survivors in groups:
            result = write_ledger_piece(
                # Verified above: the size is checked again, the whole-file CRC is not.
                [PieceInput.of(item.path, item.is_ledger, item.info, False, item.from_offset)
                 for item in files],
                piece_survivors, rules, Path(task["out_dir"]),
                ledger_file_name(task["run_id"], sequence, files[0].info.base_offset),
                task["compression"], page_checksums=page_checksums,
            )
            sequence += 1
            pieces.append(result.to_json())
    return {
        "partition": task["partition"],
        "keys": len(survivors),
        "pieces": pieces,
        "buckets": stats.buckets,
        "seconds": [verified + stats.read_s, stats.group_s, time.monotonic() - written],
    }
