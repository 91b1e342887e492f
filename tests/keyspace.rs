//! The keyspace over time and at its caps, on a standalone node: active expiry of keys nobody
//! touches, the key and memory caps (new keys refused, live buckets unharmed), and multi-key
//! commands over keys on several shards. TTLs on the manual clock run on a standalone node and
//! on a cluster alike, in tests/behaviour/strings.rs.

#![cfg(feature = "server")]

mod common;

use common::*;
use redis::aio::MultiplexedConnection;
use std::time::Duration;

async fn dbsize(c: &mut MultiplexedConnection) -> i64 {
    q(c, &["DBSIZE"]).await
}

/// Polls DBSIZE (which touches no key) until it equals `want`.
async fn wait_dbsize(node: &TestNode, want: i64) {
    let n = node;
    wait_for(
        &format!("DBSIZE to reach {want}"),
        Duration::from_secs(5),
        move || async move {
            let mut c = n.conn().await;
            (dbsize(&mut c).await == want).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_expiry_removes_untouched_keys() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.conn().await;
        // 10k buckets that are full again 100 ms from now, 1k counters with a 50 ms TTL,
        // 100 buckets that need an hour, and 100 plain keys.
        for chunk in 0..10 {
            let mut p = redis::pipe();
            for i in 0..1_000 {
                p.cmd("BK.CHECK")
                    .arg(format!("ae:{chunk}:{i}"))
                    .arg("1/100ms")
                    .ignore();
            }
            let _: () = p.query_async(&mut c).await.unwrap();
        }
        let mut p = redis::pipe();
        for i in 0..1_000 {
            p.cmd("SET")
                .arg(format!("ttl:{i}"))
                .arg(i)
                .arg("PX")
                .arg(50)
                .ignore();
        }
        for i in 0..100 {
            p.cmd("BK.CHECK")
                .arg(format!("slow:{i}"))
                .arg("1/1h")
                .ignore();
            p.cmd("SET").arg(format!("keep:{i}")).arg(i).ignore();
        }
        let _: () = p.query_async(&mut c).await.unwrap();
        assert_eq!(dbsize(&mut c).await, 11_200);
        let checks_before = info_u64(&node, "bucketd", "checks_total").await;
        node.advance_ms(200);
        wait_dbsize(&node, 200).await;
        // Nothing touched the expired keys: the check counter did not move.
        assert_eq!(
            info_u64(&node, "bucketd", "checks_total").await,
            checks_before
        );
        let n = &node;
        wait_for(
            "INFO keyspace to show 200 keys",
            Duration::from_secs(5),
            move || async move {
                let mut c = n.raw().await;
                let text = c.cmd(&["INFO", "keyspace"]).await.as_text();
                info_field(&text, "db0")
                    .filter(|v| v.starts_with("keys=200,"))
                    .map(|_| ())
            },
        )
        .await;
        let expired = info_u64(&node, "stats", "expired_keys").await.unwrap_or(0);
        assert!(expired >= 11_000, "expired_keys {expired}");
        // What was not due is intact: the slow buckets still refuse.
        for i in 0..100 {
            let r = limit(&mut c, &["BK.CHECK", &format!("slow:{i}"), "1/1h"]).await;
            assert_eq!(r[0], 0, "slow:{i} lost its state");
        }
        assert_eq!(q::<i64>(&mut c, &["GET", "keep:99"]).await, 99);
        node.advance_ms(3_600_000);
        wait_dbsize(&node, 100).await;
        node.shutdown().await;
    })
    .await
}

/// Keeps adding new keys until the node refuses; returns how many it took.
async fn fill(c: &mut MultiplexedConnection, prefix: &str, tries: usize, value: &str) -> usize {
    let mut accepted = 0;
    for i in 0..tries {
        match run(c, &["SET", &format!("{prefix}:{i}"), value]).await {
            Ok(redis::Value::Okay) => accepted += 1,
            Err(e) => assert!(e.starts_with("OOM "), "a full node answers OOM, got {e}"),
            Ok(other) => panic!("SET answered {other:?}"),
        }
    }
    accepted
}

