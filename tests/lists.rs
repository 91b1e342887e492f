//! Lists, side by side with a real `redis-server`: every list command and option, their
//! errors word for word, in RESP2 and RESP3, lists beside other kinds of keys, expiry, and a
//! long run of random commands. Then what only bucketd shows: SCAN's TYPE filter, and lists
//! against `maxmemory`.

#![cfg(feature = "server")]

mod common;

use common::real_redis::{RealRedis, SideBySide, both_protocols, run_script};
use common::*;

#[tokio::test]
async fn push_pop_index_range_and_trim_answer_as_redis_does() {
    bounded(both_protocols(async |sb: &mut SideBySide, p: &str| {
        let (k, m) = (format!("{p}:l"), format!("{p}:missing"));
        let (k, m) = (k.as_str(), m.as_str());
        run_script(
            sb,
            &[
                &["LPUSH", k, "a", "b", "c"],
                &["RPUSH", k, "d", "e", ""],
                &["LPUSHX", k, "f"],
                &["RPUSHX", k, "g", "h"],
                &["LPUSHX", m, "x"],
                &["RPUSHX", m, "x"],
                &["EXISTS", m],
                &["LLEN", k],
                &["LLEN", m],
                &["LRANGE", k, "0", "-1"],
                &["LRANGE", k, "2", "4"],
                &["LRANGE", k, "-3", "-1"],
                &["LRANGE", k, "-100", "100"],
                &["LRANGE", k, "5", "2"],
                &["LRANGE", k, "50", "60"],
                &["LRANGE", k, "-1", "-5"],
                &["LRANGE", k, "-9223372036854775808", "9223372036854775807"],
                &["LRANGE", m, "0", "-1"],
                &["!", "LRANGE", k, "a", "1"],
                &["!", "LRANGE", k, "0", "1.5"],
                &["!", "LRANGE", m, "0", "x"],
                &["LINDEX", k, "0"],
                &["LINDEX", k, "-1"],
                &["LINDEX", k, "-9"],
                &["LINDEX", k, "-10"],
                &["LINDEX", k, "9"],
                &["LINDEX", k, "100"],
                &["LINDEX", m, "0"],
                // The index is read after the key: a missing key is nil whatever it is.
                &["LINDEX", m, "notanumber"],
                &["!", "LINDEX", k, "notanumber"],
                &["!", "LINDEX", k, "01"],
                &["LPOP", k],
                &["RPOP", k],
                &["LPOP", k, "2"],
                &["RPOP", k, "2"],
                &["LPOP", k, "0"],
                &["RPOP", k, "0"],
                &["LRANGE", k, "0", "-1"],
                &["LPOP", m],
                &["RPOP", m],
                &["LPOP", m, "0"],
                &["LPOP", m, "3"],
                &["RPOP", m, "3"],
                &["!", "LPOP", k, "-1"],
                &["!", "RPOP", k, "x"],
                &["!", "LPOP", m, "-1"],
                &["!", "LPOP", k, "1", "2"],
                &["!", "LPOP"],
                &["!", "LPUSH", k],
                &["!", "RPUSHX", k],
                &["RPOP", k, "100"],
                &["EXISTS", k],
                &["RPUSH", k, "1", "2", "3", "4", "5", "6"],
                &["LTRIM", k, "1", "-2"],
                &["LRANGE", k, "0", "-1"],
                &["LTRIM", k, "-100", "100"],
                &["LRANGE", k, "0", "-1"],
                &["LTRIM", m, "0", "1"],
                &["!", "LTRIM", k, "x", "1"],
                &["!", "LTRIM", m, "0", "y"],
                // A trim to nothing deletes the key.
                &["LTRIM", k, "3", "1"],
                &["EXISTS", k],
                &["RPUSH", k, "1", "2"],
                &["LTRIM", k, "5", "10"],
                &["EXISTS", k],
                &["LPOP", k, "1"],
            ],
        )
        .await;
    }))
    .await;
}

