//! Hashes where only bucketd shows them: the bounds on one hash (fields and bytes), hashes
//! beside buckets and semaphores, their bytes against `maxmemory`, SCAN's TYPE filter, and
//! a token bucket's hash updated inside a transaction. Replies Redis defines are compared with a real Redis in
//! tests/redis_compat.rs; a restart in tests/binary.rs, a failover in tests/cluster/hashes.rs.

#![cfg(feature = "server")]

mod common;

use common::*;
use std::time::Duration;

const TOO_MANY_FIELDS: &str = "ERR hash would have more than 128 fields";
const TOO_MANY_BYTES: &str = "ERR hash would have more than 65536 bytes of fields and values";
const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

fn ok() -> Resp {
    Resp::Simple("OK".into())
}

fn err(e: &str) -> Resp {
    Resp::Error(e.into())
}

#[tokio::test]
async fn a_hash_holds_at_most_128_fields_and_a_write_past_that_changes_nothing() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        let names: Vec<String> = (0..128).map(|i| format!("f{i}")).collect();
        let mut hset = vec!["HSET", "h"];
        for n in &names {
            hset.extend([n.as_str(), "1"]);
        }
        assert_eq!(c.cmd(&hset).await, Resp::Int(128));
        // One more field, alone or beside changes to existing ones: refused as a whole.
        for cmd in [
            &["HSET", "h", "new", "v"][..],
            &["HSET", "h", "f0", "changed", "new", "v"],
            &["HMSET", "h", "f0", "changed", "new", "v"],
            &["HSETNX", "h", "new", "v"],
            &["HINCRBY", "h", "new", "1"],
            &["HINCRBYFLOAT", "h", "new", "1.5"],
        ] {
            assert_eq!(c.cmd(cmd).await, err(TOO_MANY_FIELDS), "{cmd:?}");
        }
        assert_eq!(c.cmd(&["HLEN", "h"]).await, Resp::Int(128));
        assert_eq!(c.cmd(&["HGET", "h", "f0"]).await, Resp::bulk("1"));
        assert_eq!(c.cmd(&["HEXISTS", "h", "new"]).await, Resp::Int(0));
        // Existing fields still change; a deleted one makes room for a new one.
        assert_eq!(c.cmd(&["HINCRBY", "h", "f0", "4"]).await, Resp::Int(5));
        assert_eq!(c.cmd(&["HSET", "h", "f1", "x"]).await, Resp::Int(0));
        assert_eq!(c.cmd(&["HSETNX", "h", "f1", "y"]).await, Resp::Int(0));
        assert_eq!(c.cmd(&["HDEL", "h", "f2"]).await, Resp::Int(1));
        assert_eq!(c.cmd(&["HSET", "h", "new", "v"]).await, Resp::Int(1));
        assert_eq!(c.cmd(&["HLEN", "h"]).await, Resp::Int(128));
        // A new hash of 129 fields is refused too, and is no key.
        hset[1] = "h2";
        hset.extend(["one", "more"]);
        assert_eq!(c.cmd(&hset).await, err(TOO_MANY_FIELDS));
        assert_eq!(c.cmd(&["EXISTS", "h2"]).await, Resp::Int(0));
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_hash_holds_at_most_64_kib_of_fields_and_values() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        // Field "a" (1 byte) and a value that brings the hash to exactly 65 536 bytes.
        let fill = "x".repeat(65_536 - 1);
        assert_eq!(c.cmd(&["HSET", "h", "a", &fill]).await, Resp::Int(1));
        for cmd in [
            &["HSET", "h", "b", ""][..],
            &["HSET", "h", "a", &format!("{fill}y")],
            &["HMSET", "h", "b", ""],
            &["HSETNX", "h", "b", ""],
            &["HINCRBY", "h", "b", "1"],
        ] {
            assert_eq!(c.cmd(cmd).await, err(TOO_MANY_BYTES), "{cmd:?}");
        }
        assert_eq!(c.cmd(&["HLEN", "h"]).await, Resp::Int(1));
        assert_eq!(
            c.cmd(&["HSTRLEN", "h", "a"]).await,
            Resp::Int(65_536 - 1),
            "the value is as it was"
        );
        // A shorter value makes room.
        assert_eq!(c.cmd(&["HSET", "h", "a", "short"]).await, Resp::Int(0));
        assert_eq!(c.cmd(&["HSET", "h", "b", "1"]).await, Resp::Int(1));
        assert_eq!(c.cmd(&["HINCRBY", "h", "b", "1"]).await, Resp::Int(2));
        // A single value over the cap is refused on a new key as well.
        let over = "x".repeat(65_536);
        assert_eq!(
            c.cmd(&["HSET", "h3", "f", &over]).await,
            err(TOO_MANY_BYTES)
        );
        assert_eq!(c.cmd(&["EXISTS", "h3"]).await, Resp::Int(0));
        node.shutdown().await;
    })
    .await;
}

