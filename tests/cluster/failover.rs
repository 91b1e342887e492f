//! Losing a group's leader: another replica takes over within a few election timeouts, and
//! the buckets it serves are exactly what the old leader had acknowledged.

use crate::harness::*;
use std::time::{Duration, Instant};

const KEY: &str = "failover:{tenant-17}";

/// CL.THROTTLE KEY 99 1 60: a bucket of 100, one token back per minute.
fn check(quantity: &str) -> [&str; 6] {
    ["CL.THROTTLE", KEY, "99", "1", "60", quantity]
}

/// The reply CL.THROTTLE KEY 99 1 60 gives for an admitted request leaving `left` tokens.
fn admitted(left: i64) -> [i64; 5] {
    [0, 100, left, -1, 60 * (100 - left)]
}

/// Takes one token; returns the tokens left and the node that answered.
async fn take(c: &TestCluster, client: &mut Router, left: i64) -> (i64, u64) {
    let (reply, route) = client.call(&check("1"), SERVE).await;
    let now = reply.limit()[2];
    assert_step(KEY, left, now, -1, &route);
    assert_eq!(reply.limit(), admitted(now));
    (now, c.id_of_addr(&route.addr).expect("a node answered"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_loss_fails_over_and_keeps_the_bucket() {
    bounded(async {
        let mut c = TestCluster::start("failover", Opts::default()).await;
        let g = group_of_key(&c.spec, KEY);
        let mut client = Router::new(c.addrs());
        let mut left = 100;
        let mut leader = 0;
        for _ in 0..4 {
            (left, leader) = take(&c, &mut client, left).await;
        }
        // Every replica applies the checks (followers learn the commit a moment later).
        for id in c.ids() {
            wait_for(
                &format!("node {id} to apply the checks"),
                Duration::from_secs(5),
                || async { (c.local_limit(id, &check("0")).await[2] == left).then_some(()) },
            )
            .await;
        }

        let t0 = Instant::now();
        c.stop_node(leader).await;
        let stopped = t0.elapsed();
        let (reply, route) = client.call(&check("0"), SERVE).await;
        let failover = t0.elapsed();
        println!(
            "failover: group {g} (leader node {leader}) served again from {} after {failover:?} \
             (stopping the leader took {stopped:?}; {} redirections, {} retries)",
            route.addr, route.moved, route.retries
        );
        assert_ne!(route.addr, c.addr(leader));
        assert!(
            failover < Duration::from_secs(3),
            "the group took {failover:?} to serve again"
        );
        assert_eq!(
            reply.limit(),
            admitted(left),
            "the bucket survives as acknowledged"
        );
        take(&c, &mut client, left).await;
        let new_leader = c.wait_leaders(Duration::from_secs(10)).await[g as usize];
        assert_ne!(new_leader, leader);
        c.stop_all().await;
    })
    .await;
}

/// A new leader whose wall clock is off, either way and by any amount, continues the group's
/// time: the bucket is neither charged again for time already counted (a clock behind) nor
/// refilled by a clock ahead; it refills as time passes, at the group's rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_continues_the_group_time_whatever_its_wall_clock() {
    const MIN: i64 = 60_000_000_000;
    bounded(async {
        let mut c = TestCluster::start("skewedleader", Opts::default()).await;
        let mut client = Router::new(c.addrs());
        let mut left = 100;
        let mut leader = 0;
        for _ in 0..4 {
            (left, leader) = take(&c, &mut client, left).await;
        }
        // The other replicas' wall clocks step two minutes back.
        for id in c.ids().into_iter().filter(|&id| id != leader) {
            c.clocks[id as usize - 1].step_ns(-2 * MIN);
        }
        c.stop_node(leader).await;
        let (reply, route) = client.call(&check("0"), SERVE).await;
        assert_ne!(route.addr, c.addr(leader));
        // Applied at the group's time, not two minutes earlier (which would show 2 fewer).
        assert_eq!(reply.limit(), admitted(left));
        (left, _) = take(&c, &mut client, left).await;
        // A minute passes (and a second: the group's time leans toward the wall clocks two
        // minutes behind by 0.1 % of it): one token is back.
        for id in c.running() {
            c.clocks[id as usize - 1].advance_ms(61_000);
        }
        let (reply, _) = client.call(&check("0"), SERVE).await;
        assert_eq!(reply.limit(), admitted(left + 1));
        (left, leader) = take(&c, &mut client, left + 1).await;
        // The first leader comes back; every replica but the leader steps an hour ahead, and
        // the leader goes: whoever takes over grants nothing for that hour.
        let first = c.ids().into_iter().find(|id| !c.running().contains(id));
        c.start_node(first.expect("a stopped node")).await;
        c.wait_leaders(Duration::from_secs(10)).await;
        for id in c.ids().into_iter().filter(|&id| id != leader) {
            c.clocks[id as usize - 1].step_ns(60 * MIN);
        }
        c.stop_node(leader).await;
        let (reply, route) = client.call(&check("0"), SERVE).await;
        assert_ne!(route.addr, c.addr(leader));
        assert_eq!(
            reply.limit(),
            admitted(left),
            "an hour ahead refilled the bucket"
        );
        c.stop_all().await;
    })
    .await;
}
