"""Shared fixtures. The Spark session is started once per test run and shared.

Spark settings follow the "tiny" profile measured in shared/notes/spark.md (no UI, one
shuffle partition per core, C1 JIT only, no whole-stage codegen): it halves the cost
of the small jobs tests run. Never use it for benchmarks.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from compactlog.storage.store import LogStore
from fakes import FakeClock

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TESTS_DIR = Path(__file__).parent

SPARK_TEST_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.rdd.compress": "false",
    "spark.shuffle.compress": "false",
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto",
}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[LogStore]:
    with LogStore.open(tmp_path / "data", clock=clock) as opened:
        yield opened


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Spark's Python workers import user strategy modules from here (user_strategies.py).
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")])
    )
    from compactlog.compaction.spark_session import start_session

    session = start_session("local[2]", SPARK_TEST_CONF, app_name="compactlog-tests")
    yield session
    session.stop()
