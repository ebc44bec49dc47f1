"""Client-side APIs over a LogStore: readers that track a position."""

from compactlog.client.reader import Reader
from compactlog.client.table_view import TableView

__all__ = ["Reader", "TableView"]
