#!/usr/bin/env bash
# What an idle cluster costs: starts a 3-node bucketd cluster on loopback with N groups (default:
# 16 and 256), waits until every slot is served and the leaderships have settled, then sums the
# three processes' utime + stime from /proc over a window with no client at all.
#
#   bash benches/idle.sh                # 16 and 256 groups
#   GROUPS_LIST="64" bash benches/idle.sh
#   WAIT_S=40 WINDOW_S=20 bash benches/idle.sh
#
# Settled means: at least WAIT_S seconds after start-up, and every node's count of quiet groups
# led (INFO cluster) unchanged for SETTLE_S seconds with the nodes at most 2 apart (the metadata
# group comes on top of the shard groups), for at most SETTLE_MAX_S seconds. The first elections
# can hand one node most of the groups, and the leader balancer moves them one at a time; a
# window taken during that measures the moves, not an idle cluster.
#
# Prints, per group count, the CPU of all three nodes together as a percentage of one core, and
# how many groups each node leads quietly (idle groups stop heartbeating; see INFO cluster).
set -euo pipefail
cd "$(dirname "$0")/.."

GROUPS_LIST=${GROUPS_LIST:-"16 256"}
WAIT_S=${WAIT_S:-10}
WINDOW_S=${WINDOW_S:-20}
SETTLE_S=${SETTLE_S:-5}
SETTLE_MAX_S=${SETTLE_MAX_S:-180}
BIN_GIVEN=${BIN:-}
BIN=${BIN:-target/release/bucketd}
command -v redis-cli >/dev/null || { echo "needs redis-cli (apt-get install redis-tools)" >&2; exit 2; }
if [[ -z ${BIN_GIVEN:-} ]]; then cargo build --release --quiet; fi

WORK=$(mktemp -d /tmp/bucketd-idle.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]:-}"; do [[ -n $p ]] && kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

ports=($(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(6)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
))
tick=$(getconf CLK_TCK)
quiet_counts() {
    local i q out=""
    for i in 0 1 2; do
        q=$(timeout 2 redis-cli -p "${ports[i]}" INFO cluster 2>/dev/null | tr -d '\r' |
            awk -F: '$1 == "cluster_quiet_groups" { print $2 }') || q=""
        out+="${out:+ / }${q:-?}"
    done
    echo "$out"
}
# settled: the quiet counts are known and at most 2 apart.
even() { tr -d ' ' <<<"$1" | awk -F/ '$0 !~ /\?/ { m = $1; n = $1; for (i = 2; i <= NF; i++) { if ($i > m) m = $i; if ($i < n) n = $i }; exit !(m - n <= 2) } { exit 1 }'; }
cpu_ticks() {
    local s=0 f
    for p in "${PIDS[@]}"; do
        read -r -a f <"/proc/$p/stat"
        s=$((s + f[13] + f[14]))
    done
    echo "$s"
}

for groups in $GROUPS_LIST; do
    nodes=""
    for i in 0 1 2; do
        nodes+="${nodes:+,}$((i + 1)):127.0.0.1:${ports[i]}:${ports[i + 3]}"
    done
    PIDS=()
    for i in 0 1 2; do
        "$BIN" --port "${ports[i]}" --shards 1 --cluster-nodes "$nodes" --node-id $((i + 1)) \
            --groups "$groups" --data-dir "$WORK/g$groups-n$i" >"$WORK/g$groups-n$i.log" 2>&1 &
        PIDS+=($!)
    done
    up=0
    for _ in $(seq 1 300); do
        if redis-cli -p "${ports[0]}" CLUSTER INFO 2>/dev/null | grep -q "cluster_state:ok"; then
            up=1
            break
        fi
        sleep 0.1
    done
    ((up)) || { echo "the $groups-group cluster did not come up; see $WORK" >&2; exit 1; }
    started=$SECONDS
    sleep "$WAIT_S"
    # Counted in seconds of the clock, not in rounds: each round also waits for three INFOs.
    prev="" since=$SECONDS
    while ((SECONDS - since < SETTLE_S && SECONDS - started < WAIT_S + SETTLE_MAX_S)); do
        cur=$(quiet_counts)
        if [[ $cur != "$prev" ]] || ! even "$cur"; then since=$SECONDS; fi
        prev=$cur
        sleep 1
    done
    ((SECONDS - since >= SETTLE_S)) || echo "warning: leaderships not settled after ${SETTLE_MAX_S}s: $prev" >&2
    a=$(cpu_ticks)
    sleep "$WINDOW_S"
    b=$(cpu_ticks)
    quiet=$(quiet_counts)
    pct=$(awk -v d=$((b - a)) -v t="$tick" -v w="$WINDOW_S" 'BEGIN { printf "%.1f", d * 100 / t / w }')
    echo "groups=$groups idle_cpu_all_nodes=${pct}% of one core (over ${WINDOW_S}s from $((SECONDS - started - WINDOW_S))s after the cluster was up; clock tick $((1000 / tick)) ms); quiet groups led per node: $quiet"
    for p in "${PIDS[@]}"; do kill "$p"; done
    wait 2>/dev/null || true
    PIDS=()
done
