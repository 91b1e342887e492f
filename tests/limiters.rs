//! What widely used rate limiters send to Redis, sent side by side to a real redis-server and
//! to a bucketd node with four shards, comparing every reply and then the keyspace they leave
//! (keys, TYPE, values, TTL within a tolerance).
//!
//! The scripts and command sequences are written here, after the calls the limiters make:
//! Spring Cloud Gateway's RedisRateLimiter (a token bucket over two keys, in Lua, run by
//! EVALSHA), go-redis/redis_rate (GCRA in Lua, allowN and allowAtMost, with
//! `redis.replicate_commands()`), Tyk's sliding log (ZREMRANGEBYSCORE, ZCARD or ZRANGE, ZADD,
//! EXPIRE, pipelined and inside MULTI), APISIX limit-conn (ZREMRANGEBYSCORE, ZCARD, ZADD, EXPIRE
//! in Lua, then ZREM), PyrateLimiter's Redis bucket (ZCOUNT per rate, ZADD of many members in
//! Lua, ZRANGE WITHSCORES, ZREMRANGEBYSCORE, ZCARD) and Laravel's ConcurrencyLimiter (MGET and
//! SET over several slot keys in one script) and DurationLimiter (a hash in Lua). Time is
//! passed in as arguments, as most of these limiters do, so the replies do not depend on the
//! wall clock. No key has a hash tag: a script's or a transaction's keys fall on different
//! shards.

#![cfg(feature = "server")]

mod common;

use common::bucketd_process::BucketdProcess;
use common::real_redis::RealRedis;
use common::{bounded, connect_url, run};
use redis::Value;
use redis::aio::MultiplexedConnection;

const BIN: &str = env!("CARGO_BIN_EXE_bucketd");

/// Seconds two TTLs may differ by: the two servers receive the same command a moment apart.
const TTL_TOLERANCE_S: i64 = 2;

/// Connections to both servers, fed the same commands.
struct SideBySide {
    redis: MultiplexedConnection,
    ours: MultiplexedConnection,
    // Kept alive for as long as the connections are used.
    _redis_server: RealRedis,
    _node: Ours,
}

/// The server compared with Redis: bucketd, or with BUCKETD_LIMITERS_CONTROL=1 a second
/// redis-server, which checks the test itself (every scenario must pass Redis against Redis).
enum Ours {
    Bucketd(BucketdProcess),
    Redis(RealRedis),
}

impl SideBySide {
    async fn start() -> SideBySide {
        let redis_server = RealRedis::start().await;
        let node = if std::env::var("BUCKETD_LIMITERS_CONTROL").as_deref() == Ok("1") {
            Ours::Redis(RealRedis::start().await)
        } else {
            Ours::Bucketd(BucketdProcess::start(BIN, &["--shards", "4"]))
        };
        let ours = match &node {
            Ours::Bucketd(b) => b.addr,
            Ours::Redis(r) => r.addr,
        };
        SideBySide {
            redis: connect_url(&format!("redis://{}/", redis_server.addr)).await,
            ours: connect_url(&format!("redis://{}/", ours)).await,
            _redis_server: redis_server,
            _node: node,
        }
    }

    /// Sends `args` to both and asserts the replies, or the error texts, are the same.
    async fn same(&mut self, args: &[&str]) -> Result<Value, String> {
        let theirs = run(&mut self.redis, args).await;
        let ours = run(&mut self.ours, args).await;
        assert_eq!(
            ours, theirs,
            "bucketd (left) and Redis (right) differ on {args:?}"
        );
        theirs
    }

    /// Like `same`, and the reply must be a success.
    async fn ok(&mut self, args: &[&str]) -> Value {
        match self.same(args).await {
            Ok(v) => v,
            Err(e) => panic!("Redis refused {args:?}: {e}"),
        }
    }

    /// Runs the commands as one pipeline (one write) on both, in a MULTI/EXEC block when
    /// `atomic`, and asserts the replies are the same.
    async fn pipeline(&mut self, atomic: bool, cmds: &[Vec<String>]) -> Vec<Value> {
        let mut p = redis::pipe();
        if atomic {
            p.atomic();
        }
        for c in cmds {
            let mut cmd = redis::cmd(&c[0]);
            for a in &c[1..] {
                cmd.arg(a);
            }
            p.add_command(cmd);
        }
        let theirs: Result<Vec<Value>, String> = p
            .query_async(&mut self.redis)
            .await
            .map_err(|e| common::err_text(&e));
        let ours: Result<Vec<Value>, String> = p
            .query_async(&mut self.ours)
            .await
            .map_err(|e| common::err_text(&e));
        assert_eq!(
            ours, theirs,
            "bucketd (left) and Redis (right) differ on {cmds:?}"
        );
        theirs.unwrap_or_else(|e| panic!("Redis refused {cmds:?}: {e}"))
    }

