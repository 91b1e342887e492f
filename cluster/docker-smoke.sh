#!/usr/bin/env bash
# Container smoke test: builds bucketd:local (cluster/build-image.sh), starts the three-node
# cluster of cluster/docker-compose.yml, takes a rate-limit bucket through CL.THROTTLE, stops the
# container that leads the bucket's group and checks that another node serves the bucket with
# its remaining count intact, then brings the stopped node back and checks it rejoins. Then it
# scales out and in: node4 (compose profile "scale") joins through node1 while tokens are taken
# from one key in every shard group; once BK.CLUSTER STATUS shows four members, no moves left
# and replicas on node4, the counts must still be exact; then BK.CLUSTER REMOVE drains node4
# (SMOKE_REMOVE picks another) under the same traffic, its container is stopped, and the three
# that stay must serve every slot with every count exact.
# Everything is torn down (containers and volumes) on exit, whatever happened.
#
# Skips (exit 0) when no Docker engine answers. All traffic goes to 127.0.0.1: the nodes use
# host networking. Client ports are BASE+1..4 and peer ports PEER_BASE+1..4, with BASE 7000 and
# PEER_BASE 17000 when those eight ports are free, otherwise a free set picked at random (and
# picked again if a node still finds its port taken).
#
# Environment:
#   BUCKETD_PORT_BASE, BUCKETD_PEER_PORT_BASE   pin the ports (no fallback then)
#   SMOKE_PROJECT       compose project name (default bucketd-smoke)
#   SMOKE_REMOVE        the node the scale stage removes: node4 (default), node1, node2 or node3
#   SMOKE_TIMEOUT       overall limit in seconds, cargo build included (default 1200: a release
#                       build on a busy two-core machine has taken ten minutes)
#   BUCKETD_PROFILE     the Cargo profile built and packaged (default release; CI uses smoke,
#                       optimised without LTO, which takes half as long to build)
#   SKIP_CARGO_BUILD=1  package that profile's binary as already built
set -euo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$SELF")/.."

# Bound the whole run: re-run this script under timeout(1), which signals every process of the
# run (cargo, docker clients) when time is up; the EXIT trap below still tears the cluster down.
if [ -z "${BUCKETD_SMOKE_TIMED:-}" ]; then
  if ! timeout 30 docker info >/dev/null 2>&1; then
    echo "docker: no engine answers here; skipping the container smoke test"
    exit 0
  fi
  export BUCKETD_SMOKE_TIMED=1
  exec timeout -k 60 "${SMOKE_TIMEOUT:-1200}" bash "$SELF" "$@"
fi

PROJECT=${SMOKE_PROJECT:-bucketd-smoke}
KEY=smoke:key
# CL.THROTTLE key max_burst count period: a bucket of 10, refilling one token per 60 s, so the
# remaining count only moves when the test takes tokens (or after a minute).
RULE=(9 1 60)
START=$SECONDS

log() { printf '[%3ds] %s\n' "$((SECONDS - START))" "$*"; }
pass() { printf '[%3ds] PASS: %s\n' "$((SECONDS - START))" "$*"; }
fail() {
  printf '[%3ds] FAIL: %s\n' "$((SECONDS - START))" "$*"
  exit 1
}

# Polls until the command succeeds or the time (seconds) runs out.
wait_until() {
  local secs=$1
  shift
  local deadline=$((SECONDS + secs))
  until "$@"; do
    if ((SECONDS >= deadline)); then
      return 1
    fi
    sleep 0.25
  done
}

# --- tools -------------------------------------------------------------------------------------

if docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose)
elif command -v docker-compose >/dev/null; then
  COMPOSE=(docker-compose)
else
  fail "neither 'docker compose' nor 'docker-compose' is installed"
fi
COMPOSE+=(-p "$PROJECT" -f cluster/docker-compose.yml)
# The same with node4's profile active: for node4 itself, and for whatever must also reach node4
# (down, logs). `docker compose` (v2) leaves a profile's containers behind on a plain `down`.
COMPOSE_ALL=("${COMPOSE[@]}" --profile scale)

if ! command -v redis-cli >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing redis-tools for redis-cli"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq redis-tools >/dev/null; } || true
  fi
  command -v redis-cli >/dev/null || fail "redis-cli is missing (Debian: apt-get install redis-tools)"
