"""The compaction model test (test_compaction_model.py) with the store on an s3://
location (moto on loopback): the Arrow tasks, run in this process, fetch their inputs
from the bucket and publish ledger files and deletion vectors to it; every run's
compacted view must equal the model's. Fewer examples than on a local disk (every step
is HTTP)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from compactlog.storage.store import LogStore
from support.compaction_model import ArrowDeletionVectorModel
from support.s3_support import (
    S3Server,
)


class S3ArrowDeletionVectorModel(ArrowDeletionVectorModel):
    server: S3Server  # set by the test before the machine runs

    def durable_end(self) -> int:
        """What the bucket holds: the records of the sealed segments (the active
        segment's are not served until they are uploaded)."""
        sealed = self.partition.manifest.sealed_end_offset
        assert sealed <= len(self.log)
        return sealed

    def open_store(self) -> LogStore:
        # A fresh prefix per example; the local directory holds only logs and cache.
        return LogStore.open(self.server.location("cmodel"), clock=self.clock,
                             local_dir=self.directory)


def test_compaction_on_s3_agrees_with_the_model(s3_env: S3Server) -> None:
    S3ArrowDeletionVectorModel.server = s3_env
    run_state_machine_as_test(S3ArrowDeletionVectorModel, settings=settings(
        max_examples=int(os.environ.get("COMPACTLOG_MODEL_S3_EXAMPLES", "25")),
        stateful_step_count=20, deadline=None,
        suppress_health_check=[HealthCheck.too_slow]))
