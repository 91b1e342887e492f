//! Commands on keys of any type: TYPE, DEL, UNLINK, EXISTS. Their entries, how their
//! arguments parse, and how a shard runs them.

use super::keyed::{KeyCmd, Reply};
use super::table::{CommandSpec, Parser, command};
use super::{MultiCmd, ParseError, Parsed};
use crate::protocol::Args;
use crate::rules::RuleSet;
use crate::store::{Store, Value};
use bytes::Bytes;
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
];

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
