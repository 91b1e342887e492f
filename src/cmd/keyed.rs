//! The work a shard does on keys (`KeyCmd`), what it answers (`Reply`), and the dispatch of
//! each command to the family file (`strings`, `hashes`, `expiry`, `keyspace`, `cell`,
//! `limits`, `server`, `scan`) that executes it.
//!
//! The connection parses and validates; the shard only executes, so a `KeyCmd` is always
//! well-formed. Each command yields exactly one `Reply`.
//!
//! `KeyCmd` and `Reply` (and the option types inside them) are bincode-encoded into the Raft
//! log and snapshots: their variant order and field order are an on-disk format. Variants are
//! only ever appended; none is removed, moved elsewhere, or reordered.

use super::hashes::{self, HashOp};
use super::keyspace::ObjectSub;
use super::lists::{self, ListOp};
use super::sets::{self, SetOp};
use super::zscore::format_score;
use super::zsets::{self, ZOp};
use super::{cell, concurrency, expiry, keyspace, limits, packed, scan, server, strings};
use crate::limiter::CellArgs;
use crate::limiter::Decision;
use crate::limiter::Rule;
use crate::protocol::ReplyWriter;
use crate::store::{Store, Value};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

pub(crate) use super::limits::summarize;

pub(super) const NS_PER_MS: u64 = 1_000_000;

/// The largest reply MGET builds; a larger one is refused (`MGET k k k ...` of a large value
/// would otherwise make the node hold many copies of it).
pub(crate) const MAX_REPLY_BYTES: usize = 64 << 20;

/// How SET treats an existing key.
///
/// On-disk format: bincode-encoded into the Raft log (golden bytes in tests/encoding.rs).
/// Variants are append-only: add new ones at the end, never reorder or change existing ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetCond {
    Always,
    /// NX: only if absent.
    IfAbsent,
    /// XX: only if present.
    IfPresent,
}

/// SET's expiry option.
///
/// On-disk format: bincode-encoded into the Raft log (golden bytes in tests/encoding.rs).
/// Variants are append-only: add new ones at the end, never reorder or change existing ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetExpiry {
    /// No option: the key loses any TTL it had.
    Clear,
    KeepTtl,
    /// Relative, in milliseconds (EX, PX).
    In(u64),
    /// Absolute unix time in milliseconds (EXAT, PXAT).
    At(u64),
}

/// EXPIRE's condition.
///
/// On-disk format: bincode-encoded into the Raft log (golden bytes in tests/encoding.rs).
/// Variants are append-only: add new ones at the end, never reorder or change existing ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExpireCond {
    Always,
    Nx,
    Xx,
    Gt,
    Lt,
    /// XX and LT: only a key that has a TTL, and only to shorten it.
    XxLt,
}

/// The command a time argument came from: Redis names it in "invalid expire time" errors.
///
/// On-disk format: bincode-encoded into the Raft log (golden bytes in tests/encoding.rs).
/// Variants are append-only: add new ones at the end, never reorder or change existing ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeCmd {
    Set,
    SetEx,
    PSetEx,
    GetEx,
    Expire,
    PExpire,
    ExpireAt,
    PExpireAt,
}

impl TimeCmd {
    pub fn invalid_expire(self) -> &'static str {
        match self {
            TimeCmd::Set => "ERR invalid expire time in 'set' command",
            TimeCmd::SetEx => "ERR invalid expire time in 'setex' command",
            TimeCmd::PSetEx => "ERR invalid expire time in 'psetex' command",
            TimeCmd::GetEx => "ERR invalid expire time in 'getex' command",
            TimeCmd::Expire => "ERR invalid expire time in 'expire' command",
            TimeCmd::PExpire => "ERR invalid expire time in 'pexpire' command",
            TimeCmd::ExpireAt => "ERR invalid expire time in 'expireat' command",
            TimeCmd::PExpireAt => "ERR invalid expire time in 'pexpireat' command",
        }
    }

    /// The `*AT` commands take a unix time; the others a time from now.
    pub(super) fn absolute(self) -> bool {
        matches!(self, TimeCmd::ExpireAt | TimeCmd::PExpireAt)
    }
}

