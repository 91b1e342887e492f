//! Behaviour Redis defines, checked side by side against a real `redis-server` started by the
//! test: the same requests go to both, and the replies must be identical.
//!
//! bucketd's test node runs on a manual clock set to 2023-11-14, Redis on the wall clock, so
//! expiries are compared as relative TTLs rounded to seconds, as absolute times far in the
//! future, or with a tolerance where the wall clock moves between two requests.

#![cfg(feature = "server")]

mod common;

use common::real_redis::{RealRedis, SideBySide, both_protocols, run_script};
use common::{Resp, TestNode, bounded, key_on_shard};

#[tokio::test]
async fn plain_string_commands_answer_as_redis_does() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        sb.same(&["GET", "compat:missing"]).await;
        sb.same(&["SET", "compat:a", "1"]).await;
        sb.same(&["INCRBY", "compat:a", "41"]).await;
        sb.same(&["GET", "compat:a"]).await;
        sb.same_error(&["INCRBY", "compat:a", "x"]).await;
        sb.same_error(&["GET"]).await;
        node.shutdown().await;
    })
    .await;
}

/// Sends the same command to both and asserts both integer replies lie within `tolerance`
/// of each other (a PTTL read while Redis's wall clock moves on).
async fn close(sb: &mut SideBySide, args: &[&str], tolerance: i64) {
    let (ours, theirs) = sb.both(args).await;
    let (a, b) = (ours.as_int(), theirs.as_int());
    assert!(
        (a - b).abs() <= tolerance,
        "{args:?}: bucketd {a}, Redis {b}"
    );
}

#[tokio::test]
async fn set_options_repeat_as_redis_accepts_them() {
    bounded(both_protocols(async |sb: &mut SideBySide, p: &str| {
        let k = format!("{p}:set");
        let k = k.as_str();
        run_script(
            sb,
            &[
                // Repeating an option is accepted; the last time given wins.
                &["SET", k, "1", "EX", "10", "EX", "20"],
                &["TTL", k],
                &["SET", k, "1", "PX", "5000", "PX", "30000"],
                &["TTL", k],
                &["SET", k, "2", "NX", "NX"],
                &["SET", k, "3", "XX", "XX"],
                &["GET", k],
                &["SET", k, "4", "GET", "GET"],
                &["SET", k, "5", "KEEPTTL", "KEEPTTL"],
                &["TTL", k],
                &["SET", k, "6", "EXAT", "4102444800", "EXAT", "4102444801"],
                &["EXPIRETIME", k],
                // The time is read only after every option: an earlier bad one is ignored,
                // and a syntax error wins over a bad number.
                &["SET", k, "7", "EX", "abc", "EX", "100"],
                &["TTL", k],
                &["!", "SET", k, "8", "EX", "abc", "NX", "XX"],
                &["!", "SET", k, "8", "EX", "abc"],
                // Options that contradict each other stay syntax errors.
                &["!", "SET", k, "9", "EX", "10", "PX", "20"],
                &["!", "SET", k, "9", "EX", "10", "EXAT", "20"],
                &["!", "SET", k, "9", "NX", "XX"],
                &["!", "SET", k, "9", "XX", "NX"],
                &["!", "SET", k, "9", "KEEPTTL", "EX", "5"],
                &["!", "SET", k, "9", "EX", "5", "KEEPTTL"],
                &["!", "SET", k, "9", "PERSIST"],
                &["!", "SET", k, "9", "EX"],
                &["!", "SET", k, "9", "EX", "0"],
                &["!", "SET", k, "9", "PX", "-5"],
                &["GET", k],
                &["SET", k, "10", "nx", "GET"],
                &["SET", k, "11", "xx", "get"],
                &["SET", &format!("{k}:new"), "v", "GET", "XX"],
                &["EXISTS", &format!("{k}:new")],
            ],
        )
        .await;
    }))
    .await;
}