#[tokio::test]
async fn lset_lrem_linsert_and_lpos_answer_as_redis_does() {
    bounded(both_protocols(async |sb: &mut SideBySide, p: &str| {
        let (k, m) = (format!("{p}:l"), format!("{p}:missing"));
        let (k, m) = (k.as_str(), m.as_str());
        run_script(
            sb,
            &[
                &["RPUSH", k, "a", "b", "a", "c", "a", "b", "a"],
                &["LSET", k, "0", "A"],
                &["LSET", k, "-1", "Z"],
                &["LRANGE", k, "0", "-1"],
                &["!", "LSET", k, "7", "x"],
                &["!", "LSET", k, "-8", "x"],
                &["!", "LSET", k, "x", "x"],
                &["!", "LSET", m, "0", "x"],
                &["!", "LSET", m, "x", "x"],
                &["LSET", k, "0", "a"],
                &["LSET", k, "6", "a"],
                &["LPOS", k, "a"],
                &["LPOS", k, "a", "RANK", "2"],
                &["LPOS", k, "a", "RANK", "-1"],
                &["LPOS", k, "a", "RANK", "-3"],
                &["LPOS", k, "a", "RANK", "9"],
                &["LPOS", k, "a", "COUNT", "0"],
                &["LPOS", k, "a", "COUNT", "2"],
                &["LPOS", k, "a", "COUNT", "2", "RANK", "2"],
                &["LPOS", k, "a", "COUNT", "0", "RANK", "-2"],
                &["LPOS", k, "a", "COUNT", "10", "RANK", "-1"],
                &["LPOS", k, "a", "MAXLEN", "2"],
                &["LPOS", k, "a", "MAXLEN", "2", "RANK", "2"],
                &["LPOS", k, "a", "MAXLEN", "3", "COUNT", "0"],
                &["LPOS", k, "a", "MAXLEN", "1", "RANK", "-1"],
                &["LPOS", k, "a", "MAXLEN", "0", "COUNT", "0"],
                &["LPOS", k, "c", "RANK", "1", "RANK", "-1"],
                &["LPOS", k, "nope"],
                &["LPOS", k, "nope", "COUNT", "3"],
                &["LPOS", k, "a", "RANK", "-9223372036854775808"],
                &["LPOS", k, "a", "RANK", "-9223372036854775808", "COUNT", "2"],
                &["LPOS", m, "a"],
                &["LPOS", m, "a", "COUNT", "1"],
                &["lpos", k, "a", "rank", "2", "count", "1", "maxlen", "0"],
                &["!", "LPOS", k, "a", "RANK", "0"],
                &["!", "LPOS", k, "a", "RANK", "x"],
                &["!", "LPOS", k, "a", "COUNT", "-1"],
                &["!", "LPOS", k, "a", "COUNT", "x"],
                &["!", "LPOS", k, "a", "MAXLEN", "-1"],
                &["!", "LPOS", k, "a", "MAXLEN", "x"],
                &["!", "LPOS", k, "a", "RANK"],
                &["!", "LPOS", k, "a", "COUNT"],
                &["!", "LPOS", k, "a", "FOO", "1"],
                &["!", "LPOS", m, "a", "RANK", "0"],
                &["!", "LPOS", k],
                &["LINSERT", k, "BEFORE", "c", "x"],
                &["LINSERT", k, "after", "c", "y"],
                &["LINSERT", k, "AFTER", "a", "first-a"],
                &["LINSERT", k, "before", "nope", "z"],
                &["LINSERT", m, "BEFORE", "a", "z"],
                &["EXISTS", m],
                &["!", "LINSERT", k, "NEAR", "a", "z"],
                &["!", "LINSERT", m, "NEAR", "a", "z"],
                &["!", "LINSERT", k, "BEFORE", "a"],
                &["LRANGE", k, "0", "-1"],
                &["LREM", k, "1", "a"],
                &["LREM", k, "-1", "a"],
                &["LRANGE", k, "0", "-1"],
                &["LREM", k, "0", "b"],
                &["LREM", k, "0", "nope"],
                &["LREM", k, "-100", "a"],
                &["LRANGE", k, "0", "-1"],
                &["LREM", m, "0", "a"],
                &["!", "LREM", k, "x", "a"],
                &["!", "LREM", m, "x", "a"],
                &["LREM", k, "0", "x"],
                &["LREM", k, "0", "first-a"],
                &["LREM", k, "0", "c"],
                &["LRANGE", k, "0", "-1"],
                &["LREM", k, "0", "y"],
                &["EXISTS", k],
            ],
        )
        .await;
    }))
    .await;
}

