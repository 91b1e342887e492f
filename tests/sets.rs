//! Sets, side by side with a real `redis-server`: every set command, errors word for word,
//! RESP2 and RESP3, intsets listed in Redis's ascending order up to the 512-member
//! conversion, sets beside other kinds, expiry, and random commands. A hashtable's order is
//! Redis's hash order, which no client may rely on: those replies are compared as sets, and
//! bucketd's own order is checked to be the same on every run. Then SCAN's TYPE filter and
//! `maxmemory`.

#![cfg(feature = "server")]

mod common;

use common::real_redis::{RealRedis, SideBySide, both_protocols, run_script};
use common::*;

/// The members of an SMEMBERS reply (array or RESP3 set), sorted.
fn sorted_members(r: &Resp) -> Vec<Vec<u8>> {
    let items = match r {
        Resp::Array(v) | Resp::Set(v) => v,
        other => panic!("not a set: {other:?}"),
    };
    let mut out: Vec<Vec<u8>> = items
        .iter()
        .map(|m| match m {
            Resp::Bulk(b) => b.clone(),
            other => panic!("not a member: {other:?}"),
        })
        .collect();
    out.sort();
    out
}

/// SMEMBERS on both: the same kind of reply with the same members, in any order.
async fn same_members(sb: &mut SideBySide, key: &str) {
    let (ours, theirs) = sb.both(&["SMEMBERS", key]).await;
    assert_eq!(
        std::mem::discriminant(&ours),
        std::mem::discriminant(&theirs),
        "{ours:?} / {theirs:?}"
    );
    assert_eq!(
        sorted_members(&ours),
        sorted_members(&theirs),
        "SMEMBERS {key}"
    );
}

#[tokio::test]
async fn set_commands_answer_as_redis_does() {
    bounded(both_protocols(async |sb: &mut SideBySide, p: &str| {
        let (k, m, i) = (format!("{p}:s"), format!("{p}:missing"), format!("{p}:i"));
        let (k, m, i) = (k.as_str(), m.as_str(), i.as_str());
        run_script(
            sb,
            &[
                // Integers: an intset, listed in ascending order.
                &[
                    "SADD",
                    i,
                    "5",
                    "-3",
                    "100000",
                    "5",
                    "0",
                    "-9223372036854775808",
                ],
                &["SMEMBERS", i],
                &["SADD", i, "9223372036854775807", "70000", "-40000"],
                &["SMEMBERS", i],
                &["SISMEMBER", i, "5"],
                &["SISMEMBER", i, "05"],
                &["SISMEMBER", i, "+5"],
                &["SISMEMBER", i, "x"],
                &["SMISMEMBER", i, "5", "6", "0", "-0"],
                &["SREM", i, "5", "5", "6", "x"],
                &["SCARD", i],
                &["SMEMBERS", i],
                &["TYPE", i],
                // Strings that look like integers are not integers.
                &["SADD", k, "1", "01"],
                &["SADD", k, "a", "b", "a", ""],
                &["SCARD", k],
                &["SISMEMBER", k, "01"],
                &["SISMEMBER", k, "1"],
                &["SISMEMBER", k, ""],
                &["SISMEMBER", k, "c"],
                &["SMISMEMBER", k, "a", "c", "", "a"],
                &["SREM", k, "c"],
                &["SREM", k, "a", "b", "c", "a"],
                &["SCARD", k],
                // A missing key is an empty set.
                &["SCARD", m],
                &["SISMEMBER", m, "a"],
                &["SMISMEMBER", m, "a", "b"],
                &["SMEMBERS", m],
                &["SREM", m, "a"],
                &["EXISTS", m],
                &["!", "SADD", k],
                &["!", "SREM", k],
                &["!", "SMISMEMBER", k],
                &["!", "SISMEMBER", k],
                &["!", "SISMEMBER", k, "a", "b"],
                &["!", "SCARD", k, "x"],
                &["!", "SMEMBERS", k, "x"],
                // The last member removed deletes the key.
                &["SREM", k, "1", "01", ""],
                &["EXISTS", k],
                &["TYPE", k],
            ],
        )
        .await;
        same_members(sb, i).await;
        let _ = sb.both(&["DEL", i]).await;
    }))
    .await;
}

