# Sliding-log mode of benches/compare.sh (`bash benches/compare.sh zlog`); sourced by it after
# its settings, build, scratch space, cleanup trap and helpers (log, die, cli, start_redis,
# start_bucketd, stop_server, wait_quiet, core_ticks, cpu_ticks, cpu_ns, record_run...).
#
# A Tyk-style sliding log (a sorted set of the window's requests per client) driven by
# examples/zlog_load.rs on CLIENT_CPU against three servers, each pinned to SERVER_CPU: Redis,
# bucketd `--shards 1` and bucketd `--shards 2` (both shards on the one core). Each request is
# ZREMRANGEBYSCORE + ZADD + ZCARD + EXPIRE on one random log, as one MULTI/EXEC ("multi") or one
# EVALSHA ("script"), at pipeline 1 and 16; the servers alternate run by run over ROUNDS. Each
# run reports requests/s, latency and the server's CPU time per request.
#
# Then:
# - memory per logged request: ZLOG_FILLS logs (KEYSxENTRIES, e.g. 1000x100) filled on a fresh
#   Redis and a fresh bucketd (`--shards 1`) within a window nothing leaves, used_memory (INFO
#   memory) and RSS growth divided by the entries;
# - a script over two shards: on bucketd `--shards 2`, a script that INCRs two keys whose hash
#   tags fall on different shards ("cross") against the same script on two keys of one shard
#   ("same"), with Redis running the cross-tagged one as a reference.
#
# Settings (environment): ZLOG_N_P1 / ZLOG_N_P16 (requests per run), ZLOG_CONNS (connections,
# default CLIENTS), ZLOG_KEYS (logs drawn from), ZLOG_WINDOW_MS, ZLOG_FILLS (default
# "1000x100 100x1000"), and compare.sh's ROUNDS, RUN_TIMEOUT, SERVER_CPU, CLIENT_CPU, QUIET_*.

[[ -n ${BENCHES:-} && -n ${WORK:-} && -n ${LOADGEN:-} ]] || {
    echo "benches/zlog.sh is run by: bash benches/compare.sh zlog" >&2
    exit 2
}

if [[ $QUICK == 1 ]]; then
    ZLOG_N_P1=${ZLOG_N_P1:-10000}
    ZLOG_N_P16=${ZLOG_N_P16:-50000}
else
    ZLOG_N_P1=${ZLOG_N_P1:-50000}
    ZLOG_N_P16=${ZLOG_N_P16:-300000}
fi
ZLOG_CONNS=${ZLOG_CONNS:-$CLIENTS}
ZLOG_KEYS=${ZLOG_KEYS:-10000}
ZLOG_WINDOW_MS=${ZLOG_WINDOW_MS:-60000}
ZLOG_FILLS=${ZLOG_FILLS:-1000x100 100x1000}
# A window of a day: nothing logged during a fill leaves it.
FILL_WINDOW_MS=86400000
# Hash tags of the two-shard script: with `--shards 2`, {a} is on shard 1 and {b} on shard 0
# (checked below against the node's CLUSTER KEYSLOT).
CROSS_TAGS=a,b
SAME_TAGS=a,a
RUNS="$WORK/zlog.tsv"
: >"$RUNS"

zlog_requests() { if [[ $1 == 1 ]]; then echo "$ZLOG_N_P1"; else echo "$ZLOG_N_P16"; fi; }

