#!/usr/bin/env bash
# Runs Redis's own Tcl test suite against a bucketd node, in the suite's external-server mode.
#
# The suite comes from Debian's source package for redis (bookworm: 7.0), fetched once with
# `apt-get source` into $BUCKETD_REDIS_SRC. Tests that cannot pass on bucketd by design are listed
# in skip.txt, tests that fail today because of a bug or a missing command in pending.txt; both
# are skipped. Any other failure fails the run, and so does bucketd exiting while the suite runs.
#
# Environment:
#   BUCKETD_BIN          the bucketd binary to test (default: `cargo build --release`, then
#                        target/release/bucketd)
#   BUCKETD_REDIS_SRC    where the extracted source package is kept
#                        (default: ~/.cache/bucketd/redis-src); may also point at any extracted
#                        redis source tree of the 7.0 series
#   BUCKETD_TCL_UNITS    the units to run, space-separated (default: the list below)
#   BUCKETD_TCL_LISTS    the skip and pending files beside this script, as "SKIP PENDING"
#                        (default "skip.txt pending.txt"); the data-type units have their own,
#                        "types-skip.txt types-pending.txt"
#   BUCKETD_TCL_SERVER   "redis" to run the suite against a real redis-server instead (the
#                        control: what passes there with the same lists), or "bucketd" (default)
#   BUCKETD_TCL_PENDING  "run" to run the pending tests too and name those that pass now
#   BUCKETD_TCL_VERBOSE  1 to show the suite's own output as it runs
#   BUCKETD_TCL_TIMEOUT  seconds the whole suite may take (default 600)
#   BUCKETD_TCL_LOGS     where the suite's and the node's logs are kept (default target/redis-tcl)
# Arguments are passed on to runtest, e.g. `--only '/^SET/'` or `--verbose`.
#
# Exit status: 0 when every test on neither list passed; 1 when one failed or bucketd died;
# 2 when the suite could not be run (no source package, no tclsh, no way to install them).
# The last line printed is "N passed, N failed, N skipped".
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
src="${BUCKETD_REDIS_SRC:-$HOME/.cache/bucketd/redis-src}"
logs="${BUCKETD_TCL_LOGS:-$repo/target/redis-tcl}"
suite_timeout="${BUCKETD_TCL_TIMEOUT:-600}"
pending_mode=skip
[ "${BUCKETD_TCL_PENDING:-}" = run ] && pending_mode=run

# The units that exercise what bucketd implements: strings and counters, expiry, the keyspace,
# the protocol, connection and server commands. Left out: auth, info, limits, networking and
# maxmemory (every test there is tagged external:skip, as they restart or reconfigure the
# server), querybuf (Redis's own buffer sizing), and the units of data types, scripting, Pub/Sub,
# tracking, replication and persistence that bucketd does not have.
default_units="unit/type/incr unit/type/string unit/expire unit/keyspace unit/protocol unit/quit
    unit/info-command unit/introspection unit/introspection-2 unit/multi unit/scan unit/other"
read -r -a units <<<"$(echo ${BUCKETD_TCL_UNITS:-$default_units})"
read -r skip_file pending_file <<<"${BUCKETD_TCL_LISTS:-skip.txt pending.txt}"
skip_file="$here/$skip_file"
if [ -n "${pending_file:-}" ]; then pending_file="$here/$pending_file"; else pending_file=/dev/null; fi
server="${BUCKETD_TCL_SERVER:-bucketd}"
case "$server" in bucketd | redis) ;; *) echo "BUCKETD_TCL_SERVER is bucketd or redis" >&2; exit 2 ;; esac

log() { printf 'redis-tcl: %s\n' "$*"; }
cannot_run() {
    printf 'redis-tcl: cannot run the suite: %s\n' "$*" >&2
    exit 2
}

is_root() { [ "$(id -u)" -eq 0 ]; }

