#!/usr/bin/env bash
# CPU per request of the server process, bucketd beside Redis, on the standalone hot path.
#
# Both servers run pinned to one core (CORE_SERVER), redis-benchmark to another
# (CORE_CLIENT). For each workload the server's utime+stime (from /proc/PID/stat) is read
# before and after a run of N requests at pipeline 16 from 50 clients; the servers take turns
# run by run (so noise hits both alike), the keyspace is flushed before every run, and each
# figure is the median of REPS runs. CL.THROTTLE has no Redis counterpart: its rows are
# compared with Redis's INCR on the same keys.
#
# usage: benches/cpu.sh [--reps N] [--requests N] [--callgrind] [--callgrind-requests N]
#                       [--bin PATH] [--only WORKLOAD,...]
#   --callgrind  also counts instructions per request under valgrind (slow; fewer requests)
#   --memory     also loads 1,000,000 distinct `CL.THROTTLE key 99 10 3600 1` into a fresh
#                bucketd (`redis-cli --pipe`) and reports its VmRSS growth per key
#
# Workloads: ping, incr_rand, throttle_rand (1,000,000 random keys), incr_hot, throttle_hot
# (100 keys).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
# shellcheck source=ports.sh
source "$here/ports.sh"

BIN="$root/target/release/bucketd"
REPS=3
N=2000000
CG=0
CG_N=200000
MEM=0
MEM_KEYS=1000000
ONLY=""
CORE_SERVER="${CORE_SERVER:-1}"
CORE_CLIENT="${CORE_CLIENT:-0}"
while [ $# -gt 0 ]; do
    case "$1" in
        --reps) REPS="$2"; shift 2 ;;
        --requests) N="$2"; shift 2 ;;
        --callgrind) CG=1; shift ;;
        --memory) MEM=1; shift ;;
        --callgrind-requests) CG_N="$2"; shift 2 ;;
        --bin) BIN="$2"; shift 2 ;;
        --only) ONLY="$2"; shift 2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done

for tool in redis-server redis-benchmark redis-cli taskset; do
    command -v "$tool" >/dev/null || { echo "cpu.sh: $tool is not installed" >&2; exit 1; }
done
[ -x "$BIN" ] || { echo "cpu.sh: no $BIN (cargo build --release)" >&2; exit 1; }

TICK_NS=$((1000000000 / $(getconf CLK_TCK)))
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

# name | -r | command (bucketd) | command (Redis; empty: the row reuses Redis's INCR)
WORKLOADS=(
    "ping|0|PING|PING"
    "incr_rand|1000000|INCR bucket:__rand_int__|INCR bucket:__rand_int__"
    "throttle_rand|1000000|CL.THROTTLE bucket:__rand_int__ 99 10 1|"
    "incr_hot|100|INCR bucket:__rand_int__|INCR bucket:__rand_int__"
    "throttle_hot|100|CL.THROTTLE bucket:__rand_int__ 99 10 1|"
    "evalsha_rand|1000000|EVALSHA @SHA@ 1 bucket:__rand_int__ 100 10 1|EVALSHA @SHA@ 1 bucket:__rand_int__ 100 10 1"
)
selected() {
    [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]
}
# The Redis row a bucketd workload is compared with.
redis_peer() {
    case "$1" in
        throttle_rand) echo incr_rand ;;
        throttle_hot) echo incr_hot ;;
        *) echo "$1" ;;
    esac
}

wait_up() {
    local port=$1
    for _ in $(seq 1 100); do
        redis-cli -p "$port" PING >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "cpu.sh: server on $port did not come up" >&2
    exit 1
}

# Clock ticks the process has run, user and system (fields 14 and 15, after the command name).
ticks() {
    sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'
}

# load_script PORT: loads benches/token_bucket.lua (the EVALSHA workload's script) into the
# server on PORT and prints its SHA1.
load_script() {
    redis-cli -p "$1" SCRIPT LOAD "$(cat "$here/token_bucket.lua")"
}

# bench PORT RANDOM N CMD...: one redis-benchmark run (@SHA@ in CMD is the loaded script's SHA1).
bench() {
    local port=$1 r=$2 n=$3
    shift 3
    local sha
    sha=$(load_script "$port")
    set -- "${@//@SHA@/$sha}"
    local rand=()
    [ "$r" -gt 0 ] && rand=(-r "$r")
    timeout 600 taskset -c "$CORE_CLIENT" redis-benchmark -p "$port" -c 50 -n "$n" "${rand[@]}" \
        -P 16 -q "$@" >/dev/null 2>&1
}

# measure PID PORT RANDOM CMD: ns of server CPU per request over one run.
measure() {
    local pid=$1 port=$2 r=$3 cmd=$4
    redis-cli -p "$port" FLUSHALL >/dev/null
    local before after
    before=$(ticks "$pid")
    # shellcheck disable=SC2086
    bench "$port" "$r" "$N" $cmd
    after=$(ticks "$pid")
    echo $(((after - before) * TICK_NS / N))
}

median() {
    sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : int((a[NR/2] + a[NR/2+1]) / 2)}'
}

read -r BPORT RPORT CGPORT <<<"$(free_ports 3)"
taskset -c "$CORE_SERVER" "$BIN" --bind 127.0.0.1 --port "$BPORT" --shards 1 --log warn \
    >"$WORK/bucketd.log" 2>&1 &
