"""What a server process has cost, read from /proc rather than timed from outside.

CPU is the process' user + system time (/proc/PID/stat fields 14 and 15, in clock
ticks), so other load on the machine does not change it. Peak memory is VmHWM from
/proc/PID/status; writing 5 to /proc/PID/clear_refs resets it to the current RSS
(Linux >= 4.0, for a process of our own), so one request's peak can be read alone.
"""

from __future__ import annotations

import os

_TICKS = os.sysconf("SC_CLK_TCK")
MIB = 1 << 20


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used so far."""
    with open(f"/proc/{pid}/stat") as stat:
        text = stat.read()
    # The command name (field 2) may hold spaces: fields are counted after its ')'.
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _status_bytes(pid: int, name: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {name} for process {pid}")


def rss(pid: int) -> int:
    return _status_bytes(pid, "VmRSS")


def peak_rss(pid: int) -> int:
    """VmHWM: the highest RSS since the start or the last `reset_peak`."""
    return _status_bytes(pid, "VmHWM")


def reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as clear:
        clear.write("5")


class Usage:
    """CPU and peak RSS of a process over a `with` block (`cpu`, `peak_growth`)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.cpu = 0.0
        self.peak_growth = 0
        self._cpu_before = 0.0
        self._rss_before = 0

    def __enter__(self) -> Usage:
        reset_peak(self.pid)
        self._rss_before = rss(self.pid)
        self._cpu_before = cpu_seconds(self.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu = cpu_seconds(self.pid) - self._cpu_before
        self.peak_growth = peak_rss(self.pid) - self._rss_before

    def __str__(self) -> str:
        return f"{self.cpu:.2f} s CPU, peak RSS +{self.peak_growth / MIB:.0f} MiB"
