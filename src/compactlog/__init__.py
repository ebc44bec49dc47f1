"""compactlog: a message log with key-compacted topics.

The public names are imported when first used (PEP 562), so `import compactlog`, and
with it the `compactlog` command's start-up, does not load the store and pyarrow.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compactlog.errors import CompactlogError
    from compactlog.storage import LogStore, ProducerRecord, Record

__all__ = ["CompactlogError", "LogStore", "ProducerRecord", "Record"]
__version__ = "0.1.0"

# Each public name and the module that defines it.
_HOMES = {
    "CompactlogError": "compactlog.errors",
    "LogStore": "compactlog.storage.store",
    "ProducerRecord": "compactlog.storage.records",
    "Record": "compactlog.storage.records",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'compactlog' has no attribute {name!r}")
