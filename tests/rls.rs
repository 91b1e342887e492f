//! Envoy's rate limit service (gRPC) on an in-process node whose clock the test moves: the
//! Python suite (tests/py/rls_test.py), which asks through a client generated from Envoy's
//! published protos (grpcio and xds-protos), and a few cases through envoy-types' tonic client.
//!
//! The Python suite runs against a directory of configuration files, tests/py/rls/ (copied, so
//! its hot-reload case can rewrite them): five taken unchanged from envoyproxy/ratelimit's
//! README, and one of its own. When it needs time to pass it prints `ADVANCE <ms>`; this side
//! moves the clock and answers `OK`. Its assertions are its own; this side checks it exits 0.

#![cfg(feature = "server")]

mod common;

use common::tools::{GRPC_PY, require_python};
use common::*;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tonic::transport::Channel;

/// The longest the Python suite may run, and the longest it may stay silent.
const SUITE_DEADLINE: Duration = Duration::from_secs(100);
const LINE_TIMEOUT: Duration = Duration::from_secs(30);

/// The most one `ADVANCE` may move the clock: the suite's windows are a day at most.
const MAX_ADVANCE_MS: u64 = 86_400_000;

/// How long one gRPC call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

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
    require_python(GRPC_PY);
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

/// Two limits of one domain, for the tonic cases: `user` per minute, `tenant` per second.
const SHARDS_CONFIG: &str = "\
domain: shards
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 5
  - key: tenant
    rate_limit:
      unit: second
      requests_per_unit: 2
";

/// The name of the counter a descriptor of the `shards` domain counts in: the node's own
/// format, which `counter_exists` confirms, so the values below really land on the shards
/// they were picked for.
fn counter_key(key: &str, value: &str) -> String {
    format!("rls:6:shards:{}:{key}:{}:{value}", key.len(), value.len())
}

/// A value of `key` whose counter lives on `shard` of the test node's two.
fn value_on_shard(key: &str, prefix: &str, shard: usize) -> String {
    (0..10_000)
        .map(|i| format!("{prefix}{i}"))
        .find(|v| usize::from(bucketd::slot::key_slot(counter_key(key, v).as_bytes())) % 2 == shard)
        .expect("some value lands on each shard")
}

fn descriptor(key: &str, value: &str) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.into(),
            value: value.into(),
        }],
        ..Default::default()
    }
}

async fn client(addr: SocketAddr) -> RateLimitServiceClient<Channel> {
    tokio::time::timeout(
        CALL_TIMEOUT,
        RateLimitServiceClient::connect(format!("http://{addr}")),
    )
    .await
    .expect("connected within the timeout")
    .expect("connected")
}

async fn ask(
    c: &mut RateLimitServiceClient<Channel>,
    descriptors: &[(&str, &str)],
) -> RateLimitResponse {
    let req = RateLimitRequest {
        domain: "shards".into(),
        descriptors: descriptors.iter().map(|(k, v)| descriptor(k, v)).collect(),
        hits_addend: 0,
    };
    tokio::time::timeout(CALL_TIMEOUT, c.should_rate_limit(req))
        .await
        .expect("answered within the timeout")
        .expect("answered")
        .into_inner()
}

/// `(code, requests_per_unit, unit, limit_remaining)` of a status.
fn summary(s: &DescriptorStatus) -> (Code, u32, Unit, u32) {
    let l = s.current_limit.as_ref().expect("a current limit");
    (s.code(), l.requests_per_unit, l.unit(), s.limit_remaining)
}

async fn counter_exists(node: &TestNode, key: &str) -> bool {
    let mut c = node.raw().await;
    c.cmd(&["EXISTS", key]).await.as_int() == 1
}

async fn shards_node() -> (TestNode, PathBuf) {
    let dir = temp_dir("rls-shards");
    let file = dir.join("shards.yaml");
    std::fs::write(&file, SHARDS_CONFIG).expect("configuration written");
    let node = TestNode::start_with(|s| {
        s.grpc_port = Some(0);
        s.rls_config = Some(file.clone());
    })
    .await;
    (node, dir)
}