/// After the store is full: new keys of every kind are refused with OOM, while a bucket that
/// already exists keeps counting down exactly and is never reset.
async fn full_store_behaviour(node: &TestNode, c: &mut MultiplexedConnection) {
    let before = dbsize(c).await;
    for i in 0..20 {
        let k = format!("new:{i}");
        assert!(q_err(c, &["SET", &k, "v"]).await.starts_with("OOM "));
        assert!(q_err(c, &["INCR", &k]).await.starts_with("OOM "));
        assert!(
            q_err(c, &["BK.CHECK", &k, "5/1m"])
                .await
                .starts_with("OOM ")
        );
        assert!(
            q_err(c, &["CL.THROTTLE", &k, "5", "5", "60"])
                .await
                .starts_with("OOM ")
        );
        assert!(
            q_err(c, &["BK.LEASE", &k, "5/1m", "2"])
                .await
                .starts_with("OOM ")
        );
    }
    // A peek stores nothing, so it still answers.
    assert_eq!(
        limit(c, &["BK.CHECK", "new:0", "5/1m", "PEEK"]).await[..3],
        [1, 5, 4]
    );
    assert_eq!(dbsize(c).await, before);
    for left in (0..4).rev() {
        assert_eq!(
            limit(c, &["BK.CHECK", "live", "5/1m"]).await[..3],
            [1, 5, left]
        );
    }
    for _ in 0..3 {
        assert_eq!(
            limit(c, &["BK.CHECK", "live", "5/1m"]).await[..3],
            [0, 5, 0]
        );
    }
    assert_eq!(
        limit(c, &["CL.THROTTLE", "live-cell", "2", "1", "60"]).await[..3],
        [0, 3, 1]
    );
    assert_eq!(
        limit(c, &["CL.THROTTLE", "live-cell", "2", "1", "60"]).await[..3],
        [0, 3, 0]
    );
    assert_eq!(
        limit(c, &["CL.THROTTLE", "live-cell", "2", "1", "60"]).await[0],
        1
    );
    // Existing counters and strings still change.
    assert_eq!(q::<i64>(c, &["INCR", "counter"]).await, 2);
    let _: () = q(c, &["SET", "counter", "10"]).await;
    assert_eq!(q::<i64>(c, &["INCRBY", "counter", "5"]).await, 15);
    // The refill still works once time passes, for the existing bucket.
    node.advance_ms(12_000);
    assert_eq!(
        limit(c, &["BK.CHECK", "live", "5/1m"]).await[..3],
        [1, 5, 0]
    );
}