BPID=$!
PIDS+=("$BPID")
taskset -c "$CORE_SERVER" redis-server --bind 127.0.0.1 --port "$RPORT" --save '' \
    --appendonly no --dir "$WORK" >"$WORK/redis.log" 2>&1 &
RPID=$!
PIDS+=("$RPID")
wait_up "$BPORT"
wait_up "$RPORT"

declare -A SAMPLES
for rep in $(seq 1 "$REPS"); do
    for w in "${WORKLOADS[@]}"; do
        IFS='|' read -r name r bcmd rcmd <<<"$w"
        selected "$name" || continue
        # Alternate which server goes first, so neither always runs on a warmer machine.
        if [ $((rep % 2)) -eq 1 ]; then order="b r"; else order="r b"; fi
        for who in $order; do
            if [ "$who" = b ]; then
                SAMPLES["b:$name"]+="$(measure "$BPID" "$BPORT" "$r" "$bcmd") "
            elif [ -n "$rcmd" ]; then
                SAMPLES["r:$name"]+="$(measure "$RPID" "$RPORT" "$r" "$rcmd") "
            fi
        done
    done
    echo "run $rep of $REPS done" >&2
done

med() {
    tr ' ' '\n' <<<"${SAMPLES[$1]:-}" | { grep -v '^$' || true; } | median
}
ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'
}

# Instructions per request under callgrind, counted from zero over one run of each workload.
declare -A INSTR
if [ "$CG" = 1 ]; then
    command -v valgrind >/dev/null || { echo "cpu.sh: valgrind is not installed" >&2; exit 1; }
    cg_run() {
        local label=$1 port=$2 r=$3 cmd=$4
        shift 4
        local out="$WORK/cg.$label"
        timeout 1200 valgrind --tool=callgrind --instr-atstart=no \
            --callgrind-out-file="$out" "$@" >"$WORK/cg.$label.log" 2>&1 &
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
        # Counted only over the measured run: instrumentation is on for it alone.
        callgrind_control -i on "$vpid" >/dev/null 2>&1
        # shellcheck disable=SC2086
        bench "$port" "$r" "$CG_N" $cmd
        callgrind_control -i off "$vpid" >/dev/null 2>&1
        kill "$vpid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        local total
        total=$(grep -h '^totals:' "$out" | awk '{print $2}' | head -1)
        echo $((${total:-0} / CG_N))
    }
    for w in "${WORKLOADS[@]}"; do
        IFS='|' read -r name r bcmd rcmd <<<"$w"
        selected "$name" || continue
        INSTR["b:$name"]=$(cg_run "b.$name" "$CGPORT" "$r" "$bcmd" \
            "$BIN" --bind 127.0.0.1 --port "$CGPORT" --shards 1 --log warn)
        if [ -n "$rcmd" ]; then
            INSTR["r:$name"]=$(cg_run "r.$name" "$CGPORT" "$r" "$rcmd" \
                redis-server --bind 127.0.0.1 --port "$CGPORT" --save '' --appendonly no \
                --dir "$WORK")
        fi
    done
fi

echo
echo "CPU per request (ns, utime+stime of the server / requests; median of $REPS runs of $N"
echo "requests, -c 50 -P 16; bucketd \`--shards 1\`; both servers on core $CORE_SERVER)"
echo
if [ "$CG" = 1 ]; then
    echo "| workload | bucketd ns | Redis ns | ratio | bucketd instr | Redis instr | ratio |"
    echo "|---|---|---|---|---|---|---|"
else
    echo "| workload | bucketd ns | Redis ns | ratio |"
    echo "|---|---|---|---|"
fi
for w in "${WORKLOADS[@]}"; do
    IFS='|' read -r name _ bcmd _ <<<"$w"
    selected "$name" || continue
    peer=$(redis_peer "$name")
    b=$(med "b:$name")
    rr=$(med "r:$peer")
    label="$name (\`${bcmd%% *}\`"
    [ "$peer" != "$name" ] && label+=" vs Redis INCR"
    label+=")"
    row="| $label | $b | $rr | $(ratio "$b" "$rr") |"
    if [ "$CG" = 1 ]; then
        bi=${INSTR["b:$name"]:-}
        ri=${INSTR["r:$peer"]:-}
        row+=" $bi | $ri | $(ratio "$bi" "$ri") |"
    fi
    echo "$row"
done
if [ "$MEM" = 1 ]; then
    read -r MPORT <<<"$(free_ports 1)"
    python3 "$here/gen_resp.py" "$MEM_KEYS" "$WORK/mem.resp" CL.THROTTLE '{key}' 99 10 3600 1
    taskset -c "$CORE_SERVER" "$BIN" --bind 127.0.0.1 --port "$MPORT" --shards 1 --log warn \
        >"$WORK/mem.log" 2>&1 &
    MPID=$!
    PIDS+=("$MPID")
    wait_up "$MPORT"
    rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
    before=$(rss "$MPID")
    timeout 600 redis-cli -p "$MPORT" --pipe --pipe-timeout 60 <"$WORK/mem.resp" >/dev/null
    after=$(rss "$MPID")
    keys=$(redis-cli -p "$MPORT" DBSIZE)
    echo
    awk -v a="$after" -v b="$before" -v k="$keys" 'BEGIN {
        printf "bytes per bucket: %.1f (VmRSS %d -> %d KiB, %d keys)\n", (a - b) * 1024 / k, b, a, k }'
fi

echo
echo "samples (ns):"
for k in $(printf '%s\n' "${!SAMPLES[@]}" | sort); do
    echo "  $k: ${SAMPLES[$k]}"
done
