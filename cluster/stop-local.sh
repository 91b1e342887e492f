#!/usr/bin/env bash
# Stops the nodes started by cluster/start-local.sh (SIGTERM, then SIGKILL after 5 s).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${DATA_DIR:-cluster/data}
for f in "$DATA_DIR"/node-*.pid; do
  [ -e "$f" ] || continue
  pid=$(cat "$f")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$f"
done
