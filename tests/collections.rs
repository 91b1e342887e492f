//! Sorted sets, lists and sets as a store holds them: kept in the snapshot a standalone node
//! writes and read back whole after a restart (members, order, encoding, time to live), and
//! counted in the memory INFO reports and `maxmemory` caps.

#![cfg(feature = "server")]

mod common;

use common::{Resp, TestNode, bounded, info_u64, temp_dir};

/// What a restarted node must answer alike.
const READS: &[&[&str]] = &[
    &["ZRANGE", "z", "0", "-1", "WITHSCORES"],
    &["OBJECT", "ENCODING", "z"],
    &["ZRANGE", "bigz", "0", "-1", "WITHSCORES"],
    &["OBJECT", "ENCODING", "bigz"],
    &["LRANGE", "l", "0", "-1"],
    &["OBJECT", "ENCODING", "l"],
    &["SMEMBERS", "s"],
    &["OBJECT", "ENCODING", "s"],
    &["SMEMBERS", "ints"],
    &["OBJECT", "ENCODING", "ints"],
    &["PTTL", "l"],
    &["TYPE", "z"],
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collections_survive_a_restart_whole() {
    bounded(async {
        let dir = temp_dir("collections");
        let with_dir = |s: &mut bucketd::config::Settings| {
            s.data_dir = Some(dir.clone());
            s.save_interval = 0;
        };
        let node = TestNode::start_with(with_dir).await;
        let mut c = node.raw().await;
        c.cmd(&["ZADD", "z", "1.5", "a", "-2", "b", "inf", "c"])
            .await;
        let mut big = vec!["ZADD".to_string(), "bigz".to_string()];
        for i in 0..300 {
            big.push(format!("{}", i % 17));
            big.push(format!("member-{i}"));
        }
        let big: Vec<&str> = big.iter().map(String::as_str).collect();
        c.cmd(&big).await;
        c.cmd(&["RPUSH", "l", "x", "y", "", "z"]).await;
        c.cmd(&["PEXPIRE", "l", "500000"]).await;
        c.cmd(&["SADD", "s", "m1", "m2", "10", "m3"]).await;
        c.cmd(&["SADD", "ints", "5", "-1", "300", "2"]).await;
        let mut before = Vec::new();
        for r in READS {
            before.push(c.cmd(r).await);
        }
        assert_eq!(before[1], Resp::bulk("listpack"));
        assert_eq!(before[3], Resp::bulk("skiplist"));
        assert_eq!(before[9], Resp::bulk("intset"));
        node.shutdown().await;

        let node = TestNode::start_with(with_dir).await;
        let mut c = node.raw().await;
        for (r, want) in READS.iter().zip(&before) {
            assert_eq!(&c.cmd(r).await, want, "{r:?} after the restart");
        }
        node.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
}

#[tokio::test]
async fn collections_count_in_used_memory_and_give_it_back() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        let base = info_u64(&node, "memory", "used_memory").await.unwrap_or(0);
        for key in ["l", "z", "s"] {
            for chunk in 0..20 {
                let mut args: Vec<String> = match key {
                    "l" => vec!["RPUSH".into(), key.into()],
                    "z" => vec!["ZADD".into(), key.into()],
                    _ => vec!["SADD".into(), key.into()],
                };
                for i in 0..500 {
                    let n = chunk * 500 + i;
                    if key == "z" {
                        args.push(n.to_string());
                    }
                    args.push(format!("element-{n:012}"));
                }
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                c.cmd(&args).await;
            }
        }
        // 30,000 elements of 20 bytes: at least their bytes, well under Redis's own figure.
        let used = wait_used(&node, |u| u >= base + 30_000 * 20).await;
        assert!(
            used < base + 30_000 * 200,
            "used_memory grew by {} for 30,000 elements",
            used - base
        );
        assert_eq!(c.cmd(&["DEL", "l", "z", "s"]).await, Resp::Int(3));
        wait_used(&node, |u| u < base + 30_000 * 20).await;
        node.shutdown().await;
    })
    .await
}

/// INFO's `used_memory` once `ok` holds for it (shards publish their figures on a timer, which
/// a busy machine can run late: up to 20 s is waited for).
async fn wait_used(node: &TestNode, ok: impl Fn(u64) -> bool) -> u64 {
    for _ in 0..800 {
        let u = info_u64(node, "memory", "used_memory").await.unwrap_or(0);
        if ok(u) {
            return u;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("used_memory never reached what was expected");
}