/// A request refused by a limit on one shard takes nothing from its limit on the other, in
/// either order of descriptors and either placement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_or_nothing_across_shards() {
    bounded(async {
        let (node, dir) = shards_node().await;
        let addr = node
            .handle
            .as_ref()
            .and_then(|h| h.grpc_addr)
            .expect("gRPC");
        let mut c = client(addr).await;
        for (user_shard, tenant_shard) in [(0, 1), (1, 0)] {
            let user = value_on_shard("user", &format!("u{user_shard}-"), user_shard);
            let tenant = value_on_shard("tenant", &format!("t{tenant_shard}-"), tenant_shard);
            let u = ("user", user.as_str());
            let t = ("tenant", tenant.as_str());
            for left in [1, 0] {
                let r = ask(&mut c, &[t]).await;
                assert_eq!(summary(&r.statuses[0]), (Code::Ok, 2, Unit::Second, left));
            }
            let r = ask(&mut c, &[u]).await;
            assert_eq!(summary(&r.statuses[0]), (Code::Ok, 5, Unit::Minute, 4));
            assert!(counter_exists(&node, &counter_key("user", &user)).await);
            assert!(counter_exists(&node, &counter_key("tenant", &tenant)).await);

            let r = ask(&mut c, &[u, t]).await;
            assert_eq!(r.overall_code(), Code::OverLimit, "{r:?}");
            assert_eq!(summary(&r.statuses[0]), (Code::Ok, 5, Unit::Minute, 4));
            assert_eq!(
                summary(&r.statuses[1]),
                (Code::OverLimit, 2, Unit::Second, 0)
            );
            let r = ask(&mut c, &[t, u]).await;
            assert_eq!(r.overall_code(), Code::OverLimit, "{r:?}");
            assert_eq!(
                summary(&r.statuses[0]),
                (Code::OverLimit, 2, Unit::Second, 0)
            );
            assert_eq!(summary(&r.statuses[1]), (Code::Ok, 5, Unit::Minute, 4));
            // Nothing was taken from the user's limit by the two refusals.
            let r = ask(&mut c, &[u]).await;
            assert_eq!(summary(&r.statuses[0]), (Code::Ok, 5, Unit::Minute, 3));
        }
        node.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
}

/// Over the limit until the aligned window turns, with the reset counted to that turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_limit_until_the_window_turns() {
    bounded(async {
        let (node, dir) = shards_node().await;
        let addr = node
            .handle
            .as_ref()
            .and_then(|h| h.grpc_addr)
            .expect("gRPC");
        let mut c = client(addr).await;
        // The clock starts 20 s into a minute (1_700_000_000 = 28_333_333 * 60 + 20).
        for left in (0..5).rev() {
            let r = ask(&mut c, &[("user", "alice")]).await;
            assert_eq!(r.overall_code(), Code::Ok);
            assert_eq!(summary(&r.statuses[0]), (Code::Ok, 5, Unit::Minute, left));
        }
        let r = ask(&mut c, &[("user", "alice")]).await;
        assert_eq!(r.overall_code(), Code::OverLimit);
        let s = &r.statuses[0];
        assert_eq!(summary(s), (Code::OverLimit, 5, Unit::Minute, 0));
        let reset = s.duration_until_reset.expect("a reset");
        assert_eq!((reset.seconds, reset.nanos), (40, 0));
        assert!(
            r.response_headers_to_add.is_empty(),
            "headers are off by default"
        );

        node.advance_ms(39_999);
        let r = ask(&mut c, &[("user", "alice")]).await;
        assert_eq!(
            summary(&r.statuses[0]),
            (Code::OverLimit, 5, Unit::Minute, 0)
        );
        let reset = r.statuses[0].duration_until_reset.expect("a reset");
        assert_eq!((reset.seconds, reset.nanos), (0, 1_000_000));

        node.advance_ms(1);
        let r = ask(&mut c, &[("user", "alice")]).await;
        assert_eq!(r.overall_code(), Code::Ok);
        assert_eq!(summary(&r.statuses[0]), (Code::Ok, 5, Unit::Minute, 4));
        let reset = r.statuses[0].duration_until_reset.expect("a reset");
        assert_eq!((reset.seconds, reset.nanos), (60, 0));
        node.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
}
