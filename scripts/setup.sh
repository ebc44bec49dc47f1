#!/usr/bin/env bash
# Set up compactlog on a fresh machine: check Python and Java, create .venv and install
# the project into it.
#
#   scripts/setup.sh         compactlog alone: what scripts/demo.sh needs (no root, no
#                            apt, no Node.js)
#   scripts/setup.sh --dev   also the test tools (the `dev` extra), kcat (with apt when
#                            missing) and the applications the tests run against the
#                            server (scripts/setup-apps.sh): what scripts/test.sh runs
#
# Safe to run again: it reinstalls only when pyproject.toml (or an application's pins)
# changed, or when --dev asks for more than is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

dev=false
case "${1:-}" in
  --dev) dev=true ;;
  "") ;;
  *) echo "usage: scripts/setup.sh [--dev]" >&2; exit 2 ;;
esac

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
# tests/server/test_server_scenarios.py drive it. Installed with apt-get (as root, or through
# sudo) when missing; only for the tests.
if $dev && ! command -v kcat >/dev/null 2>&1; then
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
# The stamp: the checksum of the pyproject.toml installed, and what was installed
# ("base" or "dev"; a stamp of an older setup, the checksum alone, was a dev install).
stamp=.venv/.compactlog-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
have=$(cat "$stamp" 2>/dev/null || true)
case "$have" in
  "$want"|"$want dev") installed=dev ;;
  "$want base") installed=base ;;
  *) installed=none ;;
esac
if [ "$installed" = none ] || { $dev && [ "$installed" = base ]; }; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  if $dev; then
    .venv/bin/python -m pip install --quiet -e ".[dev]"
    echo "$want dev" > "$stamp"
  else
    .venv/bin/python -m pip install --quiet -e .
    echo "$want base" > "$stamp"
  fi
fi

# The applications of tests/apps/test_apps_*.py (Quix Streams, faust-streaming, KafkaJS), each
# with its own pinned Kafka client: see scripts/setup-apps.sh.
if $dev; then
  PYTHON="$python_bin" bash scripts/setup-apps.sh
fi
