"""The code blocks of README.md and docs/*.md, and what each says about how it is tested.

Every shell, Python and TOML block carries a `docs-test` marker, an HTML comment on the
lines just above its fence (other comments may sit beside it):

    <!-- docs-test: session readme -->         run in order with the other blocks of the
                                               session `readme` (tests/docs/test_docs_run.py)
    <!-- docs-test: by tests/docs/test_x.py --> run as written by that test, which names
                                               the page it reads
    <!-- docs-test: config server -->          a server settings file: parsed by the
                                               server's own loader
    <!-- docs-test: skip REASON -->            not run, and the page says why

test_docs_run.py::test_every_block_says_how_it_is_tested keeps every block marked, so a
new example cannot go untested without a reason on the page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from support.paths import ROOT

PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
RUNNABLE = {"sh", "bash", "shell", "python", "toml"}  # blocks of other languages are output
FENCE = re.compile(r"^\s*```(\S*)\s*$")
COMMENT = re.compile(r"^\s*<!--(.*?)-->\s*$")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the checkout, e.g. "docs/server.md"
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str | None  # what follows "docs-test:" in the comment above, if any

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def directive(self) -> str:
        return (self.marker or "").split(" ", 1)[0]

    @property
    def argument(self) -> str:
        parts = (self.marker or "").split(" ", 1)
        return parts[1].strip() if len(parts) > 1 else ""


def page_blocks(page: Path) -> list[Block]:
    lines = page.read_text().split("\n")
    found: list[Block] = []
    opened: tuple[int, str] | None = None
    for number, line in enumerate(lines):
        fence = FENCE.match(line)
        if fence is None:
            continue
        if opened is None:
            opened = (number, fence.group(1))
            continue
        start, lang = opened
        opened = None
        found.append(Block(page=str(page.relative_to(ROOT)), line=start + 1, lang=lang,
                           text="\n".join(lines[start + 1:number]) + "\n",
                           marker=marker_above(lines, start)))
    return found


def marker_above(lines: list[str], fence: int) -> str | None:
    """The docs-test marker among the comment lines directly above line `fence`."""
    above = fence - 1
    while above >= 0:
        comment = COMMENT.match(lines[above])
        if comment is None:
            return None
        body = comment.group(1).strip()
        if body.startswith("docs-test:"):
            return body.removeprefix("docs-test:").strip()
        above -= 1
    return None


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in page_blocks(page)]


def runnable_blocks() -> list[Block]:
    return [block for block in all_blocks() if block.lang in RUNNABLE]


def session(name: str) -> list[Block]:
    """The blocks of a session, in page order (pages in PAGES order)."""
    return [block for block in runnable_blocks()
            if block.directive == "session" and block.argument == name]


def printed(block: Block) -> str | None:
    """What a Python block says it prints: the `#   ` lines after each `# prints:`,
    joined in order (None when it says nothing)."""
    if "# prints:" not in block.text:
        return None
    said = []
    for section in block.text.split("# prints:")[1:]:
        for line in section.split("\n")[1:]:
            if not line.startswith("#   "):
                break
            said.append(line.removeprefix("#   "))
    return "\n".join(said) + "\n"