/// Integers stay an intset, listed in Redis's order, up to 512 members; the 513th makes a
/// hashtable, and a string does at any size. Neither converts back.
#[tokio::test]
async fn the_intset_holds_512_integers_as_redis_does() {
    bounded(both_protocols(async |sb: &mut SideBySide, p: &str| {
        let k = format!("{p}:ints");
        let members: Vec<String> = (0..512)
            .map(|i| ((i * 7919) % 1000 - 500).to_string())
            .collect();
        let mut args = vec!["SADD", k.as_str()];
        args.extend(members.iter().map(String::as_str));
        sb.same(&args).await;
        sb.same(&["SCARD", &k]).await;
        // Still an intset: the same members in the same (ascending) order.
        sb.same(&["SMEMBERS", &k]).await;
        sb.same(&["SADD", &k, "-500"]).await;
        sb.same(&["SMEMBERS", &k]).await;
        // One more distinct integer converts it.
        let next = (0..)
            .map(|i: i64| (i + 1000).to_string())
            .find(|m| !members.contains(m));
        let next = next.unwrap_or_default();
        sb.same(&["SADD", &k, &next]).await;
        sb.same(&["SCARD", &k]).await;
        same_members(sb, &k).await;
        for m in &members[..500] {
            sb.same(&["SREM", &k, m]).await;
        }
        same_members(sb, &k).await;
        // A small set of integers and one string.
        let s = format!("{p}:mixed");
        sb.same(&["SADD", &s, "3", "1", "2"]).await;
        sb.same(&["SMEMBERS", &s]).await;
        sb.same(&["SADD", &s, "x"]).await;
        same_members(sb, &s).await;
        sb.same(&["SREM", &s, "x"]).await;
        same_members(sb, &s).await;
        sb.same(&["DEL", &k, &s]).await;
    }))
    .await;
}

#[tokio::test]
async fn sets_beside_other_kinds_and_expiry_answer_as_redis_does() {
    bounded(both_protocols(async |sb: &mut SideBySide, p: &str| {
        let (set, s, l) = (format!("{p}:set"), format!("{p}:s"), format!("{p}:l"));
        let (set, s, l) = (set.as_str(), s.as_str(), l.as_str());
        run_script(
            sb,
            &[
                &["SET", s, "text"],
                &["RPUSH", l, "a"],
                &["SADD", set, "a", "b"],
                &["TYPE", set],
                &["!", "GET", set],
                &["!", "LPUSH", set, "x"],
                &["!", "LLEN", set],
                &["!", "HGET", set, "f"],
                &["!", "INCR", set],
            ],
        )
        .await;
        for key in [s, l] {
            run_script(
                sb,
                &[
                    &["!", "SADD", key, "x"],
                    &["!", "SREM", key, "x"],
                    &["!", "SISMEMBER", key, "x"],
                    &["!", "SMISMEMBER", key, "x", "y"],
                    &["!", "SCARD", key],
                    &["!", "SMEMBERS", key],
                ],
            )
            .await;
        }
        run_script(
            sb,
            &[
                &["EXPIRE", set, "100"],
                &["TTL", set],
                &["SADD", set, "c"],
                &["SREM", set, "a"],
                &["TTL", set],
                &["PERSIST", set],
                &["TTL", set],
                &["DEL", set],
                &["TYPE", set],
                &["SADD", set, "x"],
                &["PEXPIRE", set, "100000"],
                &["SREM", set, "x"],
                &["SADD", set, "y"],
                &["TTL", set],
                &["DEL", set, s, l],
            ],
        )
        .await;
    }))
    .await;
}

