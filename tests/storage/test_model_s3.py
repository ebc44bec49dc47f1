"""The log store's model test (test_model.py) with the store on an s3:// location: a
moto server on loopback holds the manifests and sealed segments, a local directory the
log segments. The same rules and invariants, fewer examples (every step is HTTP): 8 in
the default run, 60 in the slow suite (COMPACTLOG_MODEL_S3_EXAMPLES sets the default
run's count)."""

from __future__ import annotations

import os

import pytest
from hypothesis.stateful import run_state_machine_as_test

from compactlog.backend import Location
from compactlog.storage.partition import Partition
from compactlog.storage.store import LogStore
from support.s3_support import (
    S3Server,
)
from support.store_model import LogStoreModel, PartitionModel, model_settings


class S3LogStoreModel(LogStoreModel):
    server: S3Server  # set by the test before the machine runs
    seals_on_close = True

    def watermark(self, partition: Partition, model: PartitionModel) -> int:
        """What the bucket holds: the sealed segments this writer committed (its reads,
        and a reader's, serve nothing of the active segment)."""
        sealed = partition.manifest.sealed_end_offset
        assert model.start <= sealed <= model.end
        return sealed

    def open_store(self, read_only: bool = False) -> LogStore:
        if not hasattr(self, "location"):
            self.location: Location = self.server.location("model")  # one per example
        if read_only:
            # A reader on the same machine: the writer's log segments are in the same
            # local directory, as they are for a local store's readers.
            return LogStore.open(self.location, read_only=True, local_dir=self.directory)
        return LogStore.open(self.location, clock=self.clock, local_dir=self.directory)


def test_the_store_on_s3_agrees_with_the_model(s3_env: S3Server) -> None:
    S3LogStoreModel.server = s3_env
    run_state_machine_as_test(S3LogStoreModel, settings=model_settings(
        int(os.environ.get("COMPACTLOG_MODEL_S3_EXAMPLES", "8"))))


@pytest.mark.slow
def test_the_store_on_s3_agrees_with_the_model_over_many_cases(s3_env: S3Server) -> None:
    S3LogStoreModel.server = s3_env
    run_state_machine_as_test(S3LogStoreModel, settings=model_settings(60))
