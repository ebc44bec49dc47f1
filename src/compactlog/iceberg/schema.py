"""The state table's schema, partition spec and name mapping (see the package's
"Mapping onto the ledger"). The ids never change: a table once written is read by them.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    BinaryType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
)

from compactlog.compaction.ledger import LEDGER_SCHEMA

PARTITION_ID, OFFSET_ID, TIMESTAMP_ID = 1, 2, 3
LAST_COLUMN_ID = 9
PARTITION_FIELD_ID = 1000
# Columns of ledger files that the table does not show, mapped to ids it never uses.
OTHER_COLUMNS_FIRST_ID = 100

SCHEMA = Schema(
    NestedField(PARTITION_ID, "partition", IntegerType(), required=False,
                doc="Kafka partition (identity partition; from the manifest, not the file)"),
    NestedField(OFFSET_ID, "offset", LongType(), required=True),
    NestedField(TIMESTAMP_ID, "timestamp", LongType(), required=True,
                doc="milliseconds since the Unix epoch"),
    NestedField(4, "key", BinaryType(), required=False),
    NestedField(5, "value", BinaryType(), required=False),
    NestedField(6, "headers", ListType(
        7, StructType(NestedField(8, "key", StringType(), required=False),
                      NestedField(9, "value", BinaryType(), required=False)),
        element_required=False), required=False),
    schema_id=0,
)

SPEC = PartitionSpec(
    PartitionField(source_id=PARTITION_ID, field_id=PARTITION_FIELD_ID,
                   transform=IdentityTransform(), name="partition"),
    spec_id=0,
)

# Iceberg's reserved ids of a position-delete file's columns.
DELETE_FILE_PATH_ID = 2147483546
DELETE_POS_ID = 2147483545
DELETE_SCHEMA = pa.schema([
    pa.field("file_path", pa.string(), nullable=False,
             metadata={"PARQUET:field_id": str(DELETE_FILE_PATH_ID)}),
    pa.field("pos", pa.int64(), nullable=False,
             metadata={"PARQUET:field_id": str(DELETE_POS_ID)}),
])


def name_mapping() -> list[dict[str, Any]]:
    """`schema.name-mapping.default`: every column of a ledger file by name. The
    table's columns get their schema ids (the list of headers its element, named
    `element` as pyarrow writes Parquet lists); the others ids from 100."""
    mapping: list[dict[str, Any]] = [
        {"field-id": PARTITION_ID, "names": ["partition"]},
        {"field-id": OFFSET_ID, "names": ["offset"]},
        {"field-id": TIMESTAMP_ID, "names": ["timestamp"]},
        {"field-id": 4, "names": ["key"]},
        {"field-id": 5, "names": ["value"]},
        {"field-id": 6, "names": ["headers"], "fields": [
            {"field-id": 7, "names": ["element", "item"], "fields": [
                {"field-id": 8, "names": ["key"]}, {"field-id": 9, "names": ["value"]}]}]},
    ]
    shown = {"offset", "timestamp", "key", "value", "headers"}
    others = [name for name in LEDGER_SCHEMA.names if name not in shown]
    mapping += [{"field-id": OTHER_COLUMNS_FIRST_ID + index, "names": [name]}
                for index, name in enumerate(others)]
    return mapping


def table_properties() -> dict[str, str]:
    return {
        "schema.name-mapping.default": json.dumps(name_mapping()),
        "write.delete.mode": "merge-on-read",
        "compactlog.table": "state",
    }