#[tokio::test]
async fn expiry_overflow_is_refused_as_redis_refuses_it() {
    bounded(both_protocols(async |sb: &mut SideBySide, p: &str| {
        let k = format!("{p}:exp");
        let k = k.as_str();
        let missing = format!("{p}:missing");
        let m = missing.as_str();
        run_script(
            sb,
            &[
                &["SET", k, "v"],
                // Seconds that overflow as milliseconds, and times from now that overflow once
                // the current time is added, are refused, for missing keys too.
                &["!", "EXPIRE", k, "9223370399119966"],
                &["!", "EXPIRE", m, "9223370399119966"],
                &["!", "EXPIRE", k, "9223372036854776"],
                &["!", "EXPIRE", k, "-9223372036854776"],
                &["!", "PEXPIRE", k, "9223372036854775807"],
                &["!", "EXPIREAT", k, "9223372036854776"],
                &["!", "SET", k, "v", "PX", "9223372036854770000"],
                &["!", "SET", k, "v", "EX", "9223372036854776"],
                &["!", "SET", k, "v", "EX", "9223372036854775"],
                &["!", "SETEX", k, "9223372036854775", "v"],
                &["!", "SETEX", k, "9223372036854776", "v"],
                &["!", "PSETEX", k, "9223372036854770000", "v"],
                &["!", "GETEX", k, "PX", "9223372036854770000"],
                &["!", "GETEX", k, "EX", "9223372036854776"],
                &["EXISTS", k],
                &["TTL", k],
                // Options are read before the number, as Redis does.
                &["!", "EXPIRE", k, "abc", "FOO"],
                &["!", "EXPIRE", k, "abc", "NX", "XX"],
                &["!", "EXPIRE", k, "abc"],
                &["!", "EXPIRE", k, "10", "GT", "LT"],
                &["EXPIRE", m, "10"],
                // Absolute times Redis accepts even when far away.
                &["EXPIREAT", k, "4102444800"],
                &["EXPIRETIME", k],
                &["PEXPIRETIME", k],
                &["PEXPIREAT", k, "4102444800499"],
                &["EXPIRETIME", k],
                &["PEXPIREAT", k, "4102444800500"],
                &["EXPIRETIME", k],
                &["PEXPIRETIME", k],
                &["PEXPIREAT", k, "9223372036854775807"],
                &["EXPIRE", k, "100", "NX"],
                &["EXPIRE", k, "100", "XX"],
                &["TTL", k],
                &["EXPIRE", k, "200", "GT"],
                &["TTL", k],
                &["EXPIRE", k, "50", "LT"],
                &["TTL", k],
                &["EXPIRE", k, "-1"],
                &["EXISTS", k],
                &["EXPIRETIME", m],
                &["PEXPIRETIME", m],
                &["SET", k, "v"],
                &["EXPIRETIME", k],
                &["PEXPIRETIME", k],
                &["!", "EXPIRETIME"],
                &["!", "PEXPIRETIME", k, k],
            ],
        )
        .await;
    }))
    .await;
}

#[tokio::test]
async fn setex_setnx_getset_getdel_answer_as_redis_does() {
    bounded(both_protocols(async |sb: &mut SideBySide, p: &str| {
        let k = format!("{p}:s");
        let k = k.as_str();
        let n = format!("{p}:n");
        let n = n.as_str();
        run_script(
            sb,
            &[
                &["SETEX", k, "10", "v"],
                &["TTL", k],
                &["GET", k],
                &["!", "SETEX", k, "0", "v"],
                &["!", "SETEX", k, "-1", "v"],
                &["!", "SETEX", k, "abc", "v"],
                &["!", "SETEX", k, "10"],
                &["!", "SETEX", k, "10", "v", "extra"],
                &["!", "PSETEX", k, "0", "v"],
                &["!", "PSETEX", k, "1.5", "v"],
                &["PSETEX", k, "30000", "w"],
                &["TTL", k],
                &["GET", k],
                &["SETNX", k, "x"],
                &["GET", k],
                &["TTL", k],
                &["SETNX", n, "1"],
                &["SETNX", n, "2"],
                &["GET", n],
                &["!", "SETNX", n],
                &["GETSET", n, "3"],
                &["GET", n],
                &["GETSET", &format!("{n}:new"), "a"],
                &["GET", &format!("{n}:new")],
                &["SETEX", n, "100", "4"],
                &["GETSET", n, "5"],
                &["TTL", n],
                &["!", "GETSET", n],
                &["GETDEL", n],
                &["GETDEL", n],
                &["EXISTS", n],
                &["!", "GETDEL"],
                &["!", "GETDEL", n, n],
            ],
        )
        .await;
        close(sb, &["PTTL", k], 2_000).await;
    }))
    .await;
}

