//! A standalone node answers as a standalone Redis does whatever its number of shards: scripts,
//! MULTI/EXEC, MGET, MSET, DEL, EXISTS, RENAME and COPY over keys of different shards run
//! atomically and isolated. Checked side by side with a real `redis-server`, replies and the
//! keyspace left, on a node of four shards with keys chosen to fall on different shards.

#![cfg(feature = "server")]

mod common;

use common::real_redis::{RealRedis, SideBySide};
use common::{Resp, TestNode, bounded, key_on_shard};

const SHARDS: usize = 4;

async fn four_shards() -> TestNode {
    TestNode::start_with(|s| s.shards = SHARDS).await
}

/// One key on each shard, named from `prefix`.
fn spread(prefix: &str) -> Vec<String> {
    (0..SHARDS)
        .map(|s| key_on_shard(prefix, s, SHARDS))
        .collect()
}

/// Every key either server holds, with its type, value and whether it has a time to live:
/// the two keyspaces must be the same.
async fn same_keyspace(sb: &mut SideBySide) {
    let (mut ours, mut theirs) = sb.both(&["KEYS", "*"]).await;
    for r in [&mut ours, &mut theirs] {
        if let Resp::Array(v) = r {
            v.sort_by_key(|k| k.as_text());
        }
    }
    assert_eq!(ours, theirs, "the keyspaces hold different keys");
    for k in ours.as_array() {
        let k = k.as_text();
        let t = sb.same(&["TYPE", &k]).await.as_text();
        match t.as_str() {
            "string" => {
                sb.same(&["GET", &k]).await;
            }
            "hash" => {
                sb.same(&["HGETALL", &k]).await;
            }
            _ => {}
        }
        let (a, b) = sb.both(&["TTL", &k]).await;
        assert_eq!(a.as_int() > 0, b.as_int() > 0, "TTL of {k}: {a:?} {b:?}");
    }
}