fi

# Every redis-cli call is bounded and goes to loopback.
rcli() { timeout 5 redis-cli -h 127.0.0.1 "$@"; }

# --- teardown, whatever happens ----------------------------------------------------------------

STARTED=0
cleanup() {
  local rc=$?
  trap - EXIT TERM INT
  set +e
  if [ "$STARTED" = 1 ]; then
    if [ "$rc" != 0 ]; then
      log "last log lines of the nodes:"
      timeout 30 "${COMPOSE_ALL[@]}" logs --no-color --tail 30 2>&1 | sed 's/^/    /'
    fi
    log "tearing down (down -v)"
    timeout 90 "${COMPOSE_ALL[@]}" down -v -t 5 >/dev/null 2>&1
    left=$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT")
    if [ -n "$left" ]; then
      # shellcheck disable=SC2086 # a list of ids
      docker rm -f -v $left >/dev/null 2>&1
    fi
  fi
  if [ "$rc" = 0 ]; then
    log "PASS: container smoke test ($((SECONDS - START)) s)"
  else
    log "FAIL: container smoke test (exit $rc after $((SECONDS - START)) s)"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'log "FAIL: interrupted or out of time"; exit 124' TERM INT

# --- build -------------------------------------------------------------------------------------

log "building the image"
cluster/build-image.sh
pass "image bucketd:local built ($(docker image inspect -f '{{.Size}}' bucketd:local) bytes)"

# --- ports -------------------------------------------------------------------------------------

# A port is taken if any TCP socket uses it locally: listeners, and also outgoing connections,
# whose local port would make a bind fail just the same.
port_busy() {
  if command -v ss >/dev/null; then
    ss -Htan | awk '{ print $4 }' | sed 's/.*://' | grep -qx "$1"
  else
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
  fi
}

ports_free() { # base peer_base
  local i
  for i in 1 2 3 4; do
    if port_busy $(($1 + i)) || port_busy $(($2 + i)); then
      return 1
    fi
  done
}

# Sets BASE and PEER_BASE. Pinned ports are used as they are; otherwise 7000/17000 when free,
# else a random free set in 20001-29993, below the kernel's range for outgoing connections'
# ports (32768 and up by default), so no connection made meanwhile can take one of them.
pick_ports() { # attempt
  if [ -n "${BUCKETD_PORT_BASE:-}" ]; then
    BASE=$BUCKETD_PORT_BASE
    PEER_BASE=${BUCKETD_PEER_PORT_BASE:-$((BASE + 10000))}
    ports_free "$BASE" "$PEER_BASE" ||
      fail "ports $((BASE + 1))-$((BASE + 4)) or $((PEER_BASE + 1))-$((PEER_BASE + 4)) are taken"
    return
  fi
  if [ "$1" = 1 ]; then
    BASE=7000
    PEER_BASE=17000
    ports_free "$BASE" "$PEER_BASE" && return
  fi
  local tries
  for tries in $(seq 50); do
    BASE=$((20000 + RANDOM % 500 * 10))
    PEER_BASE=$((BASE + 5000))
    ports_free "$BASE" "$PEER_BASE" && return
  done
  fail "found no eight free ports for the cluster in $tries tries"
}

# --- start -------------------------------------------------------------------------------------

cluster_ok() {
  local out
  out=$(rcli -p "$1" CLUSTER INFO 2>/dev/null) && grep -q "cluster_state:ok" <<<"$out"
}
exited_nodes() {
  docker ps -aq --filter "label=com.docker.compose.project=$PROJECT" --filter status=exited
}

# A previous run that was killed outright may have left its containers behind.
timeout 90 "${COMPOSE_ALL[@]}" down -v -t 5 >/dev/null 2>&1 || true
STARTED=1
# Up to three attempts: a node whose port was taken between the check and its bind exits at once;
# then the cluster starts over on other ports (unless they are pinned).
for attempt in 1 2 3; do
  pick_ports "$attempt"
  PORTS=($((BASE + 1)) $((BASE + 2)) $((BASE + 3)))
  PORT4=$((BASE + 4)) # node4's, for the scale stage
  for i in 1 2 3 4; do
    export "BUCKETD_PORT_$i=$((BASE + i))" "BUCKETD_PEER_PORT_$i=$((PEER_BASE + i))"
  done
  log "cluster ports: clients ${PORTS[*]} (node4: $PORT4), peers $((PEER_BASE + 1))-$((PEER_BASE + 4)); project $PROJECT"
  timeout 120 "${COMPOSE[@]}" up -d

  deadline=$((SECONDS + 60))
  up=0
  while ((SECONDS < deadline)); do
    if [ -n "$(exited_nodes)" ]; then
      break
    fi
    up=1
    for p in "${PORTS[@]}"; do
      cluster_ok "$p" || up=0
    done
    ((up == 0)) || break
    sleep 0.25
  done
  ((up == 1)) && break

  if [ -z "$(exited_nodes)" ]; then
    fail "the nodes did not all report cluster_state:ok within 60 s"
  fi
  log "a node exited at start:"
  timeout 30 "${COMPOSE[@]}" logs --no-color --tail 3 2>&1 | grep -i "error" | sed 's/^/    /' || true
  if [ -n "${BUCKETD_PORT_BASE:-}" ] || [ "$attempt" = 3 ]; then
    fail "the cluster did not start"
  fi
  log "starting over on other ports"
  timeout 90 "${COMPOSE_ALL[@]}" down -v -t 5 >/dev/null 2>&1 || true
done
pass "all three nodes report cluster_state:ok"

# --- the bucket --------------------------------------------------------------------------------

# Runs CL.THROTTLE with the given quantity through the given port and prints the five reply
# integers on one line; fails on anything else (errors, MOVED, refused), printing what came.
# The key and rule are TKEY and TRULE: KEY and RULE unless a caller makes them local.
TKEY=$KEY
TRULE=("${RULE[@]}")
throttle() { # port quantity [redis-cli flags]
  local port=$1 qty=$2
  shift 2
  local out
  local -a r
  if out=$(rcli "$@" -p "$port" CL.THROTTLE "$TKEY" "${TRULE[@]}" "$qty" 2>&1); then
    mapfile -t r <<<"$out"
    if [ "${#r[@]}" = 5 ] && [[ "${r[*]}" =~ ^-?[0-9]+(\ -?[0-9]+){4}$ ]]; then
      echo "${r[*]}"
      return 0
    fi
  fi
  echo "${out//$'\n'/ }"
  return 1
}

# Takes tokens (quantity > 0), retrying for up to 15 s while the answer shows the command was not
# applied: CLUSTERDOWN (no leader known, e.g. while leaderships are being evened out just
# after start or a failover) or a refused connection (redirected to a stopped node). Any
# other failure, a TRYAGAIN (the write may still commit) among them, is final.
take() { # port quantity [redis-cli flags]
  local deadline=$((SECONDS + 15)) out
  until out=$(throttle "$@"); do
    if ((SECONDS >= deadline)) || ! [[ $out =~ ^CLUSTERDOWN|Could\ not\ connect ]]; then
      echo "$out"
      return 1
    fi
    sleep 0.25
  done
  echo "$out"
}

# Checks a reply: limited=0, limit=10 and the expected remaining count.
expect_reply() { # what reply expected_remaining [tolerance]
  local what=$1 expected=$3 tol=${4:-0}
  local -a r
  read -r -a r <<<"$2"
  if [ "${r[0]}" != 0 ] || [ "${r[1]}" != 10 ] ||
    ((r[2] < expected || r[2] > expected + tol)); then
    fail "$what: got [${r[*]}], want limited=0 limit=10 remaining=$expected"
  fi
}

reply=$(take "${PORTS[0]}" 1 -c) || fail "CL.THROTTLE $KEY ${RULE[*]} through port ${PORTS[0]} failed: $reply"
FIRST_TAKE=$SECONDS
expect_reply "first CL.THROTTLE" "$reply" 9
pass "CL.THROTTLE $KEY ${RULE[*]} -> [$reply] (limited=0)"

for want in 8 7 6; do
  reply=$(take "${PORTS[want % 3]}" 1 -c) || fail "CL.THROTTLE through port ${PORTS[want % 3]} failed: $reply"
  expect_reply "taking a token" "$reply" "$want"
done
REMAINING=6
pass "took 3 more tokens through all three nodes; remaining=$REMAINING"

# Tokens come back at one per 60 s: if the run got that slow, allow that many more.
refill() { echo $(((SECONDS - FIRST_TAKE) / 60 + ((SECONDS - FIRST_TAKE) % 60 > 50 ? 1 : 0))); }

# --- stop the key's leader ---------------------------------------------------------------------

slot=$(rcli -p "${PORTS[0]}" CLUSTER KEYSLOT "$KEY" 2>&1) || true
[[ $slot =~ ^[0-9]+$ ]] || fail "CLUSTER KEYSLOT $KEY answered '$slot'"

# The port of the node listed first (the group's leader) for the slot in CLUSTER SLOTS.
slot_leader() { # port-to-ask
  rcli --no-raw -p "$1" CLUSTER SLOTS 2>/dev/null | awk -v slot="$slot" '
    /^ *[0-9]+\) 1\) \(integer\)/ { n = 0 }
    /\(integer\)/ {
      n++
      if (n == 1) lo = $NF
      else if (n == 2) hi = $NF
      else if (n == 3 && slot + 0 >= lo + 0 && slot + 0 <= hi + 0) { print $NF; exit }
    }'
}
# The leader CLUSTER SLOTS names must answer the key itself, without redirecting. Polled, as
# leaderships may still be moving while they are evened out.
leader_found() {
  leader=$(slot_leader "${PORTS[0]}" || true)
  [[ " ${PORTS[*]} " == *" $leader "* ]] && reply=$(throttle "$leader" 0)
}
# The containers' ids first, so that the stop follows the leader check at once.
CIDS=()
for i in 1 2 3; do
  CIDS+=("$(timeout 30 "${COMPOSE[@]}" ps -q "node$i" || true)")
  [ -n "${CIDS[i - 1]}" ] || fail "no container for node$i"
