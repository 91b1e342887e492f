#!/usr/bin/env bash
# Container smoke test: builds bucketd:local (cluster/build-image.sh), starts the three-node
# cluster of cluster/docker-compose.yml, takes a rate-limit bucket through CL.THROTTLE, stops the
# container that leads the bucket's group and checks that another node serves the bucket with
# its remaining count intact, then brings the stopped node back and checks it rejoins.
# Everything is torn down (containers and volumes) on exit, whatever happened.
#
# Skips (exit 0) when no Docker engine answers. All traffic goes to 127.0.0.1: the nodes use
# host networking. Client ports are BASE+1..3 and peer ports PEER_BASE+1..3, with BASE 7000 and
# PEER_BASE 17000 when those six ports are free, otherwise a free set picked at random (and
# picked again if a node still finds its port taken).
#
# Environment:
#   BUCKETD_PORT_BASE, BUCKETD_PEER_PORT_BASE   pin the ports (no fallback then)
#   SMOKE_PROJECT       compose project name (default bucketd-smoke)
#   SMOKE_TIMEOUT       overall limit in seconds, cargo build included (default 1200: a release
#                       build on a busy two-core machine has taken ten minutes)
#   SKIP_CARGO_BUILD=1  package the binary already in target/release
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
      timeout 30 "${COMPOSE[@]}" logs --no-color --tail 30 2>&1 | sed 's/^/    /'
    fi
    log "tearing down (down -v)"
    timeout 90 "${COMPOSE[@]}" down -v -t 5 >/dev/null 2>&1
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
  for i in 1 2 3; do
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
      fail "ports $((BASE + 1))-$((BASE + 3)) or $((PEER_BASE + 1))-$((PEER_BASE + 3)) are taken"
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
  fail "found no six free ports for the cluster in $tries tries"
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
timeout 90 "${COMPOSE[@]}" down -v -t 5 >/dev/null 2>&1 || true
STARTED=1
# Up to three attempts: a node whose port was taken between the check and its bind exits at once;
# then the cluster starts over on other ports (unless they are pinned).
for attempt in 1 2 3; do
  pick_ports "$attempt"
  PORTS=($((BASE + 1)) $((BASE + 2)) $((BASE + 3)))
  for i in 1 2 3; do
    export "BUCKETD_PORT_$i=$((BASE + i))" "BUCKETD_PEER_PORT_$i=$((PEER_BASE + i))"
  done
  log "cluster ports: clients ${PORTS[*]}, peers $((PEER_BASE + 1))-$((PEER_BASE + 3)); project $PROJECT"
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
  timeout 90 "${COMPOSE[@]}" down -v -t 5 >/dev/null 2>&1 || true
done
pass "all three nodes report cluster_state:ok"

# --- the bucket --------------------------------------------------------------------------------

# Runs CL.THROTTLE with the given quantity through the given port and prints the five reply
# integers on one line; fails on anything else (errors, MOVED, refused), printing what came.
throttle() { # port quantity [redis-cli flags]
  local port=$1 qty=$2
  shift 2
  local out
  local -a r
  if out=$(rcli "$@" -p "$port" CL.THROTTLE "$KEY" "${RULE[@]}" "$qty" 2>&1); then
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
