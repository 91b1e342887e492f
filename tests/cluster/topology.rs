//! Leadership and topology: leaders end balanced and rebalance after a node returns, a planned
//! leadership move shows clients only -MOVED, and a leader cut off from its majority stops
//! claiming its groups while the others report it failed.

use crate::harness::*;
use std::time::{Duration, Instant};

const SECS: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaders_end_balanced_and_rebalance_after_a_node_returns() {
    bounded(async {
        let mut c = TestCluster::start("balance", Opts::default()).await;
        // 8 groups over 3 nodes: each leads 2 or 3.
        c.wait_balanced(SECS).await;
        c.stop_node(3).await;
        // 8 over the 2 left: 4 each.
        let leaders = c.wait_balanced(SECS).await;
        assert!(leaders.iter().all(|&l| l != 3));
        c.start_node(3).await;
        // The returning node gets its share back.
        c.wait_balanced(SECS).await;
        assert!((2..=3).contains(&c.led_by(3).len()));
        c.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_leadership_move_shows_clients_only_moved() {
    bounded(async {
        // The test moves the leadership itself; the balancer would move it back.
        let mut c = TestCluster::start(
            "transfer",
            Opts {
                balance: false,
                ..Opts::patient()
            },
        )
        .await;
        let leaders = c.wait_leaders(SECS).await;
        let key = key_in_group(&c.spec, "transfer:counter", 0);
        let g = group_of_key(&c.spec, &key);
        let mut leader = leaders[g as usize];
        let mut conn = Conn::connect(&c.addr(leader)).await.expect("connect");
        let (mut acked, mut moved) = (0i64, 0);
        for round in 0..6 {
            // Hand the group to another replica, and keep writing while it moves.
            let to = c
                .spec
                .placement(g)
                .into_iter()
                .find(|&id| id != leader)
                .expect("another replica");
            let _ = c.cluster(leader).transfer_leader(g, to).await;
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                let r = conn.must(&["INCR", &key]).await;
                match &r {
                    Resp::Int(v) => {
                        acked += 1;
                        assert_eq!(*v, acked, "round {round}: a write was lost or repeated");
                    }
                    Resp::Error(e) if e.starts_with("MOVED") => {
                        moved += 1;
                        let (_, addr) = parse_moved(e).expect("a MOVED reply");
                        leader = c.id_of_addr(&addr).expect("a node");
                        conn = Conn::connect(&addr).await.expect("connect");
                    }
                    other => panic!(
                        "round {round}: a client of node {leader} saw {other:?} during a planned move"
                    ),
                }
            }
        }
        assert!(moved >= 3, "the leadership moved only {moved} times");
        c.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_stops_claiming_its_groups() {
    bounded(async {
        let mut c = TestCluster::start("cutoff", Opts::default()).await;
        c.wait_balanced(SECS).await;
        let alone = 1;
        let its_groups = c.led_by(alone);
        assert!(!its_groups.is_empty());
        let key = key_in_group(&c.spec, "cutoff:k", its_groups[0]);
        let mut direct = Conn::connect(&c.addr(alone)).await.expect("connect");
        assert!(matches!(direct.must(&["INCR", &key]).await, Resp::Int(1)));

        let cut = Instant::now();
        c.isolate(alone);
        // Within the lease (300 ms) plus a margin for a loaded machine, it no longer lists
        // itself as the leader of any group, and refuses the group's writes.
        let me = bucketd::testing::redis_id(alone);
        wait_for(
            "the cut-off node to stop claiming its groups",
            SECS,
            || async {
                let mut conn = Conn::connect(&c.addr(alone)).await.ok()?;
                let slots = conn.call(&["CLUSTER", "SLOTS"]).await.ok()?;
                let claims = slots.array().iter().any(|range| {
                    let first = &range.array()[2];
                    first.array()[2].text() == me
                });
                (!claims).then_some(())
            },
        )
        .await;
        let stopped_claiming = cut.elapsed();
        let t = Instant::now();
        let r = direct.must(&["INCR", &key]).await;
        let answered = t.elapsed();
        let e = r.error().unwrap_or_default().to_string();
        assert!(
            e.starts_with("CLUSTERDOWN") || e.starts_with("TRYAGAIN") || e.starts_with("MOVED"),
            "the cut-off node answered {r:?}"
        );
        assert!(
            answered < Duration::from_secs(2),
            "it took {answered:?} to refuse"
        );
        println!("stopped claiming after {stopped_claiming:?}; refused a write in {answered:?}");

        // The others see it as failed, and serve its groups.
        let other = 2;
        let mut conn = Conn::connect(&c.addr(other)).await.expect("connect");
        let addr = c.addr(other);
        wait_for("the majority to report the node failed", SECS, || async {
            let mut conn = Conn::connect(&addr).await.ok()?;
            let nodes = conn.call(&["CLUSTER", "NODES"]).await.ok()?.text();
            let line = nodes.lines().find(|l| l.starts_with(&me))?.to_string();
            (line.contains("fail") && line.contains("disconnected")).then_some(())
        })
        .await;
        let shards = conn.must(&["CLUSTER", "SHARDS"]).await;
        assert!(
            words(&shards).iter().any(|w| w == "fail"),
            "CLUSTER SHARDS on node {other} shows no failed node"
        );
        let mut client = Router::new(vec![c.addr(2), c.addr(3)]);
        let (r, route) = client.call(&["INCR", &key], SERVE).await;
        assert_step(&key, 1, r.int(), 1, &route);

        // Healed, it is online again for everyone.
        c.heal();
        wait_for("the node to be reported online again", SECS, || async {
            let mut conn = Conn::connect(&addr).await.ok()?;
            let nodes = conn.call(&["CLUSTER", "NODES"]).await.ok()?.text();
            let line = nodes.lines().find(|l| l.starts_with(&me))?.to_string();
            (!line.contains("fail") && line.contains(" connected")).then_some(())
        })
        .await;
        c.stop_all().await;
    })
    .await;
}

/// Every string in a reply, flattened.
fn words(r: &Resp) -> Vec<String> {
    match r {
        Resp::Simple(s) | Resp::Error(s) => vec![s.clone()],
        Resp::Bulk(Some(b)) => vec![String::from_utf8_lossy(b).into_owned()],
        Resp::Array(Some(items)) => items.iter().flat_map(words).collect(),
        _ => Vec::new(),
    }
}
