"""Topics and their compacted views as Spark DataFrames (Spark 4's Python Data Source API).

    from compactlog.spark import register
    register(spark)
    df = (spark.read.format("compactlog").option("path", "compactlog-data")
          .option("topic", "prices").option("view", "compacted").load())

    df = read_topic(spark, "compactlog-data", "prices", "compacted")  # the same, faster

See docs/querying.md. The source itself is in source.py; planning (driver) in read_plan.py,
reading (executors) in read.py, appending in write.py; `read_topic` in fast.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from compactlog.spark.fast import read_topic
from compactlog.spark.kafka_schema import SPARK_SCHEMA
from compactlog.spark.source import NAME, CompactlogDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["NAME", "SPARK_SCHEMA", "CompactlogDataSource", "read_topic", "register"]


def register(spark: SparkSession) -> None:
    """Make `spark.read.format("compactlog")` and `df.write.format("compactlog")` work.

    Spark also finds the source by itself in any Python where compactlog is installed
    (the `pyspark_compactlog` module); registering explicitly does not depend on that.
    """
    spark.dataSource.register(CompactlogDataSource)
