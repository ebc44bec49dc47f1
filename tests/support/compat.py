"""What the compatibility table of docs/server.md lists: each application and client the
tests run against `compactlog serve`, its version, and the scenarios tested.

A test says which scenario it is with `@pytest.mark.compat(SUBJECT, SCENARIO)`; the hook
in conftest.py records its outcome to build/compat-results.json (or
$COMPACTLOG_COMPAT_RESULTS), and scripts/compat_table.py renders the table from that.
tests/docs/test_compat_table.py checks that docs/server.md lists every subject and scenario
here at its current version, and that every scenario is a test's (or marked n/a).

Versions come from the pins (tests/apps/*/requirements.txt, package-lock.json,
pyproject.toml); kcat's from `kcat -V`, as it comes from the system's packages.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from support.paths import ROOT

APPS = ROOT / "tests" / "apps"

# An xfail reason that names a server gap reads "SERVER GAP: <what>. Log: <...>"; the
# table shows <what>.
GAP_PREFIX = "SERVER GAP: "


def server_gap(what: str, log: str) -> str:
    """The reason of an xfail mark for a gap in the server: `what` is short (it goes into
    the table), `log` the server's log line or the client's error that shows it."""
    return f"{GAP_PREFIX}{what}. Log: {log}"


@dataclass(frozen=True)
class Subject:
    name: str
    kind: str  # "application" or "client"
    installed: str  # how the tests get it
    # scenario id -> what is tested; a scenario the subject cannot do maps to "n/a: why"
    scenarios: dict[str, str] = field(default_factory=dict)


def _pin(path: Path, package: str) -> str:
    for line in path.read_text().splitlines():
        name, _, version = line.partition("==")
        if name.split("[")[0].strip().lower() == package:
            return version.strip()
    raise LookupError(f"{package} is not pinned in {path}")


def _project_pin(package: str) -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for spec in [*project["dependencies"], *project["optional-dependencies"]["dev"]]:
        name, _, version = spec.partition("==")
        if name.strip().lower() == package:
            return version.strip()
    raise LookupError(f"{package} is not pinned in pyproject.toml")


@cache
def kcat_version() -> str:
    """kcat's version and the librdkafka it was built with, as `kcat -V` says."""
    kcat = shutil.which("kcat")
    if kcat is None:
        return "not installed"
    text = subprocess.run([kcat, "-V"], capture_output=True, text=True, timeout=30).stdout
    version = re.search(r"Version (\S+)", text)
    librdkafka = re.search(r"librdkafka (\S+)", text)
    if version is None:
        return "unknown"
    return version.group(1) + (f" (librdkafka {librdkafka.group(1)})" if librdkafka else "")


def version(subject: str) -> str:
    if subject == "quixstreams":
        requirements = APPS / "quix" / "requirements.txt"
        return (f"{_pin(requirements, 'quixstreams')} "
                f"(confluent-kafka {_pin(requirements, 'confluent-kafka')})")
    if subject == "faust-streaming":
        requirements = APPS / "faust" / "requirements.txt"
        return (f"{_pin(requirements, 'faust-streaming')} "
                f"(aiokafka {_pin(requirements, 'aiokafka')})")
    if subject == "kafkajs":
        lock = json.loads((APPS / "kafkajs" / "package-lock.json").read_text())
        return str(lock["packages"]["node_modules/kafkajs"]["version"])
    if subject == "kcat":
        return kcat_version()
    return _project_pin(subject)


ALL_OPS = "n/a: the client has no call for it"

