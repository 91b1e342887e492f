#!/usr/bin/env bash
# Two builds of bucketd side by side, to tell whether a change moved the figures:
#
#   bash benches/ab.sh OLD_BINARY NEW_BINARY            # standalone and cluster
#   MODE=standalone bash benches/ab.sh OLD NEW          # one of them only
#
# Starts a standalone node (`--shards 1`) and a 3-node cluster of each build, every server
# pinned to core SERVER_CPU and redis-benchmark to CLIENT_CPU, then runs the same bounded
# redis-benchmark loads against A and B alternately, ROUNDS times, and prints the median ops/s
# and server CPU per request (all of a side's processes, from the scheduler's own account) of
# each with the ratios B / A. Both builds run at once on the same machine, so what the machine
# does to one it does to the other. In cluster mode CPU per request is the figure to read:
# redis-benchmark --cluster ends a run only at a 250 ms progress tick, so a short run's ops/s
# moves in steps of that tick. Settings: ROUNDS (3), N_P1 (100000),
# N_P16 (1000000), CLIENTS (50), KEYSPACE (1000000), SERVER_CPU (1), CLIENT_CPU (0).
set -euo pipefail

OLD=${1:?usage: bash benches/ab.sh OLD_BINARY NEW_BINARY}
NEW=${2:?usage: bash benches/ab.sh OLD_BINARY NEW_BINARY}
MODE=${MODE:-both}
ROUNDS=${ROUNDS:-3}
N_P1=${N_P1:-100000}
N_P16=${N_P16:-1000000}
CLIENTS=${CLIENTS:-50}
KEYSPACE=${KEYSPACE:-1000000}
SERVER_CPU=${SERVER_CPU:-1}
CLIENT_CPU=${CLIENT_CPU:-0}
HOST=127.0.0.1
WORK=$(mktemp -d /tmp/bucketd-ab.XXXXXX)
# Servers are started from command substitutions (subshells), so their pids go to a file.
PIDFILE=$WORK/pids
touch "$PIDFILE"

cleanup() {
    local p
    while read -r p; do kill "$p" 2>/dev/null || true; done <"$PIDFILE"
    while read -r p; do
        for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    done <"$PIDFILE"
    rm -rf "$WORK"
}
trap cleanup EXIT

for b in "$OLD" "$NEW"; do [[ -x $b ]] || { echo "no binary at $b" >&2; exit 2; }; done
command -v redis-benchmark >/dev/null || { echo "redis-benchmark is missing" >&2; exit 2; }

# shellcheck source=benches/ports.sh
source "$(dirname "${BASH_SOURCE[0]}")/ports.sh"

# wait_up PORT [cluster]: until the node answers PING (and, for a cluster, every slot is served).
wait_up() {
    local i
    for i in $(seq 1 300); do
        if [[ ${2:-} == cluster ]]; then
            redis-cli -h "$HOST" -p "$1" CLUSTER INFO 2>/dev/null | grep -q cluster_state:ok && return 0
        else
            [[ $(redis-cli -h "$HOST" -p "$1" PING 2>/dev/null) == PONG ]] && return 0
        fi
        sleep 0.1
    done
    echo "node on port $1 did not come up" >&2
    return 1
}

# standalone BIN: starts a node, prints its port.
standalone() {
    local port
    port=$(free_ports 1)
    taskset -c "$SERVER_CPU" "$1" --bind "$HOST" --port "$port" --shards 1 --log warn \
        >"$WORK/standalone-$port.log" 2>&1 &
    echo "$!" >>"$PIDFILE"
    echo "$port $!" >>"$WORK/sides"
    wait_up "$port" >&2
    echo "$port"
}

# cluster BIN: starts a 3-node cluster, prints the first node's port.
cluster() {
    local ports peers nodes="" i pids=""
    read -r -a ports <<<"$(free_ports 6)"
    for i in 0 1 2; do
        nodes+="${nodes:+,}$((i + 1)):$HOST:${ports[$i]}:${ports[$((i + 3))]}"
    done
    for i in 0 1 2; do
        taskset -c "$SERVER_CPU" "$1" --bind "$HOST" --port "${ports[$i]}" --shards 1 \
            --cluster-nodes "$nodes" --node-id $((i + 1)) --data-dir "$WORK/data-${ports[0]}-$i" \
            --log warn >"$WORK/cluster-${ports[$i]}.log" 2>&1 &
        echo "$!" >>"$PIDFILE"
        pids+=" $!"
    done
    echo "${ports[0]}$pids" >>"$WORK/sides"
    wait_up "${ports[0]}" cluster >&2
    echo "${ports[0]}"
}