#[tokio::test]
async fn getex_answers_as_redis_does() {
    bounded(both_protocols(async |sb: &mut SideBySide, p: &str| {
        let k = format!("{p}:g");
        let k = k.as_str();
        let m = format!("{p}:gm");
        let m = m.as_str();
        run_script(
            sb,
            &[
                &["SET", k, "5"],
                &["GETEX", k],
                &["TTL", k],
                &["GETEX", k, "EX", "100"],
                &["TTL", k],
                &["GETEX", k, "PX", "50000"],
                &["TTL", k],
                &["GETEX", k, "PERSIST"],
                &["TTL", k],
                &["GETEX", k, "EX", "10", "EX", "20"],
                &["TTL", k],
                &["GETEX", k, "PERSIST", "PERSIST"],
                &["TTL", k],
                &["GETEX", k, "EXAT", "4102444800"],
                &["EXPIRETIME", k],
                &["GETEX", k, "PXAT", "4102444800123"],
                &["PEXPIRETIME", k],
                &["!", "GETEX", k, "EX", "10", "PX", "20"],
                &["!", "GETEX", k, "PERSIST", "EX", "10"],
                &["!", "GETEX", k, "EX", "10", "PERSIST"],
                &["!", "GETEX", k, "NX"],
                &["!", "GETEX", k, "KEEPTTL"],
                &["!", "GETEX", k, "GET"],
                &["!", "GETEX", k, "EX"],
                &["!", "GETEX", k, "EX", "abc"],
                &["!", "GETEX", k, "EX", "-1"],
                &["!", "GETEX", k, "PX", "0"],
                &["!", "GETEX", k, "EXAT", "0"],
                // A missing key is nil before the time is even read.
                &["GETEX", m, "EX", "abc"],
                &["GETEX", m, "EX", "-1"],
                &["!", "GETEX", m, "EX", "1", "PX", "1"],
                // An absolute time already past deletes the key after answering it.
                &["GETEX", k, "EXAT", "1"],
                &["EXISTS", k],
                &["SET", k, "6"],
                &["GETEX", k, "PXAT", "1700000000000"],
                &["EXISTS", k],
                &["!", "GETEX"],
            ],
        )
        .await;
    }))
    .await;
}