# zlog_run ID PID PORT PIPELINE ROUND ZLOG_LOAD_ARGS...: one bounded run on a flushed server,
# appended to $RUNS as compare.sh's bench() does.
zlog_run() {
    local id=$1 pid=$2 port=$3 pipe=$4 round=$5
    shift 5
    local n
    n=$(zlog_requests "$pipe")
    cli "$port" FLUSHALL >/dev/null
    wait_quiet
    local s0 s1 k0 k1 s2 s3 k2 k3 c0 c1 n0 n1 t0 t1 out rc=0
    read -r s0 s1 < <(core_ticks "$SERVER_CPU")
    read -r k0 k1 < <(core_ticks "$CLIENT_CPU")
    c0=$(cpu_ticks "$pid")
    n0=$(cpu_ns "$pid")
    t0=$(date +%s%N)
    out=$(timeout "$RUN_TIMEOUT" taskset -c "$CLIENT_CPU" "$LOADGEN" --addr "$HOST:$port" \
        --conns "$ZLOG_CONNS" --pipeline "$pipe" --requests "$n" --keys "$ZLOG_KEYS" \
        --window-ms "$ZLOG_WINDOW_MS" --seed "$round" --timeout-s "$((RUN_TIMEOUT - 5))" --tsv \
        "$@" 2>>"$WORK/zlog_load.err") || rc=$?
    t1=$(date +%s%N)
    c1=$(cpu_ticks "$pid")
    n1=$(cpu_ns "$pid")
    read -r s2 s3 < <(core_ticks "$SERVER_CPU")
    read -r k2 k3 < <(core_ticks "$CLIENT_CPU")
    TOTAL_RUNS=$((TOTAL_RUNS + 1))
    BUSY_RUNS=$((BUSY_RUNS + RUN_NOISY))
    if ((rc != 0)); then
        log "  $id P$pipe round $round: zlog_load failed (exit $rc), run skipped:" \
            "$(tail -2 "$WORK/zlog_load.err" | tr '\n' ' ')"
        return 0
    fi
    local rps p50 p99 count
    read -r rps p50 p99 count _ <<<"$out"
    record_run "$id" "$pipe" "$round" "$(printf '%s\t%s\t%s' "$rps" "$p50" "$p99")" \
        $((c1 - c0)) $((t1 - t0)) $((s2 - s0)) $((s3 - s1)) $((k2 - k0)) $((k3 - k1)) \
        $((n1 - n0)) "$count"
    log "  $id P$pipe round $round: $rps requests/s, p50 $p50 ms, p99 $p99 ms" \
        "(server CPU $RUN_NS ns/request; server core $RUN_SRV% busy, client core $RUN_CL% busy)"
}

# smoke PORT ARGS...: a short run that must succeed (every reply checked by zlog_load).
smoke() {
    local port=$1 out
    shift
    cli "$port" FLUSHALL >/dev/null
    out=$(timeout 60 "$LOADGEN" --addr "$HOST:$port" --conns 4 --pipeline 4 --requests 200 \
        --keys 10 "$@" 2>&1) || die "port $port: zlog_load $*: $out"
}

REDIS_PORT=$(free_ports 1)
start_redis "$REDIS_PORT"
REDIS_PID=$STARTED_PID
BD1_PORT=$(free_ports 1)
start_bucketd "$BD1_PORT" 1 yes
BD1_PID=$STARTED_PID
BD2_PORT=$(free_ports 1)
start_bucketd "$BD2_PORT" 2 yes
BD2_PID=$STARTED_PID
log "redis-server pid $REDIS_PID port $REDIS_PORT; bucketd --shards 1 pid $BD1_PID port" \
    "$BD1_PORT; bucketd --shards 2 pid $BD2_PID port $BD2_PORT"

# A build without sorted sets still runs the two-shard script; its sliding-log runs and fills
# are left out, and the report says so.
BD_ZSETS=yes
reply=$(cli "$REDIS_PORT" ZADD zlog:check 1 m 2>&1)
[[ $reply == 1 ]] || die "Redis answered ZADD with '$reply'"
reply=$(cli "$BD1_PORT" ZADD zlog:check 1 m 2>&1)
if [[ $reply != 1 ]]; then
    BD_ZSETS=no
    log "bucketd answered ZADD with '$reply': its sliding-log runs are left out"
fi
for port in "$REDIS_PORT" "$BD1_PORT" "$BD2_PORT"; do
    if [[ $port == "$REDIS_PORT" || $BD_ZSETS == yes ]]; then
        for mode in multi script; do smoke "$port" --mode "$mode"; done
    fi
    smoke "$port" --mode incr2
done
# The two-shard script's keys: slot % 2 is the shard of a key on a node of two shards.
shard_of() { echo $(($(cli "$BD2_PORT" CLUSTER KEYSLOT "$1") % 2)); }
[[ $(shard_of "{${CROSS_TAGS%,*}}:a:1") != $(shard_of "{${CROSS_TAGS#*,}}:b:1") ]] ||
    die "hash tags $CROSS_TAGS fall on one shard"
[[ $(shard_of "{${SAME_TAGS%,*}}:a:1") == $(shard_of "{${SAME_TAGS#*,}}:b:1") ]] ||
    die "hash tags $SAME_TAGS fall on two shards"

# ---------------------------------------------------------------------------------------------
# Throughput and CPU per request
# ---------------------------------------------------------------------------------------------

log "sliding log: $ROUNDS round(s), $ZLOG_CONNS connections, $ZLOG_KEYS logs," \
    "window ${ZLOG_WINDOW_MS} ms, P1 n=$ZLOG_N_P1, P16 n=$ZLOG_N_P16"
