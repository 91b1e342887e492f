//! Quiet groups: idle groups stop heartbeating, yet a write to one is served at once, a quiet
//! leader that dies or is cut off is replaced, and nothing acknowledged is lost.

use crate::harness::*;
use bucketd::testing::{GroupId, NodeId};
use std::time::Duration;

const SECS: Duration = Duration::from_secs(20);

/// Groups go quiet soon after their last write, so the scenarios need not wait long.
fn opts() -> Opts {
    Opts {
        quiet_after: Some(Duration::from_millis(300)),
        ..Opts::patient()
    }
}

/// One counter key per group.
fn keys(c: &TestCluster) -> Vec<String> {
    (0..c.spec.groups)
        .map(|g| key_in_group(&c.spec, "quiet:counter", g))
        .collect()
}

/// INCR every key once through `client`; returns each key's value after it.
async fn bump_all(client: &mut Router, keys: &[String], before: &[i64]) -> Vec<i64> {
    let mut after = Vec::new();
    for (k, &b) in keys.iter().zip(before) {
        let (r, route) = client.call(&["INCR", k], SERVE).await;
        assert_step(k, b, r.int(), 1, &route);
        after.push(r.int());
    }
    after
}

/// A cluster whose every group took a write and went quiet again, with leaderships held
/// still, and the node that leads the most quiet groups.
struct Settled {
    c: TestCluster,
    keys: Vec<String>,
    /// Each key's acknowledged count.
    acked: Vec<i64>,
    busiest: NodeId,
    /// The groups `busiest` leads.
    led: Vec<GroupId>,
}

async fn settle_quietly(tag: &str) -> Settled {
    let c = TestCluster::start(tag, opts()).await;
    c.wait_balanced(SECS).await;
    c.hold_leaders(SECS).await;
    let keys = keys(&c);
    let mut client = Router::new(c.addrs());
    let acked = bump_all(&mut client, &keys, &vec![0; keys.len()]).await;
    c.wait_all_quiet(SECS).await;
    let busiest: NodeId = c
        .ids()
        .into_iter()
        .max_by_key(|&id| c.cluster(id).quiet_groups())
        .expect("a node");
    let led = c.led_by(busiest);
    assert!(!led.is_empty(), "node {busiest} leads quiet groups");
    Settled {
        c,
        keys,
        acked,
        busiest,
        led,
    }
}

