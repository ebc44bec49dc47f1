"""Starting the Spark session that runs compaction.

The master is `local[*]` unless configured: `spark://host:7077` for a standalone
cluster, or any master Spark accepts. Settings pass through unchanged (`--spark-conf
KEY=VALUE`). The defaults below are the ones measured fastest for this job on small
machines (shared/notes/spark.md): few shuffle partitions, no UI, 127.0.0.1.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
    "spark.python.worker.reuse": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    # Phase 1 reads key, offset and value_size pages straight from the Parquet files: check
    # the CRC32C of every page read (sealed files are written with page checksums).
    "spark.hadoop.parquet.page.verify-checksum.enabled": "true",
}
LOCAL_CONF: dict[str, str] = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


def spark_environment() -> None:
    """Environment Spark's launcher and Python workers need; set before the JVM starts."""
    # Workers run the first `python3` on PATH otherwise, which may lack pyarrow.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Errors only from the JVM's logging (spark-conf/log4j2.properties), unless the user
    # has a Spark configuration directory of their own.
    os.environ.setdefault("SPARK_CONF_DIR", str(Path(__file__).with_name("spark-conf")))


def start_session(
    master: str = DEFAULT_MASTER,
    conf: Mapping[str, str] | None = None,
    app_name: str = "compactlog-compaction",
) -> SparkSession:
    spark_environment()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    settings = dict(DEFAULT_CONF)
    if master.startswith("local") or master.startswith("spark://127.") or (
        master.startswith("spark://localhost")
    ):
        settings.update(LOCAL_CONF)
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
