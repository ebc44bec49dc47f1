#!/usr/bin/env python3
"""Render the compatibility table of docs/server.md from a test run.

The tests marked `@pytest.mark.compat(SUBJECT, SCENARIO)` record their outcomes in
build/compat-results.json (tests/conftest.py; $COMPACTLOG_COMPAT_RESULTS overrides the
path); the applications, clients, versions and scenarios come from tests/support/compat.py.

    scripts/compat_table.py              print the table
    scripts/compat_table.py --write      put it into docs/server.md, between the markers
    scripts/compat_table.py --check      exit 1 unless docs/server.md lists every
                                         application, client, version and scenario

A typical refresh: `scripts/test.sh` (or pytest on the test files that have compat marks),
then `scripts/compat_table.py --write`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support.compat import SUBJECTS, not_applicable, version  # noqa: E402

DOC = ROOT / "docs" / "server.md"
BEGIN = "<!-- compat-table: begin (scripts/compat_table.py --write) -->"
END = "<!-- compat-table: end -->"
HEADER = ("| application or client | version | scenario | what was tested | result |\n"
          "|---|---|---|---|---|")
DISPLAY = {"quixstreams": "Quix Streams", "faust-streaming": "faust-streaming",
           "kafkajs": "KafkaJS"}


def results_path() -> Path:
    return Path(os.environ.get("COMPACTLOG_COMPAT_RESULTS")
                or ROOT / "build" / "compat-results.json")


def result_text(result: dict[str, str] | None, current: str) -> str:
    if result is None:
        return "not run"
    if result.get("version") != current:
        return f"not run at this version (last: {result.get('version')})"
    outcome = result["outcome"]
    if outcome == "passed":
        return "passes"
    if outcome == "xpassed":
        return "passes (its xfail mark can go)"
    if outcome == "xfailed":
        return f"fails, server gap: {result['gap'] or result['reason']}"
    if outcome == "skipped":
        return f"skipped: {result['reason']}"
    return f"**FAILS** ({result['test']})"


def render(results: dict[str, dict[str, str]]) -> str:
    rows = [HEADER]
    for subject in sorted(SUBJECTS.values(), key=lambda s: (s.kind != "application", s.name)):
        current = version(subject.name)
        name = f"{DISPLAY.get(subject.name, subject.name)} ({subject.kind})"
        for scenario, what in subject.scenarios.items():
            if not_applicable(subject.name, scenario):
                result = "n/a"
                what = what.removeprefix("n/a: ")
            else:
                result = result_text(results.get(f"{subject.name}|{scenario}"), current)
            cells = [name, current, f"`{scenario}`", what, result]
            rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def rows_in(text: str) -> set[tuple[str, str, str]]:
    """(subject, version, scenario) of each row of the table between the markers."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return set()
    found = set()
    names = {f"{DISPLAY.get(s.name, s.name)} ({s.kind})": s.name for s in SUBJECTS.values()}
    for line in text[start:end].splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 5 and cells[0] in names:
            found.add((names[cells[0]], cells[1], cells[2].strip("`")))
    return found


def expected_rows() -> set[tuple[str, str, str]]:
    return {(s.name, version(s.name), scenario)
            for s in SUBJECTS.values() for scenario in s.scenarios}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=None,
                        help="the results file (default: build/compat-results.json)")
    parser.add_argument("--write", action="store_true", help="update docs/server.md")
    parser.add_argument("--check", action="store_true",
                        help="check that docs/server.md lists every row")
    args = parser.parse_args()
    if args.check:
        text = DOC.read_text()
        missing = expected_rows() - rows_in(text)
        stale = rows_in(text) - expected_rows()
        for row in sorted(missing):
            print(f"docs/server.md lacks {row}: run scripts/compat_table.py --write",
                  file=sys.stderr)
        for row in sorted(stale):
            print(f"docs/server.md lists {row}, which no test covers", file=sys.stderr)
        return 1 if missing or stale else 0
    path = args.results or results_path()
    results = json.loads(path.read_text()) if path.exists() else {}
    table = render(results)
    if not args.write:
        print(table)
        return 0
    text = DOC.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        print(f"{DOC} has no {BEGIN} ... {END} markers", file=sys.stderr)
        return 1
    DOC.write_text(text[:start + len(BEGIN)] + "\n" + table + "\n" + text[end:])
    print(f"wrote the table ({table.count(chr(10)) - 1} rows) into {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