async fn seed_live_keys(c: &mut MultiplexedConnection) {
    assert_eq!(
        limit(c, &["BK.CHECK", "live", "5/1m"]).await[..3],
        [1, 5, 4]
    );
    assert_eq!(
        limit(c, &["CL.THROTTLE", "live-cell", "2", "1", "60"]).await[..3],
        [0, 3, 2]
    );
    assert_eq!(q::<i64>(c, &["INCR", "counter"]).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_cap_refuses_new_keys_and_keeps_live_buckets() {
    bounded(async {
        let node = TestNode::start_with(|s| {
            s.shards = 1;
            s.max_keys = 10;
        })
        .await;
        let mut c = node.conn().await;
        seed_live_keys(&mut c).await;
        assert_eq!(fill(&mut c, "fill", 50, "x").await, 7);
        assert_eq!(dbsize(&mut c).await, 10);
        full_store_behaviour(&node, &mut c).await;
        // Deleting makes room again.
        assert_eq!(q::<i64>(&mut c, &["DEL", "fill:0"]).await, 1);
        assert_eq!(
            run(&mut c, &["SET", "room", "v"]).await,
            Ok(redis::Value::Okay)
        );
        assert!(
            q_err(&mut c, &["SET", "room2", "v"])
                .await
                .starts_with("OOM ")
        );
        let rejected = info_u64(&node, "bucketd", "keys_rejected_full").await;
        assert!(rejected.is_some());
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_cap_holds_across_shards() {
    bounded(async {
        let mut over = Vec::new();
        for (shards, max_keys) in [(2, 10), (2, 3), (4, 1), (4, 6), (3, 8)] {
            let node = TestNode::start_with(|s| {
                s.shards = shards;
                s.max_keys = max_keys;
            })
            .await;
            let mut c = node.conn().await;
            let accepted = fill(&mut c, "cap", 200, "x").await;
            let held = dbsize(&mut c).await;
            assert_eq!(held, accepted as i64);
            if held > max_keys as i64 {
                over.push(format!(
                    "max_keys {max_keys} with {shards} shards: holds {held} keys"
                ));
            }
            node.shutdown().await;
        }
        assert!(
            over.is_empty(),
            "the key cap was exceeded:\n{}",
            over.join("\n")
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_cap_with_two_shards_keeps_live_buckets() {
    bounded(async {
        let node = TestNode::start_with(|s| s.max_keys = 40).await;
        let mut c = node.conn().await;
        seed_live_keys(&mut c).await;
        // Enough attempts that every shard is full.
        let accepted = fill(&mut c, "fill", 400, "x").await;
        assert!(accepted > 0 && accepted <= 37, "accepted {accepted}");
        full_store_behaviour(&node, &mut c).await;
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maxmemory_refuses_new_keys_and_keeps_live_buckets() {
    bounded(async {
        let cap = 64 * 1024;
        let node = TestNode::start_with(|s| s.maxmemory = cap).await;
        let mut c = node.conn().await;
        seed_live_keys(&mut c).await;
        let value = "v".repeat(200);
        let accepted = fill(&mut c, "mem", 2_000, &value).await;
        assert!(
            accepted > 50,
            "a 64 KiB cap holds more than 50 small keys, took {accepted}"
        );
        assert!(accepted < 2_000, "the memory cap never refused");
        // Pack what is left with the smallest keys there are (1-3 characters, integer
        // values), so that no key the checks below add can fit.
        let mut small = 0;
        for i in 0..0x1000 {
            if run(&mut c, &["SET", &format!("{i:x}"), "1"]).await.is_ok() {
                small += 1;
            }
        }
        assert!(small < 0x1000, "the memory cap never refused small keys");
        let n = &node;
        let used = wait_for(
            "INFO memory to be published",
            Duration::from_secs(5),
            move || async move {
                let used = info_u64(n, "memory", "used_memory").await?;
                (used > 0).then_some(used)
            },
        )
        .await;
        assert!(
            used <= cap as u64,
            "used_memory {used} over maxmemory {cap}"
        );
        assert_eq!(
            info_u64(&node, "memory", "maxmemory").await,
            Some(cap as u64)
        );
        full_store_behaviour(&node, &mut c).await;
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_key_commands_across_shards() {
    bounded(async {
        for shards in [2, 4] {
            let node = TestNode::start_with(|s| s.shards = shards).await;
            let mut c = node.conn().await;
            let keys: Vec<String> = (0..500).map(|i| format!("mk:{i}")).collect();
            let mut on_shard = vec![0; shards];
            for k in &keys {
                on_shard[usize::from(bucketd::slot::key_slot(k.as_bytes())) % shards] += 1;
            }
            assert!(
                on_shard.iter().all(|&n| n > 50),
                "keys spread over shards: {on_shard:?}"
            );
            let mut p = redis::pipe();
            for (i, k) in keys.iter().enumerate() {
                if i % 5 == 0 {
                    p.cmd("BK.CHECK").arg(k).arg("10/1m").ignore();
                } else {
                    p.cmd("SET").arg(k).arg(i).ignore();
                }
            }
            let _: () = p.query_async(&mut c).await.unwrap();
            let missing: Vec<String> = (0..100).map(|i| format!("absent:{i}")).collect();

            let mut args = vec!["EXISTS"];
            args.extend(keys.iter().map(String::as_str));
            args.extend(missing.iter().map(String::as_str));
            assert_eq!(q::<i64>(&mut c, &args).await, 500);
            // Duplicates count every time for EXISTS.
            let mut args = vec!["EXISTS"];
            args.extend(keys.iter().map(String::as_str));
            args.extend(keys.iter().map(String::as_str));
            assert_eq!(q::<i64>(&mut c, &args).await, 1_000);

            let mut args = vec!["DEL"];
            args.extend(keys.iter().step_by(2).map(String::as_str));
            args.extend(missing.iter().take(50).map(String::as_str));
            args.extend(keys.iter().step_by(4).map(String::as_str));
            assert_eq!(q::<i64>(&mut c, &args).await, 250);
            assert_eq!(dbsize(&mut c).await, 250);
            let mut args = vec!["EXISTS"];
            args.extend(keys.iter().map(String::as_str));
            assert_eq!(q::<i64>(&mut c, &args).await, 250);

            let mut args = vec!["UNLINK"];
            args.extend(keys.iter().map(String::as_str));
            assert_eq!(q::<i64>(&mut c, &args).await, 250);
            let mut args = vec!["BK.RESET"];
            args.extend(keys.iter().map(String::as_str));
            assert_eq!(q::<i64>(&mut c, &args).await, 0);
            assert_eq!(dbsize(&mut c).await, 0);

            // Hash-tagged keys live together; counts are the same.
            let tagged: Vec<String> = (0..50).map(|i| format!("{{grp}}:{i}")).collect();
            for k in &tagged {
                let _: () = q(&mut c, &["SET", k, "1"]).await;
            }
            let mut args = vec!["DEL"];
            args.extend(tagged.iter().map(String::as_str));
            assert_eq!(q::<i64>(&mut c, &args).await, 50);
            node.shutdown().await;
        }
    })
    .await
}
