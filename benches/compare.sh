#!/usr/bin/env bash
# Side-by-side comparison of bucketd and Redis on the same hardware, in one command:
#
#   bash benches/compare.sh              # full run (about 15-20 minutes)
#   QUICK=1 bash benches/compare.sh      # smoke run (under 2 minutes)
#   bash benches/compare.sh cluster      # cluster mode (about 15 minutes; QUICK=1 works too)
#   bash benches/compare.sh rls          # Envoy rate limit service, gRPC vs RESP (about 4 minutes)
#   bash benches/compare.sh zlog         # a sliding log on sorted sets (about 10 minutes)
#
# Starts its own redis-server and bucketd on free loopback ports, pins each server to the same
# single core and redis-benchmark to the other, alternates the two servers run by run, and prints
# medians. The report is also written to $OUT (default /tmp/bucketd-compare.md).
#
# Cluster mode (the argument `cluster`, see benches/cluster.sh) does the same for a Redis Cluster
# of 3 primaries + 3 replicas and a 3-node bucketd cluster, all nine servers on the one server
# core, with `redis-benchmark --cluster`, and also measures what each cluster burns while idle.
# Its report goes to $OUT (default /tmp/bucketd-compare-cluster.md).
#
# Rate limit service mode (the argument `rls`, see benches/rls.sh) starts one bucketd node with
# `--grpc-port` and `--rls-config`, and sends it the same limits as ShouldRateLimit calls and as
# BK.CHECK / BK.CHECKALL, with 1 and 3 descriptors, from examples/rls_load.rs; besides calls/s
# and latency it reports the server's CPU time per call. Its report goes to $OUT (default
# /tmp/bucketd-compare-rls.md).
#
# Sliding-log mode (the argument `zlog`, see benches/zlog.sh) drives Redis, bucketd `--shards 1`
# and `--shards 2` with a Tyk-style sliding log (ZREMRANGEBYSCORE, ZADD, ZCARD, EXPIRE as one
# MULTI/EXEC or one EVALSHA) from examples/zlog_load.rs, compares the memory each holds per
# logged request, and runs a script over keys of two shards of one node against the same script
# on one shard. Its report goes to $OUT (default /tmp/bucketd-compare-zlog.md).
#
# Settings (environment): ROUNDS, N_P1, N_P16, CLIENTS, KEYSPACE, MEM_KEYS, RUN_TIMEOUT, OUT,
# CALLGRIND (1, the default: also count instructions per request with valgrind), CG_REQUESTS,
# SERVER_CPU, CLIENT_CPU, BASELINE (the path of another bucketd binary, say one built from an
# earlier commit: its CL.THROTTLE and INCR then run beside the others in every round, and the
# CPU table gains their rows, so a change is measured before and after in one run), and
# QUIET_PCT / QUIET_WAIT_S / QUIET_BUDGET_S (how long to wait for
# other work on the machine to calm down before each run, per run and in total); cluster mode
# also IDLE_S (seconds of each idle-CPU measurement), UP_TIMEOUT (seconds each cluster may take
# to come up), PAUSE_IDLE (1, the default: pause the bucketd nodes while Redis is measured) and
# STABLE_S (seconds bucketd's slot map must hold still before its runs).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCHES="$ROOT/benches"

MODE=${1:-standalone}
case $MODE in
standalone) DEFAULT_OUT=/tmp/bucketd-compare.md DEFAULT_RUN_TIMEOUT=120 ;;
cluster) DEFAULT_OUT=/tmp/bucketd-compare-cluster.md DEFAULT_RUN_TIMEOUT=300 ;;
rls) DEFAULT_OUT=/tmp/bucketd-compare-rls.md DEFAULT_RUN_TIMEOUT=120 ;;
zlog) DEFAULT_OUT=/tmp/bucketd-compare-zlog.md DEFAULT_RUN_TIMEOUT=120 ;;
*)
    echo "usage: bash benches/compare.sh [standalone|cluster|rls|zlog]" >&2
    exit 2
    ;;
esac

QUICK=${QUICK:-0}
if [[ $QUICK == 1 ]]; then
    ROUNDS=${ROUNDS:-1}
    N_P1=${N_P1:-50000}
    N_P16=${N_P16:-400000}
    MEM_KEYS=${MEM_KEYS:-200000}
    QUIET_WAIT_S=${QUIET_WAIT_S:-2}
    QUIET_BUDGET_S=${QUIET_BUDGET_S:-15}
