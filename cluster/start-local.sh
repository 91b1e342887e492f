#!/usr/bin/env bash
# Starts a three-node bucketd cluster on loopback (client ports 7001-7003, peer ports
# 17001-17003), each node with its own data directory, and waits until every slot is served.
# Stop it with cluster/stop-local.sh. Override with BASE_PORT, PEER_BASE_PORT, DATA_DIR, SHARD_GROUPS.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_PORT=${BASE_PORT:-7000}
PEER_BASE_PORT=${PEER_BASE_PORT:-17000}
DATA_DIR=${DATA_DIR:-cluster/data}
GROUPS_N=${SHARD_GROUPS:-16}
BIN=${BIN:-target/release/bucketd}

[ -x "$BIN" ] || cargo build --release
mkdir -p "$DATA_DIR"

NODES=""
for i in 1 2 3; do
  NODES+="${NODES:+,}$i:127.0.0.1:$((BASE_PORT + i)):$((PEER_BASE_PORT + i))"
done

for i in 1 2 3; do
  "$BIN" --port $((BASE_PORT + i)) --shards 1 \
    --cluster-nodes "$NODES" --node-id "$i" --groups "$GROUPS_N" \
    --data-dir "$DATA_DIR/node-$i" >"$DATA_DIR/node-$i.log" 2>&1 &
  echo $! >"$DATA_DIR/node-$i.pid"
  echo "node $i: pid $!, clients on 127.0.0.1:$((BASE_PORT + i)), log $DATA_DIR/node-$i.log"
done

# Wait (bounded) until the cluster reports every slot served.
for _ in $(seq 1 100); do
  if state=$(redis-cli -p $((BASE_PORT + 1)) CLUSTER INFO 2>/dev/null) && grep -q "cluster_state:ok" <<<"$state"; then
    echo "cluster is up: redis-cli -c -p $((BASE_PORT + 1))"
    exit 0
  fi
  sleep 0.1
done
echo "cluster did not come up within 10 s; see $DATA_DIR/node-*.log" >&2
exit 1
