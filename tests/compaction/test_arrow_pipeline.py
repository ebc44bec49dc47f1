"""The Arrow compaction tasks (compaction/arrow_pipeline.py) end to end, on real Spark.

The same topic compacted with compaction.phase1.engine=arrow (unbucketed, and with a
budget that forces buckets; as a Spark job, and run in the compacting process with
compaction.without.spark) and with =sql gives the same compacted view; a task run
twice (a Spark retry) leaves exactly one set of ledger files and commits.
"""

from __future__ import annotations

import errno
import json
import random
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from compactlog.compaction import arrow_pipeline
from compactlog.compaction.arrow_pipeline import (
    _task,
    compact_one,
    pack_tasks,
    runs_without_spark,
    uses_arrow,
)
from compactlog.compaction.plan import plan_partition
from compactlog.compaction.spark_jobs import SPARK_TASKS
from compactlog.compaction.spark_service import SparkCompactionService, local_master_cores
from compactlog.errors import UserError
from compactlog.storage.records import ProducerRecord, Record
from compactlog.storage.store import LogStore
from support.fakes import FakeClock

# The topic config that runs a compaction's tasks in this process, without Spark.
WITHOUT_SPARK = {"compaction.without.spark": "true"}
TOPIC = "t"
BASE = {"cleanup.policy": "compact", "segment.bytes": "4096", "min.compaction.lag.ms": "0",
        "null.key.policy": "keep", "delete.retention.ms": "86400000"}


def view(store: LogStore) -> list[list[Record]]:
    result = []
    for partition in store.topic(TOPIC).partitions:
        records: list[Record] = []
        offset = 0
        while batch := partition.read_compacted(offset, 500):
            records += batch
            offset = batch[-1].offset + 1
        result.append(records)
    return result


def compact_twice(tmp: Path, spark: SparkSession, config: dict[str, str]) -> list[list[Record]]:
    """Fill, compact, fill more, compact again: the second run reads a ledger too."""
    clock = FakeClock()
    with LogStore.open(tmp, clock=clock) as store:
        store.create_topic(TOPIC, 2, config)
        rng = random.Random(7)
        heard: list[tuple[str, int, int]] = []  # the progress callback's calls
        for _ in range(2):
            for _ in range(300):
                key = rng.choice([None, b"", *(b"k%d" % i for i in range(40))])
                value = rng.choice([None, b"", b"v" * rng.randint(1, 30)])
                headers = [("h", str(rng.randint(0, 5)).encode())] if rng.random() < 0.7 else []
                clock.advance_ms(rng.randint(0, 2))
                store.append(TOPIC, [ProducerRecord(key, value, headers, clock.ms)],
                             partition=rng.randint(0, 1))
            for partition in store.topic(TOPIC).partitions:
                partition.roll()
            heard.clear()
            service = SparkCompactionService(store, TOPIC, {
                "spark.session": spark, "clock": clock,
                "progress": lambda *call: heard.append(call)})
            report = service.compact()
            assert report.total("records_out") > 0
            arrow = config.get("compaction.phase1.engine") != "sql"
            inline = arrow and config.get("compaction.without.spark") == "true"
            # Where the time went, and where it ran: a Spark job or this process.
            assert ("tasks: group" in report.stages) is (arrow and not inline)
            assert ("inline: group" in report.stages) is inline
            if inline:
                assert report.engine == "in this process, no Spark job: 2 partitions"
                assert not [call for call in heard if call[0] == SPARK_TASKS]
            elif arrow:  # both partitions' tasks in one Spark task per core
                assert re.fullmatch(r"Spark local\[2\]: job \d+ \(1 stage, 2 tasks\)",
                                    report.engine), report.engine
                assert (SPARK_TASKS, 2, 2) in heard  # the progress followed the tasks
            else:
                assert re.fullmatch(r"Spark local\[2\]: job \d+ .*", report.engine)
            assert report.total("keys") > 0
        return view(store)


@pytest.mark.parametrize("strategy", ["latest", "first", "order:timestamp", "order:header:h"])
def test_arrow_tasks_and_spark_sql_write_the_same_view(
    strategy: str, spark: SparkSession, tmp_path: Path
) -> None:
    common = BASE | {"compaction.strategy": strategy}
    sql = compact_twice(tmp_path / "sql", spark, common | {"compaction.phase1.engine": "sql"})
    job = {"compaction.phase1.engine": "arrow"}
    arrow = compact_twice(tmp_path / "arrow", spark, common | job)
    bucketed = compact_twice(tmp_path / "bucketed", spark, common | job | {
        "compaction.task.memory.bytes": "1024"})
    inline = compact_twice(tmp_path / "inline", spark, common | {
        "compaction.phase1.engine": "arrow", "compaction.task.memory.bytes": "1024",
        "compaction.without.spark": "true"})
    assert arrow == sql
    assert bucketed == sql
    assert inline == sql