else
    ROUNDS=${ROUNDS:-3}
    if [[ $MODE == cluster ]]; then
        # redis-benchmark --cluster runs a thread per primary, and a threaded run ends only at
        # its next 250 ms progress tick: its time, and so its ops/s, is rounded up to a tick. At
        # about 25 s per run that rounding is under 1%; at 5 s it was up to 5%.
        N_P1=${N_P1:-1000000}
        N_P16=${N_P16:-6000000}
    else
        N_P1=${N_P1:-200000}
        N_P16=${N_P16:-2000000}
    fi
    MEM_KEYS=${MEM_KEYS:-1000000}
    QUIET_WAIT_S=${QUIET_WAIT_S:-15}
    QUIET_BUDGET_S=${QUIET_BUDGET_S:-60}
fi
CLIENTS=${CLIENTS:-50}
KEYSPACE=${KEYSPACE:-1000000}
RUN_TIMEOUT=${RUN_TIMEOUT:-$DEFAULT_RUN_TIMEOUT}
OUT=${OUT:-$DEFAULT_OUT}
SERVER_CPU=${SERVER_CPU:-1}
CLIENT_CPU=${CLIENT_CPU:-0}
HOST=127.0.0.1
# The expiry test's buckets: burst 50 at 10/s, all 50 taken, so each is full again 5 s later
# (long enough for all of them to be loaded first, short enough to watch them go).
EXPIRY_CMD=(CL.THROTTLE '{key}' 49 10 1 50)
EXPIRY_REFILL_S=5
EXPIRY_WAIT_S=30

