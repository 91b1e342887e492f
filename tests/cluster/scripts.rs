//! Lua scripts on a cluster: the script and its arguments go into the log and every replica
//! runs it at the entry's time, so all hold the same bucket, and the next leader goes on from
//! it after a failover.

use crate::common::real_redis::RealRedis;
use crate::harness::*;
use std::time::Duration;

const SECS: Duration = Duration::from_secs(20);

/// README's token bucket, reading the time with TIME.
const TOKEN_BUCKET: &str = include_str!("../py/token_bucket.lua");

const KEY: &str = "tb:{gateway-3}";

fn decision(r: &Resp) -> (i64, i64) {
    match r.array() {
        [a, b] => (a.int(), b.int()),
        other => panic!("expected [allowed, tokens], got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_runs_alike_on_every_replica_and_the_next_leader_goes_on_from_it() {
    bounded(async {
        let mut c = TestCluster::start("scripts", Opts::patient()).await;
        let mut client = Router::new(c.addrs());
        // A bucket of 3, refilled at 1 per second: 3 admitted, then refused.
        let mut seen = Vec::new();
        let mut leader = 0;
        for _ in 0..5 {
            let (r, route) = client
                .call(&["EVAL", TOKEN_BUCKET, "1", KEY, "3", "1", "1"], SERVE)
                .await;
            leader = c.id_of_addr(&route.addr).expect("a node answered");
            seen.push(decision(&r));
        }
        assert_eq!(seen, vec![(1, 2), (1, 1), (1, 0), (0, 0), (0, 0)]);
        // Every replica ran the same script at the same entry times: the same hash.
        let want = c.local(leader, &["HGETALL", KEY]).await;
        for id in c.ids() {
            wait_for(
                &format!("node {id} to hold the bucket"),
                Duration::from_secs(5),
                || async { (c.local(id, &["HGETALL", KEY]).await == want).then_some(()) },
            )
            .await;
        }
        // EVALSHA after SCRIPT LOAD on every node, as a cluster client that loads its scripts
        // does; a cost of 0 only reads, so a retried call changes nothing.
        let mut sha = String::new();
        for id in c.ids() {
            let mut conn = Conn::connect(&c.addr(id)).await.expect("connect");
            sha = conn.must(&["SCRIPT", "LOAD", TOKEN_BUCKET]).await.text();
        }
        let (r, _) = client
            .call(&["EVALSHA", &sha, "1", KEY, "3", "1", "0"], SERVE)
            .await;
        assert_eq!(decision(&r), (1, 0));

        // The leader goes; the next one holds the same bucket, and refills it from the time
        // the entries carry.
        c.stop_node(leader).await;
        let (r, route) = client
            .call(&["EVALSHA", &sha, "1", KEY, "3", "1", "0"], SERVE)
            .await;
        assert_ne!(route.addr, c.addr(leader));
        assert_eq!(decision(&r), (1, 0), "still empty on the next leader");
        for clock in &c.clocks {
            clock.advance_ms(2_000);
        }
        let (r, _) = client
            .call(&["EVALSHA", &sha, "1", KEY, "3", "1", "1"], SERVE)
            .await;
        assert_eq!(decision(&r), (1, 1), "two refilled, one taken");
        c.stop_all().await;
    })
    .await;
}

/// The limiter scripts gateways run, through redis-py's cluster client (`register_script`, and
/// EVALSHA after SCRIPT LOAD), next to a real Redis: tests/py/scripts.py with `--cluster`. The
/// cluster's clock stands still, so TIME is one instant for every call; the script's cases
/// hold for Redis's running clock too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limiter_scripts_through_redis_py_on_a_cluster_match_redis() {
    bounded(async {
        let mut c = TestCluster::start("scripts-py", Opts::patient()).await;
        c.wait_balanced(SECS).await;
        let redis = RealRedis::start().await;
        let port = c.spec.node(1).expect("node 1").port.to_string();
        crate::common::run_py_script(
            "scripts.py",
            &[port, redis.addr.port().to_string(), "--cluster".into()],
            Duration::from_secs(120),
        )
        .await;
        c.stop_all().await;
    })
    .await;
}