/// Hashes, buckets and semaphores refuse each other's commands, and a limit stays what it
/// was.
#[tokio::test]
async fn hashes_buckets_and_semaphores_are_different_kinds() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        assert_eq!(c.cmd(&["HSET", "h", "tokens", "5"]).await, Resp::Int(1));
        assert_eq!(
            c.cmd(&["CL.THROTTLE", "bk", "4", "1", "10"]).await.ints(),
            [0, 5, 4, -1, 10]
        );
        assert_eq!(
            c.cmd(&["BK.ACQUIRE", "sem", "2", "1m"]).await.as_array()[0],
            Resp::Int(1)
        );
        for key in ["bk", "sem"] {
            for cmd in [
                &["HSET", key, "f", "v"][..],
                &["HMSET", key, "f", "v"],
                &["HSETNX", key, "f", "v"],
                &["HGET", key, "f"],
                &["HMGET", key, "f"],
                &["HINCRBY", key, "f", "1"],
                &["HINCRBYFLOAT", key, "f", "1"],
                &["HDEL", key, "f"],
                &["HGETALL", key],
                &["HKEYS", key],
                &["HVALS", key],
                &["HLEN", key],
                &["HEXISTS", key, "f"],
                &["HSTRLEN", key, "f"],
            ] {
                assert_eq!(c.cmd(cmd).await, err(WRONGTYPE), "{cmd:?}");
            }
        }
        for cmd in [
            &["CL.THROTTLE", "h", "4", "1", "10"][..],
            &["BK.CHECK", "h", "5/1s"],
            &["BK.LEASE", "h", "5/1s", "2"],
            &["BK.ACQUIRE", "h", "2", "1m"],
            &["BK.INFLIGHT", "h"],
            &["GET", "h"],
        ] {
            assert_eq!(c.cmd(cmd).await, err(WRONGTYPE), "{cmd:?}");
        }
        assert_eq!(c.cmd(&["HGETALL", "h"]).await.as_array().len(), 2);
        assert_eq!(
            c.cmd(&["CL.THROTTLE", "bk", "4", "1", "10"]).await.ints(),
            [0, 5, 3, -1, 20]
        );
        assert_eq!(c.cmd(&["BK.INFLIGHT", "sem"]).await, Resp::Int(1));
        for (key, kind) in [("h", "hash"), ("bk", "bucket"), ("sem", "semaphore")] {
            assert_eq!(c.cmd(&["TYPE", key]).await, Resp::Simple(kind.into()));
        }
        // EXPIRE works on a hash, and leaves a bucket alone.
        assert_eq!(c.cmd(&["EXPIRE", "h", "5"]).await, Resp::Int(1));
        assert_eq!(c.cmd(&["EXPIRE", "bk", "1"]).await, Resp::Int(0));
        node.advance_ms(4_999);
        assert_eq!(c.cmd(&["HLEN", "h"]).await, Resp::Int(1));
        node.advance_ms(1);
        assert_eq!(c.cmd(&["HLEN", "h"]).await, Resp::Int(0));
        assert_eq!(c.cmd(&["EXISTS", "h"]).await, Resp::Int(0));
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn scan_finds_hashes_by_type() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        for i in 0..20 {
            let h = format!("h:{i}");
            assert_eq!(c.cmd(&["HSET", &h, "f", "v"]).await, Resp::Int(1));
            assert_eq!(c.cmd(&["SET", &format!("s:{i}"), "v"]).await, ok());
        }
        let mut found = Vec::new();
        let mut cursor = "0".to_string();
        loop {
            let r = c
                .cmd(&["SCAN", &cursor, "TYPE", "HASH", "COUNT", "7"])
                .await;
            let [next, keys] = r.as_array() else {
                panic!("{r:?}");
            };
            found.extend(keys.as_array().iter().map(Resp::as_text));
            cursor = next.as_text();
            if cursor == "0" {
                break;
            }
        }
        found.sort();
        found.dedup();
        let mut want: Vec<String> = (0..20).map(|i| format!("h:{i}")).collect();
        want.sort();
        assert_eq!(found, want);
        node.shutdown().await;
    })
    .await;
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
async fn hashes_count_against_maxmemory() {
    bounded(async {
        let cap = 256 * 1024;
        let node = TestNode::start_with(|s| {
            s.shards = 1;
            s.maxmemory = cap;
        })
        .await;
        let mut c = node.raw().await;
        let empty = used_memory(&node, "INFO memory", |_| true).await;
        // Three hashes of 60 KiB each: about 180 KiB of the 256 KiB cap.
        let value = "v".repeat(1_000);
        for h in ["h:1", "h:2", "h:3"] {
            for f in 0..60 {
                let reply = c.cmd(&["HSET", h, &format!("f{f}"), &value]).await;
                assert_eq!(reply, Resp::Int(1), "{h} f{f}");
            }
        }
        // Names, values and their lengths: 180 000 bytes of values alone.
        used_memory(&node, "the hashes in INFO memory", |u| u >= empty + 180_000).await;
        // What is left fills up with small hashes, and then a new one is refused.
        let mut refused = None;
        for f in 0..200 {
            let reply = c.cmd(&["HSET", &format!("new:{f}"), "f", &value]).await;
            if let Resp::Error(e) = reply {
                refused = Some(e);
                break;
            }
        }
        let e = refused.expect("a full store refuses new hashes");
        assert!(e.starts_with("OOM "), "{e}");
        // Their bytes go when the keys do.
        assert_eq!(c.cmd(&["DEL", "h:1", "h:2"]).await, Resp::Int(2));
        assert_eq!(c.cmd(&["HSET", "after", "f", &value]).await, Resp::Int(1));
        node.shutdown().await;
    })
    .await
}

#[tokio::test]
async fn hash_commands_run_inside_a_transaction() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        assert_eq!(c.cmd(&["MULTI"]).await, ok());
        for cmd in [
            &["HSET", "{u}:b", "tokens", "10", "ts", "1700000000000"][..],
            &["HINCRBY", "{u}:b", "tokens", "-3"],
            &["HMGET", "{u}:b", "tokens", "ts"],
            &["PEXPIRE", "{u}:b", "60000"],
        ] {
            assert_eq!(c.cmd(cmd).await, Resp::Simple("QUEUED".into()), "{cmd:?}");
        }
        assert_eq!(
            c.cmd(&["EXEC"]).await,
            Resp::Array(vec![
                Resp::Int(2),
                Resp::Int(7),
                Resp::Array(vec![Resp::bulk("7"), Resp::bulk("1700000000000")]),
                Resp::Int(1),
            ])
        );
        assert_eq!(c.cmd(&["PTTL", "{u}:b"]).await, Resp::Int(60_000));
        node.shutdown().await;
    })
    .await;
}
