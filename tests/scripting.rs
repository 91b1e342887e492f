//! Lua scripts, side by side with a real Redis started by the test: the scripts rate limiters
//! run, Redis's conversions and its errors, word for word.

#![cfg(feature = "server")]

mod common;

use common::real_redis::{RealRedis, SideBySide};
use common::{Resp, TestNode, bounded};

/// A fixed-window limiter as gateways write it: INCR, and PEXPIRE on the window's first hit.
const FIXED_WINDOW: &str = "
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if n > tonumber(ARGV[1]) then return {0, n} end
return {1, n}";

#[tokio::test]
async fn scripts_answer_as_redis_does() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;

        // A fixed window of 3 per minute: EVAL caches the script, EVALSHA finds it.
        let sha = sb.same(&["SCRIPT", "LOAD", FIXED_WINDOW]).await;
        let sha = sha.as_text();
        for _ in 0..5 {
            sb.same(&["EVALSHA", &sha, "1", "fw:user", "3", "60000"])
                .await;
        }
        sb.same(&["EVAL", FIXED_WINDOW, "1", "fw:other", "3", "60000"])
            .await;
        sb.same(&[
            "SCRIPT",
            "EXISTS",
            &sha,
            "ffffffffffffffffffffffffffffffffffffffff",
        ])
        .await;
        sb.same(&["SCRIPT", "FLUSH"]).await;
        sb.same_error(&["EVALSHA", &sha, "1", "fw:user", "3", "60000"])
            .await;
        sb.same(&["EVAL", FIXED_WINDOW, "1", "fw:user", "3", "60000"])
            .await;

        // Lua to RESP: integers truncated, false is nil, true is 1, a table stops at its
        // first nil, nested tables, status and error tables.
        for script in [
            "return 3.99",
            "return -3.7",
            "return {1, 2.7, 'a', false, true, {3, {4}}}",
            "return {1, nil, 3}",
            "return false",
            "return true",
            "return nil",
            "return redis.status_reply('FINE')",
            "return {ok = 'DONE'}",
            "return tostring(10/3) .. ' ' .. tostring(1e20)",
            "return redis.sha1hex('')",
        ] {
            sb.same(&["EVAL", script, "0"]).await;
        }
        // RESP to Lua, and numbers from Lua into commands (%.17g).
        sb.same(&[
            "EVAL",
            "redis.call('SET', KEYS[1], 10/3) return redis.call('GET', KEYS[1])",
            "1",
            "num",
        ])
        .await;
        sb.same(&[
            "EVAL",
            "redis.call('SET', KEYS[1], 0.1) return redis.call('GET', KEYS[1])",
            "1",
            "num",
        ])
        .await;
        sb.same(&[
            "EVAL",
            "return redis.call('GET', KEYS[1]) == false",
            "1",
            "missing",
        ])
        .await;
        sb.same(&[
            "EVAL",
            "return type(redis.call('SET', KEYS[1], 'v'))",
            "1",
            "t",
        ])
        .await;
        sb.same(&["EVAL", "return redis.call('SET', KEYS[1], 'v')", "1", "t"])
            .await;
        sb.same(&["EVAL", "return redis.pcall('INCR', KEYS[1])", "1", "t"])
            .await;
        sb.same(&[
            "EVAL",
            "return {KEYS[1], KEYS[2], ARGV[1], ARGV[2], #ARGV}",
            "2",
            "{a}1",
            "{a}2",
            "x",
            "y",
        ])
        .await;

        // Errors, with the script's SHA1 and line.
        for script in [
            "return x",
            "x = 1",
            "error('boom')",
            "return redis.call('INCR', KEYS[1])",
            "return redis.call('nosuch')",
            "return redis.call()",
            "return redis.call('GET', {})",
            "return redis.error_reply('MY bad')",
            "local x =",
            "return +",
        ] {
            sb.same_error(&["EVAL", script, "1", "t"]).await;
        }
        sb.same_error(&["EVAL_RO", "return redis.call('SET', KEYS[1], 1)", "1", "t"])
            .await;
        sb.same(&["EVAL_RO", "return redis.call('GET', KEYS[1])", "1", "t"])
            .await;
        sb.same_error(&["EVAL", "return 1", "-1"]).await;
        sb.same_error(&["EVAL", "return 1", "5", "a"]).await;
        sb.same_error(&["EVAL", "return 1"]).await;
        sb.same_error(&["SCRIPT", "LOAD", "return +"]).await;
        sb.same_error(&["EVALSHA", "nosuchsha", "0"]).await;
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn cjson_and_caught_errors_match_redis() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;

        // Encoding: arrays and objects, holes, number keys, %.14g numbers, escapes, raw
        // bytes, null and empty tables; key order is the order `next` visits them.
        for script in [
            "return cjson.encode({1, 2, {a = 'x/y', b = 1.5, c = cjson.null}, {}})",
            "return cjson.encode({[1] = 1, [2.5] = 2, x = 3})",
            "return cjson.encode({0.1, 1e20, 123456789012345, 3.14159265358979, -0.0, 2^53})",
            "return cjson.encode('\\1\\127/\"\\\\\\n\\t\\r\\8\\12\\200')",
            "local t = {} t[1] = 1 t[5] = 2 return cjson.encode(t)",
            "return cjson.encode({true, false, 'ü', {{{}}}})",
            "return cjson.encode({tokens = 10, ts = 1700000000123})",
            "return cjson.encode(nil)",
            "return cjson.encode(42)",
            "return {cjson._NAME, type(cjson.null), tostring(cjson.null == cjson.null)}",
        ] {
            sb.same(&["EVAL", script, "0"]).await;
        }
        // Decoding, and what a script does with it.
        for (script, json) in [
            (
                "local t = cjson.decode(ARGV[1]) return {t.a, t.b[2], tostring(t.c == cjson.null), type(t.d), t.d}",
                r#"{"a":"s","b":[1,2.5],"c":null,"d":1e3}"#,
            ),
            ("return cjson.encode(cjson.decode(ARGV[1]))", r#"{"a":[],"b":{}}"#),
            ("return cjson.encode(cjson.decode(ARGV[1]))", r#" [1, -2.5e-3, "\u00e9\ud83d\ude00\n\/", true, null] "#),
            ("return cjson.decode(ARGV[1])[1]", "[0x10, 1E2, -0, 1.5e-3]"),
            ("return cjson.decode(ARGV[1])", "\"just a string\""),
            ("return type(cjson.decode(ARGV[1]))", "null"),
            ("local t = cjson.decode(ARGV[1]) return {t.limit, t.window}", r#"{"limit": 100, "window": 60, "limit": 7}"#),
            ("local ok, e = pcall(cjson.decode, ARGV[1]) return {tostring(ok), e}", "{"),
        ] {
            sb.same(&["EVAL", script, "0", json]).await;
        }
        // cjson's errors, with the script's line.
        for (script, arg) in [
            ("return cjson.decode(ARGV[1])", "{"),
            ("return cjson.decode(ARGV[1])", "[1,2"),
            ("return cjson.decode(ARGV[1])", r#"{"a" 1}"#),
            ("return cjson.decode(ARGV[1])", "xyz"),
            ("return cjson.decode(ARGV[1])", r#""a\q""#),
            ("return cjson.decode(ARGV[1])", r#""open"#),
            ("return cjson.decode(ARGV[1])", r#""\u12""#),
            ("return cjson.decode(ARGV[1])", "1 2"),
            ("return cjson.decode(ARGV[1])", "[1,]"),
            ("return cjson.decode(ARGV[1])", "{1:2}"),
            ("return cjson.decode(ARGV[1])", "-"),
            ("return cjson.decode(ARGV[1])", ""),
            ("return cjson.decode(ARGV[1])", &"[".repeat(1001)),
            ("return cjson.encode(function() end)", ""),
            ("return cjson.encode({[true] = 1})", ""),
            ("local t = {} t[1] = 1 t[20] = 2 return cjson.encode(t)", ""),
            ("return cjson.encode({1/0})", ""),
            ("local t = {} t[1] = t return cjson.encode(t)", ""),
            ("\n\nreturn cjson.encode(math.huge)", ""),
            ("cjson.x = 1", ""),
        ] {
            sb.same_error(&["EVAL", script, "0", arg]).await;
        }

        // An error redis.call raises, caught by pcall, is the error's text; redis.pcall hands it
        // back as an error table. Library tables are read-only, as in Redis 7.
        sb.same(&["SET", "s", "x"]).await;
        for script in [
            "local ok, e = pcall(redis.call, 'INCR', KEYS[1]) return {tostring(ok), type(e), tostring(e)}",
            "local ok, e = pcall(redis.call, 'NOSUCH') return {tostring(ok), tostring(e)}",
            "local r = redis.pcall('INCR', KEYS[1]) return {type(r), r.err}",
            "local ok, e = pcall(error, 'boom') return {tostring(ok), tostring(e)}",
            "local ok, e = pcall(error, {code = 7}) return {tostring(ok), e.code}",
            "local ok, e = pcall(function() local y = nil; return y.z end) return {tostring(ok), e}",
        ] {
            sb.same(&["EVAL", script, "1", "s"]).await;
        }
        for script in [
            "redis.call = nil",
            "string.upper = nil",
            "math.x = 1",
            "table.insert = 1",
            "local ok, e = pcall(redis.call, 'INCR', KEYS[1]) error(e)",
            "error({err = 'MINE custom'})",
        ] {
            sb.same_error(&["EVAL", script, "1", "s"]).await;
        }
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn scripts_are_kept_to_their_keys_and_to_deterministic_bounded_work() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        let err = |r: Resp| match r {
            Resp::Error(e) => e,
            other => panic!("expected an error, got {other:?}"),
        };
        // A key the script did not declare: a standalone node, like a standalone Redis,
        // lets it through (a cluster node refuses it, as Redis Cluster does).
        c.cmd(&["SET", "other", "x"]).await;
        let r = c
            .cmd(&["EVAL", "return redis.call('GET', 'other')", "1", "mine"])
            .await;
        assert_eq!(r, Resp::bulk("x"));
        // No random source, clock, file system or process.
        for script in [
            "return math.random()",
            "return os.time()",
            "return io.open('/etc/passwd')",
            "return require('os')",
            "return dofile('/etc/passwd')",
        ] {
            let e = err(c.cmd(&["EVAL", script, "0"]).await);
            assert!(e.starts_with("ERR user_script:1:"), "{script}: {e}");
        }
        // Node commands are not reachable from a script.
        let e = err(c.cmd(&["EVAL", "return redis.call('FLUSHALL')", "0"]).await);
        assert!(e.contains("not allowed from script"), "{e}");
        // TIME inside a script is the node's clock, which the test moves.
        let t = c.cmd(&["EVAL", "return redis.call('TIME')[1]", "0"]).await;
        assert_eq!(
            t,
            Resp::Bulk((common::START_NS / 1_000_000_000).to_string().into_bytes())
        );
        node.advance_ms(5_000);
        let t = c.cmd(&["EVAL", "return redis.call('TIME')[1]", "0"]).await;
        assert_eq!(
            t,
            Resp::Bulk(
                (common::START_NS / 1_000_000_000 + 5)
                    .to_string()
                    .into_bytes()
            )
        );
        // A runaway script is stopped, and the node goes on serving.
        let e = err(c.cmd(&["EVAL", "while true do end", "0"]).await);
        assert!(e.contains("Script stopped"), "{e}");
        // Catching the stop does not keep it going.
        for script in [
            "while true do pcall(function() while true do end end) end",
            "while true do xpcall(function() while true do end end, function(e) return e end) end",
            "while true do pcall(redis.call, 'GET', KEYS[1]) end",
        ] {
            let e = err(c.cmd(&["EVAL", script, "1", "k"]).await);
            assert!(e.contains("Script stopped"), "{script}: {e}");
        }
        // No finalizers: they could run Lua code while a command's reply is handed over.
        let e = err(c.cmd(&["EVAL", "return newproxy(true)", "0"]).await);
        assert!(e.contains("nonexistent global variable 'newproxy'"), "{e}");
        // Neither can a script nest past what its thread can hold.
        let e = err(c
            .cmd(&[
                "EVAL",
                "local function f(n) return f(n + 1) + 1 end return f(1)",
                "0",
            ])
            .await);
        assert!(e.contains("stack overflow"), "{e}");
        let e = err(c
            .cmd(&[
                "EVAL",
                "local t = {} for i = 1, 5000 do t = {t} end return cjson.encode(t)",
                "0",
            ])
            .await);
        assert!(e.contains("excessive nesting"), "{e}");
        // One that takes all the memory it is given, too, and the next one runs.
        let e = err(c
            .cmd(&[
                "EVAL",
                "local t = {} for i = 1, 1e9 do t[i] = 'xxxxxxxxxxxxxxxx' .. i end",
                "0",
            ])
            .await);
        assert!(e.contains("not enough memory"), "{e}");
        assert_eq!(c.cmd(&["EVAL", "return 7", "0"]).await, Resp::Int(7));
        assert_eq!(c.cmd(&["PING"]).await, Resp::Simple("PONG".into()));
        node.shutdown().await;
    })
    .await;
}

/// Limiter scripts through redis-py (`register_script`, and EVALSHA after SCRIPT LOAD), next to
/// a real Redis: tests/py/scripts.py.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limiter_scripts_through_redis_py_match_redis() {
    bounded(async {
        // The script reads the time with TIME; the node's clock runs, as Redis's does.
        let node = bucketd::start(
            common::test_settings(),
            std::sync::Arc::new(bucketd::clock::SystemClock),
        )
        .await
        .expect("node starts");
        let redis = RealRedis::start().await;
        common::run_py_script(
            "scripts.py",
            &[node.addr.port().to_string(), redis.addr.port().to_string()],
            std::time::Duration::from_secs(90),
        )
        .await;
        node.shutdown().await;
    })
    .await;
}
