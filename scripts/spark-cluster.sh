#!/usr/bin/env bash
# A Spark standalone cluster (one master, one worker) from the pyspark that compactlog
# installs: pip's pyspark has no start-master.sh / start-worker.sh, but its
# spark-daemon.sh runs the same classes.
#
#   scripts/spark-cluster.sh start     # master on spark://127.0.0.1:7077, one worker
#   scripts/spark-cluster.sh status
#   scripts/spark-cluster.sh stop
#
# Then: compactlog compact TOPIC --spark-master spark://127.0.0.1:7077
#
# Settings (environment): SPARK_MASTER_HOST (127.0.0.1), SPARK_MASTER_PORT (7077),
# SPARK_MASTER_WEBUI_PORT (18080), SPARK_WORKER_WEBUI_PORT (18081), SPARK_WORKER_CORES
# (all), SPARK_WORKER_MEMORY (4g), SPARK_CLUSTER_DIR (./spark-cluster: logs, pids, work).
# For workers on other machines, run the worker part there with the master's address, and
# keep the data directory on a filesystem every machine mounts at the same path.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-$PWD/.venv/bin/python}"
export SPARK_HOME="${SPARK_HOME:-$("$PYTHON" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')}"
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$PYTHON}"
HOST="${SPARK_MASTER_HOST:-127.0.0.1}"
PORT="${SPARK_MASTER_PORT:-7077}"
MASTER_UI="${SPARK_MASTER_WEBUI_PORT:-18080}"
WORKER_UI="${SPARK_WORKER_WEBUI_PORT:-18081}"
CORES="${SPARK_WORKER_CORES:-$(nproc)}"
MEMORY="${SPARK_WORKER_MEMORY:-4g}"
DIR="$(mkdir -p "${SPARK_CLUSTER_DIR:-./spark-cluster}" && cd "${SPARK_CLUSTER_DIR:-./spark-cluster}" && pwd)"
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-$HOST}"
export SPARK_LOG_DIR="$DIR/logs" SPARK_PID_DIR="$DIR/pids" SPARK_WORKER_DIR="$DIR/work"
# An identifier for the pid files, so that two clusters on one machine do not collide.
export SPARK_IDENT_STRING="compactlog-$PORT"
DAEMON="$SPARK_HOME/sbin/spark-daemon.sh"
MASTER_CLASS=org.apache.spark.deploy.master.Master
WORKER_CLASS=org.apache.spark.deploy.worker.Worker

alive_workers() {
    "$PYTHON" - "$HOST" "$MASTER_UI" <<'EOF'
import json, sys, urllib.request
try:
    with urllib.request.urlopen(f"http://{sys.argv[1]}:{sys.argv[2]}/json/", timeout=2) as r:
        print(json.load(r).get("aliveworkers", 0))
except OSError:
    print(-1)
EOF
}

case "${1:-}" in
start)
    "$DAEMON" start "$MASTER_CLASS" 1 --host "$HOST" --port "$PORT" --webui-port "$MASTER_UI"
    "$DAEMON" start "$WORKER_CLASS" 1 --host "$HOST" --webui-port "$WORKER_UI" \
        --cores "$CORES" --memory "$MEMORY" "spark://$HOST:$PORT"
    for _ in $(seq 1 120); do
        if [ "$(alive_workers)" -ge 1 ]; then
            echo "Spark master spark://$HOST:$PORT is up with 1 worker ($CORES cores, $MEMORY);" \
                 "UI http://$HOST:$MASTER_UI; logs in $SPARK_LOG_DIR"
            exit 0
        fi
        sleep 0.5
    done
    echo "error: the worker did not register with the master within 60 s; see $SPARK_LOG_DIR" >&2
    exit 1
    ;;
stop)
    "$DAEMON" stop "$WORKER_CLASS" 1 || true
    "$DAEMON" stop "$MASTER_CLASS" 1 || true
    ;;
status)
    workers="$(alive_workers)"
    if [ "$workers" -lt 0 ]; then
        echo "no master answers on http://$HOST:$MASTER_UI"
        exit 1
    fi
    echo "spark://$HOST:$PORT: $workers worker(s) alive"
    ;;
*)
    echo "usage: $0 start|stop|status   (see the comments at the top for settings)" >&2
    exit 2
    ;;
esac
