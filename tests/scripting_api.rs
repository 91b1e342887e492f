//! The Lua API of Redis 7 that rate-limit scripts use, side by side with a real Redis started
//! by the test: `redis.*` helpers and constants, RESP3 conversions both ways, the `bit`,
//! `struct` and `cmsgpack` libraries, shebang flags, and limiter scripts in the shapes gateways
//! send. Every reply must be the same bytes as Redis's, error text included.

#![cfg(feature = "server")]

mod common;

use common::real_redis::{RealRedis, SideBySide, on_both_protocols};
use common::{Resp, TestNode, bounded};

/// EVAL `script` with `keys` and `args` on both; the replies must be identical.
async fn eval(sb: &mut SideBySide, script: &str, keys: &[&str], args: &[&str]) -> Resp {
    sb.same(&eval_args("EVAL", script, keys, args)).await
}

/// EVAL `script` on both; both must refuse it with the same error.
async fn eval_err(sb: &mut SideBySide, script: &str, keys: &[&str], args: &[&str]) -> String {
    sb.same_error(&eval_args("EVAL", script, keys, args)).await
}

fn eval_args<'a>(
    cmd: &'a str,
    script: &'a str,
    keys: &[&'a str],
    args: &[&'a str],
) -> Vec<&'a str> {
    let n: &'static str = ["0", "1", "2", "3"][keys.len().min(3)];
    let mut v = vec![cmd, script, n];
    v.extend_from_slice(keys);
    v.extend_from_slice(args);
    v
}

