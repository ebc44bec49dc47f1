"""The log store: records and batches, log and sealed segments, manifests, partitions,
topics. Other packages import the log from here, never from its modules (import-linter
checks it): the names below are its public surface.

Invariant: the surface names only what other packages use; each name is imported from
its home when first used (PEP 562), so importing one of them loads that module and
what it needs, not the whole store (a Spark task that reads Parquet does not load the
partition and its recovery). No public name is also a submodule's name: Python sets
the package's attribute to the submodule once it is imported, and the name would then
be the module (tests/storage/test_storage_surface.py).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compactlog.storage.deletion import (
        cached_deletion_positions,
        cached_deletion_vector,
        deleted_mask,
        drop_deleted,
        dv_file_name,
        read_deletion_vector,
        write_deletion_vector,
    )
    from compactlog.storage.gcpause import gc_paused
    from compactlog.storage.locks import CompactionRunningError, compaction_lock, is_locked
    from compactlog.storage.manifest import (
        LEDGER_DIR,
        SEGMENT_DIR,
        CompactionState,
        PartitionManifest,
        SegmentInfo,
    )
    from compactlog.storage.partition import DEFAULT_MAX_BYTES, Partition, View
    from compactlog.storage.partitioner import NullKeyPartitioner, partitions_for_keys
    from compactlog.storage.reads import ledger_tables, sealed_tables, with_view
    from compactlog.storage.records import (
        CONTROL_MASK,
        CRC_START,
        HEADER,
        HEADER_SIZE,
        LOG_OVERHEAD,
        MAGIC_V2,
        MAX_UNCOMPRESSED_BATCH_BYTES,
        NO_PRODUCER_ID,
        TIMESTAMP_TYPE_MASK,
        TRANSACTIONAL_MASK,
        BatchError,
        BatchHeader,
        ChecksumError,
        Headers,
        ProducerRecord,
        Record,
        check_batch,
        iter_batches,
    )
    from compactlog.storage.recovery import log_files
    from compactlog.storage.sealed import (
        HEADER_TYPE,
        RECORD_COLUMNS,
        SCHEMA,
        SealedSegment,
        SegmentMissingError,
        file_crc32c,
        open_writer,
        table_to_records,
        verify_file,
    )
    from compactlog.storage.store import LogStore, PartitionBudgetError, default_local_dir
    from compactlog.storage.sweep import sweep_unreachable
    from compactlog.storage.topic import Topic
    from compactlog.storage.upkeep_round import run_round
    from compactlog.storage.view_rows import (
        TOMBSTONE_COLUMNS,
        FileRows,
        PartitionRows,
        RowCondition,
        TimeRules,
        partition_rows,
        retention_ms,
        rows_of,
        tombstones_by_size,
        upper_bound,
        view_start,
    )

__all__ = [
    "CONTROL_MASK",
    "CRC_START",
    "DEFAULT_MAX_BYTES",
    "HEADER",
    "HEADER_SIZE",
    "HEADER_TYPE",
    "LEDGER_DIR",
    "LOG_OVERHEAD",
    "MAGIC_V2",
    "MAX_UNCOMPRESSED_BATCH_BYTES",
    "NO_PRODUCER_ID",
    "RECORD_COLUMNS",
    "SCHEMA",
    "SEGMENT_DIR",
    "TIMESTAMP_TYPE_MASK",
    "TOMBSTONE_COLUMNS",
    "TRANSACTIONAL_MASK",
    "BatchError",
    "BatchHeader",
    "ChecksumError",
    "CompactionRunningError",
    "CompactionState",
    "FileRows",
    "Headers",
    "LogStore",
    "NullKeyPartitioner",
    "Partition",
    "PartitionBudgetError",
    "PartitionManifest",
    "PartitionRows",
    "ProducerRecord",
    "Record",
    "RowCondition",
    "SealedSegment",
    "SegmentInfo",
    "SegmentMissingError",
    "TimeRules",
    "Topic",
    "View",
    "cached_deletion_positions",
    "cached_deletion_vector",
    "check_batch",
    "compaction_lock",
    "default_local_dir",
    "deleted_mask",
    "drop_deleted",
    "dv_file_name",
    "file_crc32c",
    "gc_paused",
    "is_locked",
    "iter_batches",
    "ledger_tables",
    "log_files",
    "open_writer",
    "partition_rows",
    "partitions_for_keys",
    "read_deletion_vector",
    "retention_ms",
    "rows_of",
    "run_round",
    "sealed_tables",
    "sweep_unreachable",
    "table_to_records",
    "tombstones_by_size",
    "upper_bound",
    "verify_file",
    "view_start",
    "with_view",
    "write_deletion_vector",
]

# Each public name and the module that defines it.
_HOMES = {
    "BatchError": "compactlog.storage.records",
    "BatchHeader": "compactlog.storage.records",
    "cached_deletion_positions": "compactlog.storage.deletion",
    "cached_deletion_vector": "compactlog.storage.deletion",
    "check_batch": "compactlog.storage.records",
    "ChecksumError": "compactlog.storage.records",
    "compaction_lock": "compactlog.storage.locks",
    "CompactionRunningError": "compactlog.storage.locks",
    "CompactionState": "compactlog.storage.manifest",
    "CONTROL_MASK": "compactlog.storage.records",
    "CRC_START": "compactlog.storage.records",
    "default_local_dir": "compactlog.storage.store",
    "DEFAULT_MAX_BYTES": "compactlog.storage.partition",
    "deleted_mask": "compactlog.storage.deletion",
    "drop_deleted": "compactlog.storage.deletion",
    "dv_file_name": "compactlog.storage.deletion",
    "file_crc32c": "compactlog.storage.sealed",
    "FileRows": "compactlog.storage.view_rows",
    "gc_paused": "compactlog.storage.gcpause",
    "HEADER": "compactlog.storage.records",
    "HEADER_SIZE": "compactlog.storage.records",
    "HEADER_TYPE": "compactlog.storage.sealed",
    "Headers": "compactlog.storage.records",
    "is_locked": "compactlog.storage.locks",
    "iter_batches": "compactlog.storage.records",
    "LEDGER_DIR": "compactlog.storage.manifest",
    "ledger_tables": "compactlog.storage.reads",
    "log_files": "compactlog.storage.recovery",
    "LOG_OVERHEAD": "compactlog.storage.records",
    "LogStore": "compactlog.storage.store",
    "MAGIC_V2": "compactlog.storage.records",
    "MAX_UNCOMPRESSED_BATCH_BYTES": "compactlog.storage.records",
    "NO_PRODUCER_ID": "compactlog.storage.records",
    "NullKeyPartitioner": "compactlog.storage.partitioner",
    "open_writer": "compactlog.storage.sealed",
    "Partition": "compactlog.storage.partition",
    "partition_rows": "compactlog.storage.view_rows",
    "PartitionBudgetError": "compactlog.storage.store",
    "PartitionManifest": "compactlog.storage.manifest",
    "PartitionRows": "compactlog.storage.view_rows",
    "partitions_for_keys": "compactlog.storage.partitioner",
    "ProducerRecord": "compactlog.storage.records",
    "read_deletion_vector": "compactlog.storage.deletion",
    "Record": "compactlog.storage.records",
    "RECORD_COLUMNS": "compactlog.storage.sealed",
    "retention_ms": "compactlog.storage.view_rows",
    "RowCondition": "compactlog.storage.view_rows",
    "rows_of": "compactlog.storage.view_rows",
    "run_round": "compactlog.storage.upkeep_round",
    "SCHEMA": "compactlog.storage.sealed",
    "sealed_tables": "compactlog.storage.reads",
    "SealedSegment": "compactlog.storage.sealed",
    "SEGMENT_DIR": "compactlog.storage.manifest",
    "SegmentInfo": "compactlog.storage.manifest",
    "SegmentMissingError": "compactlog.storage.sealed",
    "sweep_unreachable": "compactlog.storage.sweep",
    "table_to_records": "compactlog.storage.sealed",
    "TimeRules": "compactlog.storage.view_rows",
    "TIMESTAMP_TYPE_MASK": "compactlog.storage.records",
    "TOMBSTONE_COLUMNS": "compactlog.storage.view_rows",
    "tombstones_by_size": "compactlog.storage.view_rows",
    "Topic": "compactlog.storage.topic",
    "TRANSACTIONAL_MASK": "compactlog.storage.records",
    "upper_bound": "compactlog.storage.view_rows",
    "verify_file": "compactlog.storage.sealed",
    "View": "compactlog.storage.partition",
    "view_start": "compactlog.storage.view_rows",
    "with_view": "compactlog.storage.reads",
    "write_deletion_vector": "compactlog.storage.deletion",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'compactlog.storage' has no attribute {name!r}")