done
leader=
wait_until 15 leader_found ||
  fail "no node that CLUSTER SLOTS names as leader of slot $slot (last: '$leader') serves $KEY directly: $reply"
for i in 0 1 2; do
  [ "${PORTS[i]}" = "$leader" ] && idx=$i
done
expect_reply "peek at the leader" "$reply" "$REMAINING" "$(refill)"
service=node$((idx + 1))
cid=${CIDS[idx]}
pass "slot $slot of $KEY is led by $service (port $leader), which serves it directly"

log "stopping $service (container ${cid:0:12})"
stop_at=$SECONDS
timeout 60 docker stop -t 10 "$cid" >/dev/null
[ "$(docker inspect -f '{{.State.Running}}' "$cid")" = false ] || fail "$service is still running"

survivors=()
for i in 0 1 2; do
  ((i == idx)) || survivors+=("${PORTS[i]}")
done

served_again() {
  local p
  for p in "${survivors[@]}"; do
    if reply=$(throttle "$p" 0 -c); then
      served_by=$p
      return 0
    fi
  done
  return 1
}
served_by=
wait_until 30 served_again || fail "no surviving node served $KEY within 30 s of stopping $service"
new_leader=$(slot_leader "$served_by" || true)
pass "$KEY served again $((SECONDS - stop_at)) s after stopping $service; slot $slot now led by port ${new_leader:-?}"
[ "$new_leader" != "$leader" ] || fail "CLUSTER SLOTS still names the stopped node (port $leader) as leader"

