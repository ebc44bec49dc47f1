"""Shared fixtures. The Spark session is started once per test run and shared.

Spark settings follow the "tiny" profile measured in shared/notes/spark.md (no UI, one
shuffle partition per core, C1 JIT only, no whole-stage codegen): it halves the cost
of the small jobs tests run. Never use it for benchmarks.
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
from fakes import FakeClock

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TESTS_DIR = Path(__file__).parent

SPARK_TEST_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.rdd.compress": "false",
    "spark.shuffle.compress": "false",
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto",
}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[LogStore]:
    with LogStore.open(tmp_path / "data", clock=clock) as opened:
        yield opened


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Spark's Python workers import user strategy modules from here (user_strategies.py).
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")])
    )
    from compactlog.compaction.spark_session import start_session

    session = start_session("local[2]", SPARK_TEST_CONF, app_name="compactlog-tests")
    yield session
    session.stop()


# -- the compatibility table (tests/compat.py, scripts/compat_table.py) -------------------

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
    from compat import scenario_ids

    skip_slow_unless_asked(config, items)

    known = scenario_ids()
    used = []
    for item in items:
        for mark in item.iter_markers("compat"):
            if tuple(mark.args) not in known:
                raise pytest.UsageError(
                    f"{item.nodeid}: compat{mark.args} is not a scenario of tests/compat.py")
            used.append([*mark.args, item.nodeid])
    # tests/test_compat_table.py collects with this set to learn which tests cover what.
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
        from compat import GAP_PREFIX, version

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