/// GETEX's option. Redis validates the time only once it has found a string under the key,
/// so a refused time travels to the shard and is reported there.
///
/// On-disk format: bincode-encoded into the Raft log (golden bytes in tests/encoding.rs).
/// Variants are append-only: add new ones at the end, never reorder or change existing ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GetExOpt {
    /// No option: GETEX is GET.
    Keep,
    Persist,
    /// EX / PX, in milliseconds (positive).
    In(u64),
    /// EXAT / PXAT, unix time in milliseconds (positive).
    At(u64),
    /// The time was not an integer.
    NotInteger,
    /// The time was zero, negative, or overflowed when converted to milliseconds.
    Invalid,
}

/// On-disk format: bincode-encoded into the Raft log (golden bytes in tests/encoding.rs).
/// Variants are append-only: add new ones at the end, never reorder or change existing ones.
/// Every byte-string field decodes through `packed` (a log entry's strings share buffers);
/// a new one should too.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum KeyCmd {
    Get(#[serde(deserialize_with = "packed::bytes")] Bytes),
    Set {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        #[serde(deserialize_with = "packed::bytes")]
        value: Bytes,
        expiry: SetExpiry,
        cond: SetCond,
        get: bool,
    },
    IncrBy {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        delta: i64,
    },
    /// A reserved index of the log format: nothing parses into it and no log holds it
    /// (EXPIRE and its family are `ExpireChecked`). It keeps its place, and its fields, only
    /// so every later variant keeps its index; a batch that holds one answers an error there.
    Expire {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        ms: i64,
        absolute: bool,
        cond: ExpireCond,
    },
    Persist(#[serde(deserialize_with = "packed::bytes")] Bytes),
    Ttl {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        ms: bool,
    },
    Type(#[serde(deserialize_with = "packed::bytes")] Bytes),
    Del(#[serde(deserialize_with = "packed::list")] Vec<Bytes>),
    Exists(#[serde(deserialize_with = "packed::list")] Vec<Bytes>),
    Throttle {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        args: CellArgs,
    },
    /// One limit; `cost` 0 peeks.
    Check {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        rule: Rule,
        cost: u64,
        peek: bool,
    },
    /// Several limits consumed all-or-nothing; every key is owned by this shard.
    CheckAll {
        #[serde(deserialize_with = "packed::list")]
        keys: Vec<Bytes>,
        rules: Vec<Rule>,
        cost: u64,
        peek: bool,
    },
    /// Gives back what a `CheckAll` on this shard took, when a sibling shard refused.
    Refund {
        #[serde(deserialize_with = "packed::list")]
        keys: Vec<Bytes>,
        rules: Vec<Rule>,
        cost: u64,
    },
    /// Takes up to `max` units at once, as many as are available now.
    Lease {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        rule: Rule,
        max: u64,
    },
    DbSize,
    FlushAll,
    Keys(#[serde(deserialize_with = "packed::bytes")] Bytes),
    // New variants go below this line only: the enum's variant order is its encoding.
    /// EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT with Redis's overflow checks: `ms` is the argument
    /// in milliseconds, from now or since the epoch as `cmd` says.
    ExpireChecked {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        ms: i64,
        cond: ExpireCond,
        cmd: TimeCmd,
    },
    /// SETEX / PSETEX: SET with a time to live in milliseconds (positive).
    SetEx {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        #[serde(deserialize_with = "packed::bytes")]
        value: Bytes,
        ms: u64,
        cmd: TimeCmd,
    },
    /// SETNX: SET NX answering 1 or 0.
    SetNx {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        #[serde(deserialize_with = "packed::bytes")]
        value: Bytes,
    },
    /// GETSET: SET GET.
    GetSet {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        #[serde(deserialize_with = "packed::bytes")]
        value: Bytes,
    },
    GetEx {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        opt: GetExOpt,
    },
    GetDel(#[serde(deserialize_with = "packed::bytes")] Bytes),
    /// EXPIRETIME / PEXPIRETIME.
    ExpireTime {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        ms: bool,
    },
    /// The increment is read on the shard, after the key's type is checked, as Redis orders it.
    IncrByFloat {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        #[serde(deserialize_with = "packed::bytes")]
        incr: Bytes,
    },
    MGet(#[serde(deserialize_with = "packed::list")] Vec<Bytes>),
    /// `keys[i]` is set to `values[i]`, in order (a repeated key ends with its last value).
    MSet {
        #[serde(deserialize_with = "packed::list")]
        keys: Vec<Bytes>,
        #[serde(deserialize_with = "packed::list")]
        values: Vec<Bytes>,
    },
    /// One shard's step of SCAN from scan position `from`: replies
    /// `[next position or -1 when done, keys examined, [keys...]]`. `type_name` is matched as
    /// TYPE names it (`string`, `bucket`), in any case.
    Scan {
        from: u64,
        count: u64,
        #[serde(deserialize_with = "packed::optional")]
        pattern: Option<Bytes>,
        #[serde(deserialize_with = "packed::optional")]
        type_name: Option<Bytes>,
    },
    /// A change to the cluster's metadata, encoded (`cluster::meta::MetaOp`): only the
    /// metadata group's log carries it, and only its state machine applies it.
    Meta(#[serde(deserialize_with = "packed::bytes")] Bytes),
    /// Several limits decided together, each with its own cost; every key is owned by this
    /// shard. Nothing is taken unless every limit not marked `shadow` passes; then each limit
    /// that passes is taken, shadow ones included. A shadow limit is decided and reported as
    /// it stands, but never refuses the set.
    CheckSet {
        #[serde(deserialize_with = "packed::list")]
        keys: Vec<Bytes>,
        rules: Vec<Rule>,
        costs: Vec<u64>,
        shadow: Vec<bool>,
        peek: bool,
    },
    /// Gives back `costs[i]` units on `keys[i]`: what a `CheckSet` took, when a sibling share
    /// of the same set was refused.
    RefundSet {
        #[serde(deserialize_with = "packed::list")]
        keys: Vec<Bytes>,
        rules: Vec<Rule>,
        costs: Vec<u64>,
    },
    /// BK.ACQUIRE: takes one of `limit` (1 to 100 000) slots for `ttl_ns` (positive).
    Acquire {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        limit: u64,
        ttl_ns: u64,
    },
    /// BK.RELEASE: gives back the slot `token` holds.
    Release {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        token: u64,
    },
    /// BK.INFLIGHT: how many slots are held.
    InFlight(#[serde(deserialize_with = "packed::bytes")] Bytes),
    /// A hash command (HSET, HGET, HINCRBY...) on the hash under `key`.
    Hash {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        op: HashOp,
    },
    /// EVAL and friends: a Lua script on keys this shard owns, run whole.
    Eval(Box<super::script::Eval>),
    /// A sorted-set command (ZADD, ZRANGE, ZREMRANGEBYSCORE...) on the sorted set under `key`.
    ZSet {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        op: ZOp,
    },
    /// A list command (LPUSH, LRANGE, LTRIM...) on the list under `key`.
    List {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        op: ListOp,
    },
    /// A set command (SADD, SISMEMBER...) on the set under `key`.
    Members {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        op: SetOp,
    },
    /// RENAME (`nx` false) and RENAMENX.
    Rename {
        #[serde(deserialize_with = "packed::bytes")]
        from: Bytes,
        #[serde(deserialize_with = "packed::bytes")]
        to: Bytes,
        nx: bool,
    },
    /// COPY (into database 0, the only one).
    Copy {
        #[serde(deserialize_with = "packed::bytes")]
        from: Bytes,
        #[serde(deserialize_with = "packed::bytes")]
        to: Bytes,
        replace: bool,
    },
    /// OBJECT ENCODING / REFCOUNT.
    Object {
        #[serde(deserialize_with = "packed::bytes")]
        key: Bytes,
        sub: ObjectSub,
    },
}

/// A limit decision as it goes on the wire:
/// `[allowed, limit, remaining, retry_after_ms, reset_after_ms]`.
pub(crate) type LimitReply = [i64; 5];

impl KeyCmd {
    /// True for the limit commands (the checks the metrics time).
    pub fn is_check(&self) -> bool {
        matches!(
            self,
            KeyCmd::Throttle { .. }
                | KeyCmd::Check { .. }
                | KeyCmd::CheckAll { .. }
                | KeyCmd::Lease { .. }
                | KeyCmd::CheckSet { .. }
        )
    }

    /// The key that decides where a command parsed as `Parsed::Keyed` runs: its one key,
    /// or a script's first (none: any shard will do, as for the commands that have no key).
    pub fn route_key(&self) -> &[u8] {
        match self {
            KeyCmd::Acquire { key, .. } | KeyCmd::Release { key, .. } | KeyCmd::InFlight(key) => {
                key
            }
            KeyCmd::Eval(e) => e.keys.first().map_or(&[][..], |k| k),
            KeyCmd::Rename { from, .. } | KeyCmd::Copy { from, .. } => from,
            other => other.single_key().unwrap_or_default(),
        }
    }

    /// The key a one-key command works on (None for the others): what a batch looks up
    /// ahead of running, so the lookups' cache misses overlap.
    pub fn single_key(&self) -> Option<&[u8]> {
        match self {
            KeyCmd::Get(key)
            | KeyCmd::Persist(key)
            | KeyCmd::Type(key)
            | KeyCmd::GetDel(key)
            | KeyCmd::Set { key, .. }
            | KeyCmd::IncrBy { key, .. }
            | KeyCmd::Ttl { key, .. }
            | KeyCmd::Throttle { key, .. }
            | KeyCmd::Check { key, .. }
            | KeyCmd::Lease { key, .. }
            | KeyCmd::ExpireChecked { key, .. }
            | KeyCmd::SetEx { key, .. }
            | KeyCmd::SetNx { key, .. }
            | KeyCmd::GetSet { key, .. }
            | KeyCmd::GetEx { key, .. }
            | KeyCmd::ExpireTime { key, .. }
            | KeyCmd::IncrByFloat { key, .. }
            | KeyCmd::Hash { key, .. }
            | KeyCmd::ZSet { key, .. }
            | KeyCmd::List { key, .. }
            | KeyCmd::Members { key, .. }
            | KeyCmd::Object { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// On-disk format rules apply: bincode-encoded in the Raft replies nodes send each other (golden
/// bytes in tests/encoding.rs). Variants are append-only: add new ones at the end, never
/// reorder or change existing ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Ok,
    Nil,
    Int(i64),
    Bulk(Bytes),
    Simple(Cow<'static, str>),
    Error(Cow<'static, str>),
    Limit(LimitReply),
    /// A multi-limit check: the deciding limit, then one entry per limit in request order.
    LimitAll(LimitReply, Vec<LimitReply>),
    Array(Vec<Reply>),
    /// Pairs: a RESP3 map, flattened into an array in RESP2 (HGETALL).
    Map(Vec<(Reply, Reply)>),
    /// A RESP3 set, an array in RESP2 (a script's `{set=...}`).
    Set(Vec<Reply>),
    /// A RESP3 double, as its text (`%.17g`, `inf`, `-inf`, `nan`); a bulk string in RESP2.
    Double(Bytes),
    /// A RESP3 boolean; the integer 1 or 0 in RESP2.
    Bool(bool),
    /// A RESP3 big number, as its digits; a bulk string in RESP2.
    BigNumber(Bytes),
    /// A RESP3 verbatim string: its three-byte format and its text; a bulk string in RESP2.
    Verbatim([u8; 3], Bytes),
    /// The null array: `*-1` in RESP2, null in RESP3 (LPOP with a count on a missing key).
    NilArray,
    /// Members with their scores (ZRANGE ... WITHSCORES, ZPOPMIN with a count): in RESP3 an
    /// array of [member, double] pairs, in RESP2 one flat array of members and scores.
    Scored(Vec<(Bytes, u64)>),
}

impl Reply {
    pub fn err(msg: &'static str) -> Reply {
        Reply::Error(Cow::Borrowed(msg))
    }

    /// The integer inside an `Int` reply (for summing replies of a command split over shards).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(v) => Some(*v),
            _ => None,
        }
    }
}

pub(super) const WRONGTYPE: &str =
    "WRONGTYPE Operation against a key holding the wrong kind of value";
pub(super) const OOM: &str = "OOM command not allowed when the key limit or maxmemory is reached";
pub(super) const NOT_INT: &str = "ERR value is not an integer or out of range";
pub(super) const OVERFLOW: &str = "ERR increment or decrement would overflow";
pub(super) const NOT_FLOAT: &str = "ERR value is not a valid float";
pub(super) const NAN_OR_INF: &str = "ERR increment would produce NaN or Infinity";
/// The answer to a command at a reserved index of the log format (see `KeyCmd::Expire`).
const RESERVED: &str = "ERR reserved command";
/// The answer to a command whose reply would pass `MAX_REPLY_BYTES`.
pub(crate) const TOO_LARGE: &str = "ERR reply would exceed 64 MiB";
/// The answer in a command's place when the shard or group that ran its batch answered with
/// fewer replies than commands: every command still gets a reply, in order.
pub(crate) const MISSING_REPLY: &str = "ERR internal error: missing reply";

pub(super) fn ceil_ms(ns: u64) -> i64 {
    i64::try_from(ns.div_ceil(NS_PER_MS)).unwrap_or(i64::MAX)
}

/// Turns a decision into its wire form, with times rounded up to whole milliseconds so a
/// client that waits `retry_after` is never early.
pub(crate) fn limit_reply(d: &Decision) -> LimitReply {
    [
        i64::from(d.allowed),
        i64::try_from(d.limit).unwrap_or(i64::MAX),
        i64::try_from(d.remaining).unwrap_or(i64::MAX),
        match (d.allowed, d.retry_after_ns) {
            (false, Some(ns)) => ceil_ms(ns),
            _ => -1,
        },
        ceil_ms(d.reset_after_ns),
    ]
}

/// The limit commands, as the metrics count their decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckKind {
    Throttle = 0,
    Check = 1,
    CheckAll = 2,
    Lease = 3,
}

impl CheckKind {
    pub const ALL: [CheckKind; 4] = [
        CheckKind::Throttle,
        CheckKind::Check,
        CheckKind::CheckAll,
        CheckKind::Lease,
    ];

    /// The command's name, as a metric label.
    pub fn command(self) -> &'static str {
        match self {
            CheckKind::Throttle => "cl.throttle",
            CheckKind::Check => "bk.check",
            CheckKind::CheckAll => "bk.checkall",
            CheckKind::Lease => "bk.lease",
        }
    }
}

/// Counters a shard reports.
#[derive(Debug, Default, Clone, Copy)]
pub struct ExecStats {
    /// Limit commands run (decided or refused with an error).
    pub checks: u64,
    pub denied: u64,
    /// Decisions by `CheckKind`: `[allowed, denied]`.
    pub decided: [[u64; 2]; 4],
}

impl ExecStats {
    /// Counts one decision of a limit command. BK.CHECKALL's are counted by the connection
    /// that answers it, from its reply: a check whose keys span shards is decided in parts
    /// (and re-checked when one part refuses), and is still one decision.
    pub fn decision(&mut self, kind: CheckKind, allowed: bool) {
        self.denied += u64::from(!allowed);
        if kind != CheckKind::CheckAll {
            self.decided[kind as usize][usize::from(!allowed)] += 1;
        }
    }
}

/// Applies one command to the store at time `now` (ns), in the family file that owns it. By
/// reference: a committed log entry's commands are shared with the log and the replication
/// streams, and are applied without a copy.
pub fn execute(store: &mut Store, cmd: &KeyCmd, now: u64, stats: &mut ExecStats) -> Reply {
    match cmd {
        KeyCmd::Get(key) => strings::get(store, key, now),
        KeyCmd::Set {
            key,
            value,
            expiry,
            cond,
            get,
        } => strings::set(
            store,
            key,
            value.clone(),
            *expiry,
            *cond,
            *get,
            now,
            TimeCmd::Set,
        ),
        KeyCmd::IncrBy { key, delta } => strings::incr_by(store, key, *delta, now),
        KeyCmd::Expire { .. } => Reply::err(RESERVED),
        KeyCmd::Persist(key) => expiry::persist(store, key, now),
        KeyCmd::Ttl { key, ms } => expiry::ttl(store, key, *ms, now),
        KeyCmd::Type(key) => keyspace::type_of(store, key, now),
        KeyCmd::Del(keys) => keyspace::del(store, keys, now),
        KeyCmd::Exists(keys) => keyspace::exists(store, keys, now),
        KeyCmd::Throttle { key, args } => cell::throttle(store, key, args, now, stats),
        KeyCmd::Check {
            key,
            rule,
            cost,
            peek,
        } => limits::check(store, key, rule, *cost, *peek, now, stats),
        KeyCmd::CheckAll {
            keys,
            rules,
            cost,
            peek,
        } => limits::check_all(store, keys, rules, *cost, *peek, now, stats),
        KeyCmd::Refund { keys, rules, cost } => limits::refund(store, keys, rules, |_| *cost, now),
        KeyCmd::Lease { key, rule, max } => limits::lease(store, key, rule, *max, now, stats),
        KeyCmd::DbSize => server::dbsize(store),
        KeyCmd::FlushAll => server::flushall(store),
        KeyCmd::Keys(pattern) => server::keys(store, pattern, now),
        KeyCmd::ExpireChecked { key, ms, cond, cmd } => {
            expiry::expire_checked(store, key, *ms, *cond, *cmd, now)
        }
        KeyCmd::SetEx {
            key,
            value,
            ms,
            cmd,
        } => strings::setex(store, key, value.clone(), *ms, *cmd, now),
        KeyCmd::SetNx { key, value } => strings::setnx(store, key, value.clone(), now),
        KeyCmd::GetSet { key, value } => strings::getset(store, key, value.clone(), now),
        KeyCmd::GetEx { key, opt } => strings::getex(store, key, *opt, now),
        KeyCmd::GetDel(key) => strings::getdel(store, key, now),
        KeyCmd::ExpireTime { key, ms } => expiry::expire_time(store, key, *ms, now),
        KeyCmd::IncrByFloat { key, incr } => strings::incr_by_float(store, key, incr, now),
        KeyCmd::MGet(keys) => strings::mget(store, keys, now),
        KeyCmd::MSet { keys, values } => strings::mset(store, keys, values, now),
        KeyCmd::Scan {
            from,
            count,
            pattern,
            type_name,
        } => scan::step(
            store,
            *from,
            *count,
            pattern.as_deref(),
            type_name.as_deref(),
            now,
        ),
        KeyCmd::Meta(_) => Reply::err("ERR metadata changes go to the metadata group"),
        KeyCmd::CheckSet {
            keys,
            rules,
            costs,
            shadow,
            peek,
        } => limits::check_set(store, keys, rules, costs, shadow, *peek, now, stats),
        KeyCmd::Eval(e) => super::script::eval(store, e, now, stats),
        KeyCmd::RefundSet { keys, rules, costs } => limits::refund(
            store,
            keys,
            rules,
            |i| costs.get(i).copied().unwrap_or(0),
            now,
        ),
        KeyCmd::Acquire { key, limit, ttl_ns } => {
            concurrency::acquire(store, key, *limit, *ttl_ns, now)
        }
        KeyCmd::Release { key, token } => concurrency::release(store, key, *token, now),
        KeyCmd::InFlight(key) => concurrency::in_flight(store, key, now),
        KeyCmd::Hash { key, op } => hashes::execute(store, key, op, now),
        KeyCmd::ZSet { key, op } => zsets::execute(store, key, op, now),
        KeyCmd::List { key, op } => lists::execute(store, key, op, now),
        KeyCmd::Members { key, op } => sets::execute(store, key, op, now),
        KeyCmd::Rename { from, to, nx } => keyspace::rename(store, None, from, to, *nx, now),
        KeyCmd::Copy { from, to, replace } => keyspace::copy(store, None, from, to, *replace, now),
        KeyCmd::Object { key, sub } => keyspace::object(store, key, *sub, now),
    }
}

/// Milliseconds since the epoch, Redis's `mstime()` at `now` (ns).
pub(super) fn ms_of(now: u64) -> i64 {
    (now / NS_PER_MS) as i64
}

/// How a string is kept: integers as counters, anything else as bytes.
pub(super) fn string_value(value: &[u8]) -> Value<'_> {
    match crate::protocol::parse_i64(value) {
        Some(v) => Value::Int(v),
        None => Value::Str(value),
    }
}

/// A string key's value as a bulk reply; None for a bucket, a semaphore or a hash.
pub(super) fn string_reply(value: Value<'_>) -> Option<Reply> {
    match value {
        Value::Str(s) => Some(Reply::Bulk(Bytes::copy_from_slice(s))),
        Value::Int(v) => Some(Reply::Bulk(Bytes::from(v.to_string()))),
        Value::Bucket(_) | Value::Semaphore(_) | Value::Hash(_) | Value::Coll(_) => None,
    }
}

/// True if `now_ms + ms` passes `i64::MAX`: Redis's overflow test for a time from now.
pub(super) fn relative_overflows(ms: u64, now: u64) -> bool {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| ms.checked_add(ms_of(now)))
        .is_none()
}

/// Writes a shard's reply in the connection's protocol (RESP2 or RESP3, as `w` was made).
pub fn encode(w: &mut ReplyWriter, r: &Reply) {
    match r {
        Reply::Ok => w.ok(),
        Reply::Nil => w.null(),
        Reply::Int(v) => w.int(*v),
        Reply::Bulk(b) => w.bulk(b),
        Reply::Simple(s) => w.simple(s),
        Reply::Error(e) => w.error(e),
        Reply::Limit(l) => write_limit(w, l),
        Reply::LimitAll(summary, each) => {
            w.array(6);
            for v in summary {
                w.int(*v);
            }
            w.array(each.len());
            for l in each {
                write_limit(w, l);
            }
        }
        Reply::Array(items) => {
            w.array(items.len());
            for i in items {
                encode(w, i);
            }
        }
        Reply::Map(pairs) => {
            w.map(pairs.len());
            for (k, v) in pairs {
                encode(w, k);
                encode(w, v);
            }
        }
        Reply::NilArray => w.null_array(),
        Reply::Set(items) => {
            w.set(items.len());
            for i in items {
                encode(w, i);
            }
        }
        Reply::Double(text) => w.double(text),
        Reply::Bool(b) => w.boolean(*b),
        Reply::BigNumber(digits) => w.big_number(digits),
        Reply::Verbatim(format, text) => w.verbatim_as(format, text),
        Reply::Scored(pairs) => {
            if w.resp3 {
                w.array(pairs.len());
            } else {
                w.array(pairs.len() * 2);
            }
            for (member, score) in pairs {
                if w.resp3 {
                    w.array(2);
                }
                w.bulk(member);
                w.double(format_score(f64::from_bits(*score)).as_bytes());
            }
        }
    }
}

fn write_limit(w: &mut ReplyWriter, l: &LimitReply) {
    w.int_array(l);
}