expect_reply "peek after failover" "$reply" "$REMAINING" "$(refill)"
pass "remaining count preserved across the failover: [$reply]"

reply=$(take "${survivors[0]}" 1 -c) || fail "taking a token after the failover failed: $reply"
REMAINING=5
expect_reply "taking a token after failover" "$reply" "$REMAINING" "$(refill)"
pass "two nodes of three still take tokens: [$reply]"

# --- bring the stopped node back ---------------------------------------------------------------

log "starting $service again"
timeout 60 docker start "$cid" >/dev/null
wait_until 60 cluster_ok "$leader" || fail "restarted $service did not report cluster_state:ok within 60 s"
rejoined() { reply=$(throttle "$leader" 0 -c); }
wait_until 30 rejoined || fail "restarted $service does not serve $KEY (directly or by redirection)"
expect_reply "peek through the restarted node" "$reply" "$REMAINING" "$(refill)"
pass "restarted $service rejoined with its volume and sees [$reply]"

# --- scale out: node4 joins --------------------------------------------------------------------

# BK.CLUSTER STATUS through a port, as lines "KEY VALUE" for the cluster's fields and
# "member ID KEY VALUE" for each member's. redis-cli --raw prints the map flattened, one key or
# value a line, with the members' fields after "members".
status() { # port
  local out
  out=$(rcli --raw -p "$1" BK.CLUSTER STATUS 2>&1) || return 1
  [ "$(head -n 1 <<<"$out")" = nodes ] || return 1
  awk '
    $0 == "members" { m = 1; next }
    { k = $0; if ((getline v) <= 0) exit 1 }
    m && k == "id" { id = v }
    m { print "member", id, k, v; next }
    { print k, v }' <<<"$out"
}
# The same, on one line for the log: nodes, moves, then ID:state:replicas/leaders per member.
status_line() { # status lines
  awk '
    $1 == "nodes" { n = $2 }
    $1 == "moves_in_progress" { mv = $2 }
    $1 == "member" && $3 == "id" { ids[++k] = $2 }
    $1 == "member" { f[$2, $3] = $4 }
    END {
      printf "nodes %s, moves %s:", n, mv
      for (i = 1; i <= k; i++)
        printf " %s:%s:%s/%s", ids[i], f[ids[i], "state"], f[ids[i], "replicas"], f[ids[i], "leaders"]
      printf "\n"
    }' <<<"$1"
}
# Whether status lines show WANT members, all up, with no move in progress, and (when given)
# the member at ADDRESS holding replicas.
settled() { # status-lines want [address]
  awk -v want="$2" -v addr="${3:-}" '
    $1 == "nodes" { n = $2 }
    $1 == "moves_in_progress" { mv = $2 }
    $1 == "member" && $3 == "id" { k++ }
    $1 == "member" && $3 == "state" && $4 != "up" { down++ }
    $1 == "member" && $3 == "address" { a[$2] = $4 }
    $1 == "member" && $3 == "replicas" { r[$2] = $4 }
    END {
      if (n != want || k != want || mv != 0 || down) exit 1
      if (addr == "") exit 0
      for (id in a) if (a[id] == addr) exit !(r[id] > 0)
      exit 1
    }' <<<"$1"
}
# Every port given answers STATUS and it is settled (want, address as above). Leaves the last
# answer in LAST_STATUS and the port it came from in LAST_STATUS_PORT.
all_settled() { # want address port...
  local want=$1 addr=$2 p
  shift 2
  for p in "$@"; do
    LAST_STATUS_PORT=$p
    LAST_STATUS=$(status "$p") || {
      LAST_STATUS="(no STATUS answer)"
      return 1
    }
    settled "$LAST_STATUS" "$want" "$addr" || return 1
  done
}
member_id() { # status-lines address
  awk -v addr="$2" '$1 == "member" && $3 == "address" && $4 == addr { print $2; exit }' <<<"$1"
}
member_field() { # status-lines id field
  awk -v id="$2" -v f="$3" '$1 == "member" && $2 == id && $3 == f { print $4; exit }' <<<"$1"
}