#[tokio::test]
async fn redis_helpers_answer_as_redis_does() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        on_both_protocols(&node, &redis, async |sb: &mut SideBySide, _p: &str| {
            eval(sb, "return redis.replicate_commands()", &[], &[]).await;
            eval(
                sb,
                "redis.replicate_commands()
                 return {redis.REPL_NONE, redis.REPL_AOF, redis.REPL_SLAVE, redis.REPL_REPLICA,
                         redis.REPL_ALL}",
                &[],
                &[],
            )
            .await;
            eval(
                sb,
                "redis.set_repl(redis.REPL_ALL) redis.set_repl(redis.REPL_NONE)
                 redis.set_repl(redis.REPL_AOF) redis.set_repl(redis.REPL_REPLICA)
                 redis.set_repl('2') redis.set_repl(2.9) return 1",
                &[],
                &[],
            )
            .await;
            for bad in [
                "redis.set_repl(4)",
                "redis.set_repl(-1)",
                "redis.set_repl()",
            ] {
                eval_err(sb, bad, &[], &[]).await;
            }
            eval(
                sb,
                "local ok, e = pcall(redis.set_repl, 8) return {tostring(ok), e}",
                &[],
                &[],
            )
            .await;
            eval(
                sb,
                "return {type(redis.REDIS_VERSION), type(redis.REDIS_VERSION_NUM)}",
                &[],
                &[],
            )
            .await;
            eval_err(sb, "return REDIS_VERSION", &[], &[]).await;
            for level in ["redis.LOG_DEBUG", "redis.LOG_VERBOSE", "redis.LOG_NOTICE"] {
                let script = format!("redis.log({level}, 'limiter', 1.5, {{}}, 7) return 1");
                eval(sb, &script, &[], &[]).await;
            }
            eval(
                sb,
                "redis.log(redis.LOG_WARNING, 'w') return redis.LOG_WARNING",
                &[],
                &[],
            )
            .await;
            for bad in [
                "redis.log(4, 'x')",
                "redis.log(-1, 'x')",
                "redis.log(1)",
                "redis.log('a', 'b')",
            ] {
                eval_err(sb, bad, &[], &[]).await;
            }
            for s in ["", "abc", "a longer string with spaces"] {
                eval(sb, "return redis.sha1hex(ARGV[1])", &[], &[s]).await;
            }
            eval(sb, "return redis.breakpoint()", &[], &[]).await;
            eval(sb, "redis.debug('x', 1, {}) return 1", &[], &[]).await;
        })
        .await;
        // The version is the one INFO reports, and its number is made from it.
        let mut raw = node.raw().await;
        let info = raw.cmd(&["INFO", "server"]).await.as_text();
        let version = info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .expect("INFO has redis_version")
            .to_string();
        let script = "return {redis.REDIS_VERSION, redis.REDIS_VERSION_NUM}";
        let got = raw.cmd(&["EVAL", script, "0"]).await;
        let parts: Vec<u32> = version.split('.').map(|p| p.parse().unwrap()).collect();
        let num = (parts[0] << 16) | (parts[1] << 8) | parts[2];
        assert_eq!(
            got,
            Resp::Array(vec![Resp::bulk(&version), Resp::Int(i64::from(num))])
        );
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn resp3_conversions_answer_as_redis_does() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        on_both_protocols(&node, &redis, async |sb: &mut SideBySide, p: &str| {
            let h = format!("{{{p}}}:hash");
            let missing = format!("{{{p}}}:missing");
            sb.same(&["HSET", &h, "f", "v"]).await;
            for bad in ["redis.setresp(4)", "redis.setresp()", "redis.setresp(1)"] {
                eval_err(sb, bad, &[], &[]).await;
            }
            // Replies of redis.call, as a script sees them in each protocol.
            for resp in ["2", "3"] {
                let script = format!(
                    "redis.setresp({resp})
                     local r = redis.call('HGETALL', KEYS[1])
                     local m = redis.call('GET', KEYS[2])
                     return {{type(r), type(r.map), r.map and r.map.f or r[2], type(m),
                              tostring(m)}}"
                );
                eval(sb, &script, &[&h, &missing], &[]).await;
                let script = format!("redis.setresp({resp}) return redis.call('GET', KEYS[1])");
                eval(sb, &script, &[&missing], &[]).await;
                let script = format!("redis.setresp({resp}) return {{true, false, 1}}");
                eval(sb, &script, &[], &[]).await;
                let script = format!("redis.setresp({resp}) return redis.call('HGETALL', KEYS[1])");
                eval(sb, &script, &[&h], &[]).await;
            }
            // Tables that stand for RESP3 replies, downgraded for RESP2 clients.
            for script in [
                "return {map={a=1}}",
                "return {map={}}",
                "return {set={x=true}}",
                "return {double=3.5}",
                "return {double=0.1}",
                "return {double=-2}",
                "return {double=1/0}",
                "return {double=-1/0}",
                "return {big_number='123456789012345678901234567890'}",
                "return {verbatim_string={format='txt', string='hello'}}",
                "return {1, {double=1.5}, {map={k={set={s=true}}}}}",
                "return {err='MYERR custom'}",
                "return {ok='FINE'}",
                "return true",
                "return false",
            ] {
                eval(sb, script, &[], &[]).await;
            }
        })
        .await;
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn bit_answers_as_luabitop_in_redis_does() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        eval(
            &mut sb,
            "return {bit.tobit(2^32 + 5), bit.tobit(-1), bit.tobit(2^31), bit.tobit(1.5),
                     bit.tobit(2.5), bit.tobit(-2.5), bit.tobit(2^53 + 2), bit.tobit('12'),
                     bit.bnot(0), bit.bnot(-1), bit.band(0xff, 0x0f, 7), bit.bor(1, 2, 4, 8),
                     bit.bxor(0xff, 0x0f), bit.band(-1), bit.lshift(1, 31), bit.lshift(1, 32),
                     bit.lshift(1, 33), bit.rshift(-1, 28), bit.rshift(-1, 0),
                     bit.arshift(-256, 4), bit.arshift(256, 36), bit.rol(0x12345678, 8),
                     bit.ror(0x12345678, 8), bit.rol(1, -1), bit.bswap(0x12345678),
                     bit.bswap(-1)}",
            &[],
            &[],
        )
        .await;
        eval(
            &mut sb,
            "return {bit.tohex(-1), bit.tohex(255, 4), bit.tohex(255, -4), bit.tohex(0x12345678, 2),
                     bit.tohex(1, 0), bit.tohex(-1, 20), bit.tohex(-1, -20), bit.tohex(2^40 + 10),
                     bit.tohex(0xabcdef, -2147483648)}",
            &[],
            &[],
        )
        .await;
        for bad in [
            "return bit.band('x')",
            "return bit.tobit()",
            "return bit.bor(1, {})",
            "return bit.tohex(1, nil)",
            "return bit.lshift(1)",
        ] {
            eval_err(&mut sb, bad, &[], &[]).await;
        }
        eval_err(&mut sb, "bit.band = nil", &[], &[]).await;
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn struct_answers_as_redis_does() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        // Exact bytes.
        for script in [
            "return struct.pack('>iHb', 1, 2, 3)",
            "return struct.pack('<iHb', -1, 65535, -128)",
            "return struct.pack('>d', 1.5)",
            "return struct.pack('<f', -0.25)",
            "return struct.pack('!4 b i', 1, 2)",
            "return struct.pack('! b d', 1, 2)",
            "return struct.pack('>i3 I5', -2, 2^33)",
            "return struct.pack('x s c3 c0', 'ab', 'xyz', 'tail')",
            "return struct.pack('>lLT', -5, 2^40, 7)",
            "return struct.pack('>h', 40000)",
            "return struct.pack('B', 300)",
            "return struct.pack('i12', -1)",
        ] {
            eval(&mut sb, script, &[], &[]).await;
        }
        // Round trips, and where unpack ends.
        for script in [
            "return {struct.unpack('>iHb', struct.pack('>iHb', -5, 65535, -1))}",
            "return {struct.unpack('<lL', struct.pack('<lL', -123456789, 987654321))}",
            "local a, b, n = struct.unpack('>dd', struct.pack('>dd', 1.25, -3.5))
             return {tostring(a), tostring(b), n}",
            "local a, n = struct.unpack('f', struct.pack('f', 0.1)) return {tostring(a), n}",
            "return {struct.unpack('s c2', struct.pack('s c2', 'hello', 'zz'))}",
            "return {struct.unpack('b c0', struct.pack('b', 3) .. 'abcdef')}",
            "return {struct.unpack('!4 b i', struct.pack('!4 b i', 7, 9))}",
            "return {struct.unpack('b', 'abc', 2)}",
            "return {struct.unpack('>I2', '\\255\\255\\1', 2)}",
            "return {struct.size('>iHb'), struct.size('!8 b d'), struct.size('c10 x'),
                     struct.size('!4 h i'), struct.size('q'), struct.size('!'),
                     struct.size('! b d i2')}",
        ] {
            eval(&mut sb, script, &[], &[]).await;
        }
        for bad in [
            "return struct.pack('z', 1)",
            "return struct.pack('i40', 1)",
            "return struct.pack('i', 'x')",
            "return struct.pack('i')",
            "return struct.pack('c3', 'ab')",
            "return struct.pack('!3 i', 1)",
            "return struct.pack('i99999999999', 1)",
            "return struct.unpack('i', 'ab')",
            "return struct.unpack('s', 'abc')",
            "return struct.unpack('c0', 'abc')",
            "return struct.unpack('b', 'abc', 0)",
            "return struct.size('s')",
            "return struct.size('c0')",
            "return struct.size('!6')",
        ] {
            eval_err(&mut sb, bad, &[], &[]).await;
        }
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn cmsgpack_answers_as_redis_does() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        for script in [
            "return cmsgpack.pack({1, 2, 3})",
            "return cmsgpack.pack({a = 1})",
            "return cmsgpack.pack({})",
            "return cmsgpack.pack({1, {2, {x = 'y'}}, 's', 1.5, 0.1, -1, 300, -300, 70000,
                                   -70000, 2^40, -2^40, 2^63, true, false, 1/0})",
            "return cmsgpack.pack(1, 'two', {3})",
            "return cmsgpack.pack(string.rep('x', 40), string.rep('y', 300))",
            "return cmsgpack.pack({[1] = 'a', [3] = 'c'})",
            "return cmsgpack.pack({[1.5] = 'a'})",
            "return cmsgpack.pack(nil)",
            "local t = {} t[1] = t return cmsgpack.pack(t)",
            "local t = {} for i = 1, 20 do t[i] = i end return cmsgpack.pack(t)",
        ] {
            eval(&mut sb, script, &[], &[]).await;
        }
        for script in [
            "local t = cmsgpack.unpack(cmsgpack.pack({1, {2, 3}, 'x', {k = 'v'}}))
             return {t[1], t[2][2], t[3], t[4].k}",
            "return {cmsgpack.unpack(cmsgpack.pack(1, 'two', -3, true))}",
            "return {cmsgpack.unpack_one(cmsgpack.pack(1, 2, 3))}",
            "return {cmsgpack.unpack_one(cmsgpack.pack(1, 2, 3), 2)}",
            "return {cmsgpack.unpack_limit(cmsgpack.pack(1, 2, 3), 2)}",
            "return {cmsgpack.unpack_limit(cmsgpack.pack(1, 2, 3), 5, 1)}",
            "return {cmsgpack.unpack_limit(cmsgpack.pack(1, 2, 3), 0, 0)}",
            "return {cmsgpack.unpack_one('')}",
            "local x = cmsgpack.unpack(cmsgpack.pack(0.1)) return tostring(x)",
            "local x = cmsgpack.unpack(cmsgpack.pack(-2^40)) return tostring(x)",
            "return cmsgpack.unpack('\\205\\1\\0')",
            "return cmsgpack.unpack('\\209\\255\\0')",
        ] {
            eval(&mut sb, script, &[], &[]).await;
        }
        for bad in [
            "return cmsgpack.pack()",
            "return cmsgpack.unpack('\\193')",
            "return cmsgpack.unpack('\\146\\1')",
            "return cmsgpack.unpack()",
            "return cmsgpack.unpack_one('\\1', 5)",
            "return cmsgpack.unpack_one('\\1', -1)",
            "return cmsgpack.unpack_limit('\\1')",
        ] {
            eval_err(&mut sb, bad, &[], &[]).await;
        }
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn shebang_flags_answer_as_redis_does() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        let k = "sb:key";
        let read = "#!lua flags=no-writes\nreturn redis.call('GET', KEYS[1])";
        let write = "#!lua\nreturn redis.call('SET', KEYS[1], 'v')";
        eval(&mut sb, write, &[k], &[]).await;
        eval(&mut sb, read, &[k], &[]).await;
        sb.same(&eval_args("EVAL_RO", read, &[k], &[])).await;
        // A script that declares flags without no-writes is refused by EVAL_RO.
        sb.same_error(&eval_args("EVAL_RO", write, &[k], &[])).await;
        // A no-writes script cannot write, from EVAL either.
        eval_err(
            &mut sb,
            "#!lua flags=no-writes\nreturn redis.call('SET', KEYS[1], 'w')",
            &[k],
            &[],
        )
        .await;
        // Without a shebang, EVAL_RO still makes a script read-only when it writes.
        sb.same_error(&eval_args(
            "EVAL_RO",
            "return redis.call('SET', KEYS[1], 'x')",
            &[k],
            &[],
        ))
        .await;
        sb.same(&eval_args(
            "EVAL_RO",
            "return redis.call('GET', KEYS[1])",
            &[k],
            &[],
        ))
        .await;
        // The shebang line is dropped but counted: errors name the script's own lines.
        eval_err(&mut sb, "#!lua\n\nerror('boom')", &[], &[]).await;
        eval(
            &mut sb,
            "#!lua flags=no-cluster,allow-oom,allow-stale,allow-cross-slot-keys\nreturn 1",
            &[],
            &[],
        )
        .await;
        eval(&mut sb, "#!lua flags=\nreturn 2", &[], &[]).await;
        for bad in [
            "#!lua flags=bogus\nreturn 1",
            "#!lua flags=no-writes,,allow-oom\nreturn 1",
            "#!python\nreturn 1",
            "#!lua",
            "#!lua name=x\nreturn 1",
        ] {
            eval_err(&mut sb, bad, &[], &[]).await;
            sb.same_error(&["SCRIPT", "LOAD", bad]).await;
        }
        // EVALSHA of a loaded no-writes script runs read-only too.
        let sha = sb.same(&["SCRIPT", "LOAD", read]).await.as_text();
        sb.same(&eval_args("EVALSHA_RO", &sha, &[k], &[])).await;
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn scripts_that_may_write_need_allow_oom_on_a_full_node() {
    bounded(async {
        // bucketd at its key cap, Redis over a maxmemory it can never meet.
        let node = TestNode::start_with(|s| s.max_keys = 1).await;
        let redis = RealRedis::start_with(&["--maxmemory", "1"]).await;
        let mut ours = node.raw().await;
        ours.cmd(&["SET", "oom:fill", "1"]).await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        eval_err(&mut sb, "#!lua\nreturn 1", &[], &[]).await;
        eval_err(&mut sb, "#!lua flags=allow-stale\nreturn 1", &[], &[]).await;
        eval(&mut sb, "#!lua flags=allow-oom\nreturn 1", &[], &[]).await;
        eval(&mut sb, "#!lua flags=no-writes\nreturn 1", &[], &[]).await;
        // A script without a shebang keeps the legacy rule: it runs, and only a write in it
        // would be refused.
        eval(&mut sb, "return 1", &[], &[]).await;
        node.shutdown().await;
    })
    .await;
}