#[tokio::test]
async fn incrbyfloat_answers_with_redis_digits() {
    bounded(both_protocols(async |sb: &mut SideBySide, p: &str| {
        let k = format!("{p}:f");
        let k = k.as_str();
        let n = format!("{p}:fn");
        let n = n.as_str();
        run_script(
            sb,
            &[
                &["SET", k, "10.5"],
                &["INCRBYFLOAT", k, "0.1"],
                &["INCRBYFLOAT", k, "-5"],
                &["GET", k],
                &["SET", k, "5.0e3"],
                &["INCRBYFLOAT", k, "2.0e2"],
                &["INCRBYFLOAT", n, "3.0e3"],
                &["GET", n],
                &["INCRBYFLOAT", n, "-3000"],
                &["SET", k, "0.1"],
                &["INCRBYFLOAT", k, "0.2"],
                // Redis shows its long double's rounding; so does bucketd.
                &["SET", k, "1000"],
                &["INCRBYFLOAT", k, "0.1"],
                &["INCRBYFLOAT", k, "0.1"],
                &["SET", k, "123456.789"],
                &["INCRBYFLOAT", k, "0.001"],
                &["INCRBYFLOAT", k, "1e-20"],
                &["SET", k, "3.14159265358979323846"],
                &["INCRBYFLOAT", k, "0"],
                &["SET", k, "0.000011444091796875"],
                &["INCRBYFLOAT", k, "0"],
                &["SET", k, "99999999999999999"],
                &["INCRBYFLOAT", k, "1"],
                &["SET", k, "1"],
                &["INCRBYFLOAT", k, "0x10"],
                &["INCRBYFLOAT", k, ".5"],
                &["INCRBYFLOAT", k, "+.5e+1"],
                &["INCRBYFLOAT", k, "1.5e-7"],
                &["INCRBYFLOAT", k, "1e300"],
                &["SET", k, "1"],
                &["INCRBYFLOAT", k, "-1"],
                &["INCRBYFLOAT", k, "-0.0"],
                &["!", "INCRBYFLOAT", k, "inf"],
                &["!", "INCRBYFLOAT", k, "-infinity"],
                &["!", "INCRBYFLOAT", k, "nan"],
                &["!", "INCRBYFLOAT", k, "abc"],
                &["!", "INCRBYFLOAT", k, " 1"],
                &["!", "INCRBYFLOAT", k, "1 "],
                &["!", "INCRBYFLOAT", k, "1e"],
                &["!", "INCRBYFLOAT", k, ""],
                &["!", "INCRBYFLOAT", k, "1e5000"],
                &["SET", k, "1e4932"],
                &["!", "INCRBYFLOAT", k, "1e4932"],
                &["SET", k, "abc"],
                &["!", "INCRBYFLOAT", k, "1"],
                &["!", "INCRBYFLOAT", k],
                // The key keeps its TTL.
                &["SETEX", k, "100", "1.5"],
                &["INCRBYFLOAT", k, "1"],
                &["TTL", k],
            ],
        )
        .await;
    }))
    .await;
}

#[tokio::test]
async fn mget_and_mset_across_shards_answer_as_redis_does() {
    bounded(both_protocols(async |sb: &mut SideBySide, p: &str| {
        // The test node has two shards: these keys live on different ones.
        let a = key_on_shard(&format!("{p}:m"), 0, 2);
        let b = key_on_shard(&format!("{p}:m"), 1, 2);
        let c = key_on_shard(&format!("{p}:m:c"), 1, 2);
        let (a, b, c) = (a.as_str(), b.as_str(), c.as_str());
        let missing = format!("{p}:m:missing");
        let m = missing.as_str();
        run_script(
            sb,
            &[
                &["MSET", a, "1", b, "2"],
                &["MGET", a, b, m, a, c],
                &["MSET", a, "x", c, "3", a, "y"],
                &["MGET", c, b, a],
                &["GET", a],
                // MSET clears a TTL, as SET does.
                &["SETEX", b, "100", "t"],
                &["MSET", b, "u", a, "z"],
                &["TTL", b],
                &["MGET", b],
                &["!", "MSET", a, "1", b],
                &["!", "MSET", a],
                &["!", "MSET"],
                &["!", "MGET"],
            ],
        )
        .await;
    }))
    .await;
}

