//! Redis's own Tcl units for sorted sets, lists and sets, and for the keyspace (RENAME, COPY,
//! KEYS, TYPE over every type), each run on its own through `tests/redis-tcl/run.sh`: against a
//! real redis-server (the control, which shows that what runs can pass) and against a bucketd
//! node. A unit of its own per test, so one that stops early (a refused CONFIG SET in a block's
//! overrides ends the unit) does not hide the others. `tests/redis-tcl/types-skip.txt` lists
//! the tests left out by design and why; the same list applies to both servers.

#![cfg(feature = "server")]

#[path = "redis-tcl/closing.rs"]
mod closing;
#[path = "common/tools.rs"]
mod tools;

use closing::closing_counts;

use std::process::Command;
use tools::{REDIS_SERVER, TCLSH, require_tool};

/// Runs `unit` against `server` ("redis" or "bucketd") and fails unless every test outside
/// types-skip.txt passed, and at least `min_passed` did (as many passed against Redis, 7.0.15,
/// when the list was written: fewer means tests stopped running unnoticed).
fn run_unit(unit: &str, server: &str, min_passed: u64) {
    // One unit at a time: runtest's own test server listens on a fixed port.
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    require_tool(TCLSH);
    if server == "redis" {
        require_tool(REDIS_SERVER);
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/redis-tcl/run.sh");
    let logs = format!(
        "{}/target/redis-tcl-types/{server}/{}",
        env!("CARGO_MANIFEST_DIR"),
        unit.replace('/', "-")
    );
    let out = Command::new("bash")
        .arg(script)
        .env("BUCKETD_BIN", env!("CARGO_BIN_EXE_bucketd"))
        .env("BUCKETD_TCL_SERVER", server)
        .env("BUCKETD_TCL_UNITS", unit)
        .env("BUCKETD_TCL_LISTS", "types-skip.txt types-pending.txt")
        .env("BUCKETD_TCL_LOGS", &logs)
        .env("BUCKETD_TCL_TIMEOUT", "600")
        .output()
        .expect("bash runs tests/redis-tcl/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    if out.status.code() == Some(2) {
        panic!(
            "Redis's Tcl suite could not be run (see tests/redis_tcl.rs for what it needs):\n\
             {stderr}"
        );
    }
    let (passed, failed) = closing_counts(&stdout).unwrap_or_else(|| {
        panic!("run.sh printed no closing 'N passed, N failed' line:\n{stdout}\n{stderr}")
    });
    assert!(
        out.status.success() && failed == 0,
        "{unit} failed against {server}: {passed} passed, {failed} failed ({}); logs in \
         {logs}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(
        passed >= min_passed,
        "only {passed} tests of {unit} passed against {server} ({min_passed} pass against \
         Redis):\n{stdout}"
    );
}

const ZSET: (&str, u64) = ("unit/type/zset", 147);
const LIST: (&str, u64) = ("unit/type/list", 73);
const SET: (&str, u64) = ("unit/type/set", 16);
const KEYSPACE: (&str, u64) = ("unit/keyspace", 36);

#[test]
fn zset_unit_passes_against_redis() {
    run_unit(ZSET.0, "redis", ZSET.1);
}

#[test]
fn zset_unit_passes_against_bucketd() {
    run_unit(ZSET.0, "bucketd", ZSET.1);
}

#[test]
fn list_unit_passes_against_redis() {
    run_unit(LIST.0, "redis", LIST.1);
}

#[test]
fn list_unit_passes_against_bucketd() {
    run_unit(LIST.0, "bucketd", LIST.1);
}

#[test]
fn set_unit_passes_against_redis() {
    run_unit(SET.0, "redis", SET.1);
}

#[test]
fn set_unit_passes_against_bucketd() {
    run_unit(SET.0, "bucketd", SET.1);
}

#[test]
fn keyspace_unit_passes_against_redis() {
    run_unit(KEYSPACE.0, "redis", KEYSPACE.1);
}

#[test]
fn keyspace_unit_passes_against_bucketd() {
    run_unit(KEYSPACE.0, "bucketd", KEYSPACE.1);
}
