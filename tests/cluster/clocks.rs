//! Clocks that disagree. Every replica of a group holds the same keys, byte for byte, however
//! far its wall clock is from the others' (a replica changes its keys only by applying the
//! log, at the group's time), and a node whose wall clock runs ahead grants nothing for it
//! when it takes the group over.

use crate::harness::*;
use bucketd::testing::{GroupId, NodeId, Record, ShardMsg};
use std::time::Duration;

const SEC: i64 = 1_000_000_000;

/// Group `g`'s keys as node `id`'s replica holds them (expired ones not yet removed
/// included), by key.
async fn replica_records(c: &TestCluster, id: NodeId, g: GroupId) -> Vec<Record> {
    let node = &c.handle(id).node;
    // In cluster mode every slot of a group lives on shard (group % shards).
    let shard = &node.shards[g as usize % node.shards.len()];
    let (reply, rx) = tokio::sync::oneshot::channel();
    shard
        .send(ShardMsg::Export {
            slots: c.spec.group_slots(g),
            now: 0,
            reply,
        })
        .await
        .expect("the shard runs");
    let mut records = rx.await.expect("the shard answers");
    records.sort_by(|a, b| a.key.cmp(&b.key));
    records
}

/// Waits until every running replica of `g` holds the same records (they apply the log at
/// different moments), and those records pass `expect`; returns them.
async fn identical_replicas(
    c: &TestCluster,
    g: GroupId,
    when: &str,
    expect: impl Fn(&[Record]) -> bool,
) -> Vec<Record> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut all = Vec::new();
        for id in c.running() {
            all.push((id, replica_records(c, id, g).await));
        }
        if all.windows(2).all(|w| w[0].1 == w[1].1) && expect(&all[0].1) {
            return all.swap_remove(0).1;
        }
        if std::time::Instant::now() >= deadline {
            let summary: Vec<(NodeId, Vec<String>)> = all
                .iter()
                .map(|(id, rs)| {
                    let keys = rs
                        .iter()
                        .map(|r| String::from_utf8_lossy(&r.key).into_owned())
                        .collect();
                    (*id, keys)
                })
                .collect();
            panic!("{when}: the replicas of group {g} differ, or hold other keys: {summary:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Lets `secs` seconds pass on every running node, a second at a time, so each node's sweep
/// runs in between.
async fn pass(c: &TestCluster, secs: u64) {
    for _ in 0..secs {
        for id in c.running() {
            c.clocks[id as usize - 1].advance_ms(1000);
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
}

/// CL.THROTTLE `key` 9 10 60 `quantity`: ten per minute, a burst of ten (a token every 6 s).
fn bucket<'a>(key: &'a str, quantity: &'a str) -> [&'a str; 6] {
    ["CL.THROTTLE", key, "9", "10", "60", quantity]
}

/// A follower started with its wall clock 30 s ahead of the others' expires nothing before
/// the group's time reaches it, so its keys stay those of its leader; once it leads, its
/// clock grants no token the group's time has not earned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_hold_the_same_keys_whatever_their_clocks() {
    bounded(async {
        let mut c = TestCluster::start(
            "skew",
            Opts {
                balance: false,
                ..Opts::default()
            },
        )
        .await;
        let g: GroupId = 0;
        let leader = c.wait_leaders(Duration::from_secs(10)).await[g as usize];
        let ahead = c.other_than(leader);
        c.stop_node(ahead).await;
        c.clocks[ahead as usize - 1].step_ns(30 * SEC);
        c.start_node(ahead).await;
        c.wait_leaders(Duration::from_secs(10)).await;
        let mut client = Router::new(c.addrs());

        // Keys that expire 5 s to 44 s from now, and buckets emptied now.
        let keys: Vec<String> = (0..40)
            .map(|i| key_in_group(&c.spec, &format!("skew-{i}"), g))
            .collect();
        for (i, k) in keys.iter().enumerate() {
            let px = (5_000 + i * 1000).to_string();
            let (r, _) = client.call(&["SET", k, "v", "PX", &px], SERVE).await;
            assert_eq!(r, Resp::Simple("OK".into()), "{r:?}");
        }
        let buckets: Vec<String> = (0..8)
            .map(|i| key_in_group(&c.spec, &format!("skew-bucket-{i}"), g))
            .collect();
        for b in &buckets {
            let (r, _) = client.call(&bucket(b, "10"), SERVE).await;
            assert_eq!(r.limit()[..3], [0, 10, 0], "{b}: {r:?}");
        }
        // The test keys a replica holds.
        let test_keys = |rs: &[Record]| -> Vec<String> {
            let mut held: Vec<String> = rs
                .iter()
                .map(|r| String::from_utf8_lossy(&r.key).into_owned())
                .filter(|k| keys.contains(k))
                .collect();
            held.sort();
            held
        };
        let holding = |from: usize| {
            let mut want: Vec<String> = keys[from..].to_vec();
            want.sort();
            move |rs: &[Record]| test_keys(rs) == want
        };
        identical_replicas(&c, g, "after the writes", holding(0)).await;

        // 20 s pass: the keys of up to 20 s go on every replica; the follower's clock, 50 s on
        // by now, expires nothing more.
        pass(&c, 20).await;
        identical_replicas(&c, g, "20 s later", holding(16)).await;

        // Each bucket earned three tokens in 20 s, on the leader as on the follower.
        let mut before = Vec::new();
        for b in &buckets {
            let (r, _) = client.call(&bucket(b, "0"), SERVE).await;
            assert_eq!(r.limit()[2], 3, "{b}: {r:?}");
            before.push(r.limit());
        }

        // The follower whose clock is ahead takes over: the buckets are as they were.
        c.cluster(leader)
            .transfer_leader(g, ahead)
            .await
            .expect("the leadership moves");
        wait_for(
            "the follower ahead to lead",
            Duration::from_secs(10),
            || async { (c.agreed_leader(g) == Some(ahead)).then_some(()) },
        )
        .await;
        for (b, was) in buckets.iter().zip(&before) {
            let (r, route) = client.call(&bucket(b, "0"), SERVE).await;
            assert_eq!(c.id_of_addr(&route.addr), Some(ahead));
            assert_eq!(
                r.limit()[..3],
                was[..3],
                "{b}: the new leader's clock 30 s ahead granted tokens"
            );
        }
        // Six seconds more: one token more (the group's time leans toward the new leader's
        // clock by 0.1 % of them, 6 ms).
        pass(&c, 6).await;
        for b in &buckets {
            let (r, _) = client.call(&bucket(b, "1"), SERVE).await;
            assert_eq!(r.limit()[..3], [0, 10, 3], "{b}: {r:?}");
        }
        // And the keys: those of up to 30 s go on every replica, led by the node ahead; its
        // clock, 60 s on, expires nothing more.
        pass(&c, 4).await;
        identical_replicas(&c, g, "led by the node ahead", holding(26)).await;
        c.stop_all().await;
    })
    .await;
}

/// Every node's wall clock steps an hour back while the cluster is down: restarted, the
/// cluster resumes from the group's time, kept in its log and snapshots, so a bucket neither
/// waits out the hour nor asks a client to wait longer than the limit can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_restarted_after_its_clocks_stepped_back_resumes_its_time() {
    bounded(async {
        let opts = Opts {
            balance: false,
            ..Opts::default()
        };
        let mut c = TestCluster::start("skew-restart", opts).await;
        let key = key_in_group(&c.spec, "skew-restart", 1);
        let mut client = Router::new(c.addrs());
        let (r, _) = client.call(&bucket(&key, "10"), SERVE).await;
        assert_eq!(r.limit()[..3], [0, 10, 0], "{r:?}");
        pass(&c, 7).await;
        // A token came back after 6 s; this takes it. (A group's time can lag its nodes'
        // clocks by an entry's way to a replica that took over, so the reset may read a
        // second more.)
        let (r, _) = client.call(&bucket(&key, "1"), SERVE).await;
        let l = r.limit();
        assert!(
            l[..4] == [0, 10, 0, -1] && (59..=60).contains(&l[4]),
            "{r:?}"
        );
        c.stop_all().await;
        for clock in &c.clocks {
            clock.step_ns(-3600 * SEC);
        }
        for id in c.ids() {
            c.start_node(id).await;
        }
        c.wait_leaders(Duration::from_secs(10)).await;
        let mut client = Router::new(c.addrs());
        // The next token is a few seconds away, as before the restart, not an hour.
        let (r, _) = client.call(&bucket(&key, "1"), SERVE).await;
        let l = r.limit();
        assert!(
            l[..3] == [1, 10, 0] && (1..=6).contains(&l[3]) && (59..=60).contains(&l[4]),
            "{r:?}"
        );
        // Once that wait has passed (and a second, for the 0.1 % the group's time leans
        // toward the clocks an hour behind), the token is there.
        pass(&c, l[3] as u64 + 1).await;
        let (r, _) = client.call(&bucket(&key, "1"), SERVE).await;
        assert_eq!(r.limit()[..4], [0, 10, 0, -1], "{r:?}");
        c.stop_all().await;
    })
    .await;
}