#[tokio::test]
async fn hash_commands_answer_as_redis_does() {
    bounded(both_protocols(async |sb: &mut SideBySide, p: &str| {
        let key = |name: &str| format!("{p}:{name}");
        let (k, m, s, one, nx, gone) = (
            key("h"),
            key("h:missing"),
            key("h:str"),
            key("h:one"),
            key("h:nx"),
            key("h:gone"),
        );
        let (k, m, s, one, nx, gone) = (
            k.as_str(),
            m.as_str(),
            s.as_str(),
            one.as_str(),
            nx.as_str(),
            gone.as_str(),
        );
        run_script(
            sb,
            &[
                // Fields added, updated in place, read back in the order they were added.
                &["HSET", k, "f1", "v1", "f2", "v2"],
                &["HSET", k, "f1", "v3", "f3", "v4", "f3", "v5"],
                &["HGET", k, "f1"],
                &["HGET", k, "nofield"],
                &["HMGET", k, "f1", "nofield", "f3", "f1"],
                &["HGETALL", k],
                &["HKEYS", k],
                &["HVALS", k],
                &["HLEN", k],
                &["HEXISTS", k, "f1"],
                &["HEXISTS", k, "nofield"],
                &["HSTRLEN", k, "f1"],
                &["HSTRLEN", k, "nofield"],
                &["HSETNX", k, "f1", "x"],
                &["HSETNX", k, "f4", "x"],
                &["HSETNX", nx, "a", "b"],
                &["HGETALL", nx],
                &["HMSET", k, "f5", "v5", "f1", "again"],
                &["HSET", k, "", ""],
                &["HGET", k, ""],
                &["HSTRLEN", k, ""],
                &["HDEL", k, "f2", "f2", "nofield"],
                &["HGETALL", k],
                &["TYPE", k],
                // A missing key reads as an empty hash.
                &["HGET", m, "f"],
                &["HMGET", m, "a", "b"],
                &["HGETALL", m],
                &["HKEYS", m],
                &["HVALS", m],
                &["HLEN", m],
                &["HEXISTS", m, "f"],
                &["HSTRLEN", m, "f"],
                &["HDEL", m, "f"],
                &["EXISTS", m],
                // Integer increments.
                &["HINCRBY", k, "n", "5"],
                &["HINCRBY", k, "n", "-10"],
                &["HINCRBY", k, "n", "0"],
                &["HINCRBY", m, "n", "7"],
                &["HGETALL", m],
                &["DEL", m],
                &["HSET", k, "big", "9223372036854775807"],
                &["!", "HINCRBY", k, "big", "1"],
                &["HINCRBY", k, "big", "-1"],
                &["HSET", k, "small", "-9223372036854775808"],
                &["!", "HINCRBY", k, "small", "-1"],
                &["HINCRBY", k, "small", "0"],
                &["!", "HINCRBY", k, "f1", "1"],
                &[
                    "HSET", k, "spaced", " 5", "lead", "05", "plus", "+5", "dot", "5.0",
                ],
                &["!", "HINCRBY", k, "spaced", "1"],
                &["!", "HINCRBY", k, "lead", "1"],
                &["!", "HINCRBY", k, "plus", "1"],
                &["!", "HINCRBY", k, "dot", "1"],
                &["!", "HINCRBY", k, "", "1"],
                &["!", "HINCRBY", k, "n", "x"],
                &["!", "HINCRBY", k, "n", "1.5"],
                &["!", "HINCRBY", k, "n", ""],
                &["!", "HINCRBY", k, "n", "99999999999999999999"],
                &["HGET", k, "n"],
                // Float increments, with INCRBYFLOAT's digits.
                &["HINCRBYFLOAT", k, "fl", "10.5"],
                &["HINCRBYFLOAT", k, "fl", "0.1"],
                &["HINCRBYFLOAT", k, "fl", "-10.6"],
                &["HINCRBYFLOAT", k, "fl", "1e3"],
                &["HINCRBYFLOAT", k, "n", "1.5"],
                &["HINCRBYFLOAT", k, "dot", "1"],
                &["HINCRBYFLOAT", k, "fresh", "5.0e3"],
                &["HSET", k, "thousand", "1000"],
                &["HINCRBYFLOAT", k, "thousand", "0.1"],
                &["HINCRBYFLOAT", k, "thousand", "0.1"],
                &["HINCRBYFLOAT", k, "hex", "0x10"],
                &["HINCRBYFLOAT", k, "neg", "-0.0"],
                &["!", "HINCRBYFLOAT", k, "f1", "1"],
                &["!", "HINCRBYFLOAT", k, "spaced", "1"],
                &["!", "HINCRBYFLOAT", k, "fl", "abc"],
                &["!", "HINCRBYFLOAT", k, "fl", "inf"],
                &["!", "HINCRBYFLOAT", k, "fl", "-infinity"],
                &["!", "HINCRBYFLOAT", k, "fl", "nan"],
                &["!", "HINCRBYFLOAT", k, "fl", ""],
                &["!", "HINCRBYFLOAT", k, "fl", "1e5000"],
                &["HSET", k, "nul", "1\u{0}2", "right", "5 "],
                &["!", "HINCRBYFLOAT", k, "nul", "1"],
                &["!", "HINCRBY", k, "nul", "1"],
                &["!", "HINCRBYFLOAT", k, "right", "1"],
                &["!", "HINCRBY", k, "right", "1"],
                &["HINCRBYFLOAT", k, "pretty", "1.23"],
                &["HINCRBYFLOAT", k, "pretty", "0.77"],
                &["HINCRBYFLOAT", k, "pretty", "-0.1"],
                &["HSET", k, "wide", "17179869184"],
                &["HINCRBYFLOAT", k, "wide", "17179869184"],
                &["HINCRBY", k, "wide2", "17179869184"],
                &["HINCRBY", k, "wide2", "17179869184"],
                &["!", "HINCRBYFLOAT", nx, "f", "+inf"],
                &["HSET", k, "huge", "1e4932", "infv", "inf"],
                &["!", "HINCRBYFLOAT", k, "huge", "1e4932"],
                &["!", "HINCRBYFLOAT", k, "infv", "1"],
                &["HGET", k, "huge"],
                &["HSTRLEN", k, "big"],
                &["HSTRLEN", k, "small"],
                &["HSTRLEN", k, "nul"],
                &["HGETALL", k],
                // Wrong arity, HSET's and HMSET's odd pairs included.
                &["!", "HSET", k],
                &["!", "HSET", k, "f"],
                &["!", "HSET", k, "f", "v", "x"],
                &["!", "HMSET", k, "f"],
                &["!", "HMSET", k, "f", "v", "x"],
                &["!", "HSETNX", k, "f"],
                &["!", "HSETNX", k, "f", "v", "x"],
                &["!", "HGET", k],
                &["!", "HGET", k, "f", "x"],
                &["!", "HMGET", k],
                &["!", "HINCRBY", k, "f"],
                &["!", "HINCRBYFLOAT", k, "f", "1", "2"],
                &["!", "HDEL", k],
                &["!", "HGETALL"],
                &["!", "HGETALL", k, "x"],
                &["!", "HKEYS"],
                &["!", "HVALS", k, "x"],
                &["!", "HLEN"],
                &["!", "HEXISTS", k],
                &["!", "HSTRLEN", k, "f", "x"],
                // Hash commands refuse a string, and string commands a hash; an argument
                // error still comes first.
                &["SET", s, "v"],
                &["!", "HSET", s, "f", "v"],
                &["!", "HMSET", s, "f", "v"],
                &["!", "HSETNX", s, "f", "v"],
                &["!", "HGET", s, "f"],
                &["!", "HMGET", s, "f"],
                &["!", "HINCRBY", s, "f", "1"],
                &["!", "HINCRBYFLOAT", s, "f", "1"],
                &["!", "HDEL", s, "f"],
                &["!", "HGETALL", s],
                &["!", "HKEYS", s],
                &["!", "HVALS", s],
                &["!", "HLEN", s],
                &["!", "HEXISTS", s, "f"],
                &["!", "HSTRLEN", s, "f"],
                &["!", "HSET", s, "f"],
                &["!", "HINCRBY", s, "f", "x"],
                &["!", "HINCRBYFLOAT", s, "f", "x"],
                &["!", "HINCRBYFLOAT", s, "f", "inf"],
                &["GET", s],
                &["!", "GET", k],
                &["!", "INCR", k],
                &["!", "DECRBY", k, "2"],
                &["!", "INCRBYFLOAT", k, "1"],
                &["!", "GETSET", k, "v"],
                &["!", "GETDEL", k],
                &["!", "GETEX", k, "PERSIST"],
                &["!", "SET", k, "v", "GET"],
                &["MGET", k, s],
                &["SETNX", k, "v"],
                &["HLEN", k],
                // Expiry works on a hash as on a string, and writes keep it.
                &["TTL", k],
                &["EXPIRE", k, "100"],
                &["TTL", k],
                &["HSET", k, "another", "v"],
                &["HINCRBY", k, "cnt", "1"],
                &["HDEL", k, "f1"],
                &["TTL", k],
                &["PERSIST", k],
                &["TTL", k],
                &["PEXPIRE", k, "50000"],
                &["TTL", k],
                &["EXPIRE", k, "10", "GT"],
                &["TTL", k],
                &["EXISTS", k, s, m],
                &["DEL", k, s],
                &["EXISTS", k],
                // Deleting the last field deletes the key.
                &["HSET", one, "only", "v"],
                &["HDEL", one, "only"],
                &["EXISTS", one],
                &["TYPE", one],
                &["HSET", one, "a", "1", "b", "2"],
                &["HDEL", one, "a", "b", "c"],
                &["EXISTS", one],
                // SET replaces a hash.
                &["HSET", gone, "a", "b"],
                &["SET", gone, "str"],
                &["TYPE", gone],
                &["GET", gone],
                &["DEL", gone],
            ],
        )
        .await;
    }))
    .await;
}

