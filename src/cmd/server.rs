//! Server commands: COMMAND, INFO, CONFIG, DBSIZE, FLUSHALL, FLUSHDB, TIME, KEYS; and the
//! share of DBSIZE, FLUSHALL and KEYS that each shard runs.

use super::keyed::Reply;
use super::table::{CommandSpec, Parser, command};
use crate::store::Store;
use bytes::Bytes;

pub(super) const COMMANDS: &[CommandSpec] = &[
    command! {
        name: "command",
        arity: -1,
        flags: ["loading", "stale"],
        keys: (0, 0, 0),
        acl: ["@slow", "@connection"],
        group: "server",
        summary: "Returns details about commands: COUNT, INFO, DOCS, LIST.",
        parse: Parser::Node,
    },
    command! {
        name: "info",
        arity: -1,
        flags: ["loading", "stale"],
        keys: (0, 0, 0),
        acl: ["@slow", "@dangerous"],
        group: "server",
        summary: "Returns information and statistics about the server.",
        parse: Parser::Node,
    },
    command! {
        name: "config",
        arity: -2,
        flags: ["admin", "noscript", "loading", "stale"],
        keys: (0, 0, 0),
        acl: ["@admin", "@slow", "@dangerous"],
        group: "server",
        summary: "Reads settings: CONFIG GET; CONFIG RESETSTAT.",
        parse: Parser::Node,
    },
    command! {
        name: "dbsize",
        arity: 1,
        flags: ["readonly", "fast"],
        keys: (0, 0, 0),
        acl: ["@keyspace", "@read", "@fast"],
        group: "server",
        summary: "Returns the number of keys.",
        barrier: true,
        parse: Parser::Node,
    },
    command! {
        name: "flushall",
        arity: -1,
        flags: ["write"],
        keys: (0, 0, 0),
        acl: ["@keyspace", "@write", "@slow", "@dangerous"],
        group: "server",
        summary: "Removes all keys.",
        barrier: true,
        parse: Parser::Node,
    },
    command! {
        name: "flushdb",
        arity: -1,
        flags: ["write"],
        keys: (0, 0, 0),
        acl: ["@keyspace", "@write", "@slow", "@dangerous"],
        group: "server",
        summary: "Removes all keys.",
        barrier: true,
        parse: Parser::Node,
    },
    command! {
        name: "time",
        arity: 1,
        flags: ["loading", "stale", "fast"],
        keys: (0, 0, 0),
        acl: ["@fast"],
        group: "server",
        summary: "Returns the server time.",
        parse: Parser::Node,
    },
    command! {
        name: "keys",
        arity: 2,
        flags: ["readonly"],
        keys: (0, 0, 0),
        acl: ["@keyspace", "@read", "@slow", "@dangerous"],
        group: "generic",
        summary: "Returns all key names that match a pattern.",
        barrier: true,
        parse: Parser::Node,
    },
];

/// One shard's key count.
pub(super) fn dbsize(store: &Store) -> Reply {
    Reply::Int(store.len() as i64)
}

pub(super) fn flushall(store: &mut Store) -> Reply {
    store.clear();
    Reply::Ok
}

/// One shard's keys matching `pattern`.
pub(super) fn keys(store: &Store, pattern: &[u8], now: u64) -> Reply {
    let mut out = Vec::new();
    store.for_each_key(now, |k| {
        if crate::glob::matches(pattern, k) {
            out.push(Reply::Bulk(Bytes::copy_from_slice(k)));
        }
    });
    Reply::Array(out)
}
