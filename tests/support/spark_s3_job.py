"""A Spark job reading a topic on s3:// through the `compactlog` data source and through
`read_topic`, run by tests/spark/test_spark_source_s3.py in a process of its own.

Why a process of its own: a Spark executor reads the AWS settings from its own
environment (tasks carry none), and the Python workers of a local session inherit the
environment the JVM was started with. The test run's shared session started before the
moto server existed, so only a fresh process, started with the AWS variables set, has
executors that can reach the bucket, as a cluster's workers would with theirs.

    python spark_s3_job.py URL TOPIC [--compact] VIEW...

prints one JSON object: for each view, the rows the data source ("source"), `read_topic`
("fast") and a streaming query run once with trigger(availableNow=True) ("stream") gave,
as [partition, offset, timestamp, key hex, value hex, headers]. With --compact it first
compacts TOPIC with the Spark compaction service (a read-only store on URL).
"""

from __future__ import annotations

import json
import sys
import tempfile
from typing import Any

from compactlog.compaction.spark_session import start_session
from compactlog.spark import read_topic, register
from support.spark import SPARK_TEST_CONF


def rows(frame: Any) -> list[list[Any]]:
    found = []
    # collect() gives a timestamp as a naive local time: take Spark's ms instead.
    ordered = frame.selectExpr("*", "unix_millis(timestamp) AS timestamp_ms")
    for row in ordered.orderBy("partition", "offset").collect():
        headers = [[h["key"], None if h["value"] is None else bytes(h["value"]).hex()]
                   for h in row["headers"] or []]
        found.append([row["partition"], row["offset"], row["timestamp_ms"],
                      None if row["key"] is None else bytes(row["key"]).hex(),
                      None if row["value"] is None else bytes(row["value"]).hex(), headers])
    return found


def stream_rows(spark: Any, url: str, topic: str, view: str) -> list[list[Any]]:
    found: list[list[Any]] = []

    def collect(batch: Any, batch_id: int) -> None:
        found.extend(rows(batch))

    with tempfile.TemporaryDirectory() as checkpoint:
        query = (spark.readStream.format("compactlog").option("path", url)
                 .option("topic", topic).option("view", view)
                 .option("maxOffsetsPerTrigger", "100").load()
                 .writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
    return sorted(found)


def main(argv: list[str]) -> None:
    url, topic, *rest = argv
    compact = "--compact" in rest
    views = [view for view in rest if view != "--compact"]
    spark = start_session("local[2]", SPARK_TEST_CONF, app_name="compactlog-s3-tests")
    try:
        if compact:
            from compactlog.compaction.spark_service import SparkCompactionService
            from compactlog.storage.store import LogStore

            with tempfile.TemporaryDirectory() as local, \
                    LogStore.open(url, read_only=True, local_dir=local) as store:
                SparkCompactionService(store, topic, {"spark.session": spark}).compact()
        register(spark)
        result = {}
        for view in views:
            source = (spark.read.format("compactlog").option("path", url)
                      .option("topic", topic).option("view", view).load())
            result[view] = {"source": rows(source),
                            "fast": rows(read_topic(spark, url, topic, view)),
                            "stream": stream_rows(spark, url, topic, view)}
        print(json.dumps(result))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
