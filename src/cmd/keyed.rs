//! Commands that touch keys, and how a shard applies them to its `Store`.
//!
//! The connection parses and validates; the shard only executes, so a `KeyCmd` is always
//! well-formed. Each command yields exactly one `Reply`.

use crate::cmd::float;
use crate::limiter::cell::{self, CellArgs, CellWrite};
use crate::limiter::{self, Decision, Rule, State};
use crate::store::{OwnedValue, Slot, Store, StoreFull, Value};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

const NS_PER_MS: u64 = 1_000_000;

/// The largest reply MGET builds; a larger one is refused (`MGET k k k ...` of a large value
/// would otherwise make the node hold many copies of it).
pub const MAX_REPLY_BYTES: usize = 64 << 20;

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
    fn absolute(self) -> bool {
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
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum KeyCmd {
    Get(Bytes),
    Set {
        key: Bytes,
        value: Bytes,
        expiry: SetExpiry,
        cond: SetCond,
        get: bool,
    },
    IncrBy {
        key: Bytes,
        delta: i64,
    },
    /// EXPIRE/PEXPIRE (relative ms, may be negative) and EXPIREAT/PEXPIREAT (absolute ms),
    /// as logged before `ExpireChecked` replaced it; still applied when a log replays it.
    Expire {
        key: Bytes,
        ms: i64,
        absolute: bool,
        cond: ExpireCond,
    },
    Persist(Bytes),
    Ttl {
        key: Bytes,
        ms: bool,
    },
    Type(Bytes),
    Del(Vec<Bytes>),
    Exists(Vec<Bytes>),
    Throttle {
        key: Bytes,
        args: CellArgs,
    },
    /// One limit; `cost` 0 peeks.
    Check {
        key: Bytes,
        rule: Rule,
        cost: u64,
        peek: bool,
    },
    /// Several limits consumed all-or-nothing; every key is owned by this shard.
    CheckAll {
        keys: Vec<Bytes>,
        rules: Vec<Rule>,
        cost: u64,
        peek: bool,
    },
    /// Gives back what a `CheckAll` on this shard took, when a sibling shard refused.
    Refund {
        keys: Vec<Bytes>,
        rules: Vec<Rule>,
        cost: u64,
    },
    /// Takes up to `max` units at once, as many as are available now.
    Lease {
        key: Bytes,
        rule: Rule,
        max: u64,
    },
    DbSize,
    FlushAll,
    Keys(Bytes),
    // New variants go below this line only: the enum's variant order is its encoding.
    /// EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT with Redis's overflow checks: `ms` is the argument
    /// in milliseconds, from now or since the epoch as `cmd` says.
    ExpireChecked {
        key: Bytes,
        ms: i64,
        cond: ExpireCond,
        cmd: TimeCmd,
    },
    /// SETEX / PSETEX: SET with a time to live in milliseconds (positive).
    SetEx {
        key: Bytes,
        value: Bytes,
        ms: u64,
        cmd: TimeCmd,
    },
    /// SETNX: SET NX answering 1 or 0.
    SetNx {
        key: Bytes,
        value: Bytes,
    },
    /// GETSET: SET GET.
    GetSet {
        key: Bytes,
        value: Bytes,
    },
    GetEx {
        key: Bytes,
        opt: GetExOpt,
    },
    GetDel(Bytes),
    /// EXPIRETIME / PEXPIRETIME.
    ExpireTime {
        key: Bytes,
        ms: bool,
    },
    /// The increment is read on the shard, after the key's type is checked, as Redis orders it.
    IncrByFloat {
        key: Bytes,
        incr: Bytes,
    },
    MGet(Vec<Bytes>),
    /// `keys[i]` is set to `values[i]`, in order (a repeated key ends with its last value).
    MSet {
        keys: Vec<Bytes>,
        values: Vec<Bytes>,
    },
    /// One shard's step of SCAN from scan position `from`: replies
    /// `[next position or -1 when done, keys examined, [keys...]]`. `type_name` is matched as
    /// TYPE names it (`string`, `bucket`), in any case.
    Scan {
        from: u64,
        count: u64,
        pattern: Option<Bytes>,
        type_name: Option<Bytes>,
    },
}

/// A limit decision as it goes on the wire:
/// `[allowed, limit, remaining, retry_after_ms, reset_after_ms]`.
pub type LimitReply = [i64; 5];

impl KeyCmd {
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
            | KeyCmd::Expire { key, .. }
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
            | KeyCmd::IncrByFloat { key, .. } => Some(key),
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

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const OOM: &str = "OOM command not allowed when the key limit or maxmemory is reached";
const NOT_INT: &str = "ERR value is not an integer or out of range";
const OVERFLOW: &str = "ERR increment or decrement would overflow";
const NOT_FLOAT: &str = "ERR value is not a valid float";
const NAN_OR_INF: &str = "ERR increment would produce NaN or Infinity";
/// The answer to a command whose reply would pass `MAX_REPLY_BYTES`.
pub const TOO_LARGE: &str = "ERR reply would exceed 64 MiB";

fn ceil_ms(ns: u64) -> i64 {
    i64::try_from(ns.div_ceil(NS_PER_MS)).unwrap_or(i64::MAX)
}

/// Turns a decision into its wire form, with times rounded up to whole milliseconds so a
/// client that waits `retry_after` is never early.
pub fn limit_reply(d: &Decision) -> LimitReply {
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

/// Counters a shard reports.
#[derive(Debug, Default, Clone, Copy)]
pub struct ExecStats {
    pub checks: u64,
    pub denied: u64,
}

/// Applies one command to the store at time `now` (ns).
pub fn execute(store: &mut Store, cmd: KeyCmd, now: u64, stats: &mut ExecStats) -> Reply {
    match cmd {
        KeyCmd::Get(key) => match store.get(&key, now).map(|e| e.value) {
            None => Reply::Nil,
            Some(Value::Str(s)) => Reply::Bulk(Bytes::copy_from_slice(s)),
            Some(Value::Int(v)) => Reply::Bulk(Bytes::from(v.to_string())),
            Some(Value::Bucket(_)) => Reply::err(WRONGTYPE),
        },
        KeyCmd::Set {
            key,
            value,
            expiry,
            cond,
            get,
        } => set(store, &key, value, expiry, cond, get, now, TimeCmd::Set),
        KeyCmd::IncrBy { key, delta } => incr_by(store, &key, delta, now),
        KeyCmd::Expire {
            key,
            ms,
            absolute,
            cond,
        } => expire(store, &key, ms, absolute, cond, now),
        KeyCmd::Persist(key) => match store.slot(&key, now) {
            Slot::Live(mut live) if live.get().expires_at != 0 => {
                if matches!(live.get().value, Value::Bucket(_)) {
                    // A bucket's expiry is when it is full again; it has no other meaning.
                    return Reply::Int(0);
                }
                live.set_expiry(0);
                Reply::Int(1)
            }
            _ => Reply::Int(0),
        },
        KeyCmd::Ttl { key, ms } => match store.get(&key, now) {
            None => Reply::Int(-2),
            Some(e) if e.expires_at == 0 => Reply::Int(-1),
            Some(e) => {
                let left = e.expires_at - now;
                Reply::Int(if ms {
                    ceil_ms(left)
                } else {
                    // Redis rounds TTL to the nearest second.
                    i64::try_from((left + 500 * NS_PER_MS) / (1000 * NS_PER_MS)).unwrap_or(i64::MAX)
                })
            }
        },
        KeyCmd::Type(key) => {
            Reply::Simple(Cow::Borrowed(match store.get(&key, now).map(|e| e.value) {
                None => "none",
                Some(Value::Bucket(_)) => "bucket",
                Some(_) => "string",
            }))
        }
        KeyCmd::Del(keys) => {
            Reply::Int(keys.iter().filter(|k| store.remove(k, now)).count() as i64)
        }
        KeyCmd::Exists(keys) => {
            Reply::Int(keys.iter().filter(|k| store.get(k, now).is_some()).count() as i64)
        }
        KeyCmd::Throttle { key, args } => {
            stats.checks += 1;
            throttle(store, &key, &args, now, stats)
        }
        KeyCmd::Check {
            key,
            rule,
            cost,
            peek,
        } => {
            stats.checks += 1;
            match check_one(store, &key, &rule, cost, peek, now) {
                Ok(d) => {
                    stats.denied += u64::from(!d.allowed);
                    Reply::Limit(limit_reply(&d))
                }
                Err(e) => e,
            }
        }
        KeyCmd::CheckAll {
            keys,
            rules,
            cost,
            peek,
        } => {
            stats.checks += 1;
            let r = check_all(store, &keys, &rules, cost, peek, now);
            if let Reply::LimitAll(summary, _) = &r {
                stats.denied += u64::from(summary[0] == 0);
            }
            r
        }
        KeyCmd::Refund { keys, rules, cost } => {
            for (key, rule) in keys.iter().zip(&rules) {
                if let Slot::Live(mut live) = store.slot(key, now)
                    && let Value::Bucket(state) = live.get().value
                {
                    match limiter::refund(rule, state, cost, now) {
                        Some(s) => live.set(Value::Bucket(s), limiter::expires_at(rule, &s)),
                        // Back to full: a full bucket is no bucket.
                        None => live.remove(),
                    }
                }
            }
            Reply::Ok
        }
        KeyCmd::Lease { key, rule, max } => {
            stats.checks += 1;
            lease(store, &key, &rule, max, now)
        }
        KeyCmd::DbSize => Reply::Int(store.len() as i64),
        KeyCmd::FlushAll => {
            store.clear();
            Reply::Ok
        }
        KeyCmd::ExpireChecked { key, ms, cond, cmd } => {
            // Redis refuses `when > LLONG_MAX - now` for a time from now, missing keys too.
            if !cmd.absolute() && ms.checked_add(ms_of(now)).is_none() {
                return Reply::err(cmd.invalid_expire());
            }
            expire(store, &key, ms, cmd.absolute(), cond, now)
        }
        KeyCmd::SetEx {
            key,
            value,
            ms,
            cmd,
        } => set(
            store,
            &key,
            value,
            SetExpiry::In(ms),
            SetCond::Always,
            false,
            now,
            cmd,
        ),
        KeyCmd::SetNx { key, value } => {
            match set(
                store,
                &key,
                value,
                SetExpiry::Clear,
                SetCond::IfAbsent,
                false,
                now,
                TimeCmd::Set,
            ) {
                Reply::Ok => Reply::Int(1),
                Reply::Nil => Reply::Int(0),
                other => other,
            }
        }
        KeyCmd::GetSet { key, value } => set(
            store,
            &key,
            value,
            SetExpiry::Clear,
            SetCond::Always,
            true,
            now,
            TimeCmd::Set,
        ),
        KeyCmd::GetEx { key, opt } => getex(store, &key, opt, now),
        KeyCmd::GetDel(key) => match store.slot(&key, now) {
            Slot::Live(live) => {
                let old = match string_reply(live.get().value) {
                    Some(r) => r,
                    None => return Reply::err(WRONGTYPE),
                };
                live.remove();
                old
            }
            Slot::Empty(_) => Reply::Nil,
        },
        KeyCmd::ExpireTime { key, ms } => match store.get(&key, now) {
            None => Reply::Int(-2),
            Some(e) if e.expires_at == 0 => Reply::Int(-1),
            Some(e) => {
                let at = i64::try_from(e.expires_at / NS_PER_MS).unwrap_or(i64::MAX);
                Reply::Int(if ms { at } else { (at + 500) / 1000 })
            }
        },
        KeyCmd::IncrByFloat { key, incr } => incr_by_float(store, &key, &incr, now),
        KeyCmd::MGet(keys) => mget(store, &keys, now),
        KeyCmd::MSet { keys, values } => mset(store, &keys, &values, now),
        KeyCmd::Keys(pattern) => {
            let mut out = Vec::new();
            store.for_each_key(now, |k| {
                if crate::glob::matches(&pattern, k) {
                    out.push(Reply::Bulk(Bytes::copy_from_slice(k)));
                }
            });
            Reply::Array(out)
        }
        KeyCmd::Scan {
            from,
            count,
            pattern,
            type_name,
        } => {
            let mut keys = Vec::new();
            let count = usize::try_from(count).unwrap_or(usize::MAX);
            let step = store.scan(from, count, now, |k, v| {
                let kind: &[u8] = if matches!(v, Value::Bucket(_)) {
                    b"bucket"
                } else {
                    b"string"
                };
                if pattern.as_ref().is_none_or(|p| crate::glob::matches(p, k))
                    && type_name
                        .as_ref()
                        .is_none_or(|t| t.eq_ignore_ascii_case(kind))
                {
                    keys.push(Reply::Bulk(Bytes::copy_from_slice(k)));
                }
            });
            let next = step.next.and_then(|n| i64::try_from(n).ok()).unwrap_or(-1);
            let examined = i64::try_from(step.examined).unwrap_or(i64::MAX);
            Reply::Array(vec![
                Reply::Int(next),
                Reply::Int(examined),
                Reply::Array(keys),
            ])
        }
    }
}

/// Milliseconds since the epoch, Redis's `mstime()` at `now` (ns).
fn ms_of(now: u64) -> i64 {
    (now / NS_PER_MS) as i64
}

/// How a string is kept: integers as counters, anything else as bytes.
fn string_value(value: &[u8]) -> Value<'_> {
    match crate::protocol::args::parse_i64(value) {
        Some(v) => Value::Int(v),
        None => Value::Str(value),
    }
}

/// A string key's value as a bulk reply; None for a bucket.
fn string_reply(value: Value<'_>) -> Option<Reply> {
    match value {
        Value::Str(s) => Some(Reply::Bulk(Bytes::copy_from_slice(s))),
        Value::Int(v) => Some(Reply::Bulk(Bytes::from(v.to_string()))),
        Value::Bucket(_) => None,
    }
}

/// True if `now_ms + ms` passes `i64::MAX`: Redis's overflow test for a time from now.
fn relative_overflows(ms: u64, now: u64) -> bool {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| ms.checked_add(ms_of(now)))
        .is_none()
}

/// SET and the commands Redis builds on it. A relative expiry whose absolute time would pass
/// `i64::MAX` milliseconds is refused, naming `cmd`, before anything else happens. Times that
/// Redis accepts but that lie past 2554 (bucketd's clock is u64 nanoseconds) are clamped to that
/// end: such a key simply never expires in practice, as in Redis.
#[allow(clippy::too_many_arguments)]
fn set(
    store: &mut Store,
    key: &[u8],
    value: Bytes,
    expiry: SetExpiry,
    cond: SetCond,
    get: bool,
    now: u64,
    cmd: TimeCmd,
) -> Reply {
    if let SetExpiry::In(ms) = expiry
        && relative_overflows(ms, now)
    {
        return Reply::err(cmd.invalid_expire());
    }
    let stored = string_value(&value);
    let abs = |ms: u64| -> u64 { ms.saturating_mul(NS_PER_MS) };
    let slot = store.slot(key, now);
    let old = match &slot {
        Slot::Live(l) => match string_reply(l.get().value) {
            Some(r) => r,
            None if get => return Reply::err(WRONGTYPE),
            None => Reply::Nil,
        },
        Slot::Empty(_) => Reply::Nil,
    };
    let done = |applied: bool| -> Reply {
        if get {
            old.clone()
        } else if applied {
            Reply::Ok
        } else {
            Reply::Nil
        }
    };
    match slot {
        Slot::Live(mut live) => {
            if cond == SetCond::IfAbsent {
                return done(false);
            }
            let exp = match expiry {
                SetExpiry::Clear => 0,
                SetExpiry::KeepTtl => live.get().expires_at,
                SetExpiry::In(ms) => now.saturating_add(abs(ms)),
                SetExpiry::At(ms) => abs(ms).max(1),
            };
            live.set(stored, exp);
            done(true)
        }
        Slot::Empty(empty) => {
            if cond == SetCond::IfPresent {
                return done(false);
            }
            let exp = match expiry {
                SetExpiry::Clear | SetExpiry::KeepTtl => 0,
                SetExpiry::In(ms) => now.saturating_add(abs(ms)),
                SetExpiry::At(ms) => abs(ms).max(1),
            };
            match empty.insert(stored, exp) {
                Ok(()) => done(true),
                Err(StoreFull) => Reply::err(OOM),
            }
        }
    }
}

fn incr_by(store: &mut Store, key: &[u8], delta: i64, now: u64) -> Reply {
    match store.slot(key, now) {
        Slot::Live(mut live) => {
            let cur = match live.get().value {
                Value::Int(v) => v,
                Value::Str(s) => match crate::protocol::args::parse_i64(s) {
                    Some(v) => v,
                    None => return Reply::err(NOT_INT),
                },
                Value::Bucket(_) => return Reply::err(WRONGTYPE),
            };
            let Some(next) = cur.checked_add(delta) else {
                return Reply::err(OVERFLOW);
            };
            let exp = live.get().expires_at;
            live.set(Value::Int(next), exp);
            Reply::Int(next)
        }
        Slot::Empty(empty) => match empty.insert(Value::Int(delta), 0) {
            Ok(()) => Reply::Int(delta),
            Err(StoreFull) => Reply::err(OOM),
        },
    }
}

/// GETEX, in Redis's order: a missing key is nil and a bucket WRONGTYPE whatever the option
/// says; only then is the time checked.
fn getex(store: &mut Store, key: &[u8], opt: GetExOpt, now: u64) -> Reply {
    let Slot::Live(mut live) = store.slot(key, now) else {
        return Reply::Nil;
    };
    let Some(value) = string_reply(live.get().value) else {
        return Reply::err(WRONGTYPE);
    };
    match opt {
        GetExOpt::Keep => {}
        GetExOpt::NotInteger => return Reply::err(NOT_INT),
        GetExOpt::Invalid => return Reply::err(TimeCmd::GetEx.invalid_expire()),
        GetExOpt::Persist => {
            if live.get().expires_at != 0 {
                live.set_expiry(0);
            }
        }
        GetExOpt::In(ms) => {
            if relative_overflows(ms, now) {
                return Reply::err(TimeCmd::GetEx.invalid_expire());
            }
            live.set_expiry(now.saturating_add(ms.saturating_mul(NS_PER_MS)));
        }
        GetExOpt::At(ms) => {
            // Redis deletes a key whose absolute time is not after the current millisecond.
            if i64::try_from(ms).is_ok_and(|ms| ms <= ms_of(now)) {
                live.remove();
            } else {
                live.set_expiry(ms.saturating_mul(NS_PER_MS));
            }
        }
    }
    value
}

/// INCRBYFLOAT: the sum in Redis's `long double` arithmetic (see `cmd::float`), stored as the
/// string Redis would store; the key keeps its TTL.
fn incr_by_float(store: &mut Store, key: &[u8], incr: &[u8], now: u64) -> Reply {
    // None: an infinite operand, which can only make the sum infinite or NaN.
    let read = |s: &[u8]| match float::parse(s) {
        Some(float::Parsed::Finite(v)) => Ok(Some(v)),
        Some(float::Parsed::Infinite) => Ok(None),
        None => Err(Reply::err(NOT_FLOAT)),
    };
    let slot = store.slot(key, now);
    let current = match &slot {
        Slot::Live(live) => match live.get().value {
            Value::Int(v) => Ok(Some(float::LongDouble::from_i64(v))),
            Value::Str(s) => read(s),
            Value::Bucket(_) => return Reply::err(WRONGTYPE),
        },
        Slot::Empty(_) => Ok(Some(float::LongDouble::from_i64(0))),
    };
    let (current, incr) = match (current, read(incr)) {
        (Ok(c), Ok(i)) => (c, i),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    let Some(sum) = current.zip(incr).and_then(|(c, i)| float::add(c, i)) else {
        return Reply::err(NAN_OR_INF);
    };
    let text = float::format(sum);
    let stored = string_value(text.as_bytes());
    match slot {
        Slot::Live(mut live) => {
            let exp = live.get().expires_at;
            live.set(stored, exp);
        }
        Slot::Empty(empty) => {
            if empty.insert(stored, 0).is_err() {
                return Reply::err(OOM);
            }
        }
    }
    Reply::Bulk(Bytes::from(text))
}

/// MGET: nil for a missing key and for a bucket (Redis answers nil for any non-string), and an
/// error rather than a reply whose values pass `MAX_REPLY_BYTES`.
fn mget(store: &Store, keys: &[Bytes], now: u64) -> Reply {
    let mut total = 0usize;
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let r = match store.get(key, now).map(|e| string_reply(e.value)) {
            Some(Some(r)) => r,
            _ => Reply::Nil,
        };
        if let Reply::Bulk(b) = &r {
            total += b.len();
            if total > MAX_REPLY_BYTES {
                return Reply::err(TOO_LARGE);
            }
        }
        out.push(r);
    }
    Reply::Array(out)
}

/// MSET on one shard: every key or none. A key the store has no room for undoes the keys
/// already set, newest first, and answers OOM.
fn mset(store: &mut Store, keys: &[Bytes], values: &[Bytes], now: u64) -> Reply {
    // What each key held before (None: absent) and its expiry, in the order they were set.
    type Before = Option<(OwnedValue, u64)>;
    let mut undo: Vec<(&[u8], Before)> = Vec::with_capacity(keys.len());
    for (key, value) in keys.iter().zip(values) {
        let stored = string_value(value);
        match store.slot(key, now) {
            Slot::Live(mut live) => {
                let e = live.get();
                let before = match e.value {
                    Value::Bucket(b) => OwnedValue::Bucket(b),
                    Value::Int(i) => OwnedValue::Int(i),
                    Value::Str(s) => OwnedValue::Str(s.to_vec()),
                };
                undo.push((key, Some((before, e.expires_at))));
                live.set(stored, 0);
            }
            Slot::Empty(empty) => {
                if empty.insert(stored, 0).is_err() {
                    for (key, before) in undo.into_iter().rev() {
                        match (store.slot(key, now), before) {
                            (Slot::Live(live), None) => live.remove(),
                            (Slot::Live(mut live), Some((v, exp))) => {
                                let v = match &v {
                                    OwnedValue::Bucket(b) => Value::Bucket(*b),
                                    OwnedValue::Int(i) => Value::Int(*i),
                                    OwnedValue::Str(s) => Value::Str(s),
                                };
                                live.set(v, exp);
                            }
                            // Every key set above is live: nothing set it to expire.
                            (Slot::Empty(_), _) => {}
                        }
                    }
                    return Reply::err(OOM);
                }
                undo.push((key, None));
            }
        }
    }
    Reply::Ok
}

fn expire(
    store: &mut Store,
    key: &[u8],
    ms: i64,
    absolute: bool,
    cond: ExpireCond,
    now: u64,
) -> Reply {
    let Slot::Live(mut live) = store.slot(key, now) else {
        return Reply::Int(0);
    };
    if matches!(live.get().value, Value::Bucket(_)) {
        // A bucket expires when it has refilled; letting a client shorten that would refund
        // tokens, so only DEL / BK.RESET clear a bucket early.
        return Reply::Int(0);
    }
    let target: i128 = if absolute {
        i128::from(ms) * i128::from(NS_PER_MS)
    } else {
        i128::from(now) + i128::from(ms) * i128::from(NS_PER_MS)
    };
    let current = live.get().expires_at;
    let allowed = match cond {
        ExpireCond::Always => true,
        ExpireCond::Nx => current == 0,
        ExpireCond::Xx => current != 0,
        // A key without TTL counts as an infinite TTL for GT and LT.
        ExpireCond::Gt => current != 0 && target > i128::from(current),
        ExpireCond::Lt => current == 0 || target < i128::from(current),
        ExpireCond::XxLt => current != 0 && target < i128::from(current),
    };
    if !allowed {
        return Reply::Int(0);
    }
    if target <= i128::from(now) {
        live.remove();
    } else {
        // Past 2554 bucketd's u64 nanosecond clock ends: such an expiry is clamped to that end.
        live.set_expiry(u64::try_from(target).unwrap_or(u64::MAX));
    }
    Reply::Int(1)
}

fn bucket_state(slot: &Slot<'_>) -> Result<Option<State>, Reply> {
    match slot {
        Slot::Live(l) => match l.get().value {
            Value::Bucket(s) => Ok(Some(s)),
            _ => Err(Reply::err(WRONGTYPE)),
        },
        Slot::Empty(_) => Ok(None),
    }
}

/// Stores a new limiter state in `slot`. A full store refuses new keys with an error, and
/// never drops a live bucket to make room.
fn store_state(slot: Slot<'_>, state: State, expires_at: u64) -> Result<(), Reply> {
    match slot {
        Slot::Live(mut live) => {
            live.set(Value::Bucket(state), expires_at);
            Ok(())
        }
        Slot::Empty(empty) => empty
            .insert(Value::Bucket(state), expires_at)
            .map_err(|StoreFull| Reply::err(OOM)),
    }
}

fn throttle(
    store: &mut Store,
    key: &[u8],
    args: &CellArgs,
    now: u64,
    stats: &mut ExecStats,
) -> Reply {
    let slot = store.slot(key, now);
    let tat = match bucket_state(&slot) {
        Ok(Some(State::Gcra { tat })) => Some(tat),
        Ok(_) => None,
        Err(e) => return e,
    };
    let out = cell::throttle(tat, args, now);
    match (out.write, slot) {
        (CellWrite::Keep, _) | (CellWrite::Remove, Slot::Empty(_)) => {}
        // Only a tat is dropped; another algorithm's state on the key stays.
        (CellWrite::Remove, Slot::Live(live)) if tat.is_some() => live.remove(),
        (CellWrite::Remove, Slot::Live(_)) => {}
        (CellWrite::Store { tat, expires_at }, slot) => {
            if let Err(e) = store_state(slot, State::Gcra { tat }, expires_at) {
                return e;
            }
        }
    }
    match out.reply {
        Ok(reply) => {
            stats.denied += u64::from(reply[0] == 1);
            Reply::Limit(reply)
        }
        Err(e) => Reply::Error(Cow::Owned(e.to_string())),
    }
}

fn check_one(
    store: &mut Store,
    key: &[u8],
    rule: &Rule,
    cost: u64,
    peek: bool,
    now: u64,
) -> Result<Decision, Reply> {
    let slot = store.slot(key, now);
    let state = bucket_state(&slot)?;
    let out = limiter::check(rule, state, cost, now);
    if out.decision.allowed
        && !peek
        && let Some(s) = out.new_state
    {
        store_state(slot, s, out.expires_at)?;
    }
    Ok(out.decision)
}

fn check_all(
    store: &mut Store,
    keys: &[Bytes],
    rules: &[Rule],
    cost: u64,
    peek: bool,
    now: u64,
) -> Reply {
    // Evaluate every limit first, commit only if all pass: within one shard nothing can
    // interleave, so this is atomic.
    let mut outcomes = Vec::with_capacity(keys.len());
    for (key, rule) in keys.iter().zip(rules) {
        let state = match store.get(key, now).map(|e| e.value) {
            None => None,
            Some(Value::Bucket(s)) => Some(s),
            Some(_) => return Reply::err(WRONGTYPE),
        };
        outcomes.push((state, limiter::check(rule, state, cost, now)));
    }
    let allowed = outcomes.iter().all(|(_, o)| o.decision.allowed);
    if allowed && !peek {
        for (key, (_, out)) in keys.iter().zip(&outcomes) {
            if let Some(s) = out.new_state
                && let Err(e) = store_state(store.slot(key, now), s, out.expires_at)
            {
                return e;
            }
        }
    }
    let each: Vec<LimitReply> = outcomes
        .iter()
        .zip(rules)
        .map(|((state, out), rule)| {
            if allowed || !out.decision.allowed {
                limit_reply(&out.decision)
            } else {
                // This limit would have passed but nothing was taken: report what it has now.
                let mut r = limit_reply(&limiter::check(rule, *state, 0, now).decision);
                r[0] = 1;
                r
            }
        })
        .collect();
    Reply::LimitAll(summarize(&each, allowed), each)
}

/// Picks the limit that decides a multi-limit check: when allowed, the one with the least
/// remaining; when denied, the refusing one with the longest wait (-1, never, longest of all).
pub fn summarize(each: &[LimitReply], allowed: bool) -> LimitReply {
    let pick = if allowed {
        each.iter().min_by_key(|r| (r[2], -r[4]))
    } else {
        each.iter()
            .filter(|r| r[0] == 0)
            .max_by_key(|r| if r[3] < 0 { i64::MAX } else { r[3] })
    };
    let mut s = pick.copied().unwrap_or([i64::from(allowed), 0, 0, -1, 0]);
    s[0] = i64::from(allowed);
    if allowed {
        s[3] = -1;
    }
    s
}

fn lease(store: &mut Store, key: &[u8], rule: &Rule, max: u64, now: u64) -> Reply {
    let slot = store.slot(key, now);
    let state = match bucket_state(&slot) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let available = limiter::check(rule, state, 0, now).decision.remaining;
    let take = available.min(max);
    if take == 0 {
        let d = limiter::check(rule, state, 1, now).decision;
        let mut r = limit_reply(&d);
        r[0] = 0;
        return Reply::Limit(r);
    }
    let out = limiter::check(rule, state, take, now);
    if let Some(s) = out.new_state
        && let Err(e) = store_state(slot, s, out.expires_at)
    {
        return e;
    }
    let mut r = limit_reply(&out.decision);
    r[0] = i64::try_from(take).unwrap_or(i64::MAX);
    Reply::Limit(r)
}
