"""Quix Streams against `compactlog serve`: a stateful application (a running count per
key, tests/apps/quix/count_app.py) whose RocksDB state lives in the compacted changelog
topic Quix creates. Stop it, delete its state, restart: restored from the changelog;
compact the changelog with `compactlog compact`; delete the state again and restart:
restored again, with the right counts.

Quix Streams runs as a subprocess with its own interpreter (.venv-apps/quix, pinned in
tests/apps/quix/requirements.txt): it brings confluent-kafka 2.12.2 (librdkafka 2.12.1),
older than the project's. It uses, besides produce/consume/groups: Metadata for all
topics (AdminClient.list_topics), DescribeConfigs, CreateTopics, and an idempotent
producer (InitProducerId).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from support.apps_support import (
    AppProcess,
    StatefulCountScenario,
    app_process,
    app_python,
    server_config,
)
from support.compat import APPS
from support.kafka_server import logged_server

GROUP = "counter"
CHANGELOG = f"changelog__{GROUP}--events--default"

@contextmanager
def quix_app(bootstrap: str, state: Path, log: Path) -> Iterator[AppProcess]:
    with app_process([str(app_python("quix")), str(APPS / "quix" / "count_app.py"),
                      "--broker", bootstrap, "--group", GROUP, "--input", "events",
                      "--state-dir", str(state)], log) as app:
        yield app


@pytest.mark.slow
@pytest.mark.compat("quixstreams", "changelog-restore")
def test_quix_state_is_restored_from_the_compacted_changelog(tmp_path: Path) -> None:
    scenario = StatefulCountScenario(tmp_path, GROUP, CHANGELOG, quix_app)
    with logged_server(scenario.data, tmp_path / "server.log",
                       *server_config(tmp_path)) as server:
        scenario.play(server)
