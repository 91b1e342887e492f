#!/usr/bin/env bash
# Builds the fuzz targets and runs each for FUZZ_SECONDS (default 60) from its seed corpus.
# Prints, per target, the executions and the coverage reached; exits non-zero if any target
# crashes, leaks memory past the RSS limit or hangs (libFuzzer's artifacts land in
# fuzz/artifacts/<target>/). Needs a nightly toolchain (`cargo +nightly`); installs cargo-fuzz
# if it is missing.
#
# What a run discovers goes to fuzz/corpus-grown/<target>/ (not committed), so the seeds in
# fuzz/corpus/<target>/ stay as they are and a later local run starts from both.
set -euo pipefail

cd "$(dirname "$0")"
export PATH="$HOME/.cargo/bin:$PATH"
seconds="${FUZZ_SECONDS:-60}"
targets=(resp_request command log_record peer_frame)

log() { printf '==> %s\n' "$*"; }

if ! cargo fuzz --version >/dev/null 2>&1; then
    log "installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

# No sanitizer: the crate's own code is safe Rust, and what the targets look for (panics,
# aborts, unbounded allocation) needs none; the build and every execution are faster.
# Debug assertions stay on, so arithmetic overflow panics too.
log "building the fuzz targets"
cargo +nightly fuzz build --sanitizer none

failed=()
summary=()
for t in "${targets[@]}"; do
    log "fuzzing ${t} for ${seconds}s"
    mkdir -p "corpus-grown/${t}"
    out="$(mktemp)"
    dict=()
    case "$t" in
        resp_request | command) dict=(-dict=dict/resp.dict) ;;
    esac
    status=0
    cargo +nightly fuzz run --sanitizer none "$t" "corpus-grown/${t}" "corpus/${t}" -- \
        -max_total_time="${seconds}" -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 \
        -print_final_stats=1 "${dict[@]}" >"$out" 2>&1 || status=$?
    execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$out" | tail -n1)"
    rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$out" | tail -n1)"
    cov="$(grep -o ' cov: [0-9]*' "$out" | tail -n1 | tr -dc '0-9')"
    ft="$(grep -o ' ft: [0-9]*' "$out" | tail -n1 | tr -dc '0-9')"
    line="$(printf '%-13s execs=%s exec/s=%s cov=%s ft=%s' "$t" "${execs:-?}" "${rate:-?}" \
        "${cov:-?}" "${ft:-?}")"
    if [ "$status" -ne 0 ]; then
        line="${line} FAILED (status ${status})"
        failed+=("$t")
        # The crash report: libFuzzer's summary and the panic message before it.
        grep -E -B30 '^(SUMMARY|==[0-9]+== ERROR)|Test unit written to' "$out" | tail -n 60 || tail -n 60 "$out"
    fi
    summary+=("$line")
    rm -f "$out"
done

log "fuzzing summary (${seconds}s per target)"
printf '    %s\n' "${summary[@]}"
if [ "${#failed[@]}" -ne 0 ]; then
    log "crashed: ${failed[*]} (inputs in fuzz/artifacts/)"
    exit 1
fi