/// A token bucket in the shape Spring Cloud Gateway's limiter sends: replicate_commands, then
/// GET and SETEX of a tokens key and a timestamp key that share a hash tag.
const TOKEN_BUCKET: &str = "
redis.replicate_commands()
local tokens_key, stamp_key = KEYS[1], KEYS[2]
local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local requested = tonumber(ARGV[4])
local ttl = math.floor(capacity / rate * 2)
local last = tonumber(redis.call('get', tokens_key))
if last == nil then last = capacity end
local stamp = tonumber(redis.call('get', stamp_key))
if stamp == nil then stamp = 0 end
local filled = math.min(capacity, last + math.max(0, now - stamp) * rate)
local allowed = filled >= requested
local left = filled
local granted = 0
if allowed then
  left = filled - requested
  granted = 1
end
if ttl > 0 then
  redis.call('setex', tokens_key, ttl, left)
  redis.call('setex', stamp_key, ttl, now)
end
return { granted, left }";

/// GCRA in the shape go-redis/redis_rate sends: replicate_commands, tonumber, and SET with EX
/// of the theoretical arrival time (here the time is an argument, so both servers agree).
const GCRA: &str = "
redis.replicate_commands()
local key = KEYS[1]
local burst = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local now = tonumber(ARGV[5])
local interval = period / rate
local increment = interval * cost
local offset = interval * burst
local tat = redis.call('GET', key)
if not tat then tat = now else tat = tonumber(tat) end
tat = math.max(tat, now)
local new_tat = tat + increment
local diff = now - (new_tat - offset)
local remaining = diff / interval
if remaining < 0 then
  return {0, 0, tostring(-diff), tostring(tat - now)}
