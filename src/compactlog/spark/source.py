"""The `compactlog` Spark data source: Spark 4's Python Data Source API over a data directory.

    spark.read.format("compactlog").option("path", DIR).option("topic", T)
         .option("view", "raw" | "compacted").option("partitions", "0,2").load()
    spark.readStream.format("compactlog")...load()     # the same options, and see stream.py
    df.write.format("compactlog").option("path", DIR).option("topic", T)
      .mode("append").save()

Spark runs these methods in Python workers: `reader()`/`partitions()` and `writer()` on
the driver while planning, `read()`/`write()` on executors, `commit()`/`abort()` on the
driver. Every object here is pickled between them, so each holds only plain options.
On a cluster the executors need compactlog installed (or the package shipped with
`spark.sparkContext.addPyFile`) and, since they read the files themselves, either the
data directory at the same path (a shared filesystem) or, with `path` an s3:// URL, the
AWS settings (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, ... or a profile) in their own
environment: tasks carry a file's volume spec and name, never a credential
(spark/read_plan.py). On S3 a read covers the sealed part of the topic.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from compactlog.spark.kafka_schema import SPARK_SCHEMA
from compactlog.spark.options import parse_read_options, parse_write_options
from compactlog.spark.read import read_part
from compactlog.spark.read_plan import FilePart, TailPart, plan_read
from compactlog.spark.stream import CompactlogStreamReader
from compactlog.spark.write import StagedFile, StagedWrite, check_input_schema

if TYPE_CHECKING:
    import pyarrow as pa

NAME = "compactlog"


class CompactlogDataSource(DataSource):
    """Topics and their compacted views as DataFrames; appends from DataFrames."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return SPARK_SCHEMA

    def reader(self, schema: StructType) -> CompactlogReader:
        return CompactlogReader(dict(self.options))

    def streamReader(self, schema: StructType) -> CompactlogStreamReader:
        return CompactlogStreamReader(dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> CompactlogWriter:
        return CompactlogWriter(dict(self.options), schema, overwrite)


class CompactlogReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        # Parsed here, on the driver, so that a bad option fails the query at planning.
        self.options = parse_read_options(options)
        # When the view's time rules are evaluated: at planning, by this clock.
        self.clock: Callable[[], float] = time.time

    def partitions(self) -> list[InputPartition]:
        return plan_read(self.options, self.clock)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, FilePart | TailPart):
            # Spark reads a source with no tasks as one task InputPartition(None).
            return iter(())
        return read_part(partition)


class CompactlogWriter(DataSourceArrowWriter):
    """Tasks stage their rows; the driver's commit appends them all (see write.py)."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        self.staged = StagedWrite.start(parse_write_options(options), overwrite)
        check_input_schema(schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFile:
        return self.staged.stage(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.staged.commit([m for m in messages if isinstance(m, StagedFile)])

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self.staged.discard()