    /// Loads `script` on both and returns its SHA1, which must be the same.
    async fn load(&mut self, script: &str) -> String {
        match self.ok(&["SCRIPT", "LOAD", script]).await {
            Value::BulkString(b) => String::from_utf8(b).expect("a hex SHA1"),
            other => panic!("SCRIPT LOAD answered {other:?}"),
        }
    }

    /// Asserts both servers hold the same keys, of the same types, with the same values, and
    /// TTLs within `TTL_TOLERANCE_S`.
    async fn same_keyspace(&mut self) {
        let keys = |v: Value| -> Vec<String> {
            let mut k: Vec<String> = redis::from_redis_value(v).expect("KEYS gives names");
            k.sort();
            k
        };
        let theirs = keys(run(&mut self.redis, &["KEYS", "*"]).await.expect("KEYS"));
        let ours = keys(run(&mut self.ours, &["KEYS", "*"]).await.expect("KEYS"));
        assert_eq!(
            ours, theirs,
            "bucketd (left) and Redis (right) hold different keys"
        );
        for key in &theirs {
            let kind = self.ok(&["TYPE", key]).await;
            let kind = match kind {
                Value::SimpleString(s) => s,
                other => panic!("TYPE answered {other:?}"),
            };
            match kind.as_str() {
                "string" => self.ok(&["GET", key]).await,
                "hash" => self.sorted(&["HGETALL", key], 2).await,
                "zset" => self.ok(&["ZRANGE", key, "0", "-1", "WITHSCORES"]).await,
                "list" => self.ok(&["LRANGE", key, "0", "-1"]).await,
                "set" => self.sorted(&["SMEMBERS", key], 1).await,
                other => panic!("{key} is a {other}, which no limiter here writes"),
            };
            let ttl = |v: Result<Value, String>| -> i64 {
                redis::from_redis_value(v.expect("TTL answers")).expect("TTL is an integer")
            };
            let theirs = ttl(run(&mut self.redis, &["TTL", key]).await);
            let ours = ttl(run(&mut self.ours, &["TTL", key]).await);
            if theirs < 0 || ours < 0 {
                assert_eq!(ours, theirs, "TTL of {key}: bucketd (left), Redis (right)");
            } else {
                assert!(
                    (ours - theirs).abs() <= TTL_TOLERANCE_S,
                    "TTL of {key}: bucketd {ours}, Redis {theirs}"
                );
            }
        }
    }

    /// Runs a command whose reply is an unordered collection of `chunk`-element entries on
    /// both, and compares the entries as sets.
    async fn sorted(&mut self, args: &[&str], chunk: usize) -> Value {
        let entries = |v: Result<Value, String>| -> Vec<Vec<Vec<u8>>> {
            let v = v.unwrap_or_else(|e| panic!("{args:?} failed: {e}"));
            let flat: Vec<Vec<u8>> = match v {
                Value::Map(pairs) => pairs
                    .into_iter()
                    .flat_map(|(k, v)| [k, v])
                    .map(|x| redis::from_redis_value(x).expect("bytes"))
                    .collect(),
                v => redis::from_redis_value(v).expect("an array of bytes"),
            };
            let mut out: Vec<Vec<Vec<u8>>> = flat.chunks(chunk).map(|c| c.to_vec()).collect();
            out.sort();
            out
        };
        let theirs = entries(run(&mut self.redis, args).await);
        let ours = entries(run(&mut self.ours, args).await);
        assert_eq!(
            ours, theirs,
            "bucketd (left) and Redis (right) differ on {args:?}"
        );
        Value::Nil
    }
}

