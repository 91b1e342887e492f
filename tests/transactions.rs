//! MULTI / EXEC / DISCARD: queued, then applied atomically on the shard that owns the
//! transaction's slot. Replies are compared with a real Redis fed the same requests; where
//! bucketd deliberately differs (keys of one transaction must share a slot, as in Redis
//! Cluster), the difference is asserted on its own.

#![cfg(feature = "server")]

mod common;

use common::real_redis::{RealRedis, SideBySide};
use common::tools::{REDIS_PY, require_python};
use common::{Resp, TestNode, bounded};
use std::time::Duration;

async fn side_by_side() -> (TestNode, RealRedis, SideBySide) {
    let node = TestNode::start().await;
    let redis = RealRedis::start().await;
    let sb = SideBySide::connect(&node, &redis).await;
    (node, redis, sb)
}

#[tokio::test]
async fn transactions_answer_as_redis_does() {
    bounded(async {
        let (node, _redis, mut sb) = side_by_side().await;
        for resp3 in [false, true] {
            if resp3 {
                sb.both(&["HELLO", "3"]).await;
            }
            // Queue, then run: every reply in order, in one array.
            sb.same(&["MULTI"]).await;
            sb.same(&["SET", "{t}a", "1"]).await;
            sb.same(&["INCR", "{t}a"]).await;
            sb.same(&["INCRBY", "{t}a", "10"]).await;
            sb.same(&["GET", "{t}a"]).await;
            sb.same(&["EXPIRE", "{t}a", "100"]).await;
            sb.same(&["TTL", "{t}a"]).await;
            sb.same(&["DEL", "{t}a", "{t}b"]).await;
            sb.same(&["PING"]).await;
            sb.same(&["ECHO", "hi"]).await;
            let r = sb.same(&["EXEC"]).await;
            assert_eq!(r.as_array().len(), 9, "{r:?}");
            // An empty transaction.
            sb.same(&["MULTI"]).await;
            sb.same(&["EXEC"]).await;
            // A command that fails when it runs does not stop the others.
            sb.same(&["SET", "{t}s", "text"]).await;
            sb.same(&["MULTI"]).await;
            sb.same(&["INCR", "{t}s"]).await;
            sb.same(&["SET", "{t}n", "5"]).await;
            sb.same(&["INCR", "{t}n"]).await;
            sb.same(&["EXEC"]).await;
            sb.same(&["GET", "{t}n"]).await;
            // A command refused when queued aborts the whole transaction.
            sb.same(&["MULTI"]).await;
            sb.same(&["SET", "{t}x", "1"]).await;
            sb.same_error(&["GET"]).await;
            sb.same_error(&["NOSUCHCOMMAND", "a"]).await;
            sb.same_error(&["EXEC"]).await;
            sb.same(&["EXISTS", "{t}x"]).await;
            // DISCARD drops what was queued.
            sb.same(&["MULTI"]).await;
            sb.same(&["SET", "{t}y", "1"]).await;
            sb.same(&["DISCARD"]).await;
            sb.same(&["EXISTS", "{t}y"]).await;
            // Misuse.
            sb.same_error(&["EXEC"]).await;
            sb.same_error(&["DISCARD"]).await;
            sb.same(&["MULTI"]).await;
            sb.same_error(&["MULTI"]).await;
            sb.same_error(&["WATCH", "{t}a"]).await;
            sb.same(&["INCR", "{t}n"]).await;
            sb.same(&["EXEC"]).await;
            sb.same(&["UNWATCH"]).await;
            sb.same_error(&["EXEC", "extra"]).await;
            sb.same(&["DEL", "{t}s", "{t}n", "{t}x"]).await;
        }
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_pipelined_transaction_answers_as_redis_does() {
    bounded(async {
        let (node, _redis, mut sb) = side_by_side().await;
        let mut wire = Vec::new();
        for args in [
            &["SET", "{p}k", "1"][..],
            &["MULTI"],
            &["INCR", "{p}k"],
            &["PEXPIRE", "{p}k", "100000"],
            &["EXEC"],
            &["GET", "{p}k"],
        ] {
            wire.extend(common::encode(args));
        }
        sb.ours.send(&wire).await;
        sb.redis.send(&wire).await;
        for _ in 0..6 {
            assert_eq!(sb.ours.reply().await, sb.redis.reply().await);
        }
        node.shutdown().await;
    })
    .await;
}

/// A standalone node, like a standalone Redis, has no slot rule: a transaction's keys may be
/// anywhere (a cluster node answers CROSSSLOT, as Redis Cluster does: tests/cluster).
#[tokio::test]
async fn a_standalone_transaction_may_span_slots_and_shards() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        assert_eq!(c.cmd(&["MULTI"]).await, Resp::Simple("OK".into()));
        for cmd in [
            &["SET", "a", "1"][..],
            &["SET", "b", "2"],
            &["DEL", "a", "b", "c"],
        ] {
            assert_eq!(c.cmd(cmd).await, Resp::Simple("QUEUED".into()));
        }
        assert_eq!(
            c.cmd(&["EXEC"]).await,
            Resp::Array(vec![
                Resp::Simple("OK".into()),
                Resp::Simple("OK".into()),
                Resp::Int(2)
            ])
        );
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn transactions_are_atomic_under_concurrency() {
    bounded(async {
        // Two shards: the clients land on both, so some transactions run on their own shard
        // and some travel to the other one.
        let node = TestNode::start().await;
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let mut c = node.raw().await;
            tasks.push(tokio::spawn(async move {
                for _ in 0..200 {
                    let mut wire = Vec::new();
                    for args in [
                        &["MULTI"][..],
                        &["INCR", "{atomic}n"],
                        &["INCR", "{atomic}n"],
                        &["INCR", "{atomic}n"],
                        &["EXEC"],
                    ] {
                        wire.extend(common::encode(args));
                    }
                    c.send(&wire).await;
                    for _ in 0..4 {
                        c.reply().await;
                    }
                    let got = c.reply().await.ints();
                    // Nothing interleaved: three consecutive values.
                    assert_eq!(got[1], got[0] + 1, "{got:?}");
                    assert_eq!(got[2], got[0] + 2, "{got:?}");
                }
            }));
        }
        for t in tasks {
            t.await.expect("client task");
        }
        let mut c = node.raw().await;
        assert_eq!(
            c.cmd(&["GET", "{atomic}n"]).await,
            Resp::Bulk(b"4800".to_vec())
        );
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_transaction_is_bounded_by_the_query_buffer_limit() {
    bounded(async {
        let node = TestNode::start_with(|s| s.client_query_buffer_limit = 64 << 10).await;
        let mut c = node.raw().await;
        c.cmd(&["MULTI"]).await;
        let value = "v".repeat(1000);
        let mut refused = false;
        for _ in 0..200 {
            match c.cmd(&["SET", "{q}k", &value]).await {
                Resp::Simple(s) if s == "QUEUED" => {}
                Resp::Error(e) => {
                    assert!(e.contains("client-query-buffer-limit"), "{e}");
                    refused = true;
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(
            refused,
            "200 KB of queued commands were accepted under a 64 KiB cap"
        );
        assert!(matches!(c.cmd(&["EXEC"]).await, Resp::Error(e) if e.starts_with("EXECABORT")));
        assert_eq!(c.cmd(&["PING"]).await, Resp::Simple("PONG".into()));
        node.shutdown().await;
    })
    .await;
}

/// redis-py's `pipeline()` is transactional by default: the README's INCR + EXPIRE pattern
/// must work through it unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_transactional_pipeline() {
    require_python(REDIS_PY);
    bounded(async {
        let node = TestNode::start().await;
        let script = r#"
import sys, redis
r = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]))
for i in range(5):
    with r.pipeline() as p:
        p.incr("fw:{user1}")
        p.expire("fw:{user1}", 60)
        count, _ = p.execute()
    assert count == i + 1, count
assert r.ttl("fw:{user1}") == 60
p = r.pipeline(transaction=True)
p.set("fw:{user1}:a", "x").get("fw:{user1}:a")
assert p.execute() == [True, b"x"]
print("ok")
"#;
        let out = tokio::time::timeout(
            Duration::from_secs(60),
            tokio::process::Command::new("python3")
                .args(["-c", script, &node.port().to_string()])
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("redis-py finishes within 60 s")
        .expect("python3 runs (with redis-py installed)");
        assert!(
            out.status.success(),
            "redis-py pipeline failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        node.shutdown().await;
    })
    .await
}
