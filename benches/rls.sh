# Rate limit service mode of benches/compare.sh (`bash benches/compare.sh rls`); sourced by it
# after its settings, build, scratch space, cleanup trap and helpers (log, die, cli, wait_ready,
# wait_quiet, core_ticks, cpu_ticks, pct...).
#
# One bucketd node (`--shards 1`) pinned to SERVER_CPU, serving RESP and, with
# `--grpc-port --rls-config`, Envoy's rate limit service; examples/rls_load.rs on CLIENT_CPU
# sends it the same limits both ways, run by run alternately:
#   gRPC  ShouldRateLimit, domain `bench`, 1 or 3 descriptors (`user`, `tenant`, `route`, one
#         entry each, values drawn from RLS_KEYSPACE per key), each limited by the YAML to
#         RLS_LIMIT per second (envoyproxy's aligned window)
#   RESP  BK.CHECK (1 descriptor) or BK.CHECKALL (3) of the same counters' keys with
#         `aligned:RLS_LIMIT/1s`
# The limit is far above what a run sends, so nothing is refused and every call takes one unit
# from every counter it names. Besides calls/s and latency, the server process's CPU time
# (utime + stime from /proc/PID/stat) over each run, divided by its calls, is the steadier
# figure on a machine shared with other work.
#
# Settings (environment): RLS_N (calls per run), RLS_CONCURRENCY (calls in flight),
# RLS_GRPC_CONNECTIONS (HTTP/2 connections the calls are spread over, default 4: one would
# carry them all on one socket), RLS_RESP_CONNECTIONS (default one per call in flight, as
# redis-benchmark runs), RLS_KEYSPACE, RLS_LIMIT, and compare.sh's ROUNDS, RUN_TIMEOUT,
# SERVER_CPU, CLIENT_CPU, QUIET_*.

[[ -n ${BENCHES:-} && -n ${WORK:-} && -n ${LOADGEN:-} ]] || {
    echo "benches/rls.sh is run by: bash benches/compare.sh rls" >&2
    exit 2
}

# shellcheck source=benches/ports.sh
source "$(dirname "${BASH_SOURCE[0]}")/ports.sh"

if [[ $QUICK == 1 ]]; then
    RLS_N=${RLS_N:-30000}
else
    RLS_N=${RLS_N:-200000}
fi
RLS_CONCURRENCY=${RLS_CONCURRENCY:-$CLIENTS}
RLS_GRPC_CONNECTIONS=${RLS_GRPC_CONNECTIONS:-4}
RLS_RESP_CONNECTIONS=${RLS_RESP_CONNECTIONS:-$RLS_CONCURRENCY}
RLS_KEYSPACE=${RLS_KEYSPACE:-100000}
RLS_LIMIT=${RLS_LIMIT:-1000000}
RLS_RUNS="$WORK/rls.tsv"
: >"$RLS_RUNS"

load_args=(--concurrency "$RLS_CONCURRENCY" --keyspace "$RLS_KEYSPACE" --limit "$RLS_LIMIT")
"$LOADGEN" --print-config "${load_args[@]}" >"$WORK/rls.yaml" ||
    die "rls_load --print-config failed"

read -r RESP_PORT GRPC_PORT <<<"$(free_ports 2)"
taskset -c "$SERVER_CPU" "$BIN" --bind "$HOST" --port "$RESP_PORT" --shards 1 \
    --grpc-port "$GRPC_PORT" --rls-config "$WORK/rls.yaml" --log warn \
    >>"$WORK/bucketd-rls.log" 2>&1 &
RLS_PID=$!
PIDS+=("$RLS_PID")
wait_ready "$RESP_PORT" "$RLS_PID" ||
    die "bucketd did not start: $(tail -5 "$WORK/bucketd-rls.log")"
log "bucketd pid $RLS_PID: RESP on $RESP_PORT, rate limit service (gRPC) on $GRPC_PORT"

# A short run each way: the service must answer every call with the configured limit (the
# load generator fails the run otherwise), and both ways must count in the same counter.
for mode in grpc resp; do
    port=$GRPC_PORT
    [[ $mode == resp ]] && port=$RESP_PORT
    timeout 60 "$LOADGEN" --mode "$mode" --addr "$HOST:$port" --requests 100 --descriptors 3 \
        "${load_args[@]}" >"$WORK/smoke-$mode.out" 2>&1 ||
        die "rls_load --mode $mode: $(cat "$WORK/smoke-$mode.out")"
done
# One call's counter must be the key the RESP runs check. It goes once its window is over, so
# it is looked for at once, a few times.
same_key() {
    cli "$RESP_PORT" FLUSHALL >/dev/null
    timeout 60 "$LOADGEN" --mode grpc --addr "$HOST:$GRPC_PORT" --requests 1 --concurrency 1 \
        --keyspace 1 --limit "$RLS_LIMIT" >/dev/null 2>&1 || return 1
    [[ $(cli "$RESP_PORT" KEYS '*') == "rls:5:bench:4:user:2:u0" ]]
}
same_key || same_key || same_key ||
    die "a gRPC call counted in '$(cli "$RESP_PORT" KEYS '*' | tr '\n' ' ')', not in the RESP key"

