"""Every compaction engine, for scenario tests that must hold on each of them.

A test takes the `engine` fixture (tests/conftest.py), creates its topic
with `engine.config` merged into its own config, and compacts with `engine.service`:
  - local: the plain-Python fold of tests/local_engine.py (the reference);
  - arrow: the Arrow tasks (compaction/arrow_pipeline.py) run in this process, without
    deletion vectors (every run rewrites the ledger);
  - arrow-dv: the same with deletion vectors (compaction/incremental.py);
  - spark-sql: the Spark SQL pipeline (compaction/spark_pipeline.py) on the shared
    session (phase 1 as a Spark job, phase 2 one Spark task per piece).
The Spark service's Arrow tasks as a Spark job run the same task body as `arrow`; the
model tests (tests/compaction/test_compaction_model.py) run them.

`CommitHookEngine` (and `ArrowCommitHookEngine`, the same with the Arrow tasks) lets a
test land another actor's change (a seal, a merge, retention, DeleteRecords, a config
change, another compaction) between a compaction's plan and its commit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from compactlog.compaction import TopicCompactionService, load_factory
from compactlog.compaction.ledger import PieceResult
from compactlog.compaction.plan import PartitionPlan
from compactlog.storage.store import LogStore
from local_engine import InlineArrowEngine, LocalEngine
from support.fakes import FakeClock

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ENGINES = ("local", "arrow", "arrow-dv", "spark-sql")
_CONFIG = {
    "local": {},
    "arrow": {"compaction.deletion.vectors": "false"},
    "arrow-dv": {"compaction.deletion.vectors": "true"},
    "spark-sql": {"compaction.phase1.engine": "sql"},
}


@dataclass
class Engine:
    name: str
    clock: FakeClock
    spark: SparkSession | None = None
    config: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.config = dict(_CONFIG[self.name])

    def service(self, store: LogStore, topic: str) -> TopicCompactionService:
        if self.spark is not None:
            from compactlog.compaction.spark_service import SparkCompactionService

            return SparkCompactionService(store, topic, {"spark.session": self.spark,
                                                         "clock": self.clock})
        factory = load_factory("local_engine:LocalCompactionServiceFactory")
        settings = {"clock": self.clock, "engine": "local" if self.name == "local" else "arrow"}
        return factory.new_service(store, topic, settings)


class _BeforeCommit:
    """Runs `before_commit` once the engine's ledger files are written and before the
    runner commits them: what another actor does then lands between the compaction's
    plan and its commit (runner.py, step 5)."""

    def __init__(self, before_commit: Callable[[], object]) -> None:
        self.before_commit = before_commit

    def write_ledgers(self, plans: list[PartitionPlan],
                      run_id: str) -> dict[int, list[PieceResult]]:
        written: dict[int, list[PieceResult]] = super().write_ledgers(  # type: ignore[misc]
            plans, run_id)
        self.before_commit()
        return written


class CommitHookEngine(_BeforeCommit, LocalEngine):
    """The plain-Python engine, with a hook before the commit (`_BeforeCommit`)."""


class ArrowCommitHookEngine(_BeforeCommit, InlineArrowEngine):
    """The Arrow tasks in this process (deletion vectors, adoption, small ledger files
    merged: compaction/incremental.py), with a hook before the commit."""


def compact(store: LogStore, topic: str, clock: FakeClock) -> Any:
    factory = load_factory("local_engine:LocalCompactionServiceFactory")
    return factory.new_service(store, topic, {"clock": clock}).compact()
