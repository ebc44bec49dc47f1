"""A warm Spark job's fixed cost on the project's session, and where it goes.

In one warm SparkSession started as the product starts it (compaction/spark_session.py,
`--master`, local[2] by default), the job shapes run in turn, `--runs` rounds after five
warm-up rounds (so that the JVM's warming up and the machine's load fall on all alike);
the table gives the median and the minimum wall time, the engine that ran it, and the
ratio to the baseline (an empty 4-task RDD job):

- `rdd`: `sc.parallelize(range(4), 4).map(probe).collect()`, the baseline;
- `range.mapInArrow`: `spark.range(0, 4, 1, 4).mapInArrow(probe)`, the shape the issue
  measured;
- `product job, empty tasks`: the product's own job (arrow_pipeline.task_job), four
  tasks whose body does nothing but report when and where it ran;
- `product compaction`: one real compaction run through SparkCompactionService, on a
  fresh copy of a topic of `--records` records in 4 partitions: a Spark job, as every
  run is by default (the row says which engine ran, from the run's report).

The breakdown comes from the tasks themselves (each returns its wall-clock start and end,
its Python worker's pid, and whether pyarrow was already imported in that worker) and
from the driver: planning (building the job before it is submitted), submit to the first
task's start in Python (scheduling, task deserialization, Python worker start or reuse,
Arrow set-up), the tasks' own time, and the last task's end to the driver having the
results (result serialization and collection).

The machine may be shared: every number is a median and a minimum over many runs.

    .venv/bin/python bench/spark_fixed_cost.py
    .venv/bin/python bench/spark_fixed_cost.py --runs 20 --records 60000
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from compactlog.compaction.arrow_pipeline import task_job
from compactlog.compaction.spark_service import SparkCompactionServiceFactory
from compactlog.compaction.spark_session import DEFAULT_CONF
from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_info import commit, machine_info

TOPIC = "t"
PARTITIONS = 4


def probe(_: Any = None) -> dict[str, Any]:
    """What a task reports: when it started and ended (wall clock, as the driver's), its
    worker's pid, and whether that worker had pyarrow imported before this task."""
    started = time.time()
    return {"start": started, "end": time.time(), "pid": os.getpid(),
            "pyarrow": "pyarrow" in sys.modules}


def probe_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import json

    for batch in batches:
        yield pa.RecordBatch.from_pydict(
            {"result": [json.dumps(probe()) for _ in range(batch.num_rows)]})


def probe_task(_: dict[str, Any]) -> dict[str, Any]:
    return probe()


@dataclass
class Shape:
    name: str
    engine: str
    walls: list[float] = field(default_factory=list)
    # Per run: planning, submit to first task start, tasks, last task end to results.
    parts: list[tuple[float, float, float, float]] = field(default_factory=list)
    pids: set[int] = field(default_factory=set)
    cold_workers: int = 0  # tasks whose worker had not imported pyarrow yet

    def add(self, wall: float, plan_s: float, submitted: float, done: float,
            probes: list[dict[str, Any]]) -> None:
        self.walls.append(wall)
        if probes:
            first = min(p["start"] for p in probes)
            last = max(p["end"] for p in probes)
            self.parts.append((plan_s, first - submitted, last - first, done - last))
            self.pids.update(p["pid"] for p in probes)
            self.cold_workers += sum(not p["pyarrow"] for p in probes)


Job = Callable[[], tuple[float, list[dict[str, Any]]]]
WARM_UP_ROUNDS = 5


def run_shapes(shapes: list[tuple[Shape, Job]], runs: int) -> list[Shape]:
    """Every shape once per round, in turn, so that the JVM's warming up (its JIT) and the
    machine's load fall on all shapes alike; the first WARM_UP_ROUNDS rounds not counted."""
    for index in range(runs + WARM_UP_ROUNDS):
        for shape, job in shapes:
            began = time.time()
            plan_s, probes = job()
            done = time.time()
            if index >= WARM_UP_ROUNDS:
                shape.add(done - began, plan_s, began + plan_s, done, probes)
    return [shape for shape, _ in shapes]


def generate(data: Path, records: int) -> None:
    with LogStore.open(data) as store:
        store.create_topic(TOPIC, partitions=PARTITIONS, config={
            "cleanup.policy": "compact", "min.compaction.lag.ms": "0"})
        keys = max(1, records // 4)
        for start in range(0, records, 1000):
            store.append(TOPIC, [ProducerRecord(b"k%08d" % ((start + i) % keys), b"x" * 100)
                                 for i in range(min(1000, records - start))])
        for partition in store.topic(TOPIC).partitions:
            partition.roll()


def compaction_shape(factory: SparkCompactionServiceFactory, session: Any, template: Path,
                     scratch: Path, runs: int) -> Shape:
    shape = Shape("product compaction", "")
    engines: set[str] = set()
    for index in range(runs + 2):  # two warm-up runs, not counted
        data = scratch / f"run-{index}"
        shutil.copytree(template, data)
        with LogStore.open(data) as store:
            service = factory.new_service(store, TOPIC, {"spark.session": session})
            began = time.time()
            report = service.compact()
            wall = time.time() - began
        shutil.rmtree(data)
        # What the report says ran it, its job ids left out so that runs alike read alike.
        engines.add(re.sub(r"job \d+", "job", report.engine)
                    if getattr(report, "engine", "") else _engine_from_stages(report.stages))
        if index >= 2:
            shape.walls.append(wall)
    shape.engine = " / ".join(sorted(engines))
    return shape


def _engine_from_stages(stages: dict[str, float]) -> str:
    # Reports that do not name their engine: the stage names tell Spark tasks from inline.
    if any(name.startswith("tasks:") for name in stages):
        return "Spark job"
    if any(name.startswith("inline:") for name in stages):
        return "in process (no Spark job)"
    return "unknown"


def import_seconds(module: str) -> float:
    """Seconds a fresh interpreter takes to import `module` (a Python worker's cost when
    it is not reused)."""
    code = (f"import time; t = time.perf_counter(); import {module}; "
            "print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ})
    return float(out.stdout.strip())


def print_table(shapes: list[Shape]) -> None:
    base = statistics.median(shapes[0].walls)
    base_min = min(shapes[0].walls)
    print("\n| job | engine | runs | median s | min s | median / rdd | min / rdd |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for shape in shapes:
        median, least = statistics.median(shape.walls), min(shape.walls)
        print(f"| {shape.name} | {shape.engine} | {len(shape.walls)} | {median:.3f} | "
              f"{least:.3f} | {median / base:.2f} | {least / base_min:.2f} |")
    print("\nbreakdown, median s: planning | submit to first task | tasks | last task to "
          "results || distinct Python worker pids, tasks on a worker without pyarrow")
    for shape in shapes:
        if not shape.parts:
            continue
        columns = [statistics.median(part[i] for part in shape.parts) for i in range(4)]
        print(f"  {shape.name:28} " + " | ".join(f"{c:.3f}" for c in columns)
              + f" || {len(shape.pids)} pids, {shape.cold_workers} cold")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    info = machine_info()
    print(f"spark fixed cost bench, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
          f"commit {commit()}; {info['cpu']}, {info['cores']} cores, {info['memory']}; "
          f"master {args.master}, {args.runs} runs per row", flush=True)
    conf = dict(item.split("=", 1) for item in args.spark_conf)
    factory = SparkCompactionServiceFactory()
    began = time.monotonic()
    session = factory.start_session({"spark.master": args.master, "spark.conf": conf})
    print(f"session start-up, with its warming job: {time.monotonic() - began:.1f} s")
    context = session.sparkContext
    settings = {**DEFAULT_CONF, **conf}
    print("settings: " + ", ".join(
        f"{key}={context.getConf().get(key, settings.get(key, '(default)'))}"
        for key in ("spark.python.worker.reuse", "spark.python.use.daemon",
                    "spark.python.daemon.module", "spark.sql.execution.arrow.maxRecordsPerBatch",
                    "spark.ui.enabled")))
    print(f"import in a fresh interpreter: pyarrow {import_seconds('pyarrow'):.3f} s, "
          f"the Arrow pipeline {import_seconds('compactlog.compaction.arrow_pipeline'):.3f} s")

    def rdd() -> tuple[float, list[dict[str, Any]]]:
        return 0.0, context.parallelize(range(4), 4).map(probe).collect()

    def range_map_in_arrow() -> tuple[float, list[dict[str, Any]]]:
        import json

        began = time.time()
        frame = session.range(0, 4, 1, 4).mapInArrow(probe_batches, "result string")
        frame._jdf.queryExecution().executedPlan()  # planning, apart from the job
        planned = time.time() - began
        return planned, [json.loads(row["result"]) for row in frame.collect()]

    def product_job() -> tuple[float, list[dict[str, Any]]]:
        return 0.0, task_job(session, [{} for _ in range(4)], probe_task)

    shapes = run_shapes([
        (Shape("rdd (baseline)", "Spark RDD job"), rdd),
        (Shape("range.mapInArrow", "Spark SQL job"), range_map_in_arrow),
        (Shape("product job, empty tasks", "Spark job (arrow_pipeline.task_job)"),
         product_job),
    ], args.runs)
    scratch = Path(tempfile.mkdtemp(prefix="spark-fixed-cost-"))
    try:
        template = scratch / "template"
        generate(template, args.records)
        shapes.append(compaction_shape(factory, session, template, scratch, args.runs))
        shapes[-1].name = f"product compaction, {args.records:,} records"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        session.stop()
    print_table(shapes)


if __name__ == "__main__":
    main()