# rls_run MODE CONNECTIONS DESCRIPTORS ROUND: one bounded run, appended to $RLS_RUNS as
# MODE:CONNECTIONS.
rls_run() {
    local mode=$1 conns=$2 desc=$3 round=$4 port=$GRPC_PORT
    [[ $mode == resp ]] && port=$RESP_PORT
    local id=$mode:$conns
    cli "$RESP_PORT" FLUSHALL >/dev/null
    wait_quiet
    local s0 s1 k0 k1 s2 s3 k2 k3 c0 c1 out rc=0
    read -r s0 s1 < <(core_ticks "$SERVER_CPU")
    read -r k0 k1 < <(core_ticks "$CLIENT_CPU")
    c0=$(cpu_ticks "$RLS_PID")
    out=$(timeout "$RUN_TIMEOUT" taskset -c "$CLIENT_CPU" "$LOADGEN" --mode "$mode" \
        --addr "$HOST:$port" --connections "$conns" --descriptors "$desc" \
        --requests "$RLS_N" --seed "$round" --timeout-s "$((RUN_TIMEOUT - 5))" --tsv \
        "${load_args[@]}" 2>>"$WORK/rls_load.err") || rc=$?
    c1=$(cpu_ticks "$RLS_PID")
    read -r s2 s3 < <(core_ticks "$SERVER_CPU")
    read -r k2 k3 < <(core_ticks "$CLIENT_CPU")
    TOTAL_RUNS=$((TOTAL_RUNS + 1))
    BUSY_RUNS=$((BUSY_RUNS + RUN_NOISY))
    if ((rc != 0)); then
        log "  $id x$desc round $round: rls_load failed (exit $rc), run skipped:" \
            "$(tail -2 "$WORK/rls_load.err" | tr '\n' ' ')"
        return 0
    fi
    local rps p50 p99 calls us srv cl
    read -r rps p50 p99 calls _ <<<"$out"
    us=$(awk -v c=$((c1 - c0)) -v hz="$CLK_TCK" -v n="$calls" \
        'BEGIN { printf "%.2f", c / hz * 1e6 / n }')
    srv=$(pct $((s2 - s0)) $((s3 - s1)))
    cl=$(pct $((k2 - k0)) $((k3 - k1)))
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$id" "$desc" "$round" "$rps" "$p50" \
        "$p99" "$us" "$srv" "$cl" "$RUN_NOISY" >>"$RLS_RUNS"
    log "  $id x$desc round $round: $rps calls/s, p50 $p50 ms, p99 $p99 ms," \
        "server CPU $us us/call (server core $srv% busy, client core $cl% busy)"
}

# RESP is run twice: over one connection per call in flight (as redis-benchmark runs), and over
# as many connections as gRPC uses, where each socket read brings several calls, as it does
# for HTTP/2.
runs=("resp $RLS_RESP_CONNECTIONS" "grpc $RLS_GRPC_CONNECTIONS")
if ((RLS_GRPC_CONNECTIONS != RLS_RESP_CONNECTIONS)); then
    runs=("resp $RLS_RESP_CONNECTIONS" "resp $RLS_GRPC_CONNECTIONS" "grpc $RLS_GRPC_CONNECTIONS")
fi
log "rate limit service: $ROUNDS round(s) of $RLS_N calls, $RLS_CONCURRENCY in flight" \
    "over $RLS_GRPC_CONNECTIONS gRPC / $RLS_RESP_CONNECTIONS and $RLS_GRPC_CONNECTIONS RESP" \
    "connections, $RLS_KEYSPACE values per descriptor key"
for ((round = 1; round <= ROUNDS; round++)); do
    for desc in 1 3; do
        # Alternate the order, so drift over time does not favour one side.
        order=("${runs[@]}")
        if ((round % 2 == 0)); then
            order=()
            for ((i = ${#runs[@]} - 1; i >= 0; i--)); do order+=("${runs[$i]}"); done
        fi
        for r in "${order[@]}"; do
            read -r mode conns <<<"$r"
            rls_run "$mode" "$conns" "$desc" "$round"
        done
    done
done
stop_server "$RLS_PID"

rls_report() {
    local cpu_model rev
    cpu_model=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
    rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
    if [[ -n $(git -C "$ROOT" status --porcelain -- src Cargo.toml 2>/dev/null) ]]; then
        rev="$rev+local changes"
    fi
    cat <<EOF
# Envoy rate limit service (gRPC) vs the same checks over RESP

$(date -u '+%Y-%m-%d %H:%M UTC'); $CORES cores ($cpu_model); bucketd $rev.
One node (\`--shards 1\`) pinned to core $SERVER_CPU, examples/rls_load.rs (one thread) to core
$CLIENT_CPU; $RLS_CONCURRENCY calls in flight, over $RLS_GRPC_CONNECTIONS HTTP/2 connections for gRPC, and for RESP
over $RLS_RESP_CONNECTIONS connections (one call at a time on each) and over $RLS_GRPC_CONNECTIONS (pipelined, as the
HTTP/2 streams are); $RLS_KEYSPACE values per descriptor key, FLUSHALL before every run, the runs
alternated; $ROUNDS round(s) of $RLS_N calls. Medians over the rounds (± is the
largest distance of a run from the median). "CPU us/call" is the server process's utime + stime over
the run divided by its calls; "busy" is how busy the server's and the client's cores were. A
client core near 100% means the load generator set the pace, and CPU per call is the figure to
read.
$BUSY_RUNS of $TOTAL_RUNS runs started while other work kept the machine over $QUIET_PCT% busy (load
average at the end: $(cut -d' ' -f1-3 /proc/loadavg)).

- gRPC: \`ShouldRateLimit\`, domain \`bench\`, descriptors \`user\`, \`tenant\`, \`route\` (one
  entry each), each \`requests_per_unit: $RLS_LIMIT\`, \`unit: second\`.
- RESP: \`BK.CHECK key aligned:$RLS_LIMIT/1s\` (1 descriptor) and
  \`BK.CHECKALL 3 k1 k2 k3 spec spec spec\` (3), on the keys the service counts in.

EOF
    python3 "$BENCHES/report.py" rls "$RLS_RUNS"
}

rls_report | tee "$OUT"
log "report written to $OUT"
