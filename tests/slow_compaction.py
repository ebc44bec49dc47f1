"""A compaction service that takes its time: local_engine.py's, after a sleep of
COMPACTLOG_TEST_COMPACTION_SLEEP_S seconds (default 3), so that a test can hold runs
going while it asks for more. Loaded by import path: `slow_compaction:SlowFactory`."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from compactlog.compaction import CompactionReport
from compactlog.storage.store import LogStore
from local_engine import LocalCompactionService


class SlowService(LocalCompactionService):
    def compact(self, partitions: Sequence[int] | None = None) -> CompactionReport:
        time.sleep(float(os.environ.get("COMPACTLOG_TEST_COMPACTION_SLEEP_S", "3")))
        return super().compact(partitions)


class SlowFactory:
    def new_service(self, store: LogStore, topic: str,
                    settings: Mapping[str, Any]) -> SlowService:
        return SlowService(store, topic, settings)