apt_install() {
    is_root || return 1
    log "installing $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# The tclsh runtest itself picks (it looks for these names only), or "".
find_tclsh() {
    local v
    for v in 8.7 8.6 8.5; do
        if command -v "tclsh$v" >/dev/null; then
            command -v "tclsh$v"
            return 0
        fi
    done
}

# A deb-src entry for every `deb` entry of the system's own sources, in a file of ours; the
# system's files are left as they are.
add_deb_src() {
    local deb822=/etc/apt/sources.list.d/debian.sources
    if [ -f "$deb822" ]; then
        sed 's/^Types:[[:space:]]*deb[[:space:]]*$/Types: deb-src/' "$deb822" \
            >/etc/apt/sources.list.d/bucketd-src.sources
    elif [ -f /etc/apt/sources.list ] && grep -q '^deb ' /etc/apt/sources.list; then
        sed -n 's/^deb /deb-src /p' /etc/apt/sources.list >/etc/apt/sources.list.d/bucketd-src.list
    else
        return 1
    fi
}

# Brings the source package into $src, once. A lock keeps two runs from fetching at once.
fetch_suite() {
    [ -f "$src/tests/test_helper.tcl" ] && return 0
    # `apt-get source` run by hand in $src leaves the tree one level down, beside the package's
    # files: use it rather than fetching again into a directory that is not empty.
    local nested
    # (find fails when $src does not exist yet, as on a fresh machine: nothing nested then)
    nested="$(find "$src" -mindepth 3 -maxdepth 3 -path '*/tests/test_helper.tcl' -print -quit 2>/dev/null || true)"
    if [ -n "$nested" ]; then
        src="$(dirname "$(dirname "$nested")")"
        return 0
    fi
    mkdir -p "$(dirname "$src")" 2>/dev/null && { exec 9>"$src.lock"; } 2>/dev/null ||
        cannot_run "cannot write to $(dirname "$src") to keep the redis source package; set BUCKETD_REDIS_SRC"
    flock 9
    if [ -f "$src/tests/test_helper.tcl" ]; then
        exec 9>&-
        return 0
    fi
    command -v apt-get >/dev/null ||
        cannot_run "no $src/tests/test_helper.tcl and no apt-get to fetch Debian's redis source package; point BUCKETD_REDIS_SRC at an extracted redis 7.0 source tree"
    command -v dpkg-source >/dev/null || apt_install dpkg-dev ||
        cannot_run "apt-get source needs dpkg-source (package dpkg-dev), and this user cannot install it"
    # grep reads to the end: with pipefail, an early exit would fail the pipeline on SIGPIPE.
    if ! apt-cache showsrc redis 2>/dev/null | grep '^Package: redis$' >/dev/null; then
        is_root ||
            cannot_run "apt knows no source package for redis and only root can add a deb-src source; run this once as root, or point BUCKETD_REDIS_SRC at an extracted redis 7.0 source tree"
        if [ ! -f /etc/apt/sources.list.d/bucketd-src.sources ] &&
            [ ! -f /etc/apt/sources.list.d/bucketd-src.list ]; then
            add_deb_src || cannot_run "found no apt source to derive a deb-src source from"
            log "added a deb-src source in /etc/apt/sources.list.d/bucketd-src.*"
        fi
        log "apt-get update"
        apt-get update -qq >/dev/null || cannot_run "apt-get update failed"
    fi
    local tmp
    tmp="$(mktemp -d "$src.fetch.XXXXXX")"
    log "fetching Debian's redis source package into $src"
    if ! (cd "$tmp" && apt-get source -qq redis >"$tmp/apt-get.log" 2>&1); then
        tail -n 20 "$tmp/apt-get.log" >&2
        rm -rf "$tmp"
        cannot_run "apt-get source redis failed"
    fi
    local tree
    tree="$(find "$tmp" -mindepth 3 -maxdepth 3 -path '*/tests/test_helper.tcl' -print -quit)"
    if [ -z "$tree" ]; then
        rm -rf "$tmp"
        cannot_run "the redis source package has no tests/test_helper.tcl"
    fi
    tree="$(dirname "$(dirname "$tree")")"
    local dsc
    for dsc in "$tmp"/redis_*.dsc; do basename "$dsc" .dsc >"$tree/.bucketd-source"; done
    rmdir "$src" 2>/dev/null || true
    mv "$tree" "$src"
    rm -rf "$tmp"
    exec 9>&-
}

tclsh="$(find_tclsh)"
[ -n "$tclsh" ] || { apt_install tcl && tclsh="$(find_tclsh)" && [ -n "$tclsh" ]; } ||
    cannot_run "the suite needs tclsh 8.5 or newer (package tcl)"
fetch_suite
suite_version="$(cat "$src/.bucketd-source" 2>/dev/null || basename "$src")"

if [ "$server" = redis ]; then
    bin="$(command -v redis-server)" || cannot_run "no redis-server on PATH (apt-get install -y redis-server)"
elif [ -n "${BUCKETD_BIN:-}" ]; then
    bin="$BUCKETD_BIN"
else
    log "cargo build --release"
    (cd "$repo" && cargo build --release --quiet --bin bucketd)
    bin="${CARGO_TARGET_DIR:-$repo/target}/release/bucketd"
fi
[ -x "$bin" ] || cannot_run "no $server binary at $bin"

mkdir -p "$logs"
node_log="$logs/$server.log"
suite_log="$logs/runtest.log"
work=""
pid=""
stop() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    pid=""
    [ -n "$work" ] && rm -rf "$work"
    return 0
}
trap stop EXIT
trap 'exit 130' INT TERM

