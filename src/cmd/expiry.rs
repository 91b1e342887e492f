//! Expiry: EXPIRE and its variants, PERSIST, TTL, PTTL, EXPIRETIME, PEXPIRETIME. Their entries,
//! how their arguments parse, and how a shard runs them.
//!
//! A bucket's expiry is when it is full again; these commands never change it.

use super::keyed::{ExpireCond, KeyCmd, NS_PER_MS, Reply, TimeCmd, ceil_ms, ms_of};
use super::table::{CommandSpec, Parser, command};
use super::{ParseError, Parsed, c_str};
use crate::protocol::{ArgError, Args};
use crate::rules::RuleSet;
use crate::store::{Slot, Store};

pub(super) const COMMANDS: &[CommandSpec] = &[
    command! {
        name: "expiretime",
        arity: 2,
        flags: ["readonly", "fast"],
        keys: (1, 1, 1),
        acl: ["@keyspace", "@read", "@fast"],
        group: "generic",
        summary: "Returns a key's expiry as a unix time in seconds.",
        parse: Parser::Key(parse_expiretime),
    },
    command! {
        name: "pexpiretime",
        arity: 2,
        flags: ["readonly", "fast"],
        keys: (1, 1, 1),
        acl: ["@keyspace", "@read", "@fast"],
        group: "generic",
        summary: "Returns a key's expiry as a unix time in milliseconds.",
        parse: Parser::Key(parse_pexpiretime),
    },
    command! {
        name: "expire",
        arity: -3,
        flags: ["write", "fast"],
        keys: (1, 1, 1),
        acl: ["@keyspace", "@write", "@fast"],
        group: "generic",
        summary: "Sets a key's time to live in seconds.",
        parse: Parser::Key(parse_expire),
    },
    command! {
        name: "pexpire",
        arity: -3,
        flags: ["write", "fast"],
        keys: (1, 1, 1),
        acl: ["@keyspace", "@write", "@fast"],
        group: "generic",
        summary: "Sets a key's time to live in milliseconds.",
        parse: Parser::Key(parse_pexpire),
    },
    command! {
        name: "expireat",
        arity: -3,
        flags: ["write", "fast"],
        keys: (1, 1, 1),
        acl: ["@keyspace", "@write", "@fast"],
        group: "generic",
        summary: "Sets a key's expiry as a unix time in seconds.",
        parse: Parser::Key(parse_expireat),
    },
    command! {
        name: "pexpireat",
        arity: -3,
        flags: ["write", "fast"],
        keys: (1, 1, 1),
        acl: ["@keyspace", "@write", "@fast"],
        group: "generic",
        summary: "Sets a key's expiry as a unix time in milliseconds.",
        parse: Parser::Key(parse_pexpireat),
    },
    command! {
        name: "persist",
        arity: 2,
        flags: ["write", "fast"],
        keys: (1, 1, 1),
        acl: ["@keyspace", "@write", "@fast"],
        group: "generic",
        summary: "Removes a key's expiry.",
        parse: Parser::Key(parse_persist),
    },
    command! {
        name: "ttl",
        arity: 2,
        flags: ["readonly", "fast"],
        keys: (1, 1, 1),
        acl: ["@keyspace", "@read", "@fast"],
        group: "generic",
        summary: "Returns a key's time to live in seconds.",
        parse: Parser::Key(parse_ttl),
    },
    command! {
        name: "pttl",
        arity: 2,
        flags: ["readonly", "fast"],
        keys: (1, 1, 1),
        acl: ["@keyspace", "@read", "@fast"],
        group: "generic",
        summary: "Returns a key's time to live in milliseconds.",
        parse: Parser::Key(parse_pttl),
    },
];

/// EXPIRETIME key
fn parse_expiretime(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    expire_time_cmd(a, false)
}

/// PEXPIRETIME key
fn parse_pexpiretime(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    expire_time_cmd(a, true)
}

fn expire_time_cmd(a: &mut Args, ms: bool) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    Ok(Parsed::Keyed(KeyCmd::ExpireTime { key, ms }))
}

/// EXPIRE key seconds [NX | XX | GT | LT]
fn parse_expire(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    expire_cmd(a, TimeCmd::Expire)
}

/// PEXPIRE key milliseconds [NX | XX | GT | LT]
fn parse_pexpire(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    expire_cmd(a, TimeCmd::PExpire)
}

/// EXPIREAT key unix-seconds [NX | XX | GT | LT]
fn parse_expireat(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    expire_cmd(a, TimeCmd::ExpireAt)
}

