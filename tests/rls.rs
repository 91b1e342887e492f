//! Envoy's rate limit service (gRPC) on an in-process node whose clock the test moves: the
//! Python suite (tests/py/rls_test.py), which asks through a client generated from Envoy's
//! published protos (grpcio and xds-protos).
//!
//! The Python suite runs against a directory of configuration files, tests/py/rls/ (copied, so
//! its hot-reload case can rewrite them): five taken unchanged from envoyproxy/ratelimit's
//! README, and one of its own. When it needs time to pass it prints `ADVANCE <ms>`; this side
//! moves the clock and answers `OK`. Its assertions are its own; this side checks it exits 0.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// The longest the Python suite may run, and the longest it may stay silent.
const SUITE_DEADLINE: Duration = Duration::from_secs(100);
const LINE_TIMEOUT: Duration = Duration::from_secs(30);

/// The most one `ADVANCE` may move the clock: the suite's windows are a day at most.
const MAX_ADVANCE_MS: u64 = 86_400_000;

fn python_with_grpc() -> bool {
    std::process::Command::new("python3")
        .args([
            "-c",
            "import grpc; from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Copies the suite's configuration files into a fresh directory.
fn config_copy() -> PathBuf {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/rls");
    let to = temp_dir("rls-config");
    for e in std::fs::read_dir(&from).expect("tests/py/rls is readable") {
        let p = e.expect("directory entry").path();
        if p.extension().is_some_and(|x| x == "yaml") {
            std::fs::copy(&p, to.join(p.file_name().expect("a file name"))).expect("copied");
        }
    }
    to
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_proto_client_suite() {
    assert!(
        python_with_grpc(),
        "python3 with grpcio and xds-protos is needed (.ci/run installs them: pip install grpcio xds-protos)"
    );
    bounded(async {
        let dir = config_copy();
        let node = TestNode::start_with(|s| {
            s.grpc_port = Some(0);
            s.metrics_port = Some(0);
            s.rls_config = Some(dir.clone());
            s.rls_response_headers = true;
            s.rules_reload_ms = 50;
        })
        .await;
        let handle = node.handle.as_ref().expect("running");
        let grpc = handle.grpc_addr.expect("the gRPC port is open");
        let metrics = handle.metrics_addr.expect("the metrics port is open");

        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/rls_test.py");
        let mut child = tokio::process::Command::new("python3")
            .arg(script)
            .arg(grpc.port().to_string())
            .arg(metrics.port().to_string())
            .arg(&dir)
            .env("RLS_TEST_CLOCK_MS", (START_NS / 1_000_000).to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs");
        let mut stdin = child.stdin.take().expect("stdin");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut stderr = child.stderr.take().expect("stderr");
        let stderr = tokio::spawn(async move {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s).await;
            s
        });

        let mut report = String::new();
        let drive = async {
            loop {
                let line = match tokio::time::timeout(LINE_TIMEOUT, lines.next_line()).await {
                    Ok(Ok(Some(l))) => l,
                    Ok(Ok(None)) => break,
                    Ok(Err(e)) => panic!("reading the suite's output: {e}\n{report}"),
                    Err(_) => panic!("the suite was silent for {LINE_TIMEOUT:?}\n{report}"),
                };
                let Some(ms) = line.strip_prefix("ADVANCE ") else {
                    report.push_str(&line);
                    report.push('\n');
                    continue;
                };
                let answer = match ms.trim().parse::<u64>() {
                    Ok(ms) if ms <= MAX_ADVANCE_MS => {
                        node.advance_ms(ms);
                        "OK\n".to_string()
                    }
                    _ => format!("ERR cannot advance by {ms:?}\n"),
                };
                stdin
                    .write_all(answer.as_bytes())
                    .await
                    .expect("answer written to the suite");
                stdin.flush().await.expect("answer flushed");
            }
            tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .expect("the suite exits once its output ends")
                .expect("the suite's status")
        };
        let status = tokio::time::timeout(SUITE_DEADLINE, drive)
            .await
            .unwrap_or_else(|_| panic!("the suite did not finish within {SUITE_DEADLINE:?}"));
        let stderr = stderr.await.unwrap_or_default();
        println!("{report}");
        assert!(
            status.success(),
            "rls_test.py failed ({status:?}); its report is above\nstderr:\n{stderr}"
        );
        node.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
}
