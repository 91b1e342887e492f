//! The string commands: GET, SET and its variants, counters, INCRBYFLOAT, MGET, MSET. Their
//! entries, how their arguments parse, and how a shard runs them.

use super::keyed::{
    GetExOpt, KeyCmd, MAX_REPLY_BYTES, NAN_OR_INF, NOT_FLOAT, NOT_INT, NS_PER_MS, OOM, OVERFLOW,
    Reply, SetCond, SetExpiry, TOO_LARGE, TimeCmd, WRONGTYPE, ms_of, relative_overflows,
    string_reply, string_value,
};
use super::table::{CommandSpec, Parser, command};
use super::{MultiCmd, ParseError, Parsed, c_str, float};
use crate::protocol::{ArgError, Args};
use crate::rules::RuleSet;
use crate::store::{OwnedValue, Slot, Store, StoreFull, Value};
use bytes::Bytes;

pub(super) const COMMANDS: &[CommandSpec] = &[
    command! {
        name: "get",
        arity: 2,
        flags: ["readonly", "fast"],
        keys: (1, 1, 1),
        acl: ["@read", "@string", "@fast"],
        group: "string",
        summary: "Returns the string value of a key.",
        parse: Parser::Key(parse_get),
    },
    command! {
        name: "set",
        arity: -3,
        flags: ["write", "denyoom"],
        keys: (1, 1, 1),
        acl: ["@write", "@string", "@slow"],
        group: "string",
        summary: "Sets the string value of a key: EX, PX, EXAT, PXAT, KEEPTTL, NX, XX, GET.",
        parse: Parser::Key(parse_set),
    },
    command! {
        name: "incr",
        arity: 2,
        flags: ["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@string", "@fast"],
        group: "string",
        summary: "Increments the integer value of a key by one.",
        parse: Parser::Key(parse_incr),
    },
    command! {
        name: "incrby",
        arity: 3,
        flags: ["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@string", "@fast"],
        group: "string",
        summary: "Increments the integer value of a key by a number.",
        parse: Parser::Key(parse_incrby),
    },
    command! {
        name: "decr",
        arity: 2,
        flags: ["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@string", "@fast"],
        group: "string",
        summary: "Decrements the integer value of a key by one.",
        parse: Parser::Key(parse_decr),
    },
    command! {
        name: "decrby",
        arity: 3,
        flags: ["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@string", "@fast"],
        group: "string",
        summary: "Decrements the integer value of a key by a number.",
        parse: Parser::Key(parse_decrby),
    },
    command! {
        name: "setex",
        arity: 4,
        flags: ["write", "denyoom"],
        keys: (1, 1, 1),
        acl: ["@write", "@string", "@slow"],
        group: "string",
        summary: "Sets the string value and time to live in seconds of a key.",
        parse: Parser::Key(parse_setex),
    },
    command! {
        name: "psetex",
        arity: 4,
        flags: ["write", "denyoom"],
        keys: (1, 1, 1),
        acl: ["@write", "@string", "@slow"],
        group: "string",
        summary: "Sets the string value and time to live in milliseconds of a key.",
        parse: Parser::Key(parse_psetex),
    },
    command! {
        name: "setnx",
        arity: 3,
        flags: ["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@string", "@fast"],
        group: "string",
        summary: "Sets the string value of a key only if the key does not exist.",
        parse: Parser::Key(parse_setnx),
    },
    command! {
        name: "getset",
        arity: 3,
        flags: ["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@string", "@fast"],
        group: "string",
        summary: "Sets the string value of a key and returns its old value.",
        parse: Parser::Key(parse_getset),
    },
    command! {
        name: "getex",
        arity: -2,
        flags: ["write", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@string", "@fast"],
        group: "string",
        summary: "Returns the string value of a key and optionally sets its expiry: EX, PX, EXAT, PXAT, PERSIST.",
        parse: Parser::Key(parse_getex),
    },
    command! {
        name: "getdel",
        arity: 2,
        flags: ["write", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@string", "@fast"],
        group: "string",
        summary: "Returns the string value of a key and deletes the key.",
        parse: Parser::Key(parse_getdel),
    },
    command! {
        name: "incrbyfloat",
        arity: 3,
        flags: ["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@string", "@fast"],
        group: "string",
        summary: "Increments the float value of a key by a number.",
        parse: Parser::Key(parse_incrbyfloat),
    },
    command! {
        name: "mget",
        arity: -2,
        flags: ["readonly", "fast"],
        keys: (1, -1, 1),
        acl: ["@read", "@string", "@fast"],
        group: "string",
        summary: "Returns the string values of several keys.",
        parse: Parser::Key(parse_mget),
    },
    command! {
        name: "mset",
        arity: -3,
        flags: ["write", "denyoom"],
        keys: (1, -1, 2),
        acl: ["@write", "@string", "@slow"],
        group: "string",
        summary: "Sets several keys to their values.",
        parse: Parser::Key(parse_mset),
    },
];

/// GET key
fn parse_get(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let k = a.next_bytes()?;
    keyed(KeyCmd::Get(k))
}

/// SET key value [NX | XX] [GET] [EX s | PX ms | EXAT unix-s | PXAT unix-ms | KEEPTTL]
fn parse_set(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let value = a.next_bytes()?;
    let o = parse_string_opts(a, true)?;
    let cond = match (o.nx, o.xx) {
        (true, _) => SetCond::IfAbsent,
        (_, true) => SetCond::IfPresent,
        _ => SetCond::Always,
    };
    let expiry = match o.expire {
        None if o.keepttl => SetExpiry::KeepTtl,
        None => SetExpiry::Clear,
        Some((unit, raw)) => {
            let ms = expire_ms(unit, &raw).map_err(|e| e.into_arg(TimeCmd::Set))?;
            if unit.absolute() {
                SetExpiry::At(ms)
            } else {
                SetExpiry::In(ms)
            }
        }
    };
    keyed(KeyCmd::Set {
        key,
        value,
        expiry,
        cond,
        get: o.get,
    })
}

/// INCR key
fn parse_incr(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    incr_by_cmd(a.next_bytes()?, 1)
}

/// DECR key
fn parse_decr(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    incr_by_cmd(a.next_bytes()?, -1)
}

/// INCRBY key n
fn parse_incrby(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    incr_by_cmd(key, a.next_i64()?)
}

/// DECRBY key n
fn parse_decrby(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let delta = a
        .next_i64()?
        .checked_neg()
        .ok_or(ArgError::Msg("ERR decrement would overflow".into()))?;
    incr_by_cmd(key, delta)
}

fn incr_by_cmd(key: Bytes, delta: i64) -> Result<Parsed, ParseError> {
    keyed(KeyCmd::IncrBy { key, delta })
}

/// SETEX key seconds value
fn parse_setex(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    set_ex_cmd(a, TimeCmd::SetEx, ExpireUnit::Ex)
}

/// PSETEX key milliseconds value
fn parse_psetex(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    set_ex_cmd(a, TimeCmd::PSetEx, ExpireUnit::Px)
}

fn set_ex_cmd(a: &mut Args, cmd: TimeCmd, unit: ExpireUnit) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let time = a.next_bytes()?;
    let value = a.next_bytes()?;
    let ms = expire_ms(unit, &time).map_err(|e| e.into_arg(cmd))?;
    keyed(KeyCmd::SetEx {
        key,
        value,
        ms,
        cmd,
    })
}

/// SETNX key value
fn parse_setnx(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let value = a.next_bytes()?;
    keyed(KeyCmd::SetNx { key, value })
}

/// GETSET key value
fn parse_getset(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let value = a.next_bytes()?;
    keyed(KeyCmd::GetSet { key, value })
}

/// GETEX key [EX s | PX ms | EXAT unix-s | PXAT unix-ms | PERSIST]
fn parse_getex(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let o = parse_string_opts(a, false)?;
    let opt = match o.expire {
        None if o.persist => GetExOpt::Persist,
        None => GetExOpt::Keep,
        Some((unit, raw)) => match expire_ms(unit, &raw) {
            Ok(ms) if unit.absolute() => GetExOpt::At(ms),
            Ok(ms) => GetExOpt::In(ms),
            Err(BadExpire::NotInteger) => GetExOpt::NotInteger,
            Err(BadExpire::Invalid) => GetExOpt::Invalid,
        },
    };
    keyed(KeyCmd::GetEx { key, opt })
}

/// GETDEL key
fn parse_getdel(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let k = a.next_bytes()?;
    keyed(KeyCmd::GetDel(k))
}

/// INCRBYFLOAT key increment
fn parse_incrbyfloat(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let incr = a.next_bytes()?;
    keyed(KeyCmd::IncrByFloat { key, incr })
}

/// MGET key [key ...]
fn parse_mget(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    Ok(Parsed::Multi(MultiCmd::MGet(a.rest())))
}

/// MSET key value [key value ...]
fn parse_mset(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    if !a.remaining().is_multiple_of(2) {
        return Err(a.arity_error().into());
    }
    let rest = a.rest();
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    for pair in rest.chunks_exact(2) {
        keys.push(pair[0].clone());
        values.push(pair[1].clone());
    }
    Ok(Parsed::Multi(MultiCmd::MSet { keys, values }))
}

fn keyed(cmd: KeyCmd) -> Result<Parsed, ParseError> {
    Ok(Parsed::Keyed(cmd))
}

/// The unit of an EX / PX / EXAT / PXAT option.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ExpireUnit {
    Ex,
    Px,
    ExAt,
    PxAt,
}

