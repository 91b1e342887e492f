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

/// SCRIPT EXISTS sha, asked of node `id` itself.
async fn script_exists(c: &TestCluster, id: u64, sha: &str) -> i64 {
    let mut conn = Conn::connect(&c.addr(id)).await.expect("connect");
    conn.must(&["SCRIPT", "EXISTS", sha]).await.array()[0].int()
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
        // As in Redis Cluster, a script reaches only the keys it declares.
        let (r, _) = client
            .call(
                &["EVAL", "return redis.call('GET', 'other')", "1", KEY],
                SERVE,
            )
            .await;
        assert!(
            matches!(&r, Resp::Error(e) if e.contains("not declared in KEYS")),
            "{r:?}"
        );
        // A script that says it cannot run on a cluster is refused, as Redis Cluster does.
        let (r, _) = client
            .call(
                &["EVAL", "#!lua flags=no-cluster\nreturn 1", "1", KEY],
                SERVE,
            )
            .await;
        assert_eq!(
            r,
            Resp::Error("ERR Can not run script on cluster, 'no-cluster' flag is set.".into())
        );
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
        // SCRIPT LOAD through one node loads the script on every node before it answers, so
        // EVALSHA runs wherever the key's leader is; a cost of 0 only reads, so a retried call
        // changes nothing.
        let loader = c.other_than(leader);
        let mut conn = Conn::connect(&c.addr(loader)).await.expect("connect");
        let sha = conn.must(&["SCRIPT", "LOAD", TOKEN_BUCKET]).await.text();
        for id in c.ids() {
            assert_eq!(
                script_exists(&c, id, &sha).await,
                1,
                "node {id} knows the script"
            );
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
        // SCRIPT FLUSH through one node empties every node's cache.
        let up: Vec<_> = c.ids().into_iter().filter(|&id| id != leader).collect();
        let mut conn = Conn::connect(&c.addr(up[0])).await.expect("connect");
        conn.must(&["SCRIPT", "FLUSH"]).await;
        for &id in &up {
            assert_eq!(
                script_exists(&c, id, &sha).await,
                0,
                "node {id} forgot the script"
            );
        }
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