#[tokio::test]
async fn new_commands_report_redis_command_entries() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        for name in [
            "setex",
            "psetex",
            "setnx",
            "getset",
            "getex",
            "getdel",
            "incrbyfloat",
            "mget",
            "mset",
            "expiretime",
            "pexpiretime",
            "hset",
            "hmset",
            "hsetnx",
            "hget",
            "hmget",
            "hincrby",
            "hincrbyfloat",
            "hdel",
            "hgetall",
            "hkeys",
            "hvals",
            "hexists",
            "hlen",
            "hstrlen",
        ] {
            let (ours, theirs) = sb.both(&["COMMAND", "INFO", name]).await;
            let (ours, theirs) = (&ours.as_array()[0], &theirs.as_array()[0]);
            // Name, arity, flags, first key, last key, step and ACL categories are Redis's.
            assert_eq!(ours.as_array()[..7], theirs.as_array()[..7], "{name}");
            let (ours, theirs) = sb
                .both(&["COMMAND", "GETKEYS", name, "k1", "10", "k2", "v"])
                .await;
            if !matches!(theirs, Resp::Error(_)) {
                assert_eq!(ours, theirs, "{name}");
            }
        }
        node.shutdown().await;
    })
    .await;
}

/// Buckets stay protected: string commands on a limiter key refuse it, and no expiry command
/// can shorten it.
#[tokio::test]
async fn buckets_refuse_string_commands() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        assert_eq!(
            c.cmd(&["CL.THROTTLE", "bk", "4", "1", "10"]).await.ints(),
            [0, 5, 4, -1, 10]
        );
        let wrongtype =
            Resp::Error("WRONGTYPE Operation against a key holding the wrong kind of value".into());
        for cmd in [
            &["GETEX", "bk"][..],
            &["GETEX", "bk", "PERSIST"],
            &["GETEX", "bk", "EX", "1"],
            &["GETDEL", "bk"],
            &["GETSET", "bk", "v"],
            &["INCRBYFLOAT", "bk", "1.5"],
        ] {
            assert_eq!(c.cmd(cmd).await, wrongtype, "{cmd:?}");
        }
        assert_eq!(c.cmd(&["SETNX", "bk", "v"]).await, Resp::Int(0));
        assert_eq!(
            c.cmd(&["MGET", "bk"]).await,
            Resp::Array(vec![Resp::NilBulk])
        );
        for cmd in [
            &["EXPIRE", "bk", "1"][..],
            &["PEXPIRE", "bk", "1"],
            &["EXPIREAT", "bk", "1"],
            &["PEXPIREAT", "bk", "1"],
        ] {
            assert_eq!(c.cmd(cmd).await, Resp::Int(0), "{cmd:?}");
        }
        assert_eq!(c.cmd(&["PTTL", "bk"]).await, Resp::Int(10_000));
        assert_eq!(
            c.cmd(&["PEXPIRETIME", "bk"]).await,
            Resp::Int(1_700_000_010_000)
        );
        assert_eq!(c.cmd(&["EXPIRETIME", "bk"]).await, Resp::Int(1_700_000_010));
        node.shutdown().await;
    })
    .await;
}

