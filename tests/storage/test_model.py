"""A stateful model test of the log store against a plain Python model.

The model of a partition is the list of every record appended to it (its index is its
offset) and the log start offset. Hypothesis drives appends, rolls and seals (through
`segment.bytes`, `segment.ms` with a clock the test advances, and explicit rolls), reads
at random offsets and limits, reopening the store, a read-only store reading alongside
the writer, retention by bytes and by time, and merges of small sealed segments
(storage/merging.py); after every step the store must agree with the model.
"""

from __future__ import annotations

import os

from support.store_model import LogStoreModel, model_settings

# About 20-30 s on a 2-core machine; COMPACTLOG_MODEL_EXAMPLES=2000 for a longer soak.
LogStoreModel.TestCase.settings = model_settings(
    int(os.environ.get("COMPACTLOG_MODEL_EXAMPLES", "150")))
TestLogStoreModel = LogStoreModel.TestCase
