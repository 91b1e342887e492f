//! Concurrency limits where only a standalone node shows them: their bytes against
//! `maxmemory`, their holders across a restart from the snapshot, SCAN's TYPE filter, and the
//! reply in RESP3. The commands' semantics run on a node and on a cluster alike in
//! tests/behaviour/concurrency.rs; a leader failover in tests/cluster/concurrency.rs.

#![cfg(feature = "server")]

mod common;

use common::*;
use redis::Value;
use std::time::Duration;

/// Takes a slot that must be granted; returns its token.
async fn take(
    c: &mut impl redis::aio::ConnectionLike,
    key: &str,
    limit: &str,
    ttl: &str,
) -> String {
    let v: Value = q(c, &["BK.ACQUIRE", key, limit, ttl]).await;
    match &v {
        Value::Array(f) if f.first() == Some(&Value::Int(1)) => match &f[1] {
            Value::BulkString(t) => String::from_utf8(t.clone()).expect("utf-8 token"),
            other => panic!("a granted slot's token is {other:?}"),
        },
        other => panic!("BK.ACQUIRE {key} {limit} {ttl} was refused: {other:?}"),
    }
}

/// The bytes the node's stores hold, once INFO has published a figure that `ok` accepts.
async fn used_memory(node: &TestNode, what: &str, ok: impl Fn(u64) -> bool) -> u64 {
    wait_for(what, Duration::from_secs(5), || async {
        info_u64(node, "memory", "used_memory")
            .await
            .filter(|&used| ok(used))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_count_against_maxmemory() {
    bounded(async {
        let cap = 64 * 1024;
        let node = TestNode::start_with(|s| {
            s.shards = 1;
            s.maxmemory = cap;
        })
        .await;
        let mut c = node.conn().await;
        let empty = used_memory(&node, "INFO memory", |_| true).await;
        // 2 000 holders of 16 bytes: about half the cap, in one key.
        for _ in 0..2_000 {
            take(&mut c, "sem", "100000", "1h").await;
        }
        let held = used_memory(&node, "the holders in INFO memory", |u| u > empty).await;
        assert!(
            held - empty >= 2_000 * 16,
            "2 000 holders count {} bytes",
            held - empty
        );
        // What is left no longer fits a 40 KiB string, which an empty node would take.
        let big = "v".repeat(40 * 1024);
        let e = q_err(&mut c, &["SET", "big", &big]).await;
        assert!(e.starts_with("OOM "), "{e}");
        // A new semaphore is a new key, refused like any other once the store is full.
        let filler = "f".repeat(20 * 1024);
        let _: () = q(&mut c, &["SET", "filler", &filler]).await;
        let mut refused = None;
        for i in 0..200 {
            let key = format!("new:{i}");
            match run(&mut c, &["BK.ACQUIRE", &key, "1", "1h"]).await {
                Ok(_) => {}
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        let e = refused.expect("a full store refuses new semaphores");
        assert!(e.starts_with("OOM "), "{e}");
        // The existing semaphore still takes and gives back slots.
        let t = take(&mut c, "sem", "100000", "1h").await;
        assert_eq!(q::<i64>(&mut c, &["BK.RELEASE", "sem", &t]).await, 1);

        // Its bytes go when the key does.
        assert_eq!(q::<i64>(&mut c, &["DEL", "sem", "filler"]).await, 2);
        let _: () = q(&mut c, &["SET", "big", &big]).await;
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_survive_a_restart_and_still_expire_on_time() {
    bounded(async {
        let dir = temp_dir("semaphores");
        let with_dir = |s: &mut bucketd::config::Settings| {
            s.data_dir = Some(dir.clone());
            s.save_interval = 0;
        };
        let node = TestNode::start_with(with_dir).await;
        let mut c = node.conn().await;
        let kept = take(&mut c, "sem", "2", "10s").await;
        let gone = take(&mut c, "sem", "2", "10s").await;
        assert_eq!(q::<i64>(&mut c, &["BK.RELEASE", "sem", &gone]).await, 1);
        take(&mut c, "short", "1", "3s").await;
        node.shutdown().await;

        // The restarted node's clock starts where the first one's did.
        let node = TestNode::start_with(with_dir).await;
        let mut c = node.conn().await;
        assert_eq!(q::<i64>(&mut c, &["BK.INFLIGHT", "sem"]).await, 1);
        assert_eq!(q::<String>(&mut c, &["TYPE", "sem"]).await, "semaphore");
        // One slot is free and one is held under the token handed out before the restart.
        let again = take(&mut c, "sem", "2", "10s").await;
        let number = |t: &str| t.parse::<u64>().expect("a decimal token");
        assert!(
            number(&again) > number(&kept),
            "tokens keep growing across the restart"
        );
        let refused: Vec<Value> = q(&mut c, &["BK.ACQUIRE", "sem", "2", "10s"]).await;
        assert_eq!(refused[..3], [Value::Int(0), Value::Nil, Value::Int(2)]);
        assert_eq!(q::<i64>(&mut c, &["BK.RELEASE", "sem", &kept]).await, 1);
        assert_eq!(q::<i64>(&mut c, &["BK.RELEASE", "sem", &gone]).await, 0);
        // Deadlines are absolute: the short holder frees at 3 s as it would have.
        node.advance_ms(2_999);
        assert_eq!(q::<i64>(&mut c, &["BK.INFLIGHT", "short"]).await, 1);
        node.advance_ms(1);
        assert_eq!(q::<i64>(&mut c, &["BK.INFLIGHT", "short"]).await, 0);
        assert_eq!(q::<i64>(&mut c, &["EXISTS", "short"]).await, 0);
        node.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_finds_semaphores_by_type_and_resp3_replies_nil() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.conn_resp3().await;
        take(&mut c, "sem:1", "1", "1m").await;
        take(&mut c, "sem:2", "1", "1m").await;
        let _: () = q(&mut c, &["SET", "str", "v"]).await;
        assert_eq!(check(&mut c, "bucket", "5/1s").await[0], 1);
        let mut found = Vec::new();
        let mut cursor = "0".to_string();
        loop {
            let (next, keys): (String, Vec<String>) =
                q(&mut c, &["SCAN", &cursor, "TYPE", "semaphore"]).await;
            found.extend(keys);
            if next == "0" {
                break;
            }
            cursor = next;
        }
        found.sort();
        assert_eq!(found, ["sem:1", "sem:2"]);
        let refused: Vec<Value> = q(&mut c, &["BK.ACQUIRE", "sem:1", "1", "1m"]).await;
        let int = Value::Int;
        assert_eq!(refused, [int(0), Value::Nil, int(1), int(1), int(60_000)]);
        node.shutdown().await;
    })
    .await
}