/// MSET on one shard is all or nothing: a key the store has no room for undoes the others.
#[tokio::test]
async fn mset_on_one_shard_is_all_or_nothing() {
    bounded(async {
        let node = TestNode::start_with(|s| {
            s.shards = 1;
            s.max_keys = 3;
        })
        .await;
        let mut c = node.raw().await;
        assert_eq!(
            c.cmd(&["SETEX", "old", "100", "1"]).await,
            Resp::Simple("OK".into())
        );
        assert_eq!(c.cmd(&["SET", "n1", "x"]).await, Resp::Simple("OK".into()));
        let reply = c
            .cmd(&["MSET", "old", "2", "new1", "a", "n1", "y", "new2", "b"])
            .await;
        assert!(
            matches!(&reply, Resp::Error(e) if e.starts_with("OOM ")),
            "{reply:?}"
        );
        assert_eq!(
            c.cmd(&["MGET", "old", "new1", "n1", "new2"]).await,
            Resp::Array(vec![
                Resp::bulk("1"),
                Resp::NilBulk,
                Resp::bulk("x"),
                Resp::NilBulk
            ])
        );
        assert_eq!(
            c.cmd(&["TTL", "old"]).await,
            Resp::Int(100),
            "the TTL is restored"
        );
        assert_eq!(c.cmd(&["DBSIZE"]).await, Resp::Int(2));
        assert_eq!(
            c.cmd(&["MSET", "old", "3", "new1", "a"]).await,
            Resp::Simple("OK".into())
        );
        assert_eq!(c.cmd(&["TTL", "old"]).await, Resp::Int(-1));
        node.shutdown().await;
    })
    .await;
}