/// The groups whose slots `addr`'s CLUSTER SLOTS gives to the node on `port` as master.
async fn claimed(c: &TestCluster, addr: &str, port: u16) -> Option<Vec<GroupId>> {
    let mut conn = Conn::connect(addr).await.ok()?;
    let slots = conn.call(&["CLUSTER", "SLOTS"]).await.ok()?;
    let mut groups = Vec::new();
    for entry in slots.array() {
        let e = entry.array();
        let first = u16::try_from(e[0].int()).ok()?;
        let master = e.get(2)?.array();
        if master.get(1)?.int() == i64::from(port) {
            groups.push(c.spec.group_of_slot(first));
        }
    }
    Some(groups)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_groups_go_quiet_and_a_write_wakes_one() {
    bounded(async {
        let mut c = TestCluster::start("quiet-idle", opts()).await;
        c.wait_balanced(SECS).await;
        let leaders = c.hold_leaders(SECS).await;
        c.wait_all_quiet(SECS).await;
        // Every follower has its election timer off for the quiet groups it follows, the
        // metadata group (every node is its replica) among them.
        let followers: usize = (0..c.spec.groups)
            .map(|g| c.spec.placement(g).len() - 1)
            .sum::<usize>()
            + c.running().len()
            - 1;
        wait_for("every follower to be silenced", SECS, || async {
            let silenced: usize = c
                .running()
                .iter()
                .map(|&id| c.cluster(id).silenced_groups())
                .sum();
            (silenced == followers).then_some(())
        })
        .await;
        // Quiet leaders keep serving on their followers' promises: every node agrees who
        // serves each group.
        wait_for(
            "every node to see the quiet leaders serving",
            SECS,
            || async {
                (0..c.spec.groups)
                    .all(|g| {
                        let l = leaders[g as usize];
                        c.cluster(l).leads(g)
                            && c.running()
                                .iter()
                                .all(|&id| c.cluster(id).serving_leader(g) == Some(l))
                    })
                    .then_some(())
            },
        )
        .await;

        // A write straight to a quiet group's leader is served by it, and wakes the group.
        let g = 0;
        let leader = leaders[g as usize];
        let key = key_in_group(&c.spec, "quiet:wake", g);
        let mut conn = Conn::connect(&c.addr(leader)).await.expect("connect");
        for n in 1..=2 {
            assert!(c.cluster(leader).is_quiet(g), "group {g} is quiet");
            let woken = c.cluster(leader).quiet_wakes();
            assert_eq!(conn.must(&["INCR", &key]).await, Resp::Int(n));
            assert!(
                c.cluster(leader).quiet_wakes() > woken,
                "the write woke group {g}"
            );
            // Idle again, it goes quiet again.
            c.wait_all_quiet(SECS).await;
        }
        c.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_quiet_leader_is_replaced_and_no_write_is_lost() {
    bounded(async {
        let Settled {
            mut c,
            keys,
            acked,
            busiest: down,
            led,
        } = settle_quietly("quiet-stop").await;
        c.stop_node(down).await;

        // The survivors elect new leaders for the quiet groups and serve every group, with
        // every acknowledged write in place.
        let others: Vec<String> = c.running().iter().map(|&id| c.addr(id)).collect();
        let mut client = Router::new(others);
        let acked = bump_all(&mut client, &keys, &acked).await;
        let leaders = c.wait_leaders(SECS).await;
        for g in &led {
            assert_ne!(leaders[*g as usize], down, "group {g} has a new leader");
        }

        // The stopped node comes back and catches up.
        c.start_node(down).await;
        c.wait_leaders(SECS).await;
        let mut client = Router::new(vec![c.addr(down)]);
        for (k, &v) in keys.iter().zip(&acked) {
            let (r, _) = client.call(&["GET", k], SERVE).await;
            assert_eq!(r.text(), v.to_string(), "{k}");
        }
        c.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_quiet_leader_stops_claiming_and_the_majority_serves() {
    bounded(async {
        let Settled {
            mut c,
            keys,
            acked,
            busiest: alone,
            led,
        } = settle_quietly("quiet-cut").await;
        c.isolate(alone);

        // Cut off, it stops serving and advertising the groups it led quietly.
        let port = c.spec.node(alone).expect("in spec").port;
        wait_for(
            &format!("node {alone} to stop claiming its quiet groups"),
            SECS,
            || async {
                let claims = claimed(&c, &c.addr(alone), port).await?;
                let still: Vec<&GroupId> = led
                    .iter()
                    .filter(|g| claims.contains(g) || c.cluster(alone).leads(**g))
                    .collect();
                still.is_empty().then_some(())
            },
        )
        .await;

        // The majority side serves every group, with every acknowledged write in place.
        let mut inside = Router::new(c.addrs_but(alone));
        inside.stay_inside = true;
        let acked = bump_all(&mut inside, &keys, &acked).await;

        // Healed, the cluster agrees again and the cut-off node serves what the majority wrote.
        c.heal();
        wait_for(
            &format!("node {alone} to see the agreed leaders serving"),
            SECS,
            || async {
                (0..c.spec.groups)
                    .all(|g| {
                        c.agreed_leader(g)
                            .is_some_and(|l| c.cluster(alone).serving_leader(g) == Some(l))
                    })
                    .then_some(())
            },
        )
        .await;
        let mut client = Router::new(vec![c.addr(alone)]);
        for (k, &v) in keys.iter().zip(&acked) {
            let (r, _) = client.call(&["GET", k], SERVE).await;
            assert_eq!(r.text(), v.to_string(), "{k}");
        }
        c.stop_all().await;
    })
    .await;
}