SERVERS=("redis $REDIS_PID $REDIS_PORT" "bd1 $BD1_PID $BD1_PORT" "bd2 $BD2_PID $BD2_PORT")
for ((round = 1; round <= ROUNDS; round++)); do
    for pipe in 1 16; do
        # Alternate who goes first, so drift over time does not favour one side.
        order=("${SERVERS[@]}")
        if ((round % 2 == 0)); then
            order=("${SERVERS[2]}" "${SERVERS[1]}" "${SERVERS[0]}")
        fi
        for form in multi script; do
            for s in "${order[@]}"; do
                read -r name pid port <<<"$s"
                [[ $name == redis || $BD_ZSETS == yes ]] || continue
                zlog_run "$name:$form" "$pid" "$port" "$pipe" "$round" --mode "$form"
            done
        done
        cross=(zlog_run cross:two "$BD2_PID" "$BD2_PORT" "$pipe" "$round" --mode incr2
            --tags "$CROSS_TAGS")
        same=(zlog_run cross:one "$BD2_PID" "$BD2_PORT" "$pipe" "$round" --mode incr2
            --tags "$SAME_TAGS")
        if ((round % 2 == 1)); then
            "${same[@]}"
            "${cross[@]}"
        else
            "${cross[@]}"
            "${same[@]}"
        fi
        zlog_run redis:incr2 "$REDIS_PID" "$REDIS_PORT" "$pipe" "$round" --mode incr2 \
            --tags "$CROSS_TAGS"
    done
done
stop_server "$REDIS_PID"
stop_server "$BD1_PID"
stop_server "$BD2_PID"

# ---------------------------------------------------------------------------------------------
# Memory per logged request, on fresh servers
# ---------------------------------------------------------------------------------------------

