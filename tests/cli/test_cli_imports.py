"""What the `compactlog` command imports to start (issue 24, item 7).

`--version` and `--help` must not load the server, the Kafka protocol, aiohttp, pyarrow
or Spark: each command imports what it needs when it runs (cli/__init__.py's
LazyGroup). The time it takes is measured by bench/cli_startup.py, not asserted here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("aiohttp", "kio", "pyarrow", "pyspark", "aiokafka", "compactlog.server",
         "compactlog.storage.store")

# Runs the command in a fresh interpreter, then prints the modules it loaded.
PROBE = """
import json, sys
from compactlog.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("\\nMODULES " + json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def loaded_modules(*args: str) -> set[str]:
    result = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True,
                            text=True, timeout=60, check=True)
    line = result.stderr.rsplit("MODULES ", 1)[1]
    return set(json.loads(line))


@pytest.mark.parametrize("args", [("--version",), ("--help",), ("-h",), ("topics", "--help"),
                                  ("groups", "describe", "-h")],
                         ids=" ".join)
def test_start_up_imports_nothing_heavy(args: tuple[str, ...]) -> None:
    modules = loaded_modules(*args)
    heavy = sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert not heavy, f"`compactlog {' '.join(args)}` imported {heavy[:8]}"


def test_import_compactlog_is_light_and_its_names_still_work() -> None:
    code = ("import sys, compactlog; assert 'pyarrow' not in sys.modules; "
            "from compactlog import LogStore, Record, ProducerRecord, CompactlogError; "
            "print(LogStore.__module__)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip() == "compactlog.storage.store"
