//! Redis's own Tcl test suite (Debian's redis 7.0 source package) against a bucketd node, in the
//! suite's external-server mode: `tests/redis-tcl/run.sh`, with the binary cargo built for this
//! test. skip.txt and pending.txt beside the script say which tests are left out and why.

#![cfg(feature = "server")]

#[path = "redis-tcl/closing.rs"]
mod closing;
#[path = "common/tools.rs"]
mod tools;

use closing::closing_counts;

use std::process::Command;
use tools::{TCLSH, require_tool};

/// Fewer passing tests than this means units or tests stopped running unnoticed; raise it as
/// pending tests start passing.
const MIN_PASSED: u64 = 200;

#[test]
fn redis_tcl_suite_passes_against_bucketd() {
    require_tool(TCLSH);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/redis-tcl/run.sh");
    let out = Command::new("bash")
        .arg(script)
        .env("BUCKETD_BIN", env!("CARGO_BIN_EXE_bucketd"))
        .env("BUCKETD_TCL_TIMEOUT", "300")
        .output()
        .expect("bash runs tests/redis-tcl/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    if out.status.code() == Some(2) {
        panic!(
            "Redis's Tcl suite could not be run (it needs tclsh and Debian's redis source \
             package, which run.sh fetches with `apt-get source` as root once dpkg-source is \
             there: apt-get install -y tcl dpkg-dev; or BUCKETD_REDIS_SRC pointing at a redis \
             7.0 source tree):\n{stderr}"
        );
    }
    assert!(
        out.status.success(),
        "Redis's Tcl suite failed against bucketd ({}); logs in target/redis-tcl/\n\
         stdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let (passed, failed) = closing_counts(&stdout).unwrap_or_else(|| {
        panic!("run.sh printed no closing 'N passed, N failed' line:\n{stdout}")
    });
    assert_eq!(
        failed, 0,
        "run.sh exited 0 but reported failures:\n{stdout}"
    );
    assert!(
        passed >= MIN_PASSED,
        "only {passed} tests passed (at least {MIN_PASSED} did before):\n{stdout}"
    );
}

#[test]
fn closing_line_is_read_from_the_last_line() {
    assert_eq!(
        closing_counts("x\n128 passed, 0 failed, 317 skipped\n"),
        Some((128, 0))
    );
    assert_eq!(closing_counts("3 passed, 2 failed"), Some((3, 2)));
    assert_eq!(closing_counts("3 passed, 2 failed\ntrailing"), None);
    assert_eq!(closing_counts(""), None);
}
