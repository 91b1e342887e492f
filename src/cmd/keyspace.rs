//! Commands on keys of any type: TYPE, DEL, UNLINK, EXISTS, RENAME, RENAMENX, COPY and
//! OBJECT. Their entries, how their arguments parse, and how a shard runs them.
//!
//! RENAME and COPY take two keys, which may live on two shards of a standalone node: they then
//! run with both stores at hand (`across`), through the same functions as on one store.

use super::keyed::{KeyCmd, OOM, Reply};
use super::table::{CommandSpec, Parser, command};
use super::{MultiCmd, ParseError, Parsed, msg};
use crate::protocol::{ArgError, Args};
use crate::rules::RuleSet;
use crate::store::{Coll, Encodings, OwnedValue, Slot, Store, Value};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

pub(super) const COMMANDS: &[CommandSpec] = &[
    command! {
        name: "type",
        arity: 2,
        flags: ["readonly", "fast"],
        keys: (1, 1, 1),
        acl: ["@keyspace", "@read", "@fast"],
        group: "generic",
        summary: "Returns the type of value stored at a key.",
        parse: Parser::Key(parse_type),
    },
    command! {
        name: "del",
        arity: -2,
        flags: ["write"],
        keys: (1, -1, 1),
        acl: ["@keyspace", "@write", "@slow"],
        group: "generic",
        summary: "Deletes keys.",
        parse: Parser::Key(parse_del),
    },
    command! {
        name: "unlink",
        arity: -2,
        flags: ["write", "fast"],
        keys: (1, -1, 1),
        acl: ["@keyspace", "@write", "@fast"],
        group: "generic",
        summary: "Deletes keys.",
        parse: Parser::Key(parse_del),
    },
    command! {
        name: "exists",
        arity: -2,
        flags: ["readonly", "fast"],
        keys: (1, -1, 1),
        acl: ["@keyspace", "@read", "@fast"],
        group: "generic",
        summary: "Counts how many of the given keys exist.",
        parse: Parser::Key(parse_exists),
    },
    command! {
        name: "rename",
        arity: 3,
        flags: ["write"],
        keys: (1, 2, 1),
        acl: ["@keyspace", "@write", "@slow"],
        group: "generic",
        summary: "Renames a key and overwrites the destination.",
        parse: Parser::Key(parse_rename),
    },
    command! {
        name: "renamenx",
        arity: 3,
        flags: ["write", "fast"],
        keys: (1, 2, 1),
        acl: ["@keyspace", "@write", "@fast"],
        group: "generic",
        summary: "Renames a key only when the target key name doesn't exist.",
        parse: Parser::Key(parse_renamenx),
    },
    command! {
        name: "copy",
        arity: -3,
        flags: ["write", "denyoom"],
        keys: (1, 2, 1),
        acl: ["@keyspace", "@write", "@slow"],
        group: "generic",
        summary: "Copies the value of a key to a new key.",
        parse: Parser::Key(parse_copy),
    },
    command! {
        name: "object",
        arity: -2,
        // As Redis lists the container: its subcommands carry the read flag and categories.
        flags: [],
        keys: (2, 2, 1),
        acl: ["@slow"],
        group: "generic",
        summary: "Inspects the internals of a value: OBJECT ENCODING key, OBJECT REFCOUNT key.",
        parse: Parser::Key(parse_object),
    },
];

/// What OBJECT asks about a key.
///
/// On-disk format: bincode-encoded into the Raft log inside `KeyCmd` (golden bytes in
/// tests/encoding.rs). Variants are append-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ObjectSub {
    Encoding,
    RefCount,
}

/// RENAME key newkey
fn parse_rename(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let from = a.next_bytes()?;
    let to = a.next_bytes()?;
    Ok(Parsed::Multi(MultiCmd::Rename {
        from,
        to,
        nx: false,
    }))
}