impl ExpireUnit {
    fn of(opt: &[u8]) -> Option<ExpireUnit> {
        [
            ("EX", ExpireUnit::Ex),
            ("PX", ExpireUnit::Px),
            ("EXAT", ExpireUnit::ExAt),
            ("PXAT", ExpireUnit::PxAt),
        ]
        .into_iter()
        .find(|(name, _)| opt.eq_ignore_ascii_case(name.as_bytes()))
        .map(|(_, u)| u)
    }

    fn seconds(self) -> bool {
        matches!(self, ExpireUnit::Ex | ExpireUnit::ExAt)
    }

    fn absolute(self) -> bool {
        matches!(self, ExpireUnit::ExAt | ExpireUnit::PxAt)
    }
}

/// Why an expire time was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BadExpire {
    NotInteger,
    /// Zero, negative, or too large to be milliseconds.
    Invalid,
}

impl BadExpire {
    fn into_arg(self, cmd: TimeCmd) -> ArgError {
        match self {
            BadExpire::NotInteger => ArgError::NotInteger,
            BadExpire::Invalid => ArgError::Msg(cmd.invalid_expire().into()),
        }
    }
}

/// The time of an expire option in milliseconds, checked as Redis's
/// `getExpireMillisecondsOrReply` does before it adds the current time.
fn expire_ms(unit: ExpireUnit, raw: &[u8]) -> Result<u64, BadExpire> {
    let n = crate::protocol::parse_i64(raw).ok_or(BadExpire::NotInteger)?;
    if n <= 0 || (unit.seconds() && n > i64::MAX / 1000) {
        return Err(BadExpire::Invalid);
    }
    let ms = if unit.seconds() { n * 1000 } else { n };
    u64::try_from(ms).map_err(|_| BadExpire::Invalid)
}