/// Random set commands on a few keys, sent to both; every reply compared, SMEMBERS of a
/// hashtable as a set of members.
#[tokio::test]
async fn random_set_commands_answer_as_redis_does() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        let mut rng = Rng(0x5e75_0001);
        // Whether each key is an intset now (in Redis, so in bucketd too).
        let mut intset = [true; 3];
        for _ in 0..3000 {
            let k = rng.below(3) as usize;
            let key = format!("rs:{k}");
            let mut member = || match rng.below(10) {
                0 => format!("s{}", rng.below(50)),
                1 => format!("0{}", rng.below(9)),
                _ => (rng.below(1400) as i64 - 700).to_string(),
            };
            let (a, b, c) = (member(), member(), member());
            let cmd: Vec<&str> = match rng.below(7) {
                0..=2 => vec!["SADD", &key, &a, &b, &c],
                3 => vec!["SREM", &key, &a, &b],
                4 => vec!["SISMEMBER", &key, &a],
                5 => vec!["SMISMEMBER", &key, &a, &b, &c],
                _ => vec!["SCARD", &key],
            };
            let (ours, theirs) = sb.both(&cmd).await;
            assert_eq!(ours, theirs, "bucketd and Redis differ on {cmd:?}");
            match cmd[0] {
                "SADD" => {
                    let not_int =
                        |m: &&str| (m.len() > 1 && m.starts_with('0')) || m.starts_with('s');
                    if cmd[2..].iter().any(not_int) {
                        intset[k] = false;
                    }
                    if intset[k] && sb.same(&["SCARD", &key]).await.as_int() > 512 {
                        intset[k] = false;
                    }
                }
                // A set emptied is deleted; a new one starts as an intset again.
                "SREM" if sb.same(&["EXISTS", &key]).await == Resp::Int(0) => intset[k] = true,
                _ => {}
            }
            if rng.below(20) == 0 {
                if intset[k] {
                    sb.same(&["SMEMBERS", &key]).await;
                } else {
                    same_members(&mut sb, &key).await;
                }
            }
        }
        node.shutdown().await;
    })
    .await;
}

/// The same commands give the same SMEMBERS order on two nodes: no random seed decides it.
#[tokio::test]
async fn a_hashtable_lists_its_members_in_the_same_order_every_time() {
    bounded(async {
        let mut orders = Vec::new();
        for _ in 0..2 {
            let node = TestNode::start().await;
            let mut c = node.raw().await;
            for i in 0..2_000 {
                c.cmd(&["SADD", "s", &format!("m{}", (i * 31) % 1_500)])
                    .await;
                if i % 3 == 0 {
                    c.cmd(&["SREM", "s", &format!("m{}", (i * 7) % 1_500)])
                        .await;
                }
            }
            orders.push(c.cmd(&["SMEMBERS", "s"]).await);
            node.shutdown().await;
        }
        assert_eq!(orders[0], orders[1]);
    })
    .await;
}

#[tokio::test]
async fn scan_finds_sets_by_type() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        assert_eq!(c.cmd(&["SADD", "set:1", "1"]).await, Resp::Int(1));
        assert_eq!(c.cmd(&["SADD", "set:2", "a"]).await, Resp::Int(1));
        assert_eq!(c.cmd(&["RPUSH", "list:1", "a"]).await, Resp::Int(1));
        assert_eq!(c.cmd(&["HSET", "hash:1", "f", "v"]).await, Resp::Int(1));
        let r = c.cmd(&["SCAN", "0", "TYPE", "set", "COUNT", "1000"]).await;
        let mut found: Vec<String> = r.as_array()[1]
            .as_array()
            .iter()
            .map(Resp::as_text)
            .collect();
        found.sort();
        assert_eq!(found, ["set:1", "set:2"]);
        node.shutdown().await;
    })
    .await;
}

/// SADD grows a set in place and counts against `maxmemory`: once the node is full it is
/// refused with OOM, while reads and removals go on and make room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sets_count_against_maxmemory() {
    bounded(async {
        let node = TestNode::start_with(|s| {
            s.shards = 1;
            s.maxmemory = 256 * 1024;
        })
        .await;
        let mut c = node.raw().await;
        let mut refused = None;
        for i in 0..100_000 {
            let members: Vec<String> = (0..100).map(|j| format!("member-{i:06}-{j:03}")).collect();
            let mut args = vec!["SADD", "big"];
            args.extend(members.iter().map(String::as_str));
            match c.cmd(&args).await {
                Resp::Int(100) => {}
                Resp::Error(e) => {
                    refused = Some((i, e));
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        let (adds, e) = refused.expect("a full node refuses SADD");
        assert!(e.starts_with("OOM "), "{e}");
        assert!(adds >= 20, "refused after {adds} commands");
        assert_eq!(c.cmd(&["SADD", "other", "x"]).await, Resp::Error(e.clone()));
        assert_eq!(c.cmd(&["EXISTS", "other"]).await, Resp::Int(0));
        assert_eq!(
            c.cmd(&["SISMEMBER", "big", "member-000000-000"]).await,
            Resp::Int(1)
        );
        assert_eq!(c.cmd(&["DEL", "big"]).await, Resp::Int(1));
        assert_eq!(c.cmd(&["SADD", "other", "x"]).await, Resp::Int(1));
        node.shutdown().await;
    })
    .await
}
