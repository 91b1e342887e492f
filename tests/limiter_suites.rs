//! The Redis storage tests of two rate-limiting packages from PyPI, run as their authors wrote
//! them: `limits` (the engine under Flask-Limiter and slowapi; sync and async storages) and
//! `pyrate-limiter` (its Redis buckets). Each runs against a real `redis-server` started here,
//! the control that shows the tests themselves pass, and against a `bucketd` node with four
//! shards, started here from the binary cargo built.
//!
//! `tests/limiter-suites/run.py` fetches each package's source distribution (which carries its
//! tests) at a pinned version, points its tests at the server, and runs pytest;
//! `tests/limiter-suites/skip.txt` lists the tests it leaves out and why. The node runs on the
//! wall clock, as the packages' tests measure time themselves.

#![cfg(feature = "server")]

mod common;

use common::bucketd_process::BucketdProcess;
use common::real_redis::RealRedis;
use common::tools::{LIMITER_SUITES_PY, require_python};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_bucketd");

/// The suites assert on wall-clock time; running two at once on a small machine makes Redis
/// itself miss their margins, so the tests of this file take turns.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long run.py may take for one suite, downloads included.
const SUITE_DEADLINE: Duration = Duration::from_secs(1800);

/// The suites and how many of their tests pass against Redis: fewer than this means tests
/// stopped being collected unnoticed (a changed marker, a module that no longer imports).
const SUITES: [(&str, u64); 2] = [("limits", 90), ("pyrate-limiter", 50)];

/// `(passed, failed, errors)` from run.py's closing line,
/// "suite-counts: N passed, N failed, N errors, N skipped, N deselected".
fn closing_counts(stdout: &str) -> Option<(u64, u64, u64)> {
    let line = stdout.lines().rev().find(|l| !l.trim().is_empty())?;
    let rest = line.strip_prefix("suite-counts: ")?;
    let mut parts = rest.split(", ");
    let mut next =
        |suffix: &str| -> Option<u64> { parts.next()?.strip_suffix(suffix)?.parse().ok() };
    Some((next(" passed")?, next(" failed")?, next(" errors")?))
}

/// Runs `suite` against the server at `addr` and fails unless every selected test passed.
async fn run_suite(suite: &str, addr: &str, server: &str) {
    let min_passed = SUITES
        .iter()
        .find(|(s, _)| *s == suite)
        .map(|(_, n)| *n)
        .expect("a known suite");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/limiter-suites/run.py");
    let out = tokio::time::timeout(
        SUITE_DEADLINE,
        tokio::process::Command::new("python3")
            .args([script, suite, addr])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{suite} against {server} did not finish in {SUITE_DEADLINE:?}"))
    .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    let (passed, failed, errors) = closing_counts(&stdout).unwrap_or_else(|| {
        panic!("run.py printed no closing 'suite-counts:' line for {suite} against {server}")
    });
    assert!(
        out.status.success() && failed == 0 && errors == 0,
        "{suite}'s tests failed against {server}: {passed} passed, {failed} failed, {errors} \
         errors ({}); the output above names each failed test",
        out.status
    );
    assert!(
        passed >= min_passed,
        "only {passed} of {suite}'s tests passed against {server} (at least {min_passed} did \
         before): were tests left uncollected?"
    );
}

async fn against_redis(suite: &str) {
    require_python(LIMITER_SUITES_PY);
    let _turn = ONE_AT_A_TIME.lock().await;
    let redis = RealRedis::start().await;
    run_suite(suite, &redis.addr.to_string(), "redis-server").await;
}

async fn against_bucketd(suite: &str) {
    require_python(LIMITER_SUITES_PY);
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut node = BucketdProcess::start(BIN, &["--shards", "4"]);
    run_suite(suite, &node.addr.to_string(), "bucketd --shards 4").await;
    assert!(
        node.is_running(),
        "bucketd exited while {suite}'s tests ran; log:\n{}",
        node.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_passes_against_redis() {
    against_redis("limits").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_passes_against_bucketd() {
    against_bucketd("limits").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyrate_limiter_passes_against_redis() {
    against_redis("pyrate-limiter").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyrate_limiter_passes_against_bucketd() {
    against_bucketd("pyrate-limiter").await;
}

#[test]
fn closing_line_is_read_from_the_last_line() {
    assert_eq!(
        closing_counts("x\nsuite-counts: 9 passed, 1 failed, 2 errors, 0 skipped, 7 deselected\n"),
        Some((9, 1, 2))
    );
    assert_eq!(
        closing_counts("suite-counts: 9 passed, 1 failed, 2 errors, 0 skipped, 7 deselected\nx"),
        None
    );
    assert_eq!(closing_counts(""), None);
}
