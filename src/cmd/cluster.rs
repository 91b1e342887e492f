//! Cluster commands: CLUSTER, ASKING, READONLY, READWRITE.

use super::table::{CommandSpec, Parser, command};

pub(super) const COMMANDS: &[CommandSpec] = &[
    command! {
        name: "cluster",
        arity: -2,
        flags: ["stale"],
        keys: (0, 0, 0),
        acl: ["@slow"],
        group: "cluster",
        summary: "Cluster commands; standalone nodes answer CLUSTER KEYSLOT.",
        parse: Parser::Node,
    },
    command! {
        name: "asking",
        arity: 1,
        flags: ["fast"],
        keys: (0, 0, 0),
        acl: ["@fast", "@connection"],
        group: "cluster",
        summary: "Lets the next command on this connection reach a slot being imported.",
        parse: Parser::Node,
    },
    command! {
        name: "readonly",
        arity: 1,
        flags: ["loading", "stale", "fast"],
        keys: (0, 0, 0),
        acl: ["@keyspace", "@fast"],
        group: "cluster",
        summary: "Enables reads from replicas on this connection.",
        parse: Parser::Node,
    },
    command! {
        name: "readwrite",
        arity: 1,
        flags: ["loading", "stale", "fast"],
        keys: (0, 0, 0),
        acl: ["@keyspace", "@fast"],
        group: "cluster",
        summary: "Disables reads from replicas on this connection.",
        parse: Parser::Node,
    },
];
