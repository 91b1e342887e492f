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

/// A new leader whose clock is behind the old one's does not move the group's time back:
/// the bucket is not charged again for time already counted, nor refilled by a later clock
/// until that clock really passes the group's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_leader_with_a_slow_clock_keeps_group_time() {
    bounded(async {
        let mut c = TestCluster::start("slowclock", Opts::default()).await;
        let mut client = Router::new(c.addrs());
        let mut left = 100;
        let mut leader = 0;
        for _ in 0..4 {
            (left, leader) = take(&c, &mut client, left).await;
        }
        // The other replicas' clocks are two minutes behind the leader's.
        for id in c.ids().into_iter().filter(|&id| id != leader) {
            c.clocks[id as usize - 1].set_ns(START_NS - 120_000_000_000);
        }
        c.stop_node(leader).await;
        let (reply, route) = client.call(&check("0"), SERVE).await;
        assert_ne!(route.addr, c.addr(leader));
        // Applied at the group's time, not two minutes earlier (which would show 2 fewer).
        assert_eq!(reply.limit(), admitted(left));
        (left, _) = take(&c, &mut client, left).await;
        // Once the new leader's clock passes the group's time by a minute, one token is back.
        for id in c.running() {
            c.clocks[id as usize - 1].set_ns(START_NS + 60_000_000_000);
        }
        let (reply, _) = client.call(&check("0"), SERVE).await;
        assert_eq!(reply.limit(), admitted(left + 1));
        c.stop_all().await;
    })
    .await;
}
