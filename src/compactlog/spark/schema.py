"""The DataFrame schema of a topic read through the `compactlog` data source.

The record columns are those of the sealed segments (storage/sealed.py RECORD_COLUMNS),
with the same types, plus the partition in front:

    partition int, offset bigint, timestamp bigint, key binary, value binary,
    headers array<struct<key: string, value: binary>>

`timestamp` stays milliseconds since the Unix epoch, as in the Parquet files and in
Kafka, so the data source and `spark.read.parquet` on the same files agree and no
conversion is paid per row; `timestamp_millis(timestamp)` gives a Spark timestamp.
`value` is null for a tombstone; `headers` is null when a record has none.

Spark checks that the Arrow batches a Python source yields have exactly the Arrow form
of the declared schema, so both are built here, once, from the same definition.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from compactlog.storage.sealed import RECORD_COLUMNS

HEADER_TYPE = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)
SPARK_SCHEMA = StructType(
    [
        StructField("partition", IntegerType(), nullable=False),
        StructField("offset", LongType(), nullable=False),
        StructField("timestamp", LongType(), nullable=False),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("headers", HEADER_TYPE),
    ]
)
ARROW_SCHEMA: pa.Schema = to_arrow_schema(SPARK_SCHEMA, timezone="UTC")

assert SPARK_SCHEMA.fieldNames()[1:] == RECORD_COLUMNS, "keep in step with sealed.py"