# CLUSTER SLOTS through a port, one line per slot range: first last leader-port replica-ports...
slot_table() { # port
  local out
  out=$(rcli --no-raw -p "$1" CLUSTER SLOTS 2>&1) || return 1
  awk '
    /^ *[0-9]+\) 1\) \(integer\)/ { if (line != "") print line; line = "" }
    /\(integer\)/ { line = line (line == "" ? "" : " ") $NF }
    END { if (line != "") print line }' <<<"$out"
}

# One key per slot range (that is, per shard group), so that whatever moves, some key moves with
# it. Each has a bucket of SCALE_LIMIT that refills one token an hour: the counts are exact.
SCALE_RULE=(9999 1 3600)
SCALE_LIMIT=10000
table=$(slot_table "${PORTS[0]}") || fail "CLUSTER SLOTS failed: $table"
ranges=$(wc -l <<<"$table")
slots=$(for i in $(seq 0 999); do echo "CLUSTER KEYSLOT smoke:scale:$i"; done | rcli -p "${PORTS[0]}") ||
  fail "CLUSTER KEYSLOT failed"
mapfile -t GKEYS < <(awk '
  NR == FNR { lo[NR] = $1; hi[NR] = $2; n = NR; next }
  {
    for (r = 1; r <= n; r++)
      if (!(r in got) && $1 >= lo[r] && $1 <= hi[r]) { got[r] = 1; print "smoke:scale:" (FNR - 1) " " $1 }
  }' <(echo "$table") <(echo "$slots"))
((${#GKEYS[@]} == ranges)) || fail "found keys for ${#GKEYS[@]} of the $ranges slot ranges"
declare -A GSLOT EXP
for i in "${!GKEYS[@]}"; do
  read -r k sl <<<"${GKEYS[i]}"
  GKEYS[i]=$k
  GSLOT[$k]=$sl
  EXP[$k]=$SCALE_LIMIT
done

# CL.THROTTLE on one of those keys, following redirections; retries as take() does.
gtake() { # key port quantity
  local TKEY=$1
  local -a TRULE=("${SCALE_RULE[@]}")
  shift
  take "$@" -c
}
expect_exact() { # what reply expected_remaining
  local -a r
  read -r -a r <<<"$2"
  if [ "${r[0]}" != 0 ] || [ "${r[1]}" != "$SCALE_LIMIT" ] || [ "${r[2]}" != "$3" ]; then
    fail "$1: got [${r[*]}], want limited=0 limit=$SCALE_LIMIT remaining=$3"
  fi
}
# Takes QTY tokens from every key (0: a peek), through the ports in turn, and checks each count.
TAKES=0
take_all() { # what qty port...
  local what=$1 qty=$2 k j=0 reply
  shift 2
  local -a ports=("$@")
  for k in "${GKEYS[@]}"; do
    local p=${ports[j++ % ${#ports[@]}]}
    reply=$(gtake "$k" "$p" "$qty") ||
      fail "$what: CL.THROTTLE $k ${SCALE_RULE[*]} $qty through port $p failed: $reply"
    EXP[$k]=$((${EXP[$k]} - qty))
    expect_exact "$what: $k (slot ${GSLOT[$k]}) through port $p" "$reply" "${EXP[$k]}"
    ((qty == 0)) || TAKES=$((TAKES + 1))
  done
}
# Waits (bounded) until every port reports a settled STATUS, taking a token from every key
# between two looks, so that writes run through the moves.
settle_under_traffic() { # what secs want address traffic-ports... -- status-ports...
  local what=$1 secs=$2 want=$3 addr=$4 rounds=0
  shift 4
  local -a tports=() sports=()
  while [ "$1" != -- ]; do
    tports+=("$1")
    shift
  done
  shift
  sports=("$@")
  local deadline=$((SECONDS + secs)) t0=$SECONDS
  local seen=""
  until all_settled "$want" "$addr" "${sports[@]}"; do
    if ((SECONDS >= deadline)); then
      log "last STATUS (port $LAST_STATUS_PORT): $(status_line "$LAST_STATUS")"
      printf '%s\n' "$LAST_STATUS" | sed 's/^/    /'
      fail "$what: STATUS not settled within $secs s ($want members up, moves 0)"
    fi
    if [ "$LAST_STATUS" != "(no STATUS answer)" ]; then
      local line
      line=$(status_line "$LAST_STATUS")
      if [ "$line" != "$seen" ]; then
        log "  $what: $line"
        seen=$line
      fi
    fi
    take_all "$what (round $((rounds + 1)))" 1 "${tports[@]}"
    rounds=$((rounds + 1))
  done
  log "  $what: $(status_line "$LAST_STATUS")"
  SETTLE_SECS=$((SECONDS - t0))
  SETTLE_ROUNDS=$rounds
}

SCALE_START=$SECONDS
take_all "before the join" 1 "${PORTS[@]}"
reply=$(take "${PORTS[1]}" 1 -c) || fail "taking a token before the join failed: $reply"
REMAINING=4
expect_reply "taking a token before the join" "$reply" "$REMAINING" "$(refill)"
pass "took 1 token from each of ${#GKEYS[@]} keys (one per slot range) and from $KEY: [$reply]"

ADDR4=127.0.0.1:$PORT4
log "node4 joins through node1 (--profile scale up -d node4, client port $PORT4)"
timeout 120 "${COMPOSE_ALL[@]}" up -d --no-recreate node4
CID4=$(timeout 30 "${COMPOSE_ALL[@]}" ps -q node4 || true)
[ -n "$CID4" ] || fail "no container for node4"
# node4 listens once it has joined; until then the traffic goes through the founders only, and
# a node4 that exited (a failed join) ends the wait at once.
node4_listening() {
  [ "$(docker inspect -f '{{.State.Running}}' "$CID4")" = true ] ||
    fail "node4 exited: $(docker logs --tail 5 "$CID4" 2>&1 | tr '\n' ' ')"
  rcli -p "$PORT4" PING >/dev/null 2>&1
}
wait_until 60 node4_listening || fail "node4 did not answer PING within 60 s"
settle_under_traffic "join" 60 4 "$ADDR4" "${PORTS[@]}" -- "${PORTS[@]}" "$PORT4"
ID4=$(member_id "$LAST_STATUS" "$ADDR4")
R4=$(member_field "$LAST_STATUS" "$ID4" replicas)
pass "node4 joined as node $ID4: 4 members up, 0 moves, node $ID4 holds $R4 replicas, $((SECONDS - SCALE_START)) s after the up ($SETTLE_ROUNDS rounds of writes during the moves)"
((R4 > 0)) || fail "node4 holds no replicas"

# node4 must be in CLUSTER SLOTS and, once leaderships are evened out, lead some range: a key
# there must be served by node4 itself, without redirection, with its exact count. Polled: while
# leaderships move, the node asked and node4 may briefly disagree on who leads (node4 answers
# MOVED); such answers are logged.
node4_serves_led() {
  table=$(slot_table "${PORTS[0]}") || return 1
  led=$(awk -v p="$PORT4" '$3 == p { print $1, $2 }' <<<"$table")
  local lo hi k
  while read -r lo hi; do
    [ -n "$lo" ] || continue
    for k in "${GKEYS[@]}"; do
      ((${GSLOT[$k]} >= lo && ${GSLOT[$k]} <= hi)) || continue
      local TKEY=$k
      local -a TRULE=("${SCALE_RULE[@]}")
      if reply=$(throttle "$PORT4" 0); then
        led_key=$k led_range="$lo-$hi"
        return 0
      fi
      if [ "$reply" != "$last_miss" ]; then
        log "  port ${PORTS[0]} names node4 leader of $lo-$hi, but node4 answers $k: $reply"
        last_miss=$reply
      fi
      break
    done
  done <<<"$led"
  return 1
}
last_miss=
led=
wait_until 20 node4_serves_led ||
  fail "node4 serves no key of a range CLUSTER SLOTS says it leads, 20 s after the join (leads: $(tr '\n' ';' <<<"$led"))"
in4=$(awk -v p="$PORT4" '{ for (i = 3; i <= NF; i++) if ($i == p) { n++; break } } END { print n + 0 }' <<<"$table")
expect_exact "peek at node4, leader of $led_range" "$reply" "${EXP[$led_key]}"
pass "node4 is in $in4 of $ranges slot ranges and leads $(wc -l <<<"$led"); it serves $led_key (slot ${GSLOT[$led_key]}, range $led_range) directly: [$reply]"

take_all "after the join" 2 "$PORT4" "${PORTS[@]}"
take_all "peek after the join" 0 "$PORT4" "${PORTS[2]}"
reply=$(take "$PORT4" 1 -c) || fail "taking a token through node4 failed: $reply"
REMAINING=3
expect_reply "taking a token through node4" "$reply" "$REMAINING" "$(refill)"
pass "counts exact after the join: $TAKES tokens taken from ${#GKEYS[@]} keys through all four nodes, $KEY [$reply]"

# --- scale in: a node is drained and removed ---------------------------------------------------

# node4 by default: the way back from the scale-out, after which the cluster is again the one
# docker-compose.yml describes (every founder's --cluster-nodes stays true). node4 then holds
# replicas and leaderships like any founder, so its drain moves as much.
VICTIM=${SMOKE_REMOVE:-node4}
case $VICTIM in
  node4) VPORT=$PORT4 ;;
  node[123]) VPORT=${PORTS[${VICTIM#node} - 1]} ;;
  *) fail "SMOKE_REMOVE=$VICTIM: want node1, node2, node3 or node4" ;;
esac
STAY=()
for p in "${PORTS[@]}" "$PORT4"; do
  [ "$p" = "$VPORT" ] || STAY+=("$p")
done
status_now=$(status "${STAY[0]}") || fail "BK.CLUSTER STATUS through port ${STAY[0]} failed"
VID=$(member_id "$status_now" "127.0.0.1:$VPORT")
[ -n "$VID" ] || fail "STATUS lists no member at 127.0.0.1:$VPORT: $(status_line "$status_now")"
VCID=$(timeout 30 "${COMPOSE_ALL[@]}" ps -q "$VICTIM" || true)
[ -n "$VCID" ] || fail "no container for $VICTIM"

log "BK.CLUSTER REMOVE $VID ($VICTIM, port $VPORT) through port ${STAY[0]}"
remove_at=$SECONDS
out=$(rcli -p "${STAY[0]}" BK.CLUSTER REMOVE "$VID" 2>&1) || true
[ "$out" = OK ] || fail "BK.CLUSTER REMOVE $VID answered: $out"
settle_under_traffic "remove" 60 3 "" "${STAY[@]}" -- "${STAY[@]}"
if grep -q "^member $VID " <<<"$LAST_STATUS"; then
  fail "STATUS still lists node $VID: $(status_line "$LAST_STATUS")"
fi
pass "node $VID drained and removed: 3 members up, 0 moves, $((SECONDS - remove_at)) s after the REMOVE ($SETTLE_ROUNDS rounds of writes during the moves)"

# The removed node must serve nothing, and say why.
removed_says_so() {
  out=$(rcli -p "$VPORT" CL.THROTTLE "$KEY" "${RULE[@]}" 0 2>&1 || true)
  out=${out//$'\n'/ }
  if [[ $out =~ ^-?[0-9]+(\ -?[0-9]+){4}$ ]]; then
    fail "removed $VICTIM still serves $KEY: [$out]"
  fi
  # It knows it was removed, and sends clients on to a member with -MOVED.
  st=$(status "$VPORT" | awk '$1 == "this_node" { print $2 }')
  [[ $st == removed && $out == *MOVED* && $out != *":$VPORT"* ]]
}
if wait_until 10 removed_says_so; then
  pass "$VICTIM says it was removed and answers: $out"
else
  vstatus=$(status "$VPORT" || echo "(no STATUS answer)")
  [ "$vstatus" = "(no STATUS answer)" ] || vstatus="version $(awk '$1 == "version" { print $2 }' <<<"$vstatus"), $(status_line "$vstatus")"
  what="$VICTIM does not know it was removed, 10 s after STATUS dropped it: it answers '$out'; its own STATUS: $vstatus; the others: version $(awk '$1 == "version" { print $2 }' <<<"$LAST_STATUS")"
  docker logs --tail 3 "$VCID" 2>&1 | sed 's/^/    /'
  fail "$what"
fi

log "stopping $VICTIM (container ${VCID:0:12})"
timeout 60 docker stop -t 10 "$VCID" >/dev/null
[ "$(docker inspect -f '{{.State.Running}}' "$VCID")" = false ] || fail "$VICTIM is still running"

for p in "${STAY[@]}"; do
  wait_until 30 cluster_ok "$p" || fail "port $p does not report cluster_state:ok 30 s after $VICTIM stopped"
done
table=$(slot_table "${STAY[0]}") || fail "CLUSTER SLOTS failed: $table"
if awk -v p="$VPORT" '{ for (i = 3; i <= NF; i++) if ($i == p) found = 1 } END { exit !found }' <<<"$table"; then
  fail "CLUSTER SLOTS still lists port $VPORT: $(tr '\n' ';' <<<"$table")"
fi
pass "the three nodes left (ports ${STAY[*]}) report cluster_state:ok; CLUSTER SLOTS no longer lists port $VPORT"

take_all "after the removal" 1 "${STAY[@]}"
take_all "peek after the removal" 0 "${STAY[2]}" "${STAY[1]}" "${STAY[0]}"
reply=$(take "${STAY[0]}" 1 -c) || fail "taking a token after the removal failed: $reply"
REMAINING=2
expect_reply "taking a token after the removal" "$reply" "$REMAINING" "$(refill)"
pass "counts exact after the removal: $TAKES tokens taken from ${#GKEYS[@]} keys in all, $KEY [$reply]"
pass "scale stage: join, balance, drain and removal in $((SECONDS - SCALE_START)) s"
