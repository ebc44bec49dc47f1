"""faust-streaming against `compactlog serve`: a Table of counts per key
(tests/apps/faust/count_app.py, RocksDB store through rocksdict) whose changelog topic
faust creates. Stop the worker, delete its local state, restart: the table is restored
from the changelog; compact the changelog with `compactlog compact`; delete the state
again and restart: restored again, with the right counts.

faust runs as a subprocess with its own interpreter (.venv-apps/faust, pinned in
tests/apps/faust/requirements.txt; its Kafka client is aiokafka 0.14.0). Besides
produce/consume and a consumer group with faust's own partition assignor, it creates
its topics (the changelog and `<app>-__assignor-__leader`) with CreateTopics.
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

APP_ID = "counter"
CHANGELOG = f"{APP_ID}-counts-changelog"


@contextmanager
def faust_app(bootstrap: str, state: Path, log: Path) -> Iterator[AppProcess]:
    with app_process([str(app_python("faust")), str(APPS / "faust" / "count_app.py"),
                      "--broker", bootstrap, "--app-id", APP_ID, "--input", "events",
                      "--data-dir", str(state)], log) as app:
        yield app


@pytest.mark.slow
@pytest.mark.compat("faust-streaming", "table-restore")
def test_faust_table_is_restored_from_the_compacted_changelog(tmp_path: Path) -> None:
    scenario = StatefulCountScenario(tmp_path, APP_ID, CHANGELOG, faust_app)
    with logged_server(scenario.data, tmp_path / "server.log",
                       *server_config(tmp_path)) as server:
        scenario.play(server)
