"""Model-based test of compaction: random produce / seal / compact / read / clock steps,
checked against a plain in-memory model of the contract in DESIGN.md.

The model keeps the raw log as a list and the compacted ledger as a dict of key ->
(record, tombstone kept since). A compaction in the model folds the previous ledger and
the newly sealed records in offset order with the topic's strategy, exactly as the
contract says; the store must then read back the same view, at the same offsets. Every
strategy and tombstone retention (with an injectable clock) are covered, and
DeleteRecords: the records below its cut leave every view and the fold, so a key whose
survivor it deleted takes its best later record (issue 21, item 8).

Many incremental runs equal one full run (`one_full_run_agrees`): the same records,
appended to a fresh store and compacted once, give the same live records. (Tombstones
are left out of that comparison: a tombstone's retention counts from the run that first
kept it. Under a strategy other than `latest`, a DeleteRecords cut at or below the
horizon ends the comparison: it deletes a survivor whose key's later records the
incremental runs had already dropped, which a full run still holds.)

The plain-Python service runs many examples; the Spark service runs fewer, as each of
its compactions costs a Spark job.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
)
from pyspark.sql import SparkSession

from compactlog.compaction import TopicCompactionService, load_factory
from compactlog.compaction.arrow_survivors import supports
from compactlog.compaction.spark_service import SparkCompactionService
from compactlog.compaction.strategies import parse_strategy
from compactlog.storage.store import LogStore
from support.compaction_model import RETENTION_MS, ArrowDeletionVectorModel, Clock, CompactionModel

STRATEGIES = [
    "latest", "first", "order:header:v:long", "function:user_strategies:keep_larger_value",
]


class AnyStrategyModel(CompactionModel):
    @initialize(strategy=st.sampled_from(STRATEGIES), retention=st.sampled_from([0, RETENTION_MS]),
                null_policy=st.sampled_from(["drop", "keep"]), deletion_vectors=st.booleans(),
                rewrite=st.sampled_from([0.0, 0.5, 1.0]), adopt=st.booleans(),
                merge=st.booleans())
    def create(self, strategy: str, retention: int, null_policy: str, deletion_vectors: bool,
               rewrite: float, adopt: bool, merge: bool) -> None:
        self.adopt_min_bytes = 0 if adopt else -1
        self.merge_below_bytes = 1 << 30 if merge else 0
        self.create_topic(strategy, retention, null_policy, deletion_vectors, rewrite)


class LocalCompactionModel(AnyStrategyModel):
    def make_service(self, store: LogStore, topic: str, clock: Clock) -> TopicCompactionService:
        factory = load_factory("local_engine:LocalCompactionServiceFactory")
        return factory.new_service(store, topic, {"clock": clock})


TestLocalCompactionModel = LocalCompactionModel.TestCase
TestLocalCompactionModel.settings = settings(
    max_examples=150, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class ArrowTasksModel(AnyStrategyModel):
    """The Arrow tasks of the Spark service (run in this process) for every strategy
    they run (the others take the plain-Python engine), deletion vectors on and off."""

    def make_service(self, store: LogStore, topic: str, clock: Clock) -> TopicCompactionService:
        factory = load_factory("local_engine:LocalCompactionServiceFactory")
        return factory.new_service(store, topic, {"clock": clock, "engine": "arrow"})


TestArrowTasksModel = ArrowTasksModel.TestCase
TestArrowTasksModel.settings = settings(
    max_examples=150, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


TestArrowDeletionVectorModel = ArrowDeletionVectorModel.TestCase
TestArrowDeletionVectorModel.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.fixture(params=["job", "inline"])
def spark_model(spark: SparkSession, request: pytest.FixtureRequest) -> type[CompactionModel]:
    class SparkCompactionModel(AnyStrategyModel):
        # A Spark job for every run (the default), or the tasks in this process for the
        # strategies they run (the others only run in Spark SQL: a Spark job still).
        def create_topic(self, strategy: str, retention: int, null_policy: str,
                         deletion_vectors: bool, rewrite: float) -> None:
            if request.param == "inline" and supports(parse_strategy(strategy)):
                self.extra_config = {"compaction.without.spark": "true"}
            super().create_topic(strategy, retention, null_policy, deletion_vectors, rewrite)

        def make_service(self, store: LogStore, topic: str,
                         clock: Clock) -> TopicCompactionService:
            return SparkCompactionService(store, topic, {"spark.session": spark,
                                                         "clock": clock})

    return SparkCompactionModel


def test_spark_compaction_model(spark_model: type[CompactionModel]) -> None:
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(spark_model, settings=settings(
        max_examples=8, stateful_step_count=15, deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    ))
