"""Rich consoles for the commands' output.

A terminal gets its own width. Piped output (a file, `| less`, a CI log) would get
Rich's fallback of 80 columns, which cuts wide tables into ellipses; there the width is
taken from $COLUMNS when set, else made wide enough that tables print whole.
"""

from __future__ import annotations

import os
import sys

from rich import box
from rich.console import Console
from rich.table import Table

PIPED_WIDTH = 200


def _width(stream_is_tty: bool) -> int | None:
    if stream_is_tty or os.environ.get("COLUMNS"):
        return None  # Rich measures the terminal, or reads $COLUMNS
    return PIPED_WIDTH


def stdout_console() -> Console:
    return Console(width=_width(sys.stdout.isatty()))


def stderr_console() -> Console:
    return Console(stderr=True, width=_width(sys.stderr.isatty()))



def narrow_table(title: str, *headers: str, right: tuple[str, ...] | None = None) -> Table:
    """A table that fits 80 columns: no borders at the sides, headers given on two lines
    where they are two words (`"records\\nin"`), and cells that fold rather than lose
    their end to an ellipsis when a value is wider than its column. `right` columns are
    right-justified (by default every column but the first)."""
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False,
                  padding=(0, 1, 0, 0))  # with the column divider: two spaces
    for index, header in enumerate(headers):
        justify = header in right if right is not None else index > 0
        table.add_column(header, overflow="fold", justify="right" if justify else "left")
    return table