free_port() {
    "$tclsh" <<'EOF'
set s [socket -server {} -myaddr 127.0.0.1 0]
puts [lindex [fconfigure $s -sockname] 2]
close $s
EOF
}

answers_ping() {
    local reply
    reply="$(
        exec 2>/dev/null
        exec 8<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf 'PING\r\n' >&8
        IFS= read -r -t 2 line <&8 || exit 1
        printf '%s' "$line"
    )" || return 1
    [ "${reply%$'\r'}" = "+PONG" ]
}

# Starts bucketd on a free loopback port; a port taken between the choice and the bind only
# costs another try.
port=""
for attempt in 1 2 3; do
    candidate="$(free_port)"
    if [ "$server" = redis ]; then
        "$bin" --port "$candidate" --bind 127.0.0.1 --save '' --appendonly no --dir "$logs" \
            >"$node_log" 2>&1 &
    else
        "$bin" --port "$candidate" --shards 2 >"$node_log" 2>&1 &
    fi
    pid=$!
    for _ in $(seq 1 100); do
        if answers_ping "$candidate"; then
            port="$candidate"
            break
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$port" ] && break
    stop
done
if [ -z "$port" ]; then
    tail -n 20 "$node_log" >&2
    log "$server did not answer PING on a loopback port (log: $node_log)"
    echo "0 passed, 1 failed"
    exit 1
fi
log "$server $("$bin" --version 2>/dev/null | awk '{print $2, $3}') (pid $pid) on 127.0.0.1:$port; suite $suite_version"

# A copy of the suite's harness per run, so the cached tree stays pristine and runs can overlap.
work="$(mktemp -d)"
cp -r "$src/tests" "$src/runtest" "$work/"
# The harness sends FUNCTION FLUSH before every block in external mode and stops the whole run
# when it fails; bucketd has no functions (and no scripts), so that one call may fail.
server_tcl="$work/tests/support/server.tcl"
sed -i 's/^\([[:space:]]*\)r function flush$/\1catch {r function flush}/' "$server_tcl"
grep -q 'catch {r function flush}' "$server_tcl" ||
    cannot_run "the suite's harness changed: no 'r function flush' in tests/support/server.tcl to tolerate"

skip_list="$work/skip.list"
if [ "$pending_mode" = run ]; then
    grep -hv '^#' "$skip_file" >"$skip_list" || true
else
    grep -hv '^#' "$skip_file" "$pending_file" >"$skip_list" || true
fi

single=()
for u in "${units[@]}"; do single+=(--single "$u"); done
# --durable turns an error reply in a test into that test's failure instead of ending the run;
# --singledb: bucketd has only database 0; encodings and DEBUG DIGEST are Redis internals.
runtest=(./runtest --host 127.0.0.1 --port "$port" --singledb --durable --ignore-encoding
    --ignore-digest --clients 1 --timeout 120 --tags "-needs:debug -needs:repl -needs:save"
    --skipfile "$skip_list" "${single[@]}" "$@")
log "running ${#units[@]} units (log: $suite_log)"
status=0
if [ "${BUCKETD_TCL_VERBOSE:-0}" = 1 ]; then
    (cd "$work" && timeout --kill-after=10 "$suite_timeout" "${runtest[@]}") 2>&1 |
        tee "$suite_log" || status=${PIPESTATUS[0]}
else
    (cd "$work" && timeout --kill-after=10 "$suite_timeout" "${runtest[@]}") >"$suite_log" 2>&1 ||
        status=$?
fi
[ "$status" -eq 124 ] && log "the suite took longer than ${suite_timeout}s and was stopped"

node_died=0
if ! kill -0 "$pid" 2>/dev/null; then
    node_died=1
    wait "$pid" 2>/dev/null && node_status=0 || node_status=$?
    pid=""
fi

# Only a run of every default unit and test can tell that a list entry matches nothing.
full=0
[ -z "${BUCKETD_TCL_UNITS:-}" ] && [ "$#" -eq 0 ] && full=1
summary=0
"$tclsh" "$here/summarize.tcl" "$suite_log" "$skip_file" "$pending_file" "$pending_mode" \
    "${#units[@]}" "$status" "$full" >"$work/summary" || summary=$?
if [ "$node_died" -eq 1 ]; then
    tail -n 30 "$node_log" >&2
    log "$server exited (status $node_status) while the suite ran (log: $node_log)"
    summary=1
fi
cat "$work/summary"
exit "$summary"
