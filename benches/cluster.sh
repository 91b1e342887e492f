# Cluster mode of benches/compare.sh (`bash benches/compare.sh cluster`); sourced by it after
# its settings, build, scratch space, cleanup trap and helpers, which this file uses as they are
# (log, die, cli, wait_ready, stop_pid via the EXIT trap, wait_quiet, core_ticks, cpu_ticks...).
#
# A Redis Cluster of 3 primaries + 3 replicas and a 3-node bucketd cluster, every server on
# SERVER_CPU and redis-benchmark --cluster on CLIENT_CPU, run by run alternately:
#   Redis Cluster  EVALSHA <token_bucket.lua> 1 bucket:{tag}:__rand_int__ 100 10 1
#   Redis Cluster  INCR counter:{tag}:__rand_int__
#   bucketd        CL.THROTTLE bucket:{tag}:__rand_int__ 99 10 1
# at pipeline 1 and 16, then the CPU each cluster uses with no client at all.
#
# Why `{tag}`: with --cluster, redis-benchmark sends each connection's commands to one primary
# and fills the literal `{tag}` with a hash tag of a slot that primary serves; a key without it
# (`bucket:{__rand_int__}`) lands on any slot, and redis-benchmark exits at the first -MOVED.
# redis-benchmark 7.0 (Debian 12's) always picks the primary's first slot, so each primary sees
# one slot; the random `__rand_int__` after the tag still makes every key distinct. The report
# names the slots each run hit.

[[ -n ${BENCHES:-} && -n ${WORK:-} ]] || {
    echo "benches/cluster.sh is run by: bash benches/compare.sh cluster" >&2
    exit 2
}

IDLE_S=${IDLE_S:-10}
UP_TIMEOUT=${UP_TIMEOUT:-60}
STABLE_S=${STABLE_S:-3}
PAUSE_IDLE=${PAUSE_IDLE:-1}
ERRS="$WORK/errors.tsv"
: >"$ERRS"

# shellcheck source=benches/ports.sh
source "$(dirname "${BASH_SOURCE[0]}")/ports.sh"

# info_line PORT SECTION FIELD: one field of INFO, without the carriage return.
info_line() {
    cli "$1" INFO "$2" 2>/dev/null | tr -d '\r' | awk -F: -v k="$3" '$1 == k { print $2 }'
}

# up_until SECONDS FUNCTION ARGS...: calls FUNCTION every 0.25 s until it succeeds (0) or the
# time is up (1).
up_until() {
    local limit=$1 t0
    shift
    t0=$(date +%s)
    while (($(date +%s) - t0 < limit)); do
        if "$@"; then return 0; fi
        sleep 0.25
    done
    "$@"
}

# ---------------------------------------------------------------------------------------------
# Redis Cluster: 6 redis-server (3 primaries + 3 replicas)
# ---------------------------------------------------------------------------------------------

read -r -a ports <<<"$(free_ports 12)"
RC_PORTS=("${ports[@]:0:6}")
RC_BUS=("${ports[@]:6:6}")
RC_PIDS=()
for i in "${!RC_PORTS[@]}"; do
    port=${RC_PORTS[$i]}
    dir="$WORK/redis-$port"
    mkdir -p "$dir"
    # The bus port is given, not left at port + 10000 (which may be taken or past 65535).
    taskset -c "$SERVER_CPU" redis-server --bind "$HOST" --port "$port" \
        --cluster-enabled yes --cluster-port "${RC_BUS[$i]}" \
        --cluster-config-file "$dir/nodes.conf" --save '' --appendonly no --daemonize no \
        --dir "$dir" >>"$dir/redis.log" 2>&1 &
    RC_PIDS+=("$!")
    PIDS+=("$!")
done
for i in "${!RC_PORTS[@]}"; do
    wait_ready "${RC_PORTS[$i]}" "${RC_PIDS[$i]}" ||
        die "redis-server on port ${RC_PORTS[$i]} did not start (see $WORK/redis-${RC_PORTS[$i]})"
