#!/usr/bin/env bash
# Install the applications that tests/apps/test_apps_*.py run against `compactlog serve`, as on
# a fresh machine. Called by scripts/setup.sh; safe to run again: each part is reinstalled
# only when its pinned requirements changed (a stamp file holds their checksum).
#
# - Quix Streams and faust-streaming pin their own Kafka clients (Quix an older
#   confluent-kafka than the project's), so each gets a virtualenv of its own under
#   .venv-apps/ (git-ignored), from the exact pins in tests/apps/<app>/requirements.txt;
#   the tests run them as subprocesses with that interpreter.
# - KafkaJS: `npm ci` from tests/apps/kafkajs/package-lock.json into its node_modules/.
set -euo pipefail
cd "$(dirname "$0")/.."

python_bin=${PYTHON:-python3}

for app in quix faust; do
  requirements=tests/apps/$app/requirements.txt
  venv=.venv-apps/$app
  stamp=$venv/.compactlog-installed
  want=$(sha256sum "$requirements" | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    continue
  fi
  echo "setup-apps: installing $app into $venv" >&2
  rm -rf "$venv"
  "$python_bin" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
  "$venv/bin/python" -m pip check >&2
  echo "$want" > "$stamp"
done

# Node.js and npm for KafkaJS: installed with apt-get (as root, or through sudo) when
# missing, as scripts/setup.sh does for kcat.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  apt_prefix=unavailable
  if command -v apt-get >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ]; then
      apt_prefix=
    elif command -v sudo >/dev/null 2>&1; then
      apt_prefix=sudo
    fi
  fi
  if [ "$apt_prefix" != unavailable ]; then
    echo "node or npm is missing; installing them: ${apt_prefix:+$apt_prefix }apt-get install -y nodejs npm" >&2
    $apt_prefix env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || true
    $apt_prefix env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >&2 || true
  fi
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "compactlog's KafkaJS test (tests/apps/test_apps_kafkajs.py) needs Node.js and npm, and they could not be installed here." >&2
    echo "Install them, e.g. 'sudo apt-get install nodejs npm', and run this again." >&2
    exit 1
  fi
fi

kafkajs=tests/apps/kafkajs
stamp=$kafkajs/node_modules/.compactlog-installed
want=$(cat "$kafkajs/package.json" "$kafkajs/package-lock.json" | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup-apps: npm ci in $kafkajs" >&2
  (cd "$kafkajs" && npm ci --no-audit --no-fund --loglevel=error >&2)
  echo "$want" > "$stamp"
fi