log() { printf '[compare %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# ---------------------------------------------------------------------------------------------
# Tools, build, scratch space, cleanup
# ---------------------------------------------------------------------------------------------

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null ||
    ! command -v redis-benchmark >/dev/null; then
    log "installing Redis from Debian's packages"
    SUDO=()
    if [[ $(id -u) -ne 0 ]]; then SUDO=(sudo); fi
    "${SUDO[@]}" apt-get update
    "${SUDO[@]}" apt-get install -y redis-server redis-tools
fi
for tool in taskset timeout python3 cargo; do
    command -v "$tool" >/dev/null || die "$tool is required"
done

CORES=$(nproc)
if ((CORES < 2)); then
    log "only $CORES core: server and client will share it"
    SERVER_CPU=0
    CLIENT_CPU=0
fi

TARGET="${CARGO_TARGET_DIR:-$ROOT/target}/release"
if [[ $MODE == rls ]]; then
    log "building bucketd and its load generator (cargo build --release --bin bucketd --example rls_load)"
    (cd "$ROOT" && cargo build --release --bin bucketd --example rls_load >&2)
    LOADGEN="$TARGET/examples/rls_load"
    [[ -x $LOADGEN ]] || die "no load generator at $LOADGEN"
elif [[ $MODE == zlog ]]; then
    log "building bucketd and its load generator (cargo build --release --bin bucketd --example zlog_load)"
    (cd "$ROOT" && cargo build --release --bin bucketd --example zlog_load >&2)
    LOADGEN="$TARGET/examples/zlog_load"
    [[ -x $LOADGEN ]] || die "no load generator at $LOADGEN"
else
    log "building bucketd (cargo build --release)"
    (cd "$ROOT" && cargo build --release >&2)
fi
BIN="$TARGET/bucketd"
[[ -x $BIN ]] || die "no binary at $BIN"

WORK=$(mktemp -d /tmp/bucketd-compare.XXXXXX)
RUNS="$WORK/runs.tsv"
: >"$RUNS"
PIDS=()

stop_pid() {
    local pid=$1 i
    kill -TERM "$pid" 2>/dev/null || return 0
    # A process paused with SIGSTOP (cluster mode pauses idle nodes) acts on TERM only once
    # it runs again.
    kill -CONT "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        stop_pid "$pid"
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# free_ports N, cpu_ns PID
# shellcheck source=benches/ports.sh
source "$BENCHES/ports.sh"

cli() {
    local port=$1
    shift
    timeout 60 redis-cli -h "$HOST" -p "$port" "$@"
}

wait_ready() {
    local port=$1 pid=$2 i
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || return 1
        if [[ $(cli "$port" PING 2>/dev/null) == PONG ]]; then return 0; fi
        sleep 0.1
    done
    return 1
}

# start_redis PORT: starts redis-server pinned to SERVER_CPU; sets STARTED_PID.
start_redis() {
    local port=$1
    taskset -c "$SERVER_CPU" redis-server --bind "$HOST" --port "$port" --save '' \
        --appendonly no --daemonize no --dir "$WORK" >>"$WORK/redis-$port.log" 2>&1 &
    STARTED_PID=$!
    PIDS+=("$STARTED_PID")
    wait_ready "$port" "$STARTED_PID" || die "redis-server on port $port did not start"
}

# start_bucketd PORT SHARDS PIN(yes|no): sets STARTED_PID.
start_bucketd() {
    local port=$1 shards=$2 pin=$3 bin=${4:-$BIN}
    local prefix=()
    if [[ $pin == yes ]]; then prefix=(taskset -c "$SERVER_CPU"); fi
    "${prefix[@]}" "$bin" --bind "$HOST" --port "$port" --shards "$shards" --log warn \
        >>"$WORK/bucketd-$port.log" 2>&1 &
    STARTED_PID=$!
    PIDS+=("$STARTED_PID")
    wait_ready "$port" "$STARTED_PID" || die "bucketd on port $port did not start"
}

stop_server() {
    local pid=$1 kept=() p
    stop_pid "$pid"
    for p in "${PIDS[@]}"; do
        if [[ $p != "$pid" ]]; then kept+=("$p"); fi
    done
    PIDS=("${kept[@]}")
}

# Total CPU time of a process (all threads) in clock ticks.
cpu_ticks() {
    awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"
}

rss_kb() {
    awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"
}

info_field() {
    cli "$1" INFO memory | tr -d '\r' | awk -F: -v k="$2" '$1 == k { print $2 }'
}

# check_reply PORT EXPECTED_PATTERN CMD...: the command must work before it is benchmarked.
check_reply() {
    local port=$1 pattern=$2 reply
    shift 2
    reply=$(cli "$port" "$@" 2>&1 | tr '\n' ' ')
    if ! [[ $reply =~ $pattern ]]; then
        die "port $port: '$*' answered '$reply'"
    fi
}

CLK_TCK=$(getconf CLK_TCK)

# core_ticks CPU: "busy total" clock ticks of one core ("all" for the whole machine).
core_ticks() {
    local name=cpu$1
    [[ $1 == all ]] && name=cpu
    awk -v n="$name" '$1 == n { b = $2 + $3 + $4 + $7 + $8 + $9; print b, b + $5 + $6 }' /proc/stat
}

pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", (b > 0 ? a / b * 100 : 0) }'; }

# record_run ID PIPE ROUND PARSED CPU_TICKS WALL_NS SERVER_BUSY SERVER_ALL CLIENT_BUSY CLIENT_ALL
# [CPU_NS REQUESTS]: appends one run to $RUNS and sets RUN_PROC (the servers' CPU over the run,
# % of one core), RUN_SRV and RUN_CL (how busy the server and client cores were, %) and RUN_NS
# (the server's CPU time per request in ns, when CPU_NS and REQUESTS are given).
record_run() {
    RUN_PROC=$(awk -v c="$5" -v t="$6" -v hz="$CLK_TCK" \
        'BEGIN { printf "%.0f", (c / hz) / (t / 1e9) * 100 }')
    RUN_SRV=$(pct "$7" "$8")
    RUN_CL=$(pct "$9" "${10}")
    RUN_NS=NA
    if [[ -n ${11:-} && -n ${12:-} ]]; then
        RUN_NS=$(awk -v c="${11}" -v n="${12}" 'BEGIN { printf "%.0f", (n > 0 ? c / n : 0) }')
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$RUN_PROC" "$RUN_SRV" \
        "$RUN_CL" "$RUN_NOISY" "$RUN_NS" >>"$RUNS"
}

# Other work on the machine (builds, tests) skews a run. Before each run, wait (bounded per run
# and in total) until the whole machine is nearly idle; a run that starts busy is counted.
QUIET_PCT=${QUIET_PCT:-15}
QUIET_SPENT_MS=0
BUSY_RUNS=0
TOTAL_RUNS=0
wait_quiet() {
    local start busy=0 a b c d i
    start=$(date +%s%N)
    for ((i = 0; i < QUIET_WAIT_S * 2; i++)); do
        read -r a b < <(core_ticks all)
        sleep 0.5
        read -r c d < <(core_ticks all)
        busy=$(pct $((c - a)) $((d - b)))
        if ((busy < QUIET_PCT)); then break; fi
        if ((QUIET_SPENT_MS + ($(date +%s%N) - start) / 1000000 > QUIET_BUDGET_S * 1000)); then
            break
        fi
    done
    QUIET_SPENT_MS=$((QUIET_SPENT_MS + ($(date +%s%N) - start) / 1000000))
    if ((busy >= QUIET_PCT)); then
        log "  machine busy ($busy% of all cores) before this run"
        RUN_NOISY=1
    else
        RUN_NOISY=0
    fi
}

# bench ID PID PORT PIPELINE N ROUND CLIENT_CPU|none CMD...: one bounded redis-benchmark run,
# appended to $RUNS with the server process's CPU use (over the run, and per request) and how
# busy the server's and the client's cores were over the run (100% = one core; with no pinning,
# the mean of all cores).
bench() {
    local id=$1 pid=$2 port=$3 pipe=$4 n=$5 round=$6 pin=$7
    shift 7
    local client=() srv_core=$SERVER_CPU cli_core=$pin
    if [[ $pin == none ]]; then
        srv_core=all
        cli_core=all
    else
        client=(taskset -c "$pin")
    fi
    cli "$port" FLUSHALL >/dev/null
    wait_quiet
    local t0 t1 c0 c1 n0 n1 s0 s1 k0 k1 csv parsed rc=0
    read -r s0 s1 < <(core_ticks "$srv_core")
    read -r k0 k1 < <(core_ticks "$cli_core")
    c0=$(cpu_ticks "$pid")
    n0=$(cpu_ns "$pid")
    t0=$(date +%s%N)
    csv=$(timeout "$RUN_TIMEOUT" "${client[@]}" redis-benchmark -h "$HOST" -p "$port" \
        -c "$CLIENTS" -n "$n" -r "$KEYSPACE" -P "$pipe" --csv "$@" 2>>"$WORK/benchmark.err") ||
        rc=$?
    t1=$(date +%s%N)
    c1=$(cpu_ticks "$pid")
    n1=$(cpu_ns "$pid")
    local s2 s3 k2 k3
    read -r s2 s3 < <(core_ticks "$srv_core")
    read -r k2 k3 < <(core_ticks "$cli_core")
    TOTAL_RUNS=$((TOTAL_RUNS + 1))
    BUSY_RUNS=$((BUSY_RUNS + RUN_NOISY))
    if ((rc != 0)); then
        log "  $id P$pipe: redis-benchmark failed (exit $rc), run skipped"
        return 0
    fi
    if ! parsed=$(printf '%s\n' "$csv" | python3 "$BENCHES/report.py" parse-csv); then
        log "  $id P$pipe: unreadable output, run skipped"
        return 0
    fi
    record_run "$id" "$pipe" "$round" "$parsed" $((c1 - c0)) $((t1 - t0)) \
        $((s2 - s0)) $((s3 - s1)) $((k2 - k0)) $((k3 - k1)) $((n1 - n0)) "$n"
    local proc=$RUN_PROC srv=$RUN_SRV cl=$RUN_CL
    log "  $id P$pipe round $round: $(cut -f1 <<<"$parsed" | cut -d. -f1) ops/s" \
        "(server CPU $RUN_NS ns/request, $proc% of a core; server core $srv% busy," \
        "client core $cl% busy)"
}

requests_for() { if [[ $1 == 1 ]]; then echo "$N_P1"; else echo "$N_P16"; fi; }

if [[ $MODE == cluster ]]; then
    # shellcheck source=benches/cluster.sh
    source "$BENCHES/cluster.sh"
    exit 0
fi
if [[ $MODE == rls ]]; then
    # shellcheck source=benches/rls.sh
    source "$BENCHES/rls.sh"
    exit 0
fi
if [[ $MODE == zlog ]]; then
    # shellcheck source=benches/zlog.sh
    source "$BENCHES/zlog.sh"
    exit 0
fi

# ---------------------------------------------------------------------------------------------
# 1. Throughput and latency, one core each
# ---------------------------------------------------------------------------------------------

REDIS_PORT=$(free_ports 1)
start_redis "$REDIS_PORT"
REDIS_PID=$STARTED_PID
BUCKETD_PORT=$(free_ports 1)
start_bucketd "$BUCKETD_PORT" 1 yes
BUCKETD_PID=$STARTED_PID
log "redis-server pid $REDIS_PID port $REDIS_PORT, bucketd pid $BUCKETD_PID port $BUCKETD_PORT"
BASELINE=${BASELINE:-}
if [[ -n $BASELINE ]]; then
    [[ -x $BASELINE ]] || die "BASELINE=$BASELINE is not an executable"
    BASE_PORT=$(free_ports 1)
    start_bucketd "$BASE_PORT" 1 yes "$BASELINE"
    BASE_PID=$STARTED_PID
    log "baseline bucketd ($BASELINE) pid $BASE_PID port $BASE_PORT"
fi

SHA=$(cli "$REDIS_PORT" SCRIPT LOAD "$(cat "$BENCHES/token_bucket.lua")")
[[ $SHA =~ ^[0-9a-f]{40}$ ]] || die "SCRIPT LOAD answered '$SHA'"
# The same script, unchanged, on bucketd: what a gateway gets before it moves to the native
# command.
[[ $(cli "$BUCKETD_PORT" SCRIPT LOAD "$(cat "$BENCHES/token_bucket.lua")") == "$SHA" ]] ||
    die "bucketd's SCRIPT LOAD did not answer $SHA"

EVAL_CMD=(EVALSHA "$SHA" 1 'bucket:__rand_int__' 100 10 1)
THROTTLE_CMD=(CL.THROTTLE 'bucket:__rand_int__' 99 10 1)
CHECK_CMD=(BK.CHECK 'bucket:__rand_int__' 10/1s:100)
INCR_CMD=(INCR 'bucket:__rand_int__')

check_reply "$REDIS_PORT" '^1 99 $' EVALSHA "$SHA" 1 bucket:check 100 10 1
check_reply "$BUCKETD_PORT" '^1 99 $' EVALSHA "$SHA" 1 bucket:check 100 10 1
check_reply "$REDIS_PORT" '^PONG $' PING
check_reply "$BUCKETD_PORT" '^PONG $' PING
check_reply "$BUCKETD_PORT" '^0 100 99 -1 1 $' CL.THROTTLE bucket:check1 99 10 1
check_reply "$BUCKETD_PORT" '^1 100 99 -1 100 $' BK.CHECK bucket:check2 10/1s:100
check_reply "$REDIS_PORT" '^1 $' INCR bucket:counter
check_reply "$BUCKETD_PORT" '^1 $' INCR bucket:counter

redis_eval() { bench redis:evalsha "$REDIS_PID" "$REDIS_PORT" "$@" "${EVAL_CMD[@]}"; }
bd_eval() { bench bucketd:evalsha "$BUCKETD_PID" "$BUCKETD_PORT" "$@" "${EVAL_CMD[@]}"; }
redis_ping() { bench redis:ping "$REDIS_PID" "$REDIS_PORT" "$@" PING; }
bd_ping() { bench bucketd:ping "$BUCKETD_PID" "$BUCKETD_PORT" "$@" PING; }
redis_incr() { bench redis:incr "$REDIS_PID" "$REDIS_PORT" "$@" "${INCR_CMD[@]}"; }
bd_throttle() { bench bucketd:throttle "$BUCKETD_PID" "$BUCKETD_PORT" "$@" "${THROTTLE_CMD[@]}"; }
bd_check() { bench bucketd:check "$BUCKETD_PID" "$BUCKETD_PORT" "$@" "${CHECK_CMD[@]}"; }
bd_incr() { bench bucketd:incr "$BUCKETD_PID" "$BUCKETD_PORT" "$@" "${INCR_CMD[@]}"; }
# The baseline build's runs, when there is one.
base_runs() {
    [[ -n $BASELINE ]] || return 0
    bench baseline:throttle "$BASE_PID" "$BASE_PORT" "$@" "${THROTTLE_CMD[@]}"
    bench baseline:incr "$BASE_PID" "$BASE_PORT" "$@" "${INCR_CMD[@]}"
}

log "throughput: $ROUNDS round(s), $CLIENTS clients, keys over $KEYSPACE, P1 n=$N_P1, P16 n=$N_P16"
for ((round = 1; round <= ROUNDS; round++)); do
    for pipe in 1 16; do
        n=$(requests_for "$pipe")
        args=("$pipe" "$n" "$round" "$CLIENT_CPU")
        # Alternate who goes first, so drift over time does not favour one side.
        if ((round % 2 == 1)); then
            redis_ping "${args[@]}"
            bd_ping "${args[@]}"
            redis_eval "${args[@]}"
            bd_eval "${args[@]}"
            base_runs "${args[@]}"
            bd_throttle "${args[@]}"
            bd_check "${args[@]}"
            redis_incr "${args[@]}"
            bd_incr "${args[@]}"
        else
            bd_ping "${args[@]}"
            redis_ping "${args[@]}"
            bd_check "${args[@]}"
            bd_throttle "${args[@]}"
            bd_eval "${args[@]}"
            redis_eval "${args[@]}"
            bd_incr "${args[@]}"
            redis_incr "${args[@]}"
            base_runs "${args[@]}"
        fi
    done
done
stop_server "$REDIS_PID"
stop_server "$BUCKETD_PID"
[[ -z $BASELINE ]] || stop_server "$BASE_PID"

# ---------------------------------------------------------------------------------------------
# 1b. Instructions per request under callgrind: steady where timings are not
# ---------------------------------------------------------------------------------------------

CALLGRIND=${CALLGRIND:-1}
CG_REQUESTS=${CG_REQUESTS:-$((QUICK == 1 ? 10000 : 50000))}
CG_TABLE="(not measured: valgrind is not installed, or CALLGRIND=0)"
if [[ $CALLGRIND == 1 ]] && command -v valgrind >/dev/null && command -v callgrind_control >/dev/null; then
    log "instructions per request under callgrind ($CG_REQUESTS requests per workload)"
    if cg_out=$(timeout 1800 bash "$BENCHES/instructions.sh" --bin "$BIN" \
        --requests "$CG_REQUESTS" --only ping,incr_rand,throttle_rand,evalsha_rand 2>&1); then
        CG_TABLE=$(printf '%s\n' "$cg_out" | grep '^|')
    else
        CG_TABLE="(callgrind run failed: $(printf '%s' "$cg_out" | tail -1))"
    fi
fi

# ---------------------------------------------------------------------------------------------
# 2. Memory per bucket, on fresh servers
# ---------------------------------------------------------------------------------------------

# load PORT FILE: pipes FILE into the server; fails on any error reply.
load() {
    local port=$1 file=$2 out
    out=$(timeout 600 redis-cli -h "$HOST" -p "$port" --pipe --pipe-timeout 60 <"$file" 2>&1) ||
        die "loading $file into port $port failed: $out"
    [[ $out =~ errors:\ 0,\ replies:\ ([0-9]+) ]] || die "loading $file: $out"
}

# settle PORT PID: waits (bounded) until the server's used_memory and the process's RSS have
# both held still for 1.25 s. bucketd hands its allocators' free pages back to the system at
# most once a second while its store grows, so its RSS can still fall a second after the last
# key went in, with used_memory long steady.
settle() {
    local port=$1 pid=$2 prev=-1 cur i still=0
    for ((i = 0; i < 40; i++)); do
        sleep 0.25
        cur="$(info_field "$port" used_memory) $(rss_kb "$pid")"
        if [[ $cur == "$prev" ]]; then
            still=$((still + 1))
            ((still >= 5)) && return 0
        else
            still=0
        fi
        prev=$cur
    done
}

# measure NAME PORT PID FILE: loads FILE into an empty server; sets M_KEYS, M_USED, M_RSS
# (bytes added per key by the server's own accounting and by the process RSS).
measure() {
    local name=$1 port=$2 pid=$3 file=$4 u0 r0 u1 r1
    settle "$port" "$pid"
    u0=$(info_field "$port" used_memory)
    r0=$(rss_kb "$pid")
    log "memory: loading $MEM_KEYS buckets into $name"
    load "$port" "$file"
    settle "$port" "$pid"
    M_KEYS=$(cli "$port" DBSIZE)
    u1=$(info_field "$port" used_memory)
    r1=$(rss_kb "$pid")
    ((M_KEYS > 0)) || die "$name holds no keys after loading"
    M_USED=$(awk -v a="$u0" -v b="$u1" -v k="$M_KEYS" 'BEGIN { printf "%.1f", (b - a) / k }')
    M_RSS=$(awk -v a="$r0" -v b="$r1" -v k="$M_KEYS" 'BEGIN { printf "%.1f", (b - a) * 1024 / k }')
    M_RSS_MB="$((r0 / 1024)) MB -> $((r1 / 1024)) MB"
}

log "memory: generating $MEM_KEYS commands per server"
# A slow refill keeps every bucket alive while it is measured (the script's PEXPIRE is the time
# an empty bucket takes to refill: 100 / 0.01 s here; bucketd: 10 per hour).
python3 "$BENCHES/gen_resp.py" "$MEM_KEYS" "$WORK/redis.resp" EVALSHA "$SHA" 1 '{key}' 100 0.01 1
python3 "$BENCHES/gen_resp.py" "$MEM_KEYS" "$WORK/bucketd.resp" CL.THROTTLE '{key}' 99 10 3600 1
python3 "$BENCHES/gen_resp.py" "$MEM_KEYS" "$WORK/expiry.resp" "${EXPIRY_CMD[@]}"

REDIS_PORT=$(free_ports 1)
start_redis "$REDIS_PORT"
REDIS_PID=$STARTED_PID
[[ $(cli "$REDIS_PORT" SCRIPT LOAD "$(cat "$BENCHES/token_bucket.lua")") == "$SHA" ]] ||
    die "script hash changed"
measure "Redis" "$REDIS_PORT" "$REDIS_PID" "$WORK/redis.resp"
R_KEYS=$M_KEYS R_USED=$M_USED R_RSS=$M_RSS R_RSS_MB=$M_RSS_MB
R_ENC=$(cli "$REDIS_PORT" OBJECT ENCODING bucket:000000000001)
stop_server "$REDIS_PID"

BUCKETD_PORT=$(free_ports 1)
start_bucketd "$BUCKETD_PORT" 1 yes
BUCKETD_PID=$STARTED_PID
measure "bucketd" "$BUCKETD_PORT" "$BUCKETD_PID" "$WORK/bucketd.resp"
B_KEYS=$M_KEYS B_USED=$M_USED B_RSS=$M_RSS B_RSS_MB=$M_RSS_MB
stop_server "$BUCKETD_PID"

# Expiry: buckets that refill within EXPIRY_REFILL_S are dropped, and the memory goes back.
BUCKETD_PORT=$(free_ports 1)
start_bucketd "$BUCKETD_PORT" 1 yes
BUCKETD_PID=$STARTED_PID
settle "$BUCKETD_PORT" "$BUCKETD_PID"
E_R0=$(rss_kb "$BUCKETD_PID")
log "expiry: loading $MEM_KEYS buckets that refill in ${EXPIRY_REFILL_S}s"
t0=$(date +%s%N)
load "$BUCKETD_PORT" "$WORK/expiry.resp"
E_LOAD_MS=$((($(date +%s%N) - t0) / 1000000))
E_KEYS=$(cli "$BUCKETD_PORT" DBSIZE)
E_R1=$(rss_kb "$BUCKETD_PID")
E_EMPTY_S=">$EXPIRY_WAIT_S"
for ((i = 0; i < EXPIRY_WAIT_S * 4; i++)); do
    if [[ $(cli "$BUCKETD_PORT" DBSIZE) == 0 ]]; then
        E_EMPTY_S=$(awk -v t="$(($(date +%s%N) - t0))" 'BEGIN { printf "%.1f", t / 1e9 }')
        break
    fi
    sleep 0.25
done
sleep 1 # a few more sweeps, so emptied parts are released
E_LEFT=$(cli "$BUCKETD_PORT" DBSIZE)
E_R2=$(rss_kb "$BUCKETD_PID")
stop_server "$BUCKETD_PID"

# ---------------------------------------------------------------------------------------------
# 3. Scaling: one shard on one core vs two shards on both cores
# ---------------------------------------------------------------------------------------------

ONE_PORT=$(free_ports 1)
start_bucketd "$ONE_PORT" 1 yes
ONE_PID=$STARTED_PID
TWO_PORT=$(free_ports 1)
start_bucketd "$TWO_PORT" 2 no
TWO_PID=$STARTED_PID
log "scaling: CL.THROTTLE P16, --shards 1 pinned vs --shards 2 unpinned"
SCALE_RUNS="$WORK/scale.tsv"
MAIN_RUNS=$RUNS
RUNS=$SCALE_RUNS
for ((round = 1; round <= ROUNDS; round++)); do
    one=(bench shards:1 "$ONE_PID" "$ONE_PORT" 16 "$N_P16" "$round" "$CLIENT_CPU" "${THROTTLE_CMD[@]}")
    two=(bench shards:2 "$TWO_PID" "$TWO_PORT" 16 "$N_P16" "$round" none "${THROTTLE_CMD[@]}")
    if ((round % 2 == 1)); then
        "${one[@]}"
        "${two[@]}"
    else
        "${two[@]}"
        "${one[@]}"
    fi
done
RUNS=$MAIN_RUNS
stop_server "$ONE_PID"
stop_server "$TWO_PID"

# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

BASE_ROWS=()
if [[ -n $BASELINE ]]; then
    BASE_ROWS=("baseline build CL.THROTTLE|baseline:throttle" "baseline build INCR|baseline:incr")
fi
report() {
    local cpu_model redis_version rev
    cpu_model=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
    redis_version=$(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')
    rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
    if [[ -n $(git -C "$ROOT" status --porcelain -- src Cargo.toml 2>/dev/null) ]]; then
        rev="$rev+local changes"
    fi
    cat <<EOF
# bucketd vs Redis

$(date -u '+%Y-%m-%d %H:%M UTC'); $CORES cores ($cpu_model); Redis $redis_version; bucketd $rev.
Each server pinned to core $SERVER_CPU (\`taskset -c $SERVER_CPU\`), redis-benchmark to core $CLIENT_CPU;
$CLIENTS clients, keys \`bucket:__rand_int__\` over $KEYSPACE, FLUSHALL before every run, runs of the
two servers alternated; $ROUNDS round(s) of $N_P1 requests at pipeline 1 and $N_P16 at pipeline 16.
Medians over the rounds (± is the largest distance of a run from the median); latencies in ms as
redis-benchmark reports them. "busy" is how busy the server's and the client's cores were over the
run, kernel network work included (/proc/stat): a client core near 100% with the server core well
below means redis-benchmark, not the server, set the pace, and the ratio understates the gap.
$BUSY_RUNS of $TOTAL_RUNS runs started while other work kept the machine over $QUIET_PCT% busy (load
average at the end: $(cut -d' ' -f1-3 /proc/loadavg)).

- Redis: \`EVALSHA <sha> 1 bucket:__rand_int__ 100 10 1\` (benches/token_bucket.lua: TIME, HMGET,
  HSET, PEXPIRE), \`INCR bucket:__rand_int__\` and \`PING\`.
- bucketd (\`--shards 1\`): the same \`EVALSHA\` (the script loaded unchanged),
  \`CL.THROTTLE bucket:__rand_int__ 99 10 1\`, \`BK.CHECK bucket:__rand_int__ 10/1s:100\` (the
  same limit: burst 100, 10/s), \`INCR\` and \`PING\`.
- "CPU ns/req" is the server process's own CPU time over the run (all its threads, from
  /proc/PID/task/*/schedstat) divided by the requests: what a request costs the server, whoever
  set the pace.

## Throughput and latency

EOF
    python3 "$BENCHES/report.py" pairs "$RUNS" Redis bucketd \
        "token bucket script: EVALSHA vs EVALSHA|redis:evalsha|bucketd:evalsha" \
        "token bucket: EVALSHA vs CL.THROTTLE|redis:evalsha|bucketd:throttle" \
        "token bucket: EVALSHA vs BK.CHECK|redis:evalsha|bucketd:check" \
        "counter: INCR vs INCR|redis:incr|bucketd:incr" \
        "PING vs PING|redis:ping|bucketd:ping"
    cat <<EOF

### On bucketd: the script as it is, or the native command

The same token bucket on the same node, as the unchanged \`EVALSHA\` and as \`CL.THROTTLE\`
(ratio: native / script).

EOF
    python3 "$BENCHES/report.py" pairs "$RUNS" EVALSHA CL.THROTTLE \
        "token bucket|bucketd:evalsha|bucketd:throttle"
    cat <<EOF

### Server CPU per request against Redis's INCR

Each request's server CPU time over that of Redis's \`INCR\`, from the same runs.

EOF
    python3 "$BENCHES/report.py" cpu-ratios "$RUNS" "Redis INCR|redis:incr" \
        "bucketd CL.THROTTLE|bucketd:throttle" "bucketd BK.CHECK|bucketd:check" \
        "bucketd INCR|bucketd:incr" "${BASE_ROWS[@]}" "Redis EVALSHA|redis:evalsha" \
        "bucketd EVALSHA|bucketd:evalsha" "Redis PING|redis:ping" "bucketd PING|bucketd:ping"
    cat <<EOF

## Instructions per request (callgrind)

User-space instructions each server runs per request, counted by valgrind's callgrind over
$CG_REQUESTS requests after a warm-up (\`benches/instructions.sh\`: pipeline 16, 50 clients,
one million random keys; CL.THROTTLE is set beside Redis's INCR). Unlike timings they do not
move with the machine's load; they leave out the kernel's share (the socket work, about the
same for both servers).

$CG_TABLE

## Memory per bucket

$MEM_KEYS distinct buckets (\`bucket:000000000001\` ...; 19-byte keys) loaded with
\`redis-cli --pipe\` into a fresh server. Redis: the EVALSHA script (a hash of tokens + ts with a
TTL per key, encoding \`$R_ENC\`); bucketd: \`CL.THROTTLE key 99 10 3600 1\`. "accounting" is the
INFO memory \`used_memory\` delta, RSS the VmRSS delta of the process, both divided by DBSIZE.

| server | keys | accounting bytes/bucket | RSS bytes/bucket | RSS before -> after |
|---|---:|---:|---:|---|
| Redis | $R_KEYS | $R_USED | $R_RSS | $R_RSS_MB |
| bucketd | $B_KEYS | $B_USED | $B_RSS | $B_RSS_MB |

bucketd beyond the 19 key bytes: $(awk -v u="$B_USED" -v r="$B_RSS" 'BEGIN { printf "%.1f (accounting), %.1f (RSS)", u - 19, r - 19 }') bytes per bucket.
Redis / bucketd: $(awk -v a="$R_USED" -v b="$B_USED" -v c="$R_RSS" -v d="$B_RSS" 'BEGIN { printf "%.1fx (accounting), %.1fx (RSS)", a / b, c / d }').

## Expiry gives the memory back (bucketd)

$MEM_KEYS buckets loaded with \`${EXPIRY_CMD[*]}\` (each bucket emptied, full again after
${EXPIRY_REFILL_S}s), then DBSIZE polled until 0 (at most ${EXPIRY_WAIT_S}s).

| | RSS | DBSIZE |
|---|---:|---:|
| before | $((E_R0 / 1024)) MB | 0 |
| loaded (in ${E_LOAD_MS} ms) | $((E_R1 / 1024)) MB | $E_KEYS |
| after expiry (empty ${E_EMPTY_S}s after the load began, + 1 s) | $((E_R2 / 1024)) MB | $E_LEFT |

## Scaling (CL.THROTTLE, pipeline 16)

\`--shards 1\` pinned to core $SERVER_CPU with redis-benchmark on core $CLIENT_CPU, versus \`--shards 2\`
unpinned on both cores, where redis-benchmark (also unpinned) shares the cores with the shards: the
two-shard figure is therefore what one client machine sees, not the ceiling of two cores (its
"busy" columns are the mean of both cores).

EOF
    python3 "$BENCHES/report.py" pairs "$SCALE_RUNS" "1 shard" "2 shards" \
        "CL.THROTTLE|shards:1|shards:2"
}

report | tee "$OUT"
log "report written to $OUT"