/// RENAMENX key newkey
fn parse_renamenx(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let from = a.next_bytes()?;
    let to = a.next_bytes()?;
    Ok(Parsed::Multi(MultiCmd::Rename { from, to, nx: true }))
}

/// COPY source destination [DB destination-db] [REPLACE]. Only database 0 exists.
fn parse_copy(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let from = a.next_bytes()?;
    let to = a.next_bytes()?;
    let mut replace = false;
    while let Some(opt) = a.next_opt() {
        if opt.eq_ignore_ascii_case(b"replace") {
            replace = true;
        } else if opt.eq_ignore_ascii_case(b"db") && a.remaining() > 0 {
            if a.next_i64()? != 0 {
                return Err(msg("ERR DB index is out of range").into());
            }
        } else {
            return Err(ArgError::Syntax.into());
        }
    }
    if from == to {
        return Err(msg("ERR source and destination objects are the same").into());
    }
    Ok(Parsed::Multi(MultiCmd::Copy { from, to, replace }))
}

/// OBJECT ENCODING key, OBJECT REFCOUNT key
fn parse_object(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let sub = a.next_bytes()?;
    let which = if sub.eq_ignore_ascii_case(b"encoding") {
        ObjectSub::Encoding
    } else if sub.eq_ignore_ascii_case(b"refcount") {
        ObjectSub::RefCount
    } else {
        return Err(msg(format!(
            "ERR unknown subcommand '{}'. Try OBJECT HELP.",
            String::from_utf8_lossy(&sub)
                .chars()
                .take(128)
                .collect::<String>()
        ))
        .into());
    };
    if a.remaining() != 1 {
        return Err(ArgError::WrongArity(format!(
            "object|{}",
            String::from_utf8_lossy(&sub).to_ascii_lowercase()
        ))
        .into());
    }
    let key = a.next_bytes()?;
    Ok(Parsed::Keyed(KeyCmd::Object { key, sub: which }))
}

/// OBJECT's answer for `key`: nil when it does not exist.
pub(super) fn object(store: &Store, key: &[u8], sub: ObjectSub, now: u64) -> Reply {
    let Some(e) = store.get(key, now) else {
        return Reply::Nil;
    };
    match sub {
        ObjectSub::RefCount => Reply::Int(1),
        ObjectSub::Encoding => {
            let name = encoding(&e.value, &store.usage.caps.encodings);
            Reply::Bulk(Bytes::from_static(name.as_bytes()))
        }
    }
}

