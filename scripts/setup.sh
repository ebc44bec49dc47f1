#!/usr/bin/env bash
# Set up compactlog for development on a fresh machine: check Python and Java, create
# .venv and install the project with its test tools, and install the applications the
# tests run against the server (scripts/setup-apps.sh). Safe to run again: it reinstalls
# only when pyproject.toml (or an application's pins) changed.
set -euo pipefail
cd "$(dirname "$0")/.."

python_bin=${PYTHON:-python3}
if ! "$python_bin" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "compactlog needs Python >= 3.11 (found: $("$python_bin" --version 2>&1 || echo none))." >&2
  echo "Install it, e.g. 'apt-get install python3.11 python3.11-venv', or set PYTHON=/path/to/python3.11." >&2
  exit 1
fi

# Spark (the compaction pipeline) needs Java 17 or newer.
java_major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1 || true)
if [ -z "${java_major}" ] || [ "${java_major}" -lt 17 ]; then
  echo "compactlog's compaction runs on Apache Spark, which needs Java 17 or newer (found: ${java_major:-none})." >&2
  echo "Install it, e.g. 'apt-get install openjdk-17-jre-headless', or set JAVA_HOME." >&2
  exit 1
fi

# kcat, a command-line Kafka client on the system's librdkafka: the server scenarios in
# tests/test_server_scenarios.py drive it. Installed with apt-get (as root, or through
# sudo) when missing.
if ! command -v kcat >/dev/null 2>&1; then
  apt_prefix=unavailable
  if command -v apt-get >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ]; then
      apt_prefix=
    elif command -v sudo >/dev/null 2>&1; then
      apt_prefix=sudo
    fi
  fi
  if [ "$apt_prefix" != unavailable ]; then
    echo "kcat is missing; installing it: ${apt_prefix:+$apt_prefix }apt-get install -y kcat" >&2
    $apt_prefix env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || true
    $apt_prefix env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat >&2 || true
  fi
  if ! command -v kcat >/dev/null 2>&1; then
    echo "compactlog's server tests need kcat (the Kafka command-line client), and it could not be installed here." >&2
    echo "Install it, e.g. 'sudo apt-get install kcat' (Debian, Ubuntu) or 'brew install kcat' (macOS), and run this again." >&2
    exit 1
  fi
fi

if [ ! -x .venv/bin/python ]; then
  "$python_bin" -m venv .venv
fi
stamp=.venv/.compactlog-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[dev]"
  echo "$want" > "$stamp"
fi

# The applications of tests/test_apps_*.py (Quix Streams, faust-streaming, KafkaJS), each
# with its own pinned Kafka client: see scripts/setup-apps.sh.
PYTHON="$python_bin" bash scripts/setup-apps.sh