def test_a_run_without_spark_starts_no_spark(tmp_path: Path) -> None:
    clock = FakeClock()
    with LogStore.open(tmp_path, clock=clock) as store:
        store.create_topic(TOPIC, 2, BASE | WITHOUT_SPARK)
        for i in range(300):
            store.append(TOPIC, [ProducerRecord(b"k%d" % (i % 40), b"v%d" % i, (), clock.ms)],
                         partition=i % 2)
        for partition in store.topic(TOPIC).partitions:
            partition.roll()
        # A master no session could reach: the run must not need one.
        service = SparkCompactionService(store, TOPIC, {"spark.master": "spark://nowhere:1",
                                                        "clock": clock})
        report = service.compact()
        assert service.started_session is None
        assert report.total("keys") == 40 and "inline: write" in report.stages
        assert report.engine == "in this process, no Spark job: 2 partitions"
        assert all(len({r.key for r in p}) == len(p) for p in view(store))


def test_inline_tasks_run_on_as_many_threads_as_the_master_has_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: dict[int, str] = {}
    body = arrow_pipeline.compact_one

    def recorded(task: dict[str, Any]) -> dict[str, Any]:
        threads[task["partition"]] = threading.current_thread().name
        return body(task)

    monkeypatch.setattr(arrow_pipeline, "compact_one", recorded)
    views = []
    for master in ("local[1]", "local[2]"):
        clock = FakeClock()
        with LogStore.open(tmp_path / master, clock=clock) as store:
            store.create_topic(TOPIC, 4, BASE | WITHOUT_SPARK)
            for i in range(800):
                store.append(TOPIC, [ProducerRecord(b"k%d" % (i % 90), b"v%d" % i, (),
                                                    clock.ms)], partition=i % 4)
            for partition in store.topic(TOPIC).partitions:
                partition.roll()
            threads.clear()
            report = SparkCompactionService(store, TOPIC, {"spark.master": master,
                                                           "clock": clock}).compact()
            # Key k lands in the 2 partitions of its parity (i % 90 and i % 4 share it).
            assert report.total("keys") == 180 and "inline: write" in report.stages
            views.append(view(store))
            if master == "local[1]":
                assert set(threads.values()) == {threading.current_thread().name}
            else:
                assert len(threads) == 4
                assert all(name.startswith("compaction-task") for name in threads.values())
    assert views[0] == views[1]