#[tokio::test]
async fn lists_beside_other_kinds_and_expiry_answer_as_redis_does() {
    bounded(both_protocols(async |sb: &mut SideBySide, p: &str| {
        let (l, s, h) = (format!("{p}:l"), format!("{p}:s"), format!("{p}:h"));
        let (l, s, h) = (l.as_str(), s.as_str(), h.as_str());
        run_script(
            sb,
            &[
                &["SET", s, "text"],
                &["HSET", h, "f", "v"],
                &["RPUSH", l, "a", "b"],
                &["TYPE", l],
                &["!", "GET", l],
                &["!", "INCR", l],
                &["!", "HGET", l, "f"],
                &["!", "SADD", l, "m"],
                &["!", "SCARD", l],
            ],
        )
        .await;
        for key in [s, h] {
            run_script(
                sb,
                &[
                    &["!", "LPUSH", key, "x"],
                    &["!", "RPUSH", key, "x"],
                    &["!", "LPUSHX", key, "x"],
                    &["!", "RPUSHX", key, "x"],
                    &["!", "LPOP", key],
                    &["!", "RPOP", key, "2"],
                    &["!", "LPOP", key, "0"],
                    &["!", "LINDEX", key, "0"],
                    &["!", "LINDEX", key, "x"],
                    &["!", "LRANGE", key, "0", "-1"],
                    &["!", "LTRIM", key, "0", "1"],
                    &["!", "LLEN", key],
                    &["!", "LSET", key, "0", "x"],
                    &["!", "LSET", key, "x", "x"],
                    &["!", "LREM", key, "0", "x"],
                    &["!", "LINSERT", key, "BEFORE", "a", "x"],
                    &["!", "LPOS", key, "x"],
                    &["!", "LPOS", key, "x", "COUNT", "1"],
                ],
            )
            .await;
        }
        run_script(
            sb,
            &[
                &["EXPIRE", l, "100"],
                &["TTL", l],
                // Writes keep the expiry.
                &["LPUSH", l, "c"],
                &["LSET", l, "0", "C"],
                &["RPOP", l],
                &["TTL", l],
                &["PERSIST", l],
                &["TTL", l],
                &["EXISTS", l],
                &["DEL", l],
                &["TYPE", l],
                &["EXISTS", l],
                &["DEL", l],
                &["RPUSH", l, "x"],
                &["PEXPIRE", l, "100000"],
                // A list emptied and pushed again is a new key, without the old TTL.
                &["LPOP", l],
                &["RPUSH", l, "y"],
                &["TTL", l],
                &["DEL", l, s, h],
            ],
        )
        .await;
    }))
    .await;
}

/// Thousands of random list commands on a few keys, sent to both, every reply compared:
/// short and long elements (so lists grow past one chunk and shrink back), every command.
#[tokio::test]
async fn random_list_commands_answer_as_redis_does() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        let mut rng = Rng(0x5eed_1157);
        let long = "L".repeat(3000);
        for _ in 0..4000 {
            let key = format!("rl:{}", rng.below(3));
            let elem = match rng.below(12) {
                0 => long.clone(),
                1 => format!("{}{}", "m".repeat(200), rng.below(3)),
                _ => format!("e{}", rng.below(6)),
            };
            let n = rng.below(8).to_string();
            let i = rng.int(12);
            let j = rng.int(12);
            let cmd: Vec<&str> = match rng.below(16) {
                0..=2 => vec!["RPUSH", &key, &elem, "e1", &elem],
                3..=4 => vec!["LPUSH", &key, &elem, "e2"],
                5 => vec!["LPUSHX", &key, &elem],
                6 => vec!["RPUSHX", &key, "e3", &elem],
                7 => vec![if rng.below(2) == 0 { "LPOP" } else { "RPOP" }, &key, &n],
                8 => vec!["LINDEX", &key, &i],
                9 => vec!["LRANGE", &key, &i, &j],
                10 => vec!["LTRIM", &key, &i, "-1"],
                11 => vec!["LSET", &key, &i, &elem],
                12 => vec!["LREM", &key, &i, &elem],
                13 => vec![
                    "LINSERT",
                    &key,
                    if rng.below(2) == 0 { "BEFORE" } else { "AFTER" },
                    "e1",
                    &elem,
                ],
                14 => vec!["LPOS", &key, &elem, "RANK", &j, "COUNT", &n, "MAXLEN", &n],
                _ => vec!["LLEN", &key],
            };
            let (ours, theirs) = sb.both(&cmd).await;
            assert_eq!(ours, theirs, "bucketd and Redis differ on {cmd:?}");
        }
        for k in 0..3 {
            sb.same(&["LRANGE", &format!("rl:{k}"), "0", "-1"]).await;
        }
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn scan_finds_lists_by_type() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        assert_eq!(c.cmd(&["RPUSH", "list:1", "a"]).await, Resp::Int(1));
        assert_eq!(c.cmd(&["LPUSH", "list:2", "a", "b"]).await, Resp::Int(2));
        assert_eq!(c.cmd(&["SADD", "set:1", "a"]).await, Resp::Int(1));
        assert_eq!(c.cmd(&["SET", "str:1", "a"]).await, ok());
        let mut found = Vec::new();
        let mut cursor = "0".to_string();
        loop {
            let r = c.cmd(&["SCAN", &cursor, "TYPE", "list"]).await;
            let r = r.as_array();
            cursor = r[0].as_text();
            found.extend(r[1].as_array().iter().map(Resp::as_text));
            if cursor == "0" {
                break;
            }
        }
        found.sort();
        assert_eq!(found, ["list:1", "list:2"]);
        let r = c.cmd(&["SCAN", "0", "TYPE", "LIST", "COUNT", "1000"]).await;
        assert_eq!(r.as_array()[1].as_array().len(), 2);
        node.shutdown().await;
    })
    .await;
}

