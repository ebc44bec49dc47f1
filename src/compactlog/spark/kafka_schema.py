"""The DataFrame schema of a topic read through the `compactlog` data source: the
columns, names and types of Spark's Kafka source (`spark.read.format("kafka")`,
KafkaRecordToRowConverter in Spark; its integration guide lists them), so a query
written for Kafka reads compactlog unchanged:

    key binary, value binary, topic string, partition int, offset bigint,
    timestamp timestamp, timestampType int, headers array<struct<key: string, value: binary>>

`timestamp` is Spark's timestamp type, converted from the files' milliseconds since the
Unix epoch as each batch is built (one vectorised cast per batch). `timestampType` is
Kafka's: 0 CreateTime (the producer's timestamp, which the store keeps); 1 would be
LogAppendTime, which no topic here uses yet. `value` is null for a tombstone; `headers`
is null when a record has none (Kafka's source adds the column only with
includeHeaders; here it is always there).

Before issue 24 the schema was `partition, offset, timestamp bigint, key, value,
headers`: a query that used `timestamp` as milliseconds needs
`unix_millis(timestamp)` now (docs/querying.md, "Changed").

Spark checks that the Arrow batches a Python source yields have exactly the Arrow form
of the declared schema, so both are built here, once, from the same definition, and
`spark_batches` is the one place that turns the store's record columns into them.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
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
    TimestampType,
)

from compactlog.storage import RECORD_COLUMNS

CREATE_TIME = 0  # Kafka's timestampType of a producer's timestamp
HEADER_TYPE = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)
SPARK_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType(), nullable=False),
        StructField("partition", IntegerType(), nullable=False),
        StructField("offset", LongType(), nullable=False),
        StructField("timestamp", TimestampType(), nullable=False),
        StructField("timestampType", IntegerType(), nullable=False),
        StructField("headers", HEADER_TYPE),
    ]
)
ARROW_SCHEMA: pa.Schema = to_arrow_schema(SPARK_SCHEMA, timezone="UTC")
# The record columns as the Parquet files hold them (timestamp in ms), for Spark's reader.
PARQUET_SCHEMA = (f"offset bigint, timestamp bigint, key binary, value binary, "
                  f"headers {HEADER_TYPE.simpleString()}")

assert set(RECORD_COLUMNS) <= set(SPARK_SCHEMA.fieldNames()), "keep in step with sealed.py"


def spark_batches(table: pa.Table, topic: str, partition: int) -> Iterator[pa.RecordBatch]:
    """`table`'s record columns (storage/sealed.py RECORD_COLUMNS) as batches of the
    Arrow form of SPARK_SCHEMA."""
    rows = table.num_rows
    if not rows:
        return
    timestamp_type = ARROW_SCHEMA.field("timestamp").type
    columns = {
        "key": table.column("key"),
        "value": table.column("value"),
        "topic": pa.repeat(pa.scalar(topic, pa.string()), rows),
        "partition": pa.array(np.full(rows, partition, dtype=np.int32)),
        "offset": table.column("offset"),
        "timestamp": table.column("timestamp").cast(pa.timestamp("ms", tz="UTC"))
                                              .cast(timestamp_type),
        "timestampType": pa.array(np.full(rows, CREATE_TIME, dtype=np.int32)),
        "headers": table.column("headers"),
    }
    yield from pa.Table.from_arrays([columns[name] for name in ARROW_SCHEMA.names],
                                    schema=ARROW_SCHEMA).to_batches()
