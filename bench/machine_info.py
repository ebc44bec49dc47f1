"""What every benchmark prints about the machine it ran on."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import psutil  # type: ignore[import-untyped]


def cpu_model() -> str:
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, str]:
    """CPU, cores, memory, OS and Python; each bench adds the versions it depends on."""
    return {
        "cpu": cpu_model(),
        "cores": str(os.cpu_count()),
        "memory": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def commit() -> str:
    """The short commit of the checkout this bench runs from (empty outside git)."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False, cwd=Path(__file__).parent).stdout.strip()
