"""The API version tables of `compactlog serve`: what it serves and what it advertises."""

from __future__ import annotations

import tempfile
from pathlib import Path

from compactlog.server.broker import Broker
from compactlog.server.handlers import register_all
from compactlog.storage.store import LogStore


def tables() -> tuple[dict[int, tuple[int, int]], dict[int, tuple[int, int]]]:
    """(served, advertised) version tables, as `compactlog serve` builds them."""
    with tempfile.TemporaryDirectory() as directory, LogStore.open(Path(directory)) as store:
        broker = Broker(store, "127.0.0.1", 9092)
        try:
            register_all(broker)
            return dict(broker.versions), dict(broker.advertised)
        finally:
            broker.close()


SERVED, ADVERTISED = tables()