#[tokio::test]
async fn scripts_over_keys_of_several_shards_answer_as_on_redis() {
    bounded(async {
        let node = four_shards().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        let k = spread("lock");
        // A concurrency limiter's shape: read every slot's holder, take the first free one.
        let take = "local held = redis.call('MGET', unpack(KEYS)) \
                    for i, v in ipairs(held) do \
                      if not v then redis.call('SET', KEYS[i], ARGV[1], 'EX', ARGV[2]) return i end \
                    end return 0";
        let mut args = vec!["EVAL", take, "4"];
        args.extend(k.iter().map(String::as_str));
        for id in ["a", "b", "c", "d", "e"] {
            let mut a = args.clone();
            a.extend([id, "60"]);
            sb.same(&a).await;
        }
        // Writes on every shard, then reads them all back, in one script.
        let counts = spread("count");
        let mut a = vec![
            "EVAL",
            "for i, k in ipairs(KEYS) do redis.call('INCRBY', k, i) end \
             return redis.call('MGET', unpack(KEYS))",
            "4",
        ];
        a.extend(counts.iter().map(String::as_str));
        sb.same(&a).await;
        sb.same(&a).await;
        // A key the script did not declare, on another shard, read before anything is
        // written; and keys a script names without declaring any.
        sb.same(&["EVAL", "return redis.call('GET', ARGV[1])", "1", &k[0], &counts[1]])
            .await;
        sb.same(&[
            "EVAL",
            "redis.call('SET', 'undeclared:a', 1) redis.call('SET', 'undeclared:b', 2) \
             return redis.call('MGET', 'undeclared:a', 'undeclared:b')",
            "0",
        ])
        .await;
        // KEYS from a script sees the whole keyspace; the pattern's clean-up script of a
        // limiter library deletes what it finds.
        let (mut ours, mut theirs) = sb
            .both(&["EVAL", "return redis.call('KEYS', ARGV[1])", "0", "count*"])
            .await;
        for r in [&mut ours, &mut theirs] {
            if let Resp::Array(v) = r {
                v.sort_by_key(|k| k.as_text());
            }
        }
        assert_eq!(ours, theirs);
        sb.same(&[
            "EVAL",
            "local keys = redis.call('KEYS', KEYS[1]) local n = 0 \
             for _, key in ipairs(keys) do n = n + redis.call('DEL', key) end return n",
            "1",
            "lock*",
        ])
        .await;
        sb.same(&["EVAL", "return redis.call('DBSIZE')", "0"]).await;
        // SCAN from a script walks every shard with the cursor a client's SCAN has.
        let walk = "local c, out = '0', {} repeat \
                      local r = redis.call('SCAN', c, 'MATCH', ARGV[1], 'COUNT', 3) \
                      c = r[1] for _, k in ipairs(r[2]) do out[#out + 1] = k end \
                    until c == '0' table.sort(out) return out";
        sb.same(&["EVAL", walk, "0", "*"]).await;
        sb.same(&["EVAL", walk, "1", &k[2], "count*"]).await;
        // A SCAN whose arguments are refused answers the client's error, in the script's words.
        sb.same_error(&["EVAL", "return redis.call('SCAN', '0', 'COUNT', '0')", "0"])
            .await;
        same_keyspace(&mut sb).await;
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_script_that_fails_half_way_leaves_what_redis_leaves() {
    bounded(async {
        let node = four_shards().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        let k = spread("half");
        sb.same(&["HSET", &k[3], "f", "v"]).await;
        // Writes on two shards, then fails on the third key's type: Redis keeps the writes.
        let script = "redis.call('SET', KEYS[1], 'one') redis.call('SET', KEYS[2], 'two') \
                      redis.call('INCR', KEYS[4]) redis.call('SET', KEYS[3], 'never')";
        let (ours, theirs) = sb
            .both(&["EVAL", script, "4", &k[0], &k[1], &k[2], &k[3]])
            .await;
        assert!(matches!(ours, Resp::Error(_)), "{ours:?}");
        assert!(matches!(theirs, Resp::Error(_)), "{theirs:?}");
        same_keyspace(&mut sb).await;
        // A script that writes, then reaches a key of another shard it did not declare,
        // cannot be run again over every shard: bucketd refuses it there (Redis has no
        // shards and runs it), and keeps what it wrote, as for any failing script.
        let mut c = node.raw().await;
        let e = c
            .cmd(&[
                "EVAL",
                "redis.call('SET', KEYS[1], 'w') return redis.call('GET', ARGV[1])",
                "1",
                &k[0],
                &k[1],
            ])
            .await;
        assert!(
            matches!(&e, Resp::Error(t) if t.contains("declare every key")),
            "{e:?}"
        );
        assert_eq!(c.cmd(&["GET", &k[0]]).await, Resp::bulk("w"));
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn transactions_over_several_shards_answer_as_on_redis() {
    bounded(async {
        let node = four_shards().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        let k = spread("txn");
        sb.same(&["HSET", &k[2], "f", "1"]).await;
        sb.same(&["MULTI"]).await;
        sb.same(&["SET", &k[0], "10"]).await;
        sb.same(&["INCRBY", &k[1], "5"]).await;
        // Fails when it runs, as in Redis; the rest of the transaction still applies.
        sb.same(&["INCR", &k[2]]).await;
        sb.same(&["MGET", &k[0], &k[1], &k[3]]).await;
        sb.same(&["RENAME", &k[0], &k[3]]).await;
        sb.same(&["EXPIRE", &k[3], "100"]).await;
        sb.same(&["PING"]).await;
        sb.same(&["EXEC"]).await;
        // A script inside a transaction, over every shard.
        sb.same(&["MULTI"]).await;
        sb.same(&["EVAL", "return redis.call('INCR', KEYS[1])", "1", &k[1]])
            .await;
        sb.same(&["DEL", &k[1], &k[2], &k[3]]).await;
        sb.same(&["EXEC"]).await;
        same_keyspace(&mut sb).await;
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn multi_key_commands_rename_copy_and_object_answer_as_on_redis() {
    bounded(async {
        let node = four_shards().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        let k = spread("mk");
        sb.same(&["MSET", &k[0], "1", &k[1], "two", &k[2], "3"])
            .await;
        sb.same(&["MGET", &k[0], &k[1], &k[2], &k[3]]).await;
        sb.same(&["EXISTS", &k[0], &k[1], &k[3], &k[0]]).await;
        sb.same(&["DEL", &k[2], &k[3]]).await;
        // RENAME and RENAMENX across shards and on one, with a time to live carried along.
        sb.same(&["EXPIRE", &k[1], "500"]).await;
        sb.same(&["RENAME", &k[1], &k[2]]).await;
        sb.same(&["EXISTS", &k[1]]).await;
        let (a, b) = sb.both(&["TTL", &k[2]]).await;
        assert!((a.as_int() - b.as_int()).abs() <= 1, "{a:?} {b:?}");
        sb.same_error(&["RENAME", &k[1], &k[3]]).await;
        sb.same_error(&["RENAMENX", &k[1], &k[3]]).await;
        sb.same(&["RENAMENX", &k[2], &k[0]]).await;
        sb.same(&["RENAMENX", &k[2], &k[3]]).await;
        sb.same(&["RENAME", &k[3], &k[3]]).await;
        sb.same(&["RENAMENX", &k[3], &k[3]]).await;
        sb.same(&["HSET", &k[1], "f", "v", "g", "w"]).await;
        sb.same(&["RENAME", &k[1], &k[0]]).await;
        sb.same(&["HGETALL", &k[0]]).await;
        // COPY: refused without REPLACE onto an existing key, a missing source, options.
        sb.same(&["COPY", &k[0], &k[2]]).await;
        sb.same(&["COPY", &k[0], &k[3]]).await;
        sb.same(&["COPY", &k[0], &k[3], "REPLACE"]).await;
        sb.same(&["HGETALL", &k[3]]).await;
        sb.same(&["COPY", "missing", &k[1]]).await;
        sb.same(&["COPY", &k[3], &k[1], "DB", "0"]).await;
        sb.same_error(&["COPY", &k[3], &k[3]]).await;
        sb.same_error(&["COPY", &k[3], &k[1], "BOGUS"]).await;
        sb.same_error(&["COPY", &k[3], &k[1], "DB", "x"]).await;
        sb.same_error(&["RENAME", &k[0]]).await;
        // OBJECT ENCODING of strings and hashes, as Redis 7.0 names them.
        sb.same(&["SET", "enc:int", "12345"]).await;
        sb.same(&["SET", "enc:short", "hello"]).await;
        sb.same(&["SET", "enc:long", &"x".repeat(60)]).await;
        sb.same(&["HSET", "enc:bighash", "f", &"v".repeat(100)])
            .await;
        for key in [
            "enc:int",
            "enc:short",
            "enc:long",
            "enc:bighash",
            &k[3],
            "missing",
        ] {
            sb.same(&["OBJECT", "ENCODING", key]).await;
        }
        sb.same(&["OBJECT", "REFCOUNT", "enc:int"]).await;
        sb.same_error(&["OBJECT", "NOSUCH", "enc:int"]).await;
        sb.same_error(&["OBJECT", "ENCODING"]).await;
        same_keyspace(&mut sb).await;
        node.shutdown().await;
    })
    .await;
}

/// Transactions and scripts over keys of every shard interleave with readers that never see
/// one half applied: every read of the keys finds them equal, and no increment is lost.
#[tokio::test]
async fn scripts_and_transactions_over_several_shards_are_isolated() {
    bounded(async {
        let node = four_shards().await;
        let keys = spread("iso");
        let mut setup = node.raw().await;
        for k in &keys {
            setup.cmd(&["SET", k, "0"]).await;
        }
        const ROUNDS: usize = 150;
        let mut tasks = Vec::new();
        for w in 0..4 {
            let mut c = node.raw().await;
            let keys = keys.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    if w % 2 == 0 {
                        c.cmd(&["MULTI"]).await;
                        for k in &keys {
                            c.cmd(&["INCR", k]).await;
                        }
                        let r = c.cmd(&["EXEC"]).await;
                        assert_eq!(r.as_array().len(), keys.len(), "{r:?}");
                    } else {
                        let mut a = vec![
                            "EVAL",
                            "for _, k in ipairs(KEYS) do redis.call('INCR', k) end",
                            "4",
                        ];
                        a.extend(keys.iter().map(String::as_str));
                        c.cmd(&a).await;
                    }
                }
            }));
        }
        let mut readers = Vec::new();
        for _ in 0..2 {
            let mut c = node.raw().await;
            let keys = keys.clone();
            readers.push(tokio::spawn(async move {
                let mut a = vec!["MGET"];
                a.extend(keys.iter().map(String::as_str));
                for _ in 0..ROUNDS * 2 {
                    let v: Vec<String> = c
                        .cmd(&a)
                        .await
                        .as_array()
                        .iter()
                        .map(Resp::as_text)
                        .collect();
                    assert!(v.iter().all(|x| *x == v[0]), "a torn read: {v:?}");
                }
            }));
        }
        for t in tasks.into_iter().chain(readers) {
            t.await.expect("client task");
        }
        let want = (4 * ROUNDS).to_string();
        for k in &keys {
            assert_eq!(setup.cmd(&["GET", k]).await, Resp::bulk(&want), "{k}");
        }
        node.shutdown().await;
    })
    .await;
}
