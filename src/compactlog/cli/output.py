"""Rich consoles for the commands' output.

A terminal gets its own width. Piped output (a file, `| less`, a CI log) would get
Rich's fallback of 80 columns, which cuts wide tables into ellipses; there the width is
taken from $COLUMNS when set, else made wide enough that tables print whole.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console

PIPED_WIDTH = 200


def _width(stream_is_tty: bool) -> int | None:
    if stream_is_tty or os.environ.get("COLUMNS"):
        return None  # Rich measures the terminal, or reads $COLUMNS
    return PIPED_WIDTH


def stdout_console() -> Console:
    return Console(width=_width(sys.stdout.isatty()))


def stderr_console() -> Console:
    return Console(stderr=True, width=_width(sys.stderr.isatty()))