/// SET's and GETEX's options, accepted exactly as Redis's `parseExtendedStringArgumentsOrReply`
/// accepts them: an option may repeat (the last time given wins), options that contradict each
/// other are a syntax error. The time itself is only read afterwards.
#[derive(Default)]
struct StringOpts {
    nx: bool,
    xx: bool,
    get: bool,
    keepttl: bool,
    persist: bool,
    expire: Option<(ExpireUnit, Bytes)>,
}

fn parse_string_opts(a: &mut Args, set: bool) -> Result<StringOpts, ArgError> {
    let mut o = StringOpts::default();
    while let Some(arg) = a.next_opt() {
        let opt = c_str(&arg);
        let is = |kw: &str| opt.eq_ignore_ascii_case(kw.as_bytes());
        let unit = o.expire.as_ref().map(|(u, _)| *u);
        if set && is("NX") && !o.xx {
            o.nx = true;
        } else if set && is("XX") && !o.nx {
            o.xx = true;
        } else if set && is("GET") {
            o.get = true;
        } else if set && is("KEEPTTL") && unit.is_none() {
            o.keepttl = true;
        } else if !set && is("PERSIST") && unit.is_none() {
            o.persist = true;
        } else if let Some(u) = ExpireUnit::of(opt)
            && !o.keepttl
            && !o.persist
            && unit.is_none_or(|prev| prev == u)
            && a.remaining() > 0
        {
            o.expire = Some((u, a.next_bytes()?));
        } else {
            return Err(ArgError::Syntax);
        }
    }
    Ok(o)
}

