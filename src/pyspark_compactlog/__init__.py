"""Lets Spark find the `compactlog` data source without `compactlog.spark.register`.

Spark 4 registers, on first use of a Python data source, the `DefaultSource` of every
importable top-level module whose name starts with `pyspark_`.
"""

from compactlog.spark.source import CompactlogDataSource as DefaultSource

__all__ = ["DefaultSource"]