SUBJECTS: dict[str, Subject] = {s.name: s for s in [
    Subject("quixstreams", "application", "tests/apps/quix/requirements.txt, own venv", {
        "changelog-restore": "a running count per key in RocksDB state; state deleted and "
                             "restored from the compacted changelog topic Quix created, "
                             "again after `compactlog compact` of the changelog",
    }),
    Subject("faust-streaming", "application", "tests/apps/faust/requirements.txt, own venv", {
        "table-restore": "a Table of counts per key (RocksDB store); local state deleted and "
                         "restored from the changelog topic faust created, again after "
                         "`compactlog compact` of the changelog",
    }),
    Subject("kafkajs", "application", "tests/apps/kafkajs/package-lock.json, npm ci", {
        "topic-produce-group": "create a compacted topic, produce keyed records and "
                               "tombstones, consume with a group, commit, restart the "
                               "server, resume; list topics",
        "alter-config": "alterConfigs (AlterConfigs), then describeConfigs",
        "delete-records": "deleteTopicRecords, then the low watermark",
        "delete-group": "deleteGroups, then listGroups",
    }),
    Subject("kafka-python", "client", "pyproject.toml dev extra", {
        "end-to-end": "tests/server/test_server_scenarios.py: create a compacted topic, produce "
                      "keyed records and tombstones with every codec, compact while "
                      "serving, read the view and the live log, group read and commit, "
                      "restart, resume",
        "list-topics": "list_topics",
        "alter-config-AlterConfigs": "alter_configs(incremental=False) (AlterConfigs)",
        "alter-config-IncrementalAlterConfigs":
            "alter_configs(incremental=True) (IncrementalAlterConfigs)",
        "delete-records": "delete_records, then beginning_offsets and a read",
        "delete-group": "delete_groups after a group committed, then list_groups",
    }),
    Subject("aiokafka", "client", "pyproject.toml", {
        "end-to-end": "tests/server/test_server_scenarios.py: create a compacted topic, produce "
                      "keyed records and tombstones with every codec, compact while "
                      "serving, read the view and the live log, group read and commit, "
                      "restart, resume",
        "list-topics": "list_topics",
        "alter-config-AlterConfigs": "alter_configs (AlterConfigs), then describe_configs",
        "delete-records": "delete_records, then beginning_offsets and a read",
        "delete-group": ALL_OPS + " (aiokafka 0.14 has no DeleteGroups)",
    }),
    Subject("confluent-kafka", "client", "pyproject.toml dev extra", {
        "end-to-end": "tests/server/test_server_scenarios.py: create a compacted topic, produce "
                      "keyed records and tombstones with every codec, compact while "
                      "serving, read the view and the live log, group read and commit, "
                      "restart, resume",
        "list-topics": "list_topics (Metadata for all topics)",
        "alter-config-AlterConfigs": "alter_configs (AlterConfigs), then describe_configs",
        "alter-config-IncrementalAlterConfigs":
            "incremental_alter_configs (IncrementalAlterConfigs), then describe_configs",
        "delete-records": "delete_records, then the low watermark and a read",
        "delete-group": "delete_consumer_groups after a group committed, then "
                        "list_consumer_groups",
        "metadata-refresh-topic":
            "a producer and a group consumer with topic.metadata.refresh.interval.ms=1000 "
            "until each refreshed 3 times: no connection closed, no client error, all "
            "records consumed",
        "metadata-refresh-pattern":
            "the same with the consumer subscribed to a pattern (its periodic refresh asks "
            "for all topics)",
    }),
    Subject("kcat", "client", "Debian package (scripts/setup.sh --dev)", {
        "end-to-end": "tests/server/test_server_scenarios.py: create a compacted topic, produce "
                      "keyed records and tombstones with every codec, compact while "
                      "serving, read the view and the live log, group read and commit, "
                      "restart, resume",
        "list-topics": "kcat -L",
        "alter-config": ALL_OPS,
        "delete-records": ALL_OPS,
        "delete-group": ALL_OPS,
    }),
]}


def scenario_ids() -> set[tuple[str, str]]:
    return {(s.name, scenario) for s in SUBJECTS.values() for scenario in s.scenarios}


def not_applicable(subject: str, scenario: str) -> bool:
    return SUBJECTS[subject].scenarios[scenario].startswith("n/a")
