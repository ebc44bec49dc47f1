#!/usr/bin/env bash
# Set up (if needed) and run the main job on the embedded default: a data directory
# under the current folder (./compactlog-data), no server.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bash "$here/scripts/setup.sh"  # compactlog alone: the demo needs no test tools
exec "$here/.venv/bin/python" "$here/examples/demo.py" "$@"
