"""Shared fixtures: a fake clock, a store, the Spark session (started once per test run
and shared, with support/spark.py's settings), moto's S3 server, the S3 fault proxy, every
compaction engine and the admin-API servers. Helpers are in the support package
(tests/README.md); test modules take these fixtures by name and import none of them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from compactlog.storage.store import LogStore
from support.admin import Servers
from support.engines import ENGINES, Engine
from support.fakes import FakeClock
from support.paths import TESTS_DIR
from support.s3_faults import S3Proxy
from support.s3_support import S3Server, start_s3_server
from support.spark import SPARK_TEST_CONF

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[LogStore]:
    with LogStore.open(tmp_path / "data", clock=clock) as opened:
        yield opened


def module_folders() -> list[Path]:
    """The folders of the test modules, each on sys.path under pytest's default import
    mode, as tests/ is."""
    return sorted({path.parent for path in TESTS_DIR.glob("*/test_*.py")})


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Spark's Python workers import user strategy modules from here (user_strategies.py),
    # and functions of test modules (pickled by reference) from their folders.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(TESTS_DIR), *map(str, module_folders()), os.environ.get("PYTHONPATH")])
    )
    from compactlog.compaction.spark_session import start_session

    session = start_session("local[2]", SPARK_TEST_CONF, app_name="compactlog-tests")
    yield session
    session.stop()


# -- object storage: moto's S3 server and the fault proxy (support/s3_support.py, s3_faults.py)

@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    """moto's S3 server on loopback, started once per test run; each test takes its own
    key prefix (`s3.location()`)."""
    yield from start_s3_server()


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The `s3` server, its AWS settings put in this test's environment (undone after)."""
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    return s3


@pytest.fixture
def s3_proxy(s3: S3Server) -> Iterator[S3Proxy]:
    """A fault proxy in front of the session's moto server, stopped after the test."""
    host, _, port = s3.endpoint_url.removeprefix("http://").partition(":")
    proxy = S3Proxy((host, int(port)), s3).start()
    try:
        yield proxy
    finally:
        proxy.stop()


# -- every compaction engine (support/engines.py) ----------------------------------------

@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest, clock: FakeClock) -> Engine:
    name: str = request.param
    spark = request.getfixturevalue("spark") if name.startswith("spark") else None
    return Engine(name, clock, spark)


# -- servers with the admin API (support/admin.py) ----------------------------------------

@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    started = Servers(tmp_path)
    yield started
    started.stop()


# -- the compatibility table (tests/support/compat.py, scripts/compat_table.py) ----------

_COMPAT_RESULTS = pytest.StashKey[dict[str, dict[str, str]]]()


# -- slow tests: left out of the default run, which CI runs ------------------------------

SLOW_SKIP_REASON = "slow: run with --runslow (or select with -m)"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False,
                     help="also run the tests marked slow (crash loops, soak, apps, cluster)")


def skip_slow_unless_asked(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The default run leaves out tests marked slow so that CI stays well inside its
    budget; `--runslow` runs them too, and an explicit `-m` expression decides alone."""
    if config.getoption("--runslow") or config.option.markexpr:
        return
    skip = pytest.mark.skip(reason=SLOW_SKIP_REASON)
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_COMPAT_RESULTS] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from support.compat import scenario_ids

    skip_slow_unless_asked(config, items)

    known = scenario_ids()
    used = []
    for item in items:
        for mark in item.iter_markers("compat"):
            if tuple(mark.args) not in known:
                raise pytest.UsageError(
                    f"{item.nodeid}: compat{mark.args} is not a scenario of "
                    "tests/support/compat.py")
            used.append([*mark.args, item.nodeid])
    # tests/docs/test_compat_table.py collects with this set to learn which tests cover what.
    listing = os.environ.get("COMPACTLOG_LIST_COMPAT")
    if listing:
        Path(listing).write_text(json.dumps(used))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    marks = list(item.iter_markers("compat"))
    # The call's outcome; a setup that did not pass, or a teardown that failed (such as
    # a server that did not stop cleanly), stands instead.
    if marks and (report.when == "call" or (report.when == "setup" and not report.passed)
                  or (report.when == "teardown" and report.failed)):
        from support.compat import GAP_PREFIX, version

        xfail = hasattr(report, "wasxfail")
        reason = str(getattr(report, "wasxfail", ""))
        outcome = ("xfailed" if report.skipped else "xpassed") if xfail else report.outcome
        if outcome == "skipped" and isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[2])
            if reason.endswith(SLOW_SKIP_REASON):
                return report  # not run, so the outcome recorded before stands
        for mark in marks:
            subject, scenario = mark.args
            item.config.stash[_COMPAT_RESULTS][f"{subject}|{scenario}"] = {
                "subject": subject, "scenario": scenario, "version": version(subject),
                "outcome": outcome, "gap": reason.removeprefix(GAP_PREFIX).split(". Log:")[0]
                if reason.startswith(GAP_PREFIX) else "",
                "reason": reason, "test": item.nodeid,
                "recorded": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
    return report


def compat_results_path() -> Path:
    return Path(os.environ.get("COMPACTLOG_COMPAT_RESULTS")
                or TESTS_DIR.parent / "build" / "compat-results.json")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Merge this run's outcomes into the results file (a partial run updates only the
    scenarios it ran)."""
    recorded = session.config.stash.get(_COMPAT_RESULTS, {})
    if not recorded:
        return
    path = compat_results_path()
    merged: dict[str, Any] = {}
    if path.exists():
        try:
            merged = json.loads(path.read_text())
        except ValueError:
            merged = {}
    merged.update(recorded)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(sorted(merged.items())), indent=2) + "\n")
