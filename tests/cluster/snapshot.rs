//! Snapshots: a node that was down while its groups snapshotted and purged their logs gets
//! the snapshot installed and then the log after it; a restart from snapshots keeps counts
//! and hashes.

use crate::harness::*;
use bucketd::testing::{GroupId, Reply};
use bytes::Bytes;
use openraft::type_config::async_runtime::WatchReceiver;
use std::time::Duration;

const SECS: Duration = Duration::from_secs(10);
const PURGE: Duration = Duration::from_secs(20);

/// Snapshots group `g` on every running replica and purges the log the snapshot covers;
/// returns the highest purged index.
async fn snapshot_and_purge(c: &TestCluster, g: GroupId) -> u64 {
    let mut purged = 0;
    for id in c.running() {
        let raft = c.cluster(id).raft(g).expect("replica").clone();
        let applied = raft
            .metrics()
            .borrow_watched()
            .last_applied
            .map(|l| l.index)
            .unwrap_or(0);
        raft.trigger().snapshot().await.expect("trigger snapshot");
        let at = wait_for(
            &format!("node {id} to snapshot group {g}"),
            SECS,
            || async {
                raft.metrics()
                    .borrow_watched()
                    .snapshot
                    .map(|l| l.index)
                    .filter(|&i| i >= applied)
            },
        )
        .await;
        // A leader defers purging logs a replication is reading (here: the retries towards the
        // stopped node, which free them between attempts); ask until it is done.
        let done = wait_for(&format!("node {id} to purge group {g}"), PURGE, || async {
            let p = raft.metrics().borrow_watched().purged.map(|l| l.index);
            if p >= Some(at) {
                return p;
            }
            raft.trigger().purge_log(at).await.expect("trigger purge");
            None
        })
        .await;
        purged = purged.max(done);
    }
    purged
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lagging_node_is_sent_a_snapshot_and_restarts_from_it() {
    bounded(async {
        let mut c = TestCluster::start("snapshot", Opts::default()).await;
        c.wait_balanced(SECS).await;
        let down = 2;
        c.stop_node(down).await;
        // Let the two left share the leaderships, then hold them still: a leadership moving
        // while logs are purged makes the purge wait for the move.
        c.wait_balanced(SECS).await;
        c.hold_leaders(SECS).await;

        let keys: Vec<Vec<String>> = (0..c.spec.groups)
            .map(|g| {
                (0..4)
                    .map(|j| key_in_group(&c.spec, &format!("snap:{j}"), g))
                    .collect()
            })
            .collect();
        let check = |k: &str, q: &str| line(&["CL.THROTTLE", k, "99", "1", "3600", q]);
        // Writes per group, each group's on its own client, in two halves.
        let writes: Vec<Vec<Vec<String>>> = keys
            .iter()
            .map(|ks| {
                (0..12)
                    .flat_map(|round| {
                        ks.iter()
                            .enumerate()
                            .filter(move |(j, _)| round % (j + 1) == 0)
                            .map(|(_, k)| check(k, "1"))
                    })
                    .collect()
            })
            .collect();
        let half = |first: bool| -> Vec<Vec<Vec<String>>> {
            writes
                .iter()
                .map(|w| {
                    let (a, b) = w.split_at(w.len() / 2);
                    if first { a.to_vec() } else { b.to_vec() }
                })
                .collect()
        };
        replies_concurrently(&c.addrs(), half(true)).await;
        // A hash in each group, which only the snapshots carry to the lagging node.
        let hashes: Vec<String> = (0..c.spec.groups)
            .map(|g| key_in_group(&c.spec, "snap:hash", g))
            .collect();
        let hset = |h: &str, g: usize| line(&["HSET", h, "group", &g.to_string(), "n", "-1"]);
        let mut writer = Router::new(c.addrs());
        replies(
            &mut writer,
            &hashes
                .iter()
                .enumerate()
                .map(|(g, h)| hset(h, g))
                .collect::<Vec<_>>(),
        )
        .await;
        for g in 0..c.spec.groups {
            snapshot_and_purge(&c, g).await;
        }
        replies_concurrently(&c.addrs(), half(false)).await;
        let mut purged = Vec::new();
        for g in 0..c.spec.groups {
            purged.push(snapshot_and_purge(&c, g).await);
        }
        // A few entries after the last snapshot, that only the log carries.
        let mut client = Router::new(c.addrs());
        replies(
            &mut client,
            &keys.iter().map(|ks| check(&ks[0], "2")).collect::<Vec<_>>(),
        )
        .await;
        let peeks: Vec<Vec<String>> = keys.iter().flatten().map(|k| check(k, "0")).collect();
        let expected = replies(&mut client, &peeks).await;

        c.start_node(down).await;
        for g in 0..c.spec.groups {
            let raft = c.cluster(down).raft(g).expect("replica").clone();
            // Its log no longer reaches what the others purged: only a snapshot does.
            wait_for(
                &format!("node {down} to install a snapshot of group {g}"),
                SECS,
                || async {
                    raft.metrics()
                        .borrow_watched()
                        .snapshot
                        .map(|l| l.index)
                        .filter(|&i| i >= purged[g as usize])
                },
            )
            .await;
            let file = c
                .data_dir(down)
                .join(format!("group-{g:04}"))
                .join("snapshot")
                .join("snapshot.bin");
            assert!(file.exists(), "{} is written", file.display());
        }
        for (p, want) in peeks.iter().zip(&expected) {
            let args: Vec<&str> = p.iter().map(String::as_str).collect();
            wait_for(&format!("node {down} to hold {p:?}"), SECS, || async {
                (c.local_limit(down, &args).await == want.limit()).then_some(())
            })
            .await;
        }

        let bulk = |s: String| Reply::Bulk(Bytes::from(s));
        for (g, h) in hashes.iter().enumerate() {
            let want = Reply::Map(vec![
                (bulk("group".into()), bulk(g.to_string())),
                (bulk("n".into()), bulk("-1".into())),
            ]);
            wait_for(&format!("node {down} to hold {h}"), SECS, || async {
                (c.local(down, &["HGETALL", h]).await == want).then_some(())
            })
            .await;
        }

        // Every node now starts from its snapshot plus the log after it.
        c.stop_all().await;
        for id in c.ids() {
            c.start_node(id).await;
        }
        c.wait_leaders(SECS).await;
        let mut client = Router::new(c.addrs());
        let after = replies(&mut client, &peeks).await;
        for ((p, want), got) in peeks.iter().zip(&expected).zip(&after) {
            assert_eq!(got, want, "{p:?} after restarting from snapshots");
        }
        for (g, h) in hashes.iter().enumerate() {
            let (got, _) = client.call(&["HMGET", h, "group", "n"], SERVE).await;
            let want: Vec<String> = vec![g.to_string(), "-1".into()];
            let got: Vec<String> = got.array().iter().map(Resp::text).collect();
            assert_eq!(got, want, "{h} after restarting from snapshots");
        }
        c.stop_all().await;
    })
    .await;
}

/// A node bounds what its Raft log holds in memory by bytes: a busy group past its share
/// snapshots and drops the entries the snapshot covers long before openraft's count of
/// entries would, on every replica, and the counts stay right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_held_in_memory_stays_within_its_bound() {
    bounded(async {
        // 9 groups (8 and the metadata): a share of 10 KiB each, about forty checks on a long
        // key. Without trimming, the checks below leave over 100 KiB in group 0's log alone.
        const BOUND: u64 = 90 << 10;
        const CHECKS: usize = 400;
        let c = TestCluster::start(
            "log-memory",
            Opts {
                log_memory: Some(BOUND),
                ..Opts::patient()
            },
        )
        .await;
        let g = 0;
        let key = key_in_group(&c.spec, &format!("trim:{}", "k".repeat(200)), g);
        let check = |q: &str| line(&["CL.THROTTLE", &key, "999", "1", "3600", q]);
        let mut client = Router::new(c.addrs());
        let writes: Vec<Vec<String>> = (0..CHECKS).map(|_| check("1")).collect();
        for r in replies(&mut client, &writes).await {
            assert_eq!(r.limit()[0], 0, "{r:?}");
        }
        for id in c.running() {
            let cluster = c.cluster(id);
            let (_, bound) = cluster.log_memory();
            assert_eq!(bound, BOUND, "node {id}'s bound");
            wait_for(
                &format!("node {id}'s log in memory within {BOUND} bytes"),
                SECS,
                || async { (cluster.log_memory().0 <= BOUND).then_some(()) },
            )
            .await;
            let m = cluster
                .raft(g)
                .expect("replica")
                .metrics()
                .borrow_watched()
                .clone();
            let purged = m.purged.map_or(0, |l| l.index);
            assert!(
                purged > 0 && purged < CHECKS as u64,
                "node {id} purged group {g} up to {purged}"
            );
        }
        let peek = replies(&mut client, &[check("0")]).await;
        assert_eq!(peek[0].limit()[2], 1000 - CHECKS as i64, "{peek:?}");
    })
    .await;
}