fn ok() -> Resp {
    Resp::Simple("OK".into())
}

/// Pushes grow a list in place and count against `maxmemory`: once the node is full, every
/// command that can grow a list is refused with OOM (Redis's `denyoom`), on new keys and on
/// existing ones, while reads and removals go on and make room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_count_against_maxmemory() {
    bounded(async {
        let node = TestNode::start_with(|s| {
            s.shards = 1;
            s.maxmemory = 256 * 1024;
        })
        .await;
        let mut c = node.raw().await;
        let value = "v".repeat(1_000);
        let mut refused = None;
        for i in 0..1_000 {
            let args: Vec<&str> = std::iter::once("RPUSH")
                .chain(std::iter::once("big"))
                .chain(std::iter::repeat_n(value.as_str(), 10))
                .collect();
            match c.cmd(&args).await {
                Resp::Int(n) => assert_eq!(n, (i + 1) * 10),
                Resp::Error(e) => {
                    refused = Some((i, e));
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        let (pushes, e) = refused.expect("a full node refuses a push");
        assert!(e.starts_with("OOM "), "{e}");
        // Most of the cap went to the list before it was refused.
        assert!(pushes >= 15, "refused after {pushes} pushes");
        let oom = Resp::Error(e.clone());
        for cmd in [
            &["LPUSH", "big", "x"][..],
            &["RPUSHX", "big", "x"],
            &["LPUSH", "new", "x"],
            &["LSET", "big", "0", "x"],
            &["LINSERT", "big", "BEFORE", "x", "y"],
            &["SADD", "set", "x"],
        ] {
            assert_eq!(c.cmd(cmd).await, oom, "{cmd:?}");
        }
        assert_eq!(c.cmd(&["EXISTS", "new"]).await, Resp::Int(0));
        assert_eq!(c.cmd(&["LINDEX", "big", "0"]).await, Resp::bulk(&value));
        // Removals go on, and give the memory back.
        let len = c.cmd(&["LLEN", "big"]).await.as_int();
        assert_eq!(c.cmd(&["LTRIM", "big", "0", "9"]).await, ok());
        assert!(len > 10);
        assert_eq!(c.cmd(&["LPUSH", "new", "x"]).await, Resp::Int(1));
        node.shutdown().await;
    })
    .await
}

/// A push as large as a request may be is one list; one past the request limits is refused
/// before it reaches a list.
#[tokio::test]
async fn a_huge_push_is_bounded_by_the_request_limits() {
    bounded(async {
        let node = TestNode::start_with(|s| s.client_query_buffer_limit = 1 << 20).await;
        let mut c = node.raw().await;
        let many: Vec<String> = (0..20_000).map(|i| format!("element-{i:012}")).collect();
        let mut args = vec!["RPUSH", "l"];
        args.extend(many.iter().map(String::as_str));
        assert_eq!(c.cmd(&args).await, Resp::Int(20_000));
        assert_eq!(
            c.cmd(&["LINDEX", "l", "-1"]).await,
            Resp::bulk("element-000000019999")
        );
        let too_many: Vec<String> = (0..60_000).map(|i| format!("element-{i:012}")).collect();
        let mut args = vec!["RPUSH", "l2"];
        args.extend(too_many.iter().map(String::as_str));
        let mut refused = node.raw().await;
        // The node may close the connection before the whole request is written.
        let _ = refused.try_send(&encode(&args)).await;
        let r = refused.try_reply(std::time::Duration::from_secs(10)).await;
        assert!(
            !matches!(r, Ok(Resp::Int(_))),
            "a request past the query buffer limit was run: {r:?}"
        );
        assert_eq!(c.cmd(&["EXISTS", "l2"]).await, Resp::Int(0));
        node.shutdown().await;
    })
    .await
}

/// The list and set commands' COMMAND INFO entries: name, arity, flags, keys and ACL
/// categories are Redis's.
#[tokio::test]
async fn list_and_set_commands_report_redis_command_entries() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        for name in [
            "lpush",
            "rpush",
            "lpushx",
            "rpushx",
            "lpop",
            "rpop",
            "lindex",
            "lrange",
            "ltrim",
            "llen",
            "lset",
            "lrem",
            "linsert",
            "lpos",
            "sadd",
            "srem",
            "sismember",
            "smismember",
            "scard",
            "smembers",
        ] {
            let (ours, theirs) = sb.both(&["COMMAND", "INFO", name]).await;
            let (ours, theirs) = (&ours.as_array()[0], &theirs.as_array()[0]);
            assert_eq!(ours.as_array()[..7], theirs.as_array()[..7], "{name}");
        }
        node.shutdown().await;
    })
    .await;
}