fn cmd(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// A token bucket over two keys (tokens left, last refill), refilled by elapsed time; both
/// written with SETEX for twice the time a full refill takes. Spring Cloud Gateway's shape.
const TWO_KEY_TOKEN_BUCKET: &str = r#"
redis.replicate_commands()
local rate, capacity = tonumber(ARGV[1]), tonumber(ARGV[2])
local now, want = tonumber(ARGV[3]), tonumber(ARGV[4])
local ttl = math.floor(capacity / rate * 2)
local left = tonumber(redis.call("get", KEYS[1])) or capacity
local last = tonumber(redis.call("get", KEYS[2])) or 0
local filled = math.min(capacity, left + math.max(0, now - last) * rate)
local granted = filled >= want
if granted then filled = filled - want end
if ttl > 0 then
  redis.call("setex", KEYS[1], ttl, filled)
  redis.call("setex", KEYS[2], ttl, now)
end
return { granted and 1 or 0, filled }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_over_two_keys_by_evalsha() {
    bounded(async {
        let mut s = SideBySide::start().await;
        let sha = s.load(TWO_KEY_TOKEN_BUCKET).await;
        // The keys differ in more than a suffix, so they land on different shards.
        let keys = ["gateway.tokens.alice", "gateway.refilled.alice"];
        for (now, want) in [(100, 1), (100, 3), (100, 2), (101, 5), (101, 1), (160, 10)] {
            let (now, want) = (now.to_string(), want.to_string());
            s.ok(&[
                "EVALSHA", &sha, "2", keys[0], keys[1], "2", "5", &now, &want,
            ])
            .await;
        }
        // A client that lost its script cache sees NOSCRIPT and falls back to EVAL.
        s.same(&[
            "EVALSHA",
            &"0".repeat(40),
            "2",
            keys[0],
            keys[1],
            "2",
            "5",
            "1",
            "1",
        ])
        .await
        .expect_err("an unknown SHA1 is refused");
        s.ok(&[
            "EVAL",
            TWO_KEY_TOKEN_BUCKET,
            "2",
            keys[0],
            keys[1],
            "2",
            "5",
            "161",
            "1",
        ])
        .await;
        s.same_keyspace().await;
    })
    .await
}

/// GCRA over one key holding the theoretical arrival time, in seconds as a float; ARGV[5] is 1
/// for "at most": take what is left, up to the cost. go-redis/redis_rate's shape, with the
/// time passed in instead of read with TIME.
const GCRA: &str = r#"
redis.replicate_commands()
local burst, rate, period = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local cost, now, at_most = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6] == "1"
local interval = period / rate
local tolerance = burst * interval
local tat = tonumber(redis.call("GET", KEYS[1])) or now
if tat < now then tat = now end
local remaining = math.floor((now - (tat - tolerance)) / interval)
if at_most then
  if remaining < 1 then
    return {0, 0, tostring(tat - tolerance - now + interval), tostring(tat - now)}
  end
  if remaining < cost then cost = remaining end
end
local new_tat = tat + cost * interval
local allow_at = new_tat - tolerance
if now < allow_at then
  return {0, math.max(0, remaining), tostring(allow_at - now), tostring(tat - now)}
end
local reset_after = new_tat - now
if reset_after > 0 then
  redis.call("SET", KEYS[1], new_tat, "EX", math.ceil(reset_after))
end
return {cost, remaining - cost, tostring(-1), tostring(reset_after)}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_allow_n_and_allow_at_most() {
    bounded(async {
        let mut s = SideBySide::start().await;
        let sha = s.load(GCRA).await;
        let steps = [
            ("rate:login:bob", "1", "1000", "0"),
            ("rate:login:bob", "3", "1000", "0"),
            ("rate:login:bob", "4", "1000", "0"),
            ("rate:login:bob", "4", "1000.5", "1"),
            ("rate:login:bob", "1", "1000.5", "1"),
            ("rate:upload:carol", "2", "2000", "1"),
            ("rate:upload:carol", "10", "2000.25", "1"),
            ("rate:login:bob", "1", "1030", "0"),
        ];
        for (key, cost, now, at_most) in steps {
            s.ok(&[
                "EVALSHA", &sha, "1", key, "5", "10", "60", cost, now, at_most,
            ])
            .await;
        }
        s.same_keyspace().await;
    })
    .await
}

