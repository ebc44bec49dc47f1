#!/usr/bin/env bash
# Set up (if needed) and run every check: ruff, mypy, and the whole pytest suite.
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not slow"` for the quick run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests bench examples
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