# zlog_settle PORT PID: waits (bounded) until used_memory and RSS have held still for 1.25 s.
zlog_settle() {
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

# fill NAME PORT PID KEYS ENTRIES: logs ENTRIES requests in each of KEYS logs; appends a row to
# $MEM_ROWS (name, keys, entries, used_memory bytes/entry, RSS bytes/entry, encoding).
MEM_ROWS="$WORK/zlog-mem.tsv"
: >"$MEM_ROWS"
fill() {
    local name=$1 port=$2 pid=$3 keys=$4 entries=$5 u0 r0 u1 r1 out total enc
    total=$((keys * entries))
    zlog_settle "$port" "$pid"
    u0=$(info_field "$port" used_memory)
    r0=$(rss_kb "$pid")
    out=$(timeout "$RUN_TIMEOUT" taskset -c "$CLIENT_CPU" "$LOADGEN" --addr "$HOST:$port" \
        --mode script --conns 4 --pipeline 16 --sequential --keys "$keys" --requests "$total" \
        --window-ms "$FILL_WINDOW_MS" 2>&1) || die "$name: filling $keys x $entries: $out"
    zlog_settle "$port" "$pid"
    u1=$(info_field "$port" used_memory)
    r1=$(rss_kb "$pid")
    [[ $(cli "$port" DBSIZE) == "$keys" ]] || die "$name: DBSIZE is not $keys after the fill"
    [[ $(cli "$port" ZCARD zlog:0) == "$entries" ]] ||
        die "$name: zlog:0 does not hold $entries entries after the fill"
    enc=$(cli "$port" OBJECT ENCODING zlog:0 2>&1 | tr -d '\n')
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$keys" "$entries" \
        "$(awk -v a="$u0" -v b="$u1" -v n="$total" 'BEGIN { printf "%.1f", (b - a) / n }')" \
        "$(awk -v a="$r0" -v b="$r1" -v n="$total" 'BEGIN { printf "%.1f", (b - a) * 1024 / n }')" \
        "$enc" >>"$MEM_ROWS"
    log "memory: $name, $keys logs x $entries entries: $(tail -1 "$MEM_ROWS" | cut -f4) bytes" \
        "per entry (used_memory), $(tail -1 "$MEM_ROWS" | cut -f5) (RSS), encoding $enc"
}

for shape in $ZLOG_FILLS; do
    keys=${shape%x*}
    entries=${shape#*x}
    REDIS_PORT=$(free_ports 1)
    start_redis "$REDIS_PORT"
    fill Redis "$REDIS_PORT" "$STARTED_PID" "$keys" "$entries"
    stop_server "$STARTED_PID"
    [[ $BD_ZSETS == yes ]] || continue
    BD1_PORT=$(free_ports 1)
    start_bucketd "$BD1_PORT" 1 yes
    fill bucketd "$BD1_PORT" "$STARTED_PID" "$keys" "$entries"
    stop_server "$STARTED_PID"
done

# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

zlog_report() {
    local cpu_model redis_version rev
    cpu_model=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
    redis_version=$(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')
    rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
    if [[ -n $(git -C "$ROOT" status --porcelain -- src Cargo.toml 2>/dev/null) ]]; then
        rev="$rev+local changes"
    fi
    cat <<EOF
# A sliding log (sorted sets) on bucketd and Redis

$(date -u '+%Y-%m-%d %H:%M UTC'); $CORES cores ($cpu_model); Redis $redis_version; bucketd $rev.
Each server pinned to core $SERVER_CPU (\`taskset -c $SERVER_CPU\`; \`--shards 2\` puts both shards
there), examples/zlog_load.rs (one thread) to core $CLIENT_CPU; $ZLOG_CONNS connections, logs
\`zlog:N\` drawn from $ZLOG_KEYS, window $ZLOG_WINDOW_MS ms, FLUSHALL before every run, runs
alternated; $ROUNDS round(s) of $ZLOG_N_P1 requests at pipeline 1 and $ZLOG_N_P16 at pipeline 16
(a request: a whole MULTI..EXEC, or one EVALSHA). Medians over the rounds (± is the largest
distance of a run from the median); latencies in ms, per pipelined batch. "CPU ns/req" is the
server process's CPU time over the run divided by its requests; "busy" is how busy the server's
and the client's cores were. A client core near 100% means the load generator set the pace, and
CPU per request is the figure to read.
$BUSY_RUNS of $TOTAL_RUNS runs started while other work kept the machine over $QUIET_PCT% busy (load
average at the end: $(cut -d' ' -f1-3 /proc/loadavg)).

A request, for a random log at the generator's time t (ms):
\`ZREMRANGEBYSCORE key -inf t-window\`, \`ZADD key t t-counter\`, \`ZCARD key\`,
\`EXPIRE key window_s\`; "multi" sends them as MULTI..EXEC, "script" as EVALSHA of a script doing
the same (examples/zlog_load.rs).$([[ $BD_ZSETS == yes ]] ||
        printf '\n\n%s' "This bucketd answered ZADD with an error (no sorted sets): only Redis ran the sliding log.")

## Throughput and CPU per request: bucketd \`--shards 1\` against Redis

EOF
    python3 "$BENCHES/report.py" pairs "$RUNS" Redis bucketd \
        "sliding log, MULTI/EXEC|redis:multi|bd1:multi" \
        "sliding log, EVALSHA|redis:script|bd1:script"
    cat <<EOF

## The same, bucketd \`--shards 2\` (both shards on the one core) against Redis

EOF
    python3 "$BENCHES/report.py" pairs "$RUNS" Redis "bucketd 2 shards" \
        "sliding log, MULTI/EXEC|redis:multi|bd2:multi" \
        "sliding log, EVALSHA|redis:script|bd2:script"
    cat <<EOF

## Memory per logged request

Fresh servers; KEYS logs filled with ENTRIES requests each (EVALSHA, in turn, with a window of
a day, so nothing is trimmed); "used_memory" is the INFO memory delta, RSS the VmRSS delta of
the process, each divided by the entries. Members are \`t-counter\` (about 20 bytes).

| server | logs | entries per log | used_memory bytes/entry | RSS bytes/entry | encoding |
|---|---:|---:|---:|---:|---|
$(awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6 }' "$MEM_ROWS")

bucketd / Redis, used_memory per entry:
$(awk -F'\t' '$1 == "Redis" { r[$2 "x" $3] = $4 } $1 == "bucketd" { b[$2 "x" $3] = $4 }
    END { for (k in r) if (k in b && r[k] > 0) printf "%s: %.2fx; ", k, b[k] / r[k]; print "" }' "$MEM_ROWS")

## A script over two shards of one node

bucketd \`--shards 2\` (both shards on core $SERVER_CPU): \`EVALSHA\` of a script that INCRs two keys,
\`{TAG1}:a:N\` and \`{TAG2}:b:N\`, N from $ZLOG_KEYS: tags $CROSS_TAGS (the keys on different shards:
the script borrows the other shard's store) against $SAME_TAGS (both on one shard). Ratios: two
shards / one shard. Redis runs the $CROSS_TAGS script as a reference.

EOF
    python3 "$BENCHES/report.py" pairs "$RUNS" "one shard" "two shards" \
        "INCR two keys in a script|cross:one|cross:two"
    echo
    python3 "$BENCHES/report.py" pairs "$RUNS" Redis "bucketd two shards" \
        "INCR two keys in a script|redis:incr2|cross:two"
}

zlog_report | tee "$OUT"
log "report written to $OUT"