/// PEXPIREAT key unix-milliseconds [NX | XX | GT | LT]
fn parse_pexpireat(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    expire_cmd(a, TimeCmd::PExpireAt)
}

fn expire_cmd(a: &mut Args, cmd: TimeCmd) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let param = a.next_bytes()?;
    // Redis reads the options before the time: a bad option wins over a bad number.
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    while let Some(c) = a.next_opt() {
        let opt = c_str(&c);
        match opt.to_ascii_uppercase().as_slice() {
            b"NX" => nx = true,
            b"XX" => xx = true,
            b"GT" => gt = true,
            b"LT" => lt = true,
            _ => {
                return Err(ArgError::Msg(format!(
                    "ERR Unsupported option {}",
                    String::from_utf8_lossy(opt)
                ))
                .into());
            }
        }
    }
    if nx && (xx || gt || lt) {
        return Err(ArgError::Msg(
            "ERR NX and XX, GT or LT options at the same time are not compatible".into(),
        )
        .into());
    }
    if gt && lt {
        return Err(ArgError::Msg(
            "ERR GT and LT options at the same time are not compatible".into(),
        )
        .into());
    }
    // GT already needs an existing TTL, so XX adds nothing to it; LT with XX does.
    let cond = match (nx, xx, gt, lt) {
        (true, ..) => ExpireCond::Nx,
        (_, _, true, _) => ExpireCond::Gt,
        (_, true, _, true) => ExpireCond::XxLt,
        (_, _, _, true) => ExpireCond::Lt,
        (_, true, ..) => ExpireCond::Xx,
        _ => ExpireCond::Always,
    };
    let n = crate::protocol::parse_i64(&param).ok_or(ArgError::NotInteger)?;
    // Seconds that overflow when made milliseconds are refused here; a time from now that
    // overflows once the current time is added is refused by the shard, which knows the time.
    let ms = if matches!(cmd, TimeCmd::Expire | TimeCmd::ExpireAt) {
        n.checked_mul(1000)
            .ok_or_else(|| ArgError::Msg(cmd.invalid_expire().into()))?
    } else {
        n
    };
    Ok(Parsed::Keyed(KeyCmd::ExpireChecked { key, ms, cond, cmd }))
}

/// PERSIST key
fn parse_persist(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let k = a.next_bytes()?;
    Ok(Parsed::Keyed(KeyCmd::Persist(k)))
}

/// TTL key
fn parse_ttl(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    ttl_cmd(a, false)
}

/// PTTL key
fn parse_pttl(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    ttl_cmd(a, true)
}

fn ttl_cmd(a: &mut Args, ms: bool) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    Ok(Parsed::Keyed(KeyCmd::Ttl { key, ms }))
}

/// EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT as `KeyCmd::ExpireChecked` carries them.
pub(super) fn expire_checked(
    store: &mut Store,
    key: &[u8],
    ms: i64,
    cond: ExpireCond,
    cmd: TimeCmd,
    now: u64,
) -> Reply {
    // Redis refuses `when > LLONG_MAX - now` for a time from now, missing keys too.
    if !cmd.absolute() && ms.checked_add(ms_of(now)).is_none() {
        return Reply::err(cmd.invalid_expire());
    }
    expire(store, key, ms, cmd.absolute(), cond, now)
}

pub(super) fn persist(store: &mut Store, key: &[u8], now: u64) -> Reply {
    match store.slot(key, now) {
        Slot::Live(mut live) if live.get().expires_at != 0 => {
            if live.get().value.sets_own_expiry() {
                // A bucket's expiry is when it is full again, a semaphore's when its last
                // holder's time is up; neither has another meaning.
                return Reply::Int(0);
            }
            live.set_expiry(0);
            Reply::Int(1)
        }
        _ => Reply::Int(0),
    }
}

pub(super) fn ttl(store: &Store, key: &[u8], ms: bool, now: u64) -> Reply {
    match store.get(key, now) {
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
    }
}

/// EXPIRETIME / PEXPIRETIME.
pub(super) fn expire_time(store: &Store, key: &[u8], ms: bool, now: u64) -> Reply {
    match store.get(key, now) {
        None => Reply::Int(-2),
        Some(e) if e.expires_at == 0 => Reply::Int(-1),
        Some(e) => {
            let at = i64::try_from(e.expires_at / NS_PER_MS).unwrap_or(i64::MAX);
            Reply::Int(if ms { at } else { (at + 500) / 1000 })
        }
    }
}

pub(super) fn expire(
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
    if live.get().value.sets_own_expiry() {
        // A bucket expires when it has refilled; letting a client shorten that would refund
        // tokens (or free a semaphore's slots), so only DEL / BK.RESET clear one early.
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
