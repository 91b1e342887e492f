//! Envoy's rate limit service on a cluster: every node answers, a descriptor counts once
//! wherever it is asked, and a request's descriptors are decided all or nothing across the
//! groups that own their counters.

use crate::harness::*;
use bucketd::slot::key_slot;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use std::time::Duration;
use tonic::transport::Channel;

const SECS: Duration = Duration::from_secs(15);

const CONFIG: &str = "
domain: api
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: ip
    rate_limit:
      unit: minute
      requests_per_unit: 100
";

fn descriptor(key: &str, value: &str) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.into(),
            value: value.into(),
        }],
        ..Default::default()
    }
}

/// The counter a one-entry descriptor of domain `api` lives in (as the service names it).
fn counter(key: &str, value: &str) -> String {
    format!("rls:3:api:{}:{key}:{}:{value}", key.len(), value.len())
}

async fn client(c: &TestCluster, id: u64) -> RateLimitServiceClient<Channel> {
    let addr = c.handle(id).grpc_addr.expect("gRPC on");
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("gRPC connection")
}

/// Asks, and gives the overall code and each descriptor's limit_remaining; a transient
/// `unavailable` (a leadership settling) is asked again, within the test's time.
async fn ask(
    rls: &mut RateLimitServiceClient<Channel>,
    descriptors: Vec<RateLimitDescriptor>,
) -> (i32, Vec<u32>) {
    let req = RateLimitRequest {
        domain: "api".into(),
        descriptors,
        hits_addend: 0,
    };
    for _ in 0..50 {
        match rls.should_rate_limit(req.clone()).await {
            Ok(r) => {
                let r = r.into_inner();
                return (
                    r.overall_code,
                    r.statuses.iter().map(|s| s.limit_remaining).collect(),
                );
            }
            Err(s) if s.code() == tonic::Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(s) => panic!("ShouldRateLimit failed: {s}"),
        }
    }
    panic!("the rate limit service stayed unavailable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_answers_and_descriptors_are_decided_all_or_nothing_across_groups() {
    bounded(async {
        let dir = TempDir::new("rls-config");
        let file = dir.path().join("api.yaml");
        std::fs::create_dir_all(dir.path()).expect("config dir");
        std::fs::write(&file, CONFIG).expect("write the config");
        let mut c = TestCluster::start(
            "rls",
            Opts {
                rls_config: Some(file),
                ..Opts::patient()
            },
        )
        .await;
        c.wait_leaders(SECS).await;
        let mut clients = Vec::new();
        for id in c.ids() {
            clients.push(client(&c, id).await);
        }

        // One user's three requests, one per node: counted together, wherever the group's
        // leader is; the fourth, on any node, is over the limit.
        for (i, rls) in clients.iter_mut().enumerate() {
            let (code, left) = ask(rls, vec![descriptor("user", "alice")]).await;
            assert_eq!(code, Code::Ok as i32, "request {i}");
            assert_eq!(left, vec![2 - i as u32], "request {i}");
        }
        for rls in clients.iter_mut() {
            let (code, left) = ask(rls, vec![descriptor("user", "alice")]).await;
            assert_eq!((code, left), (Code::OverLimit as i32, vec![0]));
        }

        // An ip whose counter is in another group than alice's.
        let alice = c
            .spec
            .group_of_slot(key_slot(counter("user", "alice").as_bytes()));
        let ip = (0..100)
            .map(|i| format!("10.0.0.{i}"))
            .find(|v| c.spec.group_of_slot(key_slot(counter("ip", v).as_bytes())) != alice)
            .expect("an ip in another group");
        // Refused because of alice: the ip's counter is not touched.
        for rls in clients.iter_mut() {
            let (code, left) = ask(
                rls,
                vec![descriptor("ip", &ip), descriptor("user", "alice")],
            )
            .await;
            assert_eq!(code, Code::OverLimit as i32);
            assert_eq!(left, vec![100, 0], "nothing taken from the ip");
        }
        // Another user passes, and the ip counts from its full limit.
        let (code, left) = ask(
            &mut clients[1],
            vec![descriptor("ip", &ip), descriptor("user", "bob")],
        )
        .await;
        assert_eq!((code, left), (Code::Ok as i32, vec![99, 2]));
        c.stop_all().await;
    })
    .await;
}
