#!/usr/bin/env bash
# Set up (if needed) and run every check: ruff, mypy, the import layers (import-linter,
# contracts in pyproject.toml), and the pytest suite (tests marked
# slow only with --runslow or a -m that selects them).
# Extra arguments go to pytest, e.g. `scripts/test.sh --runslow` for the slow tests too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev  # the test tools, kcat and the test applications too
.venv/bin/ruff check src tests bench examples
.venv/bin/mypy
(cd src && ../.venv/bin/lint-imports --config ../pyproject.toml)
.venv/bin/python -m pytest "$@"