done
log "Redis Cluster nodes on ports ${RC_PORTS[*]} (pids ${RC_PIDS[*]}), creating the cluster"
rc_addrs=()
for port in "${RC_PORTS[@]}"; do rc_addrs+=("$HOST:$port"); done
timeout 120 redis-cli --cluster create "${rc_addrs[@]}" --cluster-replicas 1 --cluster-yes \
    >"$WORK/redis-cluster-create.log" 2>&1 ||
    die "redis-cli --cluster create failed: $(tail -5 "$WORK/redis-cluster-create.log")"

# Up: every node says cluster_state:ok and sees the same full slot map, and every replica's
# link to its primary is up (so replication is part of what the runs measure).
RC_PRIMARIES=()
redis_cluster_up() {
    local port role primaries=()
    for port in "${RC_PORTS[@]}"; do
        [[ $(info_line "$port" cluster cluster_enabled) == 1 ]] || return 1
        [[ $(cli "$port" CLUSTER INFO 2>/dev/null | tr -d '\r' | grep '^cluster_state:') == \
            cluster_state:ok ]] || return 1
        role=$(info_line "$port" replication role)
        if [[ $role == master ]]; then
            primaries+=("$port")
        elif [[ $(info_line "$port" replication master_link_status) != up ]]; then
            return 1
        fi
    done
    ((${#primaries[@]} == 3)) || return 1
    python3 "$BENCHES/cluster_view.py" slots "$HOST" "${RC_PORTS[@]}" >"$WORK/rc-slots" ||
        return 1
    RC_PRIMARIES=("${primaries[@]}")
}
up_until "$UP_TIMEOUT" redis_cluster_up ||
    die "Redis Cluster not up within ${UP_TIMEOUT}s: $(cat "$WORK/rc-slots" 2>/dev/null)"
log "Redis Cluster up: primaries ${RC_PRIMARIES[*]}, $(cat "$WORK/rc-slots")"

# The script on every node, replicas too: scripts are not replicated, and a replica that is
# promoted must still answer EVALSHA.
SHA=
for port in "${RC_PORTS[@]}"; do
    sha=$(cli "$port" SCRIPT LOAD "$(cat "$BENCHES/token_bucket.lua")")
    [[ $sha =~ ^[0-9a-f]{40}$ ]] || die "SCRIPT LOAD on $port answered '$sha'"
    [[ -z $SHA || $sha == "$SHA" ]] || die "SCRIPT LOAD on $port gave another hash"
    SHA=$sha
done

# ---------------------------------------------------------------------------------------------
# bucketd cluster: 3 nodes, as cluster/start-local.sh starts them
# ---------------------------------------------------------------------------------------------

read -r -a ports <<<"$(free_ports 6)"
BD_PORTS=("${ports[@]:0:3}")
BD_PEER=("${ports[@]:3:3}")
BD_PIDS=()
bd_nodes=
for i in 0 1 2; do
    bd_nodes+="${bd_nodes:+,}$((i + 1)):$HOST:${BD_PORTS[$i]}:${BD_PEER[$i]}"
done
for i in 0 1 2; do
    taskset -c "$SERVER_CPU" "$BIN" --bind "$HOST" --port "${BD_PORTS[$i]}" --shards 1 \
        --cluster-nodes "$bd_nodes" --node-id $((i + 1)) --groups 16 \
        --data-dir "$WORK/bucketd-node-$((i + 1))" --log warn \
        >>"$WORK/bucketd-node-$((i + 1)).log" 2>&1 &
    BD_PIDS+=("$!")
    PIDS+=("$!")
done
for i in 0 1 2; do
    wait_ready "${BD_PORTS[$i]}" "${BD_PIDS[$i]}" ||
        die "bucketd node $((i + 1)) did not start: $(tail -5 "$WORK/bucketd-node-$((i + 1)).log")"
done
log "bucketd nodes on ports ${BD_PORTS[*]} (pids ${BD_PIDS[*]}), waiting for every group's leader"

# Up: every node says cluster_state:ok with all 16384 slots ok (each group has a leader it
# knows), and all three give the same CLUSTER SLOTS map, so no node redirects another's clients.
bucketd_cluster_up() {
    local port info
    for port in "${BD_PORTS[@]}"; do
        info=$(cli "$port" CLUSTER INFO 2>/dev/null | tr -d '\r')
        grep -qx 'cluster_state:ok' <<<"$info" || return 1
        grep -qx 'cluster_slots_ok:16384' <<<"$info" || return 1
    done
    python3 "$BENCHES/cluster_view.py" slots "$HOST" "${BD_PORTS[@]}" >"$WORK/bd-slots"
}

# bucketd_stable: bucketd_cluster_up, and the same slot map for STABLE_S seconds in a row
# (a new leader may hand a group back to its preferred node soon after an election).
bucketd_stable() {
    local t0 since=0 prev='' cur
    t0=$(date +%s)
    while (($(date +%s) - t0 < UP_TIMEOUT)); do
        if bucketd_cluster_up; then
            cur=$(cat "$WORK/bd-slots")
            if [[ $cur != "$prev" ]]; then
                prev=$cur
                since=$(date +%s%N)
            elif (($(date +%s%N) - since >= STABLE_S * 1000000000)); then
                return 0
            fi
        else
            prev=''
        fi
        sleep 0.25
    done
    return 1
}

bucketd_stable ||
    die "bucketd cluster not up and stable within ${UP_TIMEOUT}s:" \
        "$(cat "$WORK/bd-slots" 2>/dev/null)"
log "bucketd cluster up: $(cat "$WORK/bd-slots")"
cp "$WORK/bd-slots" "$WORK/bd-slots-start"

# An idle bucketd cluster still pings and, for 2 s after its last write, heartbeats each group
# (see the idle CPU in the report), on the very core the Redis Cluster is measured on. So that
# nothing of it is counted against Redis, unless PAUSE_IDLE=0 the bucketd nodes are paused
# (SIGSTOP) while Redis runs,
# and resumed, then waited for until every group has a leader again and the map holds still,
# before bucketd's own runs and the idle measurements.
BD_PAUSED=0
bd_pause() {
    if ((PAUSE_IDLE && !BD_PAUSED)); then
        kill -STOP "${BD_PIDS[@]}"
        BD_PAUSED=1
    fi
}
bd_resume() {
    ((BD_PAUSED)) || return 0
    local t0
    t0=$(date +%s%N)
    kill -CONT "${BD_PIDS[@]}"
    BD_PAUSED=0
    bucketd_stable || die "bucketd cluster not back within ${UP_TIMEOUT}s after a pause"
    log "  bucketd resumed, leaders stable after $((($(date +%s%N) - t0) / 1000000)) ms" \
        "(including the ${STABLE_S}s hold): $(cat "$WORK/bd-slots")"
}

# ---------------------------------------------------------------------------------------------
# The commands work before they are measured (through redirections, as a cluster client sees)
# ---------------------------------------------------------------------------------------------

EVAL_CMD=(EVALSHA "$SHA" 1 'bucket:{tag}:__rand_int__' 100 10 1)
INCR_CMD=(INCR 'counter:{tag}:__rand_int__')
THROTTLE_CMD=(CL.THROTTLE 'bucket:{tag}:__rand_int__' 99 10 1)

for port in "${RC_PRIMARIES[@]}"; do
    check_reply "$port" '^1 99 $' -c EVALSHA "$SHA" 1 "bucket:{check}:$port" 100 10 1
    check_reply "$port" '^1 $' -c INCR "counter:{check}:$port"
done
for port in "${BD_PORTS[@]}"; do
    check_reply "$port" '^0 100 99 -1 1 $' -c CL.THROTTLE "bucket:{check}:$port" 99 10 1
done


# ---------------------------------------------------------------------------------------------
# Idle CPU: no client connected; both clusters measured over the same window
# ---------------------------------------------------------------------------------------------

# idle_cpu NAME: measures every server process over IDLE_S seconds; sets IDLE_<NAME>_RC and
# IDLE_<NAME>_BD to "percent-of-a-core per process ... total".
idle_cpu() {
    local name=$1 pid t0 t1 i
    local all=("${RC_PIDS[@]}" "${BD_PIDS[@]}") before=() after=()
    for pid in "${all[@]}"; do before+=("$(cpu_ticks "$pid")"); done
    t0=$(date +%s%N)
    sleep "$IDLE_S" &
    wait "$!"
    for pid in "${all[@]}"; do after+=("$(cpu_ticks "$pid")"); done
    t1=$(date +%s%N)
    local pcts=()
    for i in "${!all[@]}"; do
        pcts+=("$(awk -v c="$((after[i] - before[i]))" -v t="$((t1 - t0))" -v hz="$CLK_TCK" \
            'BEGIN { printf "%.2f", (c / hz) / (t / 1e9) * 100 }')")
    done
    local rc=("${pcts[@]:0:6}") bd=("${pcts[@]:6:3}")
    printf -v "IDLE_${name}_RC" '%s' "${rc[*]} $(sum_of "${rc[@]}")"
    printf -v "IDLE_${name}_BD" '%s' "${bd[*]} $(sum_of "${bd[@]}")"
}

sum_of() { printf '%s\n' "$@" | awk '{ s += $1 } END { printf "%.2f", s }'; }

# Let start-up work (full resyncs, elections, first snapshots) finish before measuring.
sleep 3
log "idle CPU: ${IDLE_S}s with no clients"
idle_cpu START
log "  Redis Cluster (6 processes): $IDLE_START_RC % of a core; bucketd (3): $IDLE_START_BD"

# ---------------------------------------------------------------------------------------------
# Throughput and latency
# ---------------------------------------------------------------------------------------------

# error_counts PORT...: "CODE COUNT" lines, the errorstats of the nodes added up.
error_counts() {
    local port
    for port in "$@"; do cli "$port" INFO errorstats 2>/dev/null | tr -d '\r'; done |
        awk -F'[_:=]' '/^errorstat_/ { n[$2] += $4 } END { for (k in n) print k, n[k] }' | sort
}

# commands_per_node PORT...: total_commands_processed of each node, space-separated.
commands_per_node() {
    local port out=()
    for port in "$@"; do out+=("$(info_line "$port" stats total_commands_processed)"); done
    echo "${out[*]}"
}

# proposed_totals PORT...: "ENTRIES COMMANDS", the log entries the bucketd nodes proposed and the
# commands in them (one INFO cluster per node), summed over the nodes.
proposed_totals() {
    local port
    for port in "$@"; do cli "$port" INFO cluster 2>/dev/null | tr -d '\r'; done |
        awk -F: '$1 == "cluster_entries_proposed" { e += $2 }
            $1 == "cluster_commands_proposed" { c += $2 }
            END { printf "%d %d\n", e, c }'
}

# summed COUNTER PID...: COUNTER (cpu_ticks or cpu_ns) of each process, added up.
summed() {
    local counter=$1 pid sum=0
    shift
    for pid in "$@"; do sum=$((sum + $("$counter" "$pid"))); done
    echo "$sum"
}

# cbench ID SIDE(redis|bucketd) PIPELINE N ROUND CMD...: one bounded redis-benchmark --cluster
# run against that cluster, appended to $RUNS (the columns compare.sh's runs have, the server
# process CPU being that of all the cluster's processes) and its error replies to $ERRS.
cbench() {
    local id=$1 side=$2 pipe=$3 n=$4 round=$5
    shift 5
    local nodes pids entry port
    if [[ $side == redis ]]; then
        nodes=("${RC_PORTS[@]}") pids=("${RC_PIDS[@]}") entry=${RC_PRIMARIES[0]}
        bd_pause
        # Replicas follow their primary's FLUSHALL.
        for port in "${RC_PRIMARIES[@]}"; do cli "$port" FLUSHALL >/dev/null; done
    else
        # FLUSHALL is refused in cluster mode; the buckets of a run refill and expire 0.1 s
        # after their last check, so the next run starts empty all the same.
        nodes=("${BD_PORTS[@]}") pids=("${BD_PIDS[@]}") entry=${BD_PORTS[0]}
        bd_resume
    fi
    # What redis-benchmark will see when it asks for CLUSTER NODES at its start.
    local hit
    hit=$(python3 "$BENCHES/cluster_view.py" targets "$HOST" "$entry" |
        awk '{ printf "%s%s:%s", s, $1, $2; s = " " }')
    wait_quiet
    local e0 e1 cmd0 cmd1 s0 s1 k0 k1 s2 s3 k2 k3 c0 c1 n0 n1 t0 t1 parsed rc=0
    local pe0=0 pc0=0 pe1=0 pc1=0
    local err="$WORK/bench-$id-P$pipe-$round.err"
    e0=$(error_counts "${nodes[@]}")
    cmd0=$(commands_per_node "${nodes[@]}")
    [[ $side == bucketd ]] && read -r pe0 pc0 < <(proposed_totals "${nodes[@]}")
    read -r s0 s1 < <(core_ticks "$SERVER_CPU")
    read -r k0 k1 < <(core_ticks "$CLIENT_CPU")
    c0=$(summed cpu_ticks "${pids[@]}")
    n0=$(summed cpu_ns "${pids[@]}")
    t0=$(date +%s%N)
    # In the background and waited for, so that Ctrl-C reaches the trap at once (bash runs a
    # trap only after a foreground command ends, and timeout keeps it from the terminal's
    # signals); the EXIT trap stops it by pid like the servers.
    timeout "$RUN_TIMEOUT" taskset -c "$CLIENT_CPU" redis-benchmark --cluster -h "$HOST" \
        -p "$entry" -c "$CLIENTS" -n "$n" -r "$KEYSPACE" -P "$pipe" --csv "$@" \
        >"$err.csv" 2>"$err" &
    local bench_pid=$!
    PIDS+=("$bench_pid")
    wait "$bench_pid" || rc=$?
    unset 'PIDS[${#PIDS[@]}-1]'
    t1=$(date +%s%N)
    c1=$(summed cpu_ticks "${pids[@]}")
    n1=$(summed cpu_ns "${pids[@]}")
    read -r s2 s3 < <(core_ticks "$SERVER_CPU")
    read -r k2 k3 < <(core_ticks "$CLIENT_CPU")
    e1=$(error_counts "${nodes[@]}")
    cmd1=$(commands_per_node "${nodes[@]}")
    [[ $side == bucketd ]] && read -r pe1 pc1 < <(proposed_totals "${nodes[@]}")
    TOTAL_RUNS=$((TOTAL_RUNS + 1))
    BUSY_RUNS=$((BUSY_RUNS + RUN_NOISY))

    local errors served refetch
    errors=$(awk 'NR == FNR { b[$1] = $2; next }
        { d = $2 - b[$1]; if (d > 0) { printf "%s%s %d", sep, $1, d; sep = ", " } }' \
        <(printf '%s\n' "$e0") <(printf '%s\n' "$e1"))
    served=$(awk -v a="$cmd0" -v b="$cmd1" 'BEGIN {
        n = split(a, x, " "); split(b, y, " ")
        for (i = 1; i <= n; i++) printf "%s%d", (i > 1 ? " / " : ""), y[i] - x[i] }')
    refetch=$(grep -c 'slots configuration changed' "$err" || true)
    # Commands per Raft log entry over the run (bucketd only: Redis has no entries).
    local per_entry=-
    if ((pe1 > pe0)); then
        per_entry=$(awk -v e=$((pe1 - pe0)) -v c=$((pc1 - pc0)) 'BEGIN { printf "%.1f", c / e }')
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$id" "$pipe" "$round" "$rc" \
        "${errors:-none}" "$refetch" "$hit" "$served" "$per_entry" >>"$ERRS"
    if ((rc != 0)); then
        log "  $id P$pipe: redis-benchmark failed (exit $rc): $(grep -v '^WARNING' "$err" |
            tail -1), run skipped"
        return 0
    fi
    if ! parsed=$(python3 "$BENCHES/report.py" parse-csv <"$err.csv"); then
        log "  $id P$pipe: unreadable output, run skipped"
        return 0
    fi
    record_run "$id" "$pipe" "$round" "$parsed" $((c1 - c0)) $((t1 - t0)) \
        $((s2 - s0)) $((s3 - s1)) $((k2 - k0)) $((k3 - k1)) $((n1 - n0)) "$n"
    local proc=$RUN_PROC srv=$RUN_SRV cl=$RUN_CL
    log "  $id P$pipe round $round: $(cut -f1 <<<"$parsed" | cut -d. -f1) ops/s" \
        "(cluster CPU $proc%, server core $srv% busy, client core $cl% busy;" \
        "error replies: ${errors:-none}; slots hit $hit; commands per node $served;" \
        "commands per log entry $per_entry)"
}

r_eval() { cbench rc:evalsha redis "$@" "${EVAL_CMD[@]}"; }
r_incr() { cbench rc:incr redis "$@" "${INCR_CMD[@]}"; }
b_throttle() { cbench bd:throttle bucketd "$@" "${THROTTLE_CMD[@]}"; }

log "throughput: $ROUNDS round(s), $CLIENTS clients, keys over $KEYSPACE, P1 n=$N_P1, P16 n=$N_P16"
for ((round = 1; round <= ROUNDS; round++)); do
    for pipe in 1 16; do
        args=("$pipe" "$(requests_for "$pipe")" "$round")
        # Alternate who goes first, so drift over time does not favour one cluster.
        if ((round % 2 == 1)); then
            r_eval "${args[@]}"
            r_incr "${args[@]}"
            b_throttle "${args[@]}"
        else
            b_throttle "${args[@]}"
            r_incr "${args[@]}"
            r_eval "${args[@]}"
        fi
    done
done

# Idle again, now that both have served traffic (Redis still holds the last runs' keys).
bd_resume
log "idle CPU after the runs: ${IDLE_S}s with no clients"
idle_cpu AFTER
log "  Redis Cluster: $IDLE_AFTER_RC; bucketd: $IDLE_AFTER_BD"

# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

# idle_rows LABEL "P1 ... PN TOTAL" NAMES...: one table row per process, then the total.
idle_rows() {
    local label=$1 values i
    read -r -a values <<<"$2"
    shift 2
    local names=("$@")
    for i in "${!names[@]}"; do
        printf '| %s | %s | %s%% |\n' "$label" "${names[$i]}" "${values[$i]}"
    done
    printf '| %s | **total** | **%s%%** |\n' "$label" "${values[${#names[@]}]}"
}

slot_shares() { sed 's/.*primaries=\([^ ]*\).*/\1/; s/,/, /g' "$1"; }

pause_note() {
    if ((PAUSE_IDLE)); then
        echo "the bucketd nodes are paused (SIGSTOP) during the Redis runs, since an idle bucketd
  cluster uses a share of the server core (below), and resumed before bucketd's runs once every
  group has a leader and the slot map has held still for ${STABLE_S} s; the idle Redis Cluster
  stays up during bucketd's runs (it uses next to nothing)."
    else
        echo "the other cluster stays up, idle (PAUSE_IDLE=0), and its idle CPU (below) is taken
  from the core the measured cluster runs on."
    fi
}

cluster_report() {
    local cpu_model redis_version rev rc_names=() bd_names=() port i
    cpu_model=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
    redis_version=$(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')
    rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
    if [[ -n $(git -C "$ROOT" status --porcelain -- src Cargo.toml 2>/dev/null) ]]; then
        rev="$rev+local changes"
    fi
    for port in "${RC_PORTS[@]}"; do
        if [[ " ${RC_PRIMARIES[*]} " == *" $port "* ]]; then
            rc_names+=("$port (primary)")
        else
            rc_names+=("$port (replica)")
        fi
    done
    for i in 0 1 2; do bd_names+=("node $((i + 1)), port ${BD_PORTS[$i]}"); done
    local p1 p16
    p1=$(python3 "$BENCHES/report.py" ratio "$RUNS" bd:throttle rc:evalsha 1)
    p16=$(python3 "$BENCHES/report.py" ratio "$RUNS" bd:throttle rc:incr 16)
    cat <<EOF
# bucketd cluster vs Redis Cluster

$(date -u '+%Y-%m-%d %H:%M UTC'); $CORES cores ($cpu_model); Redis $redis_version; bucketd $rev.

- Redis Cluster: 6 \`redis-server\` (\`--cluster-enabled yes --save "" --appendonly no\`), made
  3 primaries + 3 replicas by \`redis-cli --cluster create ... --cluster-replicas 1\`; replication
  is asynchronous (a primary answers before its replica has the write). The Lua script
  (benches/token_bucket.lua) loaded with \`SCRIPT LOAD\` on every node.
- bucketd: 3 nodes from the release build, \`--shards 1\`, 16 shard groups of 3 replicas each
  (as cluster/start-local.sh starts them); a check is answered once a majority of its group's
  replicas has it in its Raft log and the leader applied it.
- **All nine server processes share core $SERVER_CPU** (\`taskset -c $SERVER_CPU\`): 6 Redis processes
  or 3 bucketd nodes on one core, so a cluster's replication work competes with serving on that
  core. redis-benchmark (one thread per primary) runs on core $CLIENT_CPU. Only one cluster is
  under load at a time; $(pause_note)
- Load: \`redis-benchmark --cluster -h $HOST -p <a primary> -c $CLIENTS -n N -r $KEYSPACE [-P 16] --csv\`,
  $ROUNDS round(s) of N=$N_P1 at pipeline 1 and N=$N_P16 at pipeline 16, the three runs alternated
  (order reversed every other round). Medians over the rounds (± is the largest distance of a
  run from the median); latencies in ms as redis-benchmark reports them.
  - Redis Cluster: \`${EVAL_CMD[*]}\` and \`${INCR_CMD[*]}\`
  - bucketd: \`${THROTTLE_CMD[*]}\` (the same limit: burst 100, 10/s)
- Keys: redis-benchmark $redis_version sends each connection to one primary (connections spread
  evenly over the primaries) and puts in place of \`{tag}\` the hash tag of that primary's
  *first* slot (newer redis-benchmark picks a random slot of the primary), so each primary sees
  one slot, and the random \`__rand_int__\` after the tag keeps the keys distinct. A key such as
  \`bucket:{__rand_int__}\` (no \`{tag}\`) makes it exit on the first \`-MOVED\`. In bucketd that
  means one of the 16 shard groups per node, the one with that node's lowest led slot; the
  slots each run hit are in the table of error replies below. Slots per primary at the start
  (CLUSTER SLOTS): Redis Cluster $(slot_shares "$WORK/rc-slots"); bucketd
  $(slot_shares "$WORK/bd-slots-start") (the groups each node leads).
- Redis primaries get \`FLUSHALL\` before each of their runs; bucketd refuses \`FLUSHALL\` in
  cluster mode, and its buckets expire 0.1 s after their last check, so each run starts empty.
- $BUSY_RUNS of $TOTAL_RUNS runs started while other work kept the machine over $QUIET_PCT% busy (load
  average at the end: $(cut -d' ' -f1-3 /proc/loadavg)).

## Throughput and latency

EOF
    python3 "$BENCHES/report.py" columns "$RUNS" \
        "Redis Cluster EVALSHA|rc:evalsha" "Redis Cluster INCR|rc:incr" \
        "bucketd CL.THROTTLE|bd:throttle"
    cat <<EOF

- bucketd CL.THROTTLE / Redis Cluster EVALSHA at pipeline 1: **$p1**
- bucketd CL.THROTTLE / Redis Cluster INCR at pipeline 16: **$p16**

CPU over the runs (medians): all of the cluster's processes together (100% = one core), and how
busy the server core and the client core were (/proc/stat, kernel network work included). A
client core near 100% means redis-benchmark, not the servers, set the pace.

EOF
    python3 "$BENCHES/report.py" cpu-columns "$RUNS" \
        "Redis Cluster EVALSHA|rc:evalsha" "Redis Cluster INCR|rc:incr" \
        "bucketd CL.THROTTLE|bd:throttle"
    cat <<EOF

CPU time per request of all the cluster's processes together (the scheduler's run time of
every thread, /proc/PID/task/*/schedstat, over the run, divided by the requests sent; medians
over the rounds), against Redis Cluster's \`INCR\`. Unlike throughput, it does not depend on
who set the pace, and it moves less with the machine's other load.

EOF
    python3 "$BENCHES/report.py" cpu-ratios "$RUNS" "Redis Cluster INCR|rc:incr" \
        "Redis Cluster EVALSHA|rc:evalsha" "bucketd CL.THROTTLE|bd:throttle"
    cat <<EOF

## Error replies and redirections during the runs

From INFO errorstats of every node of the cluster, before and after each run (bucketd counts
-MOVED, -TRYAGAIN, -CLUSTERDOWN there as Redis does), and redis-benchmark's own "slots
configuration changed" notices (one per -MOVED/-ASK/-CLUSTERDOWN it acted on). redis-benchmark
counts a redirected request as done, so a run with redirections overstates its throughput.
redis-benchmark also counts an error it does not act on (-TRYAGAIN) as a completed request.
"slots hit" is each primary's first slot (port:slot) when the run started; "commands per node"
the total_commands_processed delta of each node, Redis ports in the order ${RC_PORTS[*]} (primaries
${RC_PRIMARIES[*]}; Redis counts the commands a script calls, and replicas the writes they
replay), bucketd ports ${BD_PORTS[*]}. "per entry" is the commands in each Raft log entry the
bucketd nodes proposed during the run (INFO cluster: cluster_commands_proposed over
cluster_entries_proposed): each entry costs a log write on every replica and a round trip to
each follower, whatever it carries.

| run | pipeline | round | exit | error replies | slot refetches | slots hit | commands per node | per entry |
|---|---:|---:|---:|---|---:|---|---|---:|
$(awk -F'\t' -v OFS=' | ' '{ $1 = $1; print "| " $0 " |" }' "$ERRS")

## Idle CPU

utime + stime of each process from /proc over ${IDLE_S} s with no client connected (both clusters
measured over the same window), as a percentage of one core; the clock-tick resolution is
$(awk -v hz="$CLK_TCK" -v s="$IDLE_S" 'BEGIN { printf "%.2f", 100 / hz / s }')% here.

| when | process | CPU (% of one core) |
|---|---|---:|
$(idle_rows "Redis Cluster, after start-up" "$IDLE_START_RC" "${rc_names[@]}")
$(idle_rows "bucketd, after start-up" "$IDLE_START_BD" "${bd_names[@]}")
$(idle_rows "Redis Cluster, after the runs" "$IDLE_AFTER_RC" "${rc_names[@]}")
$(idle_rows "bucketd, after the runs" "$IDLE_AFTER_BD" "${bd_names[@]}")
EOF
}

cluster_report | tee "$OUT"
log "report written to $OUT"