def test_a_task_failing_on_its_thread_commits_nothing_and_the_next_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One partition's task fails (a disk full, after its ledger files are written) while
    the others run on the other thread: the run fails, no partition's (horizon, ledger)
    changes, and the next run compacts them all."""
    body = arrow_pipeline.compact_one

    def full_disk_on_partition_1(task: dict[str, Any]) -> dict[str, Any]:
        result = body(task)
        if task["partition"] == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return result

    clock = FakeClock()
    with LogStore.open(tmp_path, clock=clock) as store:
        store.create_topic(TOPIC, 4, BASE | WITHOUT_SPARK)
        for i in range(800):
            store.append(TOPIC, [ProducerRecord(b"k%d" % (i % 90), b"v%d" % i, (), clock.ms)],
                         partition=i % 4)
        for partition in store.topic(TOPIC).partitions:
            partition.roll()
        before = [p.manifest.compaction for p in store.topic(TOPIC).partitions]
        viewed = view(store)
        monkeypatch.setattr(arrow_pipeline, "compact_one", full_disk_on_partition_1)
        service = SparkCompactionService(store, TOPIC, {"spark.master": "local[2]",
                                                        "clock": clock})
        with pytest.raises(OSError, match="No space left"):
            service.compact()
        assert [p.manifest.compaction for p in store.topic(TOPIC).partitions] == before
        assert view(store) == viewed
        monkeypatch.setattr(arrow_pipeline, "compact_one", body)
        report = service.compact()
        assert report.total("keys") == 180
        assert all(len({r.key for r in p}) == len(p) for p in view(store))


def test_local_master_cores() -> None:
    assert local_master_cores("local") == 1
    assert local_master_cores("local[3]") == 3
    assert local_master_cores("local[2,4]") == 2
    assert local_master_cores("local[*]") >= 1
    for remote in ("spark://host:7077", "yarn", "local-cluster[2,1,1024]", "k8s://x"):
        assert local_master_cores(remote) == 0


def test_a_job_packs_its_partitions_into_one_spark_task_per_core() -> None:
    # Longest processing time first: each partition, heaviest first, joins the lightest
    # task so far; never more tasks than cores, never an empty task.
    assert pack_tasks(["a", "b", "c", "d"], [10, 10, 10, 10], 2) == [["a", "c"], ["b", "d"]]
    assert pack_tasks(["a", "b", "c"], [1, 8, 5], 2) == [["b"], ["c", "a"]]
    assert pack_tasks(["a", "b"], [1, 1], 8) == [["a"], ["b"]]
    assert pack_tasks(["a", "b", "c"], [3, 2, 1], 1) == [["a", "b", "c"]]


def test_without_spark_only_when_asked_and_never_for_a_spark_sql_plan(tmp_path: Path) -> None:
    clock = FakeClock()
    with LogStore.open(tmp_path, clock=clock) as store:
        for name, config in [("plain", BASE), ("asked", BASE | WITHOUT_SPARK),
                             ("sql", BASE | WITHOUT_SPARK | {"compaction.phase1.engine": "sql"}),
                             ("long", BASE | WITHOUT_SPARK | {
                                 "compaction.strategy": "order:header:h:long"})]:
            store.create_topic(name, 1, config)
            store.append(name, [ProducerRecord(b"k", b"v", (("h", b"1"),), clock.ms)])
            partition = store.topic(name).partition(0)
            partition.roll()
            plan = plan_partition(name, 0, partition.directory, partition.manifest,
                                  partition.manifest_version, store.topic(name).config,
                                  clock.ms)
            if name == "plain":
                # Every run is a Spark job, however small, unless asked by name.
                assert not runs_without_spark([plan])
                assert runs_without_spark([plan], asked=True)
            elif name == "asked":
                assert runs_without_spark([plan])
            else:
                reason = ("compaction.phase1.engine=sql" if name == "sql"
                          else "strategy 'order:header:h:long' runs only in Spark SQL")
                with pytest.raises(UserError, match=re.escape(
                        f"partition 0: compaction.without.spark=true, but {reason}")):
                    runs_without_spark([plan])
                # The service fails before any work, and starts no Spark.
                service = SparkCompactionService(store, name, {
                    "spark.master": "spark://nowhere:1", "clock": clock})
                with pytest.raises(UserError, match=r"compaction\.without\.spark"):
                    service.compact()
                assert service.started_session is None


def test_auto_runs_long_headers_and_functions_in_sql(tmp_path: Path) -> None:
    clock = FakeClock()
    with LogStore.open(tmp_path, clock=clock) as store:
        for name, strategy, engine, arrow in [
            ("a", "latest", "auto", True),
            ("b", "order:header:h:long", "auto", False),
            ("c", "function:user_strategies:keep_larger_value", "arrow", False),
            ("d", "latest", "sql", False),
        ]:
            store.create_topic(name, 1, BASE | {"compaction.strategy": strategy,
                                                "compaction.phase1.engine": engine})
            partition = store.topic(name).partition(0)
            plan = plan_partition(name, 0, partition.directory, partition.manifest,
                                  partition.manifest_version, store.topic(name).config, 0)
            assert uses_arrow(plan) is arrow, name


def test_a_task_run_twice_rewrites_only_its_own_files(tmp_path: Path) -> None:
    clock = FakeClock()
    with LogStore.open(tmp_path, clock=clock) as store:
        store.create_topic(TOPIC, 1, BASE)
        for i in range(400):
            store.append(TOPIC, [ProducerRecord(b"k%d" % (i % 50), b"v%d" % i, (), clock.ms)],
                         partition=0)
        partition = store.topic(TOPIC).partition(0)
        partition.roll()
        plan = plan_partition(TOPIC, 0, partition.directory, partition.manifest,
                              partition.manifest_version, store.topic(TOPIC).config, clock.ms)
        plan.ledger_dir.mkdir(exist_ok=True)
        task = json.loads(json.dumps(_task(plan, "run1")))
        first = compact_one(task)
        files = sorted(path.name for path in plan.ledger_dir.iterdir())
        second = compact_one(task)  # a retry of the same task
        assert sorted(path.name for path in plan.ledger_dir.iterdir()) == files
        assert first["keys"] == second["keys"] == 50

        def stable(result: dict[str, object]) -> object:
            pieces = json.loads(json.dumps(result["pieces"]))
            for piece in pieces:
                piece["info"].pop("sealed_at_ms")
            return pieces

        assert stable(first) == stable(second)
        assert [piece["info"]["file"] for piece in first["pieces"]] == files