pub(super) fn get(store: &Store, key: &[u8], now: u64) -> Reply {
    match store.get(key, now).map(|e| e.value) {
        None => Reply::Nil,
        Some(Value::Str(s)) => Reply::Bulk(Bytes::copy_from_slice(s)),
        Some(Value::Int(v)) => Reply::Bulk(Bytes::from(v.to_string())),
        Some(Value::Bucket(_) | Value::Semaphore(_) | Value::Hash(_) | Value::Coll(_)) => {
            Reply::err(WRONGTYPE)
        }
    }
}

pub(super) fn setex(
    store: &mut Store,
    key: &[u8],
    value: Bytes,
    ms: u64,
    cmd: TimeCmd,
    now: u64,
) -> Reply {
    set(
        store,
        key,
        value,
        SetExpiry::In(ms),
        SetCond::Always,
        false,
        now,
        cmd,
    )
}

/// SETNX: SET NX answering 1 or 0.
pub(super) fn setnx(store: &mut Store, key: &[u8], value: Bytes, now: u64) -> Reply {
    match set(
        store,
        key,
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

/// GETSET: SET GET.
pub(super) fn getset(store: &mut Store, key: &[u8], value: Bytes, now: u64) -> Reply {
    set(
        store,
        key,
        value,
        SetExpiry::Clear,
        SetCond::Always,
        true,
        now,
        TimeCmd::Set,
    )
}

pub(super) fn getdel(store: &mut Store, key: &[u8], now: u64) -> Reply {
    match store.slot(key, now) {
        Slot::Live(live) => {
            let old = match string_reply(live.get().value) {
                Some(r) => r,
                None => return Reply::err(WRONGTYPE),
            };
            live.remove();
            old
        }
        Slot::Empty(_) => Reply::Nil,
    }
}

/// SET and the commands Redis builds on it. A relative expiry whose absolute time would pass
/// `i64::MAX` milliseconds is refused, naming `cmd`, before anything else happens. Times that
/// Redis accepts but that lie past 2554 (bucketd's clock is u64 nanoseconds) are clamped to that
/// end: such a key simply never expires in practice, as in Redis.
#[allow(clippy::too_many_arguments)]
pub(super) fn set(
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

pub(super) fn incr_by(store: &mut Store, key: &[u8], delta: i64, now: u64) -> Reply {
    match store.slot(key, now) {
        Slot::Live(mut live) => {
            let cur = match live.get().value {
                Value::Int(v) => v,
                Value::Str(s) => match crate::protocol::parse_i64(s) {
                    Some(v) => v,
                    None => return Reply::err(NOT_INT),
                },
                Value::Bucket(_) | Value::Semaphore(_) | Value::Hash(_) | Value::Coll(_) => {
                    return Reply::err(WRONGTYPE);
                }
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
pub(super) fn getex(store: &mut Store, key: &[u8], opt: GetExOpt, now: u64) -> Reply {
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
pub(super) fn incr_by_float(store: &mut Store, key: &[u8], incr: &[u8], now: u64) -> Reply {
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
            Value::Bucket(_) | Value::Semaphore(_) | Value::Hash(_) | Value::Coll(_) => {
                return Reply::err(WRONGTYPE);
            }
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
pub(super) fn mget(store: &Store, keys: &[Bytes], now: u64) -> Reply {
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
pub(super) fn mset(store: &mut Store, keys: &[Bytes], values: &[Bytes], now: u64) -> Reply {
    // What each key held before (None: absent) and its expiry, in the order they were set.
    type Before = Option<(OwnedValue, u64)>;
    let mut undo: Vec<(&[u8], Before)> = Vec::with_capacity(keys.len());
    for (key, value) in keys.iter().zip(values) {
        let stored = string_value(value);
        match store.slot(key, now) {
            Slot::Live(mut live) => {
                let e = live.get();
                undo.push((key, Some((OwnedValue::from(e.value), e.expires_at))));
                live.set(stored, 0);
            }
            Slot::Empty(empty) => {
                if empty.insert(stored, 0).is_err() {
                    for (key, before) in undo.into_iter().rev() {
                        match (store.slot(key, now), before) {
                            (Slot::Live(live), None) => live.remove(),
                            (Slot::Live(mut live), Some((v, exp))) => {
                                let (mut holders, mut coll) = (Vec::new(), None);
                                live.set(v.as_value(&mut holders, &mut coll), exp);
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