/// Tyk's sliding log over one key: drop entries older than the period, count or list what is
/// left, log this request (score and member are its time in nanoseconds), and expire the log
/// after the period.
fn sliding_log_round(key: &str, now_ns: u64, period_s: u64, list: bool) -> Vec<Vec<String>> {
    let cutoff = (now_ns - period_s * 1_000_000_000).to_string();
    let now = now_ns.to_string();
    let read = if list {
        cmd(&["ZRANGE", key, "0", "-1"])
    } else {
        cmd(&["ZCARD", key])
    };
    vec![
        cmd(&["ZREMRANGEBYSCORE", key, "-inf", &cutoff]),
        read,
        cmd(&["ZADD", key, &now, &now]),
        cmd(&["EXPIRE", key, &period_s.to_string()]),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_pipelined_and_in_multi() {
    bounded(async {
        let mut s = SideBySide::start().await;
        let start: u64 = 1_700_000_000_000_000_000;
        let second = 1_000_000_000;
        for (i, atomic) in [false, true, false, true, true, false]
            .into_iter()
            .enumerate()
        {
            let now = start + i as u64 * second / 2;
            for (key, list) in [("tyk-sl-key-a", false), ("tyk-sl-key-b", true)] {
                s.pipeline(atomic, &sliding_log_round(key, now, 2, list))
                    .await;
            }
        }
        // The newest entries, by negative index, with and without scores.
        s.ok(&["ZRANGE", "tyk-sl-key-a", "-2", "-1"]).await;
        s.ok(&["ZRANGE", "tyk-sl-key-b", "-3", "-1", "WITHSCORES"])
            .await;
        s.ok(&["ZRANGE", "tyk-sl-key-b", "-100", "100"]).await;
        s.ok(&["ZRANGE", "tyk-sl-key-b", "-1", "-2"]).await;
        // A transaction whose keys are on different shards.
        let both = [
            cmd(&["ZCARD", "tyk-sl-key-a"]),
            cmd(&["ZCARD", "tyk-sl-key-b"]),
            cmd(&["EXPIRE", "tyk-sl-key-a", "30"]),
        ];
        s.pipeline(true, &both).await;
        s.same_keyspace().await;
    })
    .await
}

/// APISIX limit-conn: a connection is a member scored by when it expires; expired ones are
/// dropped, and a new one is refused when the count is at the limit.
const CONN_ENTER: &str = r#"
local limit, ttl, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call("ZREMRANGEBYSCORE", KEYS[1], 0, now)
local open = redis.call("ZCARD", KEYS[1])
if open >= limit then
  return {0, open}
end
redis.call("ZADD", KEYS[1], now + ttl, ARGV[4])
redis.call("EXPIRE", KEYS[1], ttl)
return {1, open + 1}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limit_in_lua() {
    bounded(async {
        let mut s = SideBySide::start().await;
        let sha = s.load(CONN_ENTER).await;
        let key = "limit_conn:route-7";
        for (now, id) in [(10, "r1"), (11, "r2"), (12, "r3"), (13, "r4")] {
            s.ok(&["EVALSHA", &sha, "1", key, "3", "60", &now.to_string(), id])
                .await;
        }
        // Leaving: the request's member goes, and the count follows.
        s.ok(&["ZREM", key, "r2"]).await;
        s.ok(&["ZREM", key, "never-entered"]).await;
        s.ok(&["ZCARD", key]).await;
        s.ok(&["EVALSHA", &sha, "1", key, "3", "60", "14", "r5"])
            .await;
        // Much later, every member has expired and is dropped.
        s.ok(&["EVALSHA", &sha, "1", key, "3", "60", "100", "r6"])
            .await;
        s.ok(&["ZREMRANGEBYSCORE", key, "0", "200"]).await;
        s.ok(&["ZCARD", key]).await;
        s.ok(&["EVALSHA", &sha, "1", key, "3", "60", "101", "r7"])
            .await;
        s.same_keyspace().await;
    })
    .await
}

/// PyrateLimiter's bucket: for every rate (window in ms, limit), count the log's entries in the
/// window with ZCOUNT; if the weight fits them all, log it as that many members at once.
const WEIGHTED_LOG: &str = r#"
local now, weight, name = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local rates = tonumber(ARGV[4])
for i = 0, rates - 1 do
  local window, limit = tonumber(ARGV[5 + 2 * i]), tonumber(ARGV[6 + 2 * i])
  if redis.call("ZCOUNT", KEYS[1], now - window, now) + weight > limit then
    return i
  end
end
local members = {}
for n = 1, weight do
  members[#members + 1] = now
  members[#members + 1] = name .. ":" .. now .. ":" .. n
end
redis.call("ZADD", KEYS[1], unpack(members))
return -1
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_log_with_zcount_and_batched_zadd() {
    bounded(async {
        let mut s = SideBySide::start().await;
        let sha = s.load(WEIGHTED_LOG).await;
        let key = "pyrate-bucket/api";
        let rates = ["2", "1000", "5", "10000", "8"];
        for (now, weight) in [(1000, 1), (1200, 2), (1300, 3), (1500, 1), (2600, 4)] {
            let (now, weight) = (now.to_string(), weight.to_string());
            let mut args = vec!["EVALSHA", &sha, "1", key, &now, &weight, "item"];
            args.extend(rates);
            s.ok(&args).await;
        }
        s.ok(&["ZCOUNT", key, "1000", "2000"]).await;
        s.ok(&["ZCOUNT", key, "(1000", "+inf"]).await;
        s.ok(&["ZRANGE", key, "0", "-1", "WITHSCORES"]).await;
        s.ok(&["ZRANGE", key, "-1", "-1", "WITHSCORES"]).await;
        s.ok(&["ZREMRANGEBYSCORE", key, "0", "1250"]).await;
        s.ok(&["ZCARD", key]).await;
        // A bucket's own batch ZADD, outside a script, of many members.
        let mut batch = vec!["ZADD".to_string(), key.to_string()];
        for n in 0..200 {
            batch.push((3000 + n / 10).to_string());
            batch.push(format!("bulk:{n}"));
        }
        let batch: Vec<&str> = batch.iter().map(String::as_str).collect();
        s.ok(&batch).await;
        s.ok(&["ZCARD", key]).await;
        s.ok(&["ZCOUNT", key, "3005", "3010"]).await;
        s.same_keyspace().await;
    })
    .await
}

/// Laravel's ConcurrencyLimiter: each slot is a key; take the first free one (MGET over them
/// all) with SET EX, and give it back only if it still holds the holder's id.
const TAKE_SLOT: &str = r#"
for index, holder in pairs(redis.call("mget", unpack(KEYS))) do
  if not holder then
    redis.call("set", KEYS[index], ARGV[3], "EX", ARGV[2])
    return ARGV[1] .. index
  end
end
"#;
const GIVE_BACK_SLOT: &str = r#"
if redis.call("get", KEYS[1]) == ARGV[1] then
  return redis.call("del", KEYS[1])
end
return 0
"#;
/// Laravel's DurationLimiter: a hash with the window's start, end and count.
const DURATION_WINDOW: &str = r#"
local function reset()
  redis.call("HMSET", KEYS[1], "start", ARGV[2], "end", ARGV[2] + ARGV[3], "count", 1)
  return redis.call("EXPIRE", KEYS[1], ARGV[3] * 2)
end
if redis.call("EXISTS", KEYS[1]) == 0 then
  return {reset(), ARGV[2] + ARGV[3], ARGV[4] - 1}
end
if ARGV[1] >= redis.call("HGET", KEYS[1], "start") and ARGV[1] <= redis.call("HGET", KEYS[1], "end") then
  return {
    tonumber(redis.call("HINCRBY", KEYS[1], "count", 1)) <= tonumber(ARGV[4]),
    redis.call("HGET", KEYS[1], "end"),
    ARGV[4] - redis.call("HGET", KEYS[1], "count")
  }
end
return {reset(), ARGV[2] + ARGV[3], ARGV[4] - 1}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_slots_and_duration_window() {
    bounded(async {
        let mut s = SideBySide::start().await;
        // Slot keys without a hash tag, as Laravel names them outside a cluster.
        let slots = ["reports-lock1", "reports-lock2", "reports-lock3"];
        for holder in ["h-a", "h-b", "h-c", "h-d"] {
            s.same(&[
                "EVAL",
                TAKE_SLOT,
                "3",
                slots[0],
                slots[1],
                slots[2],
                "reports-lock",
                "60",
                holder,
            ])
            .await
            .expect("taking a slot runs");
        }
        s.ok(&["MGET", slots[0], slots[1], slots[2]]).await;
        s.ok(&["EVAL", GIVE_BACK_SLOT, "1", slots[1], "h-x"]).await;
        s.ok(&["EVAL", GIVE_BACK_SLOT, "1", slots[1], "h-b"]).await;
        s.ok(&[
            "EVAL",
            TAKE_SLOT,
            "3",
            slots[0],
            slots[1],
            slots[2],
            "reports-lock",
            "60",
            "h-e",
        ])
        .await;
        // Times as ARGV: microseconds, seconds, the window's length, the limit.
        let key = "duration:nightly-export";
        for (micros, secs) in [
            ("1700000000000000", "1700000000"),
            ("1700000001000000", "1700000001"),
            ("1700000002000000", "1700000002"),
            ("1700000009000000", "1700000009"),
            ("1700000020000000", "1700000020"),
        ] {
            s.ok(&["EVAL", DURATION_WINDOW, "1", key, micros, secs, "10", "2"])
                .await;
        }
        s.same_keyspace().await;
    })
    .await
}
