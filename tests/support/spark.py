"""The Spark settings of the tests' session (conftest.py's `spark` fixture) and of the
Spark jobs tests start themselves.

They follow the "tiny" profile measured in shared/notes/spark.md (no UI, one shuffle
partition per core, C1 JIT only, no whole-stage codegen): it halves the cost of the small
jobs tests run. Never use it for benchmarks.
"""

from __future__ import annotations

SPARK_TEST_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.rdd.compress": "false",
    "spark.shuffle.compress": "false",
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto",
}
