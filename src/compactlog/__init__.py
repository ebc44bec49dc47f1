"""compactlog: a message log with key-compacted topics."""

from compactlog.errors import CompactlogError
from compactlog.storage.records import ProducerRecord, Record
from compactlog.storage.store import LogStore

__all__ = ["CompactlogError", "LogStore", "ProducerRecord", "Record"]
__version__ = "0.1.0"