/// OBJECT ENCODING's name for a value: Redis 7.0's for its types, bucketd's type name for the
/// limiter types Redis does not have.
fn encoding(value: &Value<'_>, e: &Encodings) -> &'static str {
    match value {
        Value::Int(_) => "int",
        // Redis keeps strings of up to 44 bytes in the object itself.
        Value::Str(s) if s.len() <= 44 => "embstr",
        Value::Str(_) => "raw",
        // A small hash is a listpack in Redis while it is within both thresholds.
        Value::Hash(h)
            if h.len() <= Encodings::get(&e.hash_max_listpack_entries)
                && h.iter().all(|(f, v)| {
                    let max = Encodings::get(&e.hash_max_listpack_value);
                    f.len() <= max && v.len() <= max
                }) =>
        {
            "listpack"
        }
        Value::Hash(_) => "hashtable",
        Value::Coll(c) => c.encoding(),
        Value::Bucket(_) => "bucket",
        Value::Semaphore(_) => "semaphore",
    }
}

/// Puts a detached value under `key`, replacing what is there.
fn put(store: &mut Store, key: &[u8], value: OwnedValue, expires_at: u64, now: u64) -> bool {
    match (store.slot(key, now), value) {
        (Slot::Live(mut l), OwnedValue::Coll(c)) => {
            l.set_coll(Coll::from_owned(&c), expires_at);
            true
        }
        (Slot::Empty(e), OwnedValue::Coll(c)) => {
            e.insert_coll(Coll::from_owned(&c), expires_at).is_ok()
        }
        (slot, value) => {
            let (mut scratch, mut coll) = (Vec::new(), None);
            let v = value.as_value(&mut scratch, &mut coll);
            match slot {
                Slot::Live(mut l) => {
                    l.set(v, expires_at);
                    true
                }
                Slot::Empty(e) => e.insert(v, expires_at).is_ok(),
            }
        }
    }
}

/// RENAME / RENAMENX from `src` to `dst` (None: the same store), as Redis 7.0 answers.
pub(super) fn rename(
    src: &mut Store,
    dst: Option<&mut Store>,
    from: &[u8],
    to: &[u8],
    nx: bool,
    now: u64,
) -> Reply {
    let Some(e) = src.get(from, now) else {
        return Reply::err("ERR no such key");
    };
    if from == to {
        return if nx { Reply::Int(0) } else { Reply::Ok };
    }
    let (value, expires_at) = (OwnedValue::from(e.value), e.expires_at);
    {
        let d: &mut Store = match dst {
            Some(d) => d,
            None => &mut *src,
        };
        if nx && d.get(to, now).is_some() {
            return Reply::Int(0);
        }
        if !put(d, to, value, expires_at, now) {
            return Reply::err(OOM);
        }
    }
    src.remove(from, now);
    if nx { Reply::Int(1) } else { Reply::Ok }
}

/// COPY from `src` to `dst` (None: the same store), as Redis 7.0 answers.
pub(super) fn copy(
    src: &mut Store,
    dst: Option<&mut Store>,
    from: &[u8],
    to: &[u8],
    replace: bool,
    now: u64,
) -> Reply {
    let Some(e) = src.get(from, now) else {
        return Reply::Int(0);
    };
    let (value, expires_at) = (OwnedValue::from(e.value), e.expires_at);
    let d: &mut Store = match dst {
        Some(d) => d,
        None => src,
    };
    if !replace && d.get(to, now).is_some() {
        return Reply::Int(0);
    }
    if !put(d, to, value, expires_at, now) {
        return Reply::err(OOM);
    }
    Reply::Int(1)
}

/// TYPE key
fn parse_type(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let k = a.next_bytes()?;
    Ok(Parsed::Keyed(KeyCmd::Type(k)))
}

/// DEL key [key ...], UNLINK key [key ...] (and BK.RESET, which is DEL for buckets)
pub(super) fn parse_del(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    Ok(Parsed::Multi(MultiCmd::Del(a.rest())))
}

/// EXISTS key [key ...]
fn parse_exists(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    Ok(Parsed::Multi(MultiCmd::Exists(a.rest())))
}

pub(super) fn type_of(store: &Store, key: &[u8], now: u64) -> Reply {
    Reply::Simple(Cow::Borrowed(
        store.get(key, now).map_or("none", |e| type_name(&e.value)),
    ))
}

/// What TYPE (and SCAN's TYPE filter) calls a value: Redis's names for strings and hashes.
/// Redis has no limiter types, so bucketd names its own: `bucket` for rate-limit state,
/// `semaphore` for a concurrency limit.
pub(super) fn type_name(value: &Value<'_>) -> &'static str {
    match value {
        Value::Bucket(_) => "bucket",
        Value::Semaphore(_) => "semaphore",
        Value::Hash(_) => "hash",
        Value::Coll(c) => c.type_name(),
        Value::Int(_) | Value::Str(_) => "string",
    }
}

pub(super) fn del(store: &mut Store, keys: &[Bytes], now: u64) -> Reply {
    Reply::Int(keys.iter().filter(|k| store.remove(k, now)).count() as i64)
}

pub(super) fn exists(store: &Store, keys: &[Bytes], now: u64) -> Reply {
    Reply::Int(keys.iter().filter(|k| store.get(k, now).is_some()).count() as i64)
}
