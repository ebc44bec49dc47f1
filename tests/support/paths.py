"""Where things are: the tests folder (on the PYTHONPATH of the processes tests start, for
`local_engine:...` and `function:user_strategies:...`), the support package and the
checkout's root."""

from __future__ import annotations

from pathlib import Path

SUPPORT_DIR = Path(__file__).resolve().parent
TESTS_DIR = SUPPORT_DIR.parent
ROOT = TESTS_DIR.parent
