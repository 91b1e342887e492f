#!/usr/bin/env bash
# Instructions per request, bucketd beside Redis, counted by valgrind's callgrind: unlike
# timings they do not move with the machine's load (compare.sh runs this for its report; it
# measures the time and the CPU per request itself).
#
# Each workload runs once per server under callgrind: a warm-up, then REQUESTS requests at
# pipeline 16 from 50 clients with instrumentation on for them alone. CL.THROTTLE has no Redis
# counterpart: its rows are set beside Redis's INCR on the same keys. Kernel work (the
# sockets) is not counted.
#
# usage: benches/instructions.sh [--requests N] [--bin PATH] [--only WORKLOAD,...]
#
# Workloads: ping, incr_rand, throttle_rand, evalsha_rand (1,000,000 random keys; evalsha runs
# benches/token_bucket.lua on both servers), incr_hot, throttle_hot (100 keys).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
# shellcheck source=ports.sh
source "$here/ports.sh"

BIN="$root/target/release/bucketd"
N=50000
ONLY=""
while [ $# -gt 0 ]; do
    case "$1" in
        --requests) N="$2"; shift 2 ;;
        --bin) BIN="$2"; shift 2 ;;
        --only) ONLY="$2"; shift 2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done

for tool in redis-server redis-benchmark redis-cli valgrind callgrind_control ss; do
    command -v "$tool" >/dev/null || { echo "instructions.sh: $tool is not installed" >&2; exit 1; }
done
[ -x "$BIN" ] || { echo "instructions.sh: no $BIN (cargo build --release)" >&2; exit 1; }

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    for p in "${PIDS[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

# name | -r | command (bucketd) | command (Redis; empty: the row uses Redis's INCR)
WORKLOADS=(
    "ping|0|PING|PING"
    "incr_rand|1000000|INCR bucket:__rand_int__|INCR bucket:__rand_int__"
    "throttle_rand|1000000|CL.THROTTLE bucket:__rand_int__ 99 10 1|"
    "evalsha_rand|1000000|EVALSHA @SHA@ 1 bucket:__rand_int__ 100 10 1|EVALSHA @SHA@ 1 bucket:__rand_int__ 100 10 1"
    "incr_hot|100|INCR bucket:__rand_int__|INCR bucket:__rand_int__"
    "throttle_hot|100|CL.THROTTLE bucket:__rand_int__ 99 10 1|"
)
selected() {
    [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]
}
# The Redis row a bucketd workload is set beside.
redis_peer() {
    case "$1" in
        throttle_rand) echo incr_rand ;;
        throttle_hot) echo incr_hot ;;
        *) echo "$1" ;;
    esac
}

# bench PORT RANDOM N CMD...: one redis-benchmark run (@SHA@ in CMD is the SHA1 of
# benches/token_bucket.lua, loaded first).
bench() {
    local port=$1 r=$2 n=$3
    shift 3
    local sha
    sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$here/token_bucket.lua")")
    set -- "${@//@SHA@/$sha}"
    local rand=()
    [ "$r" -gt 0 ] && rand=(-r "$r")
    timeout 600 redis-benchmark -p "$port" -c 50 -n "$n" "${rand[@]}" -P 16 -q "$@" \
        >/dev/null 2>&1
}

# count LABEL PORT RANDOM CMD SERVER...: instructions per request of SERVER running CMD.
count() {
    local label=$1 port=$2 r=$3 cmd=$4
    shift 4
    local out="$WORK/cg.$label"
    timeout 1200 valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" "$@" \
        >"$WORK/cg.$label.log" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    for _ in $(seq 1 300); do
        redis-cli -p "$port" PING >/dev/null 2>&1 && break
        sleep 0.2
    done
    # The valgrind process itself ($! is the timeout wrapping it): the one listening.
    local vpid
    vpid=$(ss -ltnpH "sport = :$port" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
    # Warm up (the first requests take the process's one-time costs), then count.
    # shellcheck disable=SC2086
    bench "$port" "$r" 20000 $cmd
    redis-cli -p "$port" FLUSHALL >/dev/null
    callgrind_control -i on "$vpid" >/dev/null 2>&1
    # shellcheck disable=SC2086
    bench "$port" "$r" "$N" $cmd
    callgrind_control -i off "$vpid" >/dev/null 2>&1
    kill "$vpid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    local total
    total=$(grep -h '^totals:' "$out" | awk '{print $2}' | head -1)
    echo $((${total:-0} / N))
}

ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }'
}

read -r PORT <<<"$(free_ports 1)"
# The Redis rows wanted: each selected workload's peer.
declare -A WANT_REDIS
for w in "${WORKLOADS[@]}"; do
    IFS='|' read -r name _ _ _ <<<"$w"
    if selected "$name"; then WANT_REDIS["$(redis_peer "$name")"]=1; fi
done
declare -A INSTR
for w in "${WORKLOADS[@]}"; do
    IFS='|' read -r name r bcmd rcmd <<<"$w"
    if selected "$name"; then
        INSTR["b:$name"]=$(count "b.$name" "$PORT" "$r" "$bcmd" \
            "$BIN" --bind 127.0.0.1 --port "$PORT" --shards 1 --log warn)
    fi
    if [ -n "$rcmd" ] && [ -n "${WANT_REDIS[$name]:-}" ]; then
        INSTR["r:$name"]=$(count "r.$name" "$PORT" "$r" "$rcmd" \
            redis-server --bind 127.0.0.1 --port "$PORT" --save '' --appendonly no --dir "$WORK")
    fi
done

echo "| workload | bucketd instructions | Redis instructions | bucketd / Redis |"
echo "|---|---:|---:|---:|"
for w in "${WORKLOADS[@]}"; do
    IFS='|' read -r name _ bcmd _ <<<"$w"
    selected "$name" || continue
    peer=$(redis_peer "$name")
    b=${INSTR["b:$name"]:-}
    rr=${INSTR["r:$peer"]:-}
    label="$name (\`${bcmd%% *}\`"
    [ "$peer" != "$name" ] && label+=" vs Redis INCR"
    label+=")"
    echo "| $label | $b | $rr | $(ratio "$b" "$rr") |"
done
