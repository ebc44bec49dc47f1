"""Start-up of the `compactlog` command: `--version`, `--help` and `topics --help`,
with the floor of any Python command measured in the same run.

Each command runs N times as a fresh process (the installed `compactlog` script, as a
user runs it); the table gives the median and the fastest wall time. Baselines:
`python -c pass` (the interpreter alone) and `python -c "import click"` (the least a
click CLI can import). The target (issue 24, item 7) is under 0.3 s for `--version`
and `--help`; tests/cli/test_cli_imports.py checks what start-up imports, not its time.

    PYTHONPATH=src .venv/bin/python bench/cli_startup.py [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine_info import machine_info

COMPACTLOG = str(Path(sys.executable).with_name("compactlog"))

CASES: list[tuple[str, list[str]]] = [
    ("python -c pass", [sys.executable, "-c", "pass"]),
    ('python -c "import click"', [sys.executable, "-c", "import click"]),
    ("compactlog --version", [COMPACTLOG, "--version"]),
    ("compactlog --help", [COMPACTLOG, "--help"]),
    ("compactlog topics --help", [COMPACTLOG, "topics", "--help"]),
]


def wall_times(command: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, stdout=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="Runs of each command.")
    args = parser.parse_args()
    for key, value in machine_info().items():
        print(f"{key}: {value}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\n| command | median s | fastest s |\n|---|---:|---:|")
    for name, command in CASES:
        times = wall_times(command, args.runs)
        print(f"| `{name}` | {statistics.median(times):.3f} | {min(times):.3f} |")


if __name__ == "__main__":
    main()