# CPU time in nanoseconds of the processes serving PORT, summed over their threads.
side_ns() {
    local pid total=0
    for pid in $(awk -v p="$1" '$1 == p { $1 = ""; print }' "$WORK/sides"); do
        total=$((total + $(cpu_ns "$pid")))
    done
    echo "$total"
}

# run PORT PIPELINE N [--cluster] CMD...: one bounded run, prints its requests per second and
# the server CPU per request in ns.
run() {
    local port=$1 pipe=$2 n=$3
    shift 3
    local extra=()
    if [[ $1 == --cluster ]]; then
        extra=(--cluster)
        shift
    fi
    local c0 c1 ops
    c0=$(side_ns "$port")
    ops=$(timeout 300 taskset -c "$CLIENT_CPU" redis-benchmark "${extra[@]}" -h "$HOST" -p "$port" \
        -c "$CLIENTS" -n "$n" -r "$KEYSPACE" -P "$pipe" -q "$@" 2>/dev/null |
        tr '\r' '\n' | awk '/requests per second/ { for (i = 1; i <= NF; i++) if ($(i+1) ~ /^requests/) v = $i } END { print v + 0 }')
    c1=$(side_ns "$port")
    echo "$ops $(((c1 - c0) / n))"
}

median() { tr ' ' '\n' | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

# compare TITLE PORT_A PORT_B PIPELINE N [--cluster] CMD...
compare() {
    local title=$1 pa=$2 pb=$3 pipe=$4 n=$5
    shift 5
    local a=() b=() ca=() cb=() r x y
    for r in $(seq 1 "$ROUNDS"); do
        read -r x y < <(run "$pa" "$pipe" "$n" "$@")
        a+=("$x") ca+=("$y")
        read -r x y < <(run "$pb" "$pipe" "$n" "$@")
        b+=("$x") cb+=("$y")
    done
    local ma mb mca mcb
    ma=$(echo "${a[*]}" | median)
    mb=$(echo "${b[*]}" | median)
    mca=$(echo "${ca[*]}" | median)
    mcb=$(echo "${cb[*]}" | median)
    printf '| %s | P%s | %s | %s | %.2fx | %s | %s | %.3fx |\n' "$title" "$pipe" "$ma" "$mb" \
        "$(awk -v a="$ma" -v b="$mb" 'BEGIN { print (a > 0 ? b / a : 0) }')" \
        "${ca[*]}" "${cb[*]}" "$(awk -v a="$mca" -v b="$mcb" 'BEGIN { print (a > 0 ? b / a : 0) }')"
}

echo "A: $OLD"
echo "B: $NEW"
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $ROUNDS rounds, medians of ops/s, $CLIENTS clients, $KEYSPACE keys"
echo
echo "| load | pipeline | A ops/s | B ops/s | B / A | A CPU ns/request | B CPU ns/request | B / A (medians) |"
echo "|---|---|---|---|---|---|---|---|"
THROTTLE=(CL.THROTTLE 'bucket:__rand_int__' 99 10 1)
if [[ $MODE == both || $MODE == standalone ]]; then
    sa=$(standalone "$OLD")
    sb=$(standalone "$NEW")
    compare "standalone CL.THROTTLE" "$sa" "$sb" 1 "$N_P1" "${THROTTLE[@]}"
    compare "standalone CL.THROTTLE" "$sa" "$sb" 16 "$N_P16" "${THROTTLE[@]}"
    compare "standalone INCR" "$sa" "$sb" 16 "$N_P16" INCR 'counter:__rand_int__'
fi
if [[ $MODE == both || $MODE == cluster ]]; then
    ca=$(cluster "$OLD")
    cb=$(cluster "$NEW")
    CT=(--cluster CL.THROTTLE 'bucket:{tag}:__rand_int__' 99 10 1)
    compare "cluster CL.THROTTLE" "$ca" "$cb" 1 "$N_P1" "${CT[@]}"
    compare "cluster CL.THROTTLE" "$ca" "$cb" 16 "$N_P16" "${CT[@]}"
fi