/// MGET never builds a reply of more than 64 MiB, on one shard or gathered from several.
#[tokio::test]
async fn mget_refuses_replies_over_64_mib() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        let big = "x".repeat(8 << 20);
        let a = key_on_shard("big", 0, 2);
        let b = key_on_shard("big", 1, 2);
        for k in [&a, &b] {
            assert_eq!(c.cmd(&["SET", k, &big]).await, Resp::Simple("OK".into()));
        }
        let too_large = Resp::Error("ERR reply would exceed 64 MiB".into());
        let mut same = vec!["MGET"];
        same.extend(std::iter::repeat_n(a.as_str(), 9));
        assert_eq!(c.cmd(&same).await, too_large, "nine copies on one shard");
        let mut spread = vec!["MGET"];
        for _ in 0..5 {
            spread.extend([a.as_str(), b.as_str()]);
        }
        assert_eq!(
            c.cmd(&spread).await,
            too_large,
            "ten copies over two shards"
        );
        // Exactly 64 MiB of values is still answered.
        let mut fits = vec!["MGET"];
        for _ in 0..4 {
            fits.extend([a.as_str(), b.as_str()]);
        }
        let reply = c.cmd(&fits).await;
        assert_eq!(reply.as_array().len(), 8);
        assert!(reply.as_array().iter().all(|r| *r == Resp::bulk(&big)));
        node.shutdown().await;
    })
    .await;
}
