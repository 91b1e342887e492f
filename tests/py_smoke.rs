//! Runs the redis-py smoke test (tests/py/smoke.py) against a node, with python3 and the `redis`
//! module (redis-py), which `.ci/run` installs.

#![cfg(feature = "server")]

mod common;

use common::tools::{REDIS_PY, require_python};
use common::*;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_smoke() {
    require_python(REDIS_PY);
    bounded(async {
        let node = TestNode::start().await;
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/smoke.py");
        let out = tokio::time::timeout(
            Duration::from_secs(60),
            tokio::process::Command::new("python3")
                .arg(script)
                .arg(node.port().to_string())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("the smoke test finishes within 60 s")
        .expect("python3 runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        println!("{stdout}");
        assert!(
            out.status.success(),
            "smoke.py failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}",
            out.status
        );
        node.shutdown().await;
    })
    .await
}