end
local reset_after = new_tat - now
if reset_after > 0 then
  redis.call('SET', key, new_tat, 'EX', math.ceil(reset_after))
end
return {cost, math.floor(remaining), tostring(-1), tostring(reset_after)}";

#[tokio::test]
async fn limiter_scripts_answer_as_redis_does() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        on_both_protocols(&node, &redis, async |sb: &mut SideBySide, p: &str| {
            let tokens = format!("request_rate_limiter.{{{p}:user}}.tokens");
            let stamp = format!("request_rate_limiter.{{{p}:user}}.timestamp");
            let keys = [tokens.as_str(), stamp.as_str()];
            for now in [
                "1700000000",
                "1700000000",
                "1700000000",
                "1700000000",
                "1700000001",
            ] {
                eval(sb, TOKEN_BUCKET, &keys, &["1", "3", now, "1"]).await;
            }
            sb.same(&["GET", &tokens]).await;
            sb.same(&["GET", &stamp]).await;
            sb.same(&["TTL", &tokens]).await;
            let key = format!("rate:{p}:gcra");
            for now in ["100", "100", "100", "100.5", "101", "160"] {
                eval(sb, GCRA, &[&key], &["2", "10", "60", "1", now]).await;
            }
            sb.same(&["GET", &key]).await;
            sb.same(&["TTL", &key]).await;
        })
        .await;
        node.shutdown().await;
    })
    .await;
}
