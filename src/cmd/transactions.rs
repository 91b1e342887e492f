//! Transactions: MULTI, EXEC, DISCARD, WATCH, UNWATCH. The connection runs them, since a
//! transaction is connection state; their entries parse into `NodeCmd::Transaction`, which
//! says which of them it is.

use super::NodeCmd;
use super::table::{CommandSpec, Parser, command};
use crate::protocol::{ArgError, Args};

/// Which transaction command a request is; the connection acts on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnCmd {
    Multi,
    Exec,
    Discard,
    Watch,
    Unwatch,
}

pub(super) const COMMANDS: &[CommandSpec] = &[
    command! {
        name: "multi",
        arity: 1,
        flags: ["noscript", "loading", "stale", "fast", "allow_busy"],
        keys: (0, 0, 0),
        acl: ["@fast", "@transaction"],
        group: "transactions",
        summary: "Starts a transaction: later commands are queued until EXEC.",
        parse: Parser::Node(parse_multi),
    },
    command! {
        name: "exec",
        arity: 1,
        flags: ["noscript", "loading", "stale", "skip_slowlog"],
        keys: (0, 0, 0),
        acl: ["@slow", "@transaction"],
        group: "transactions",
        summary: "Runs the queued commands atomically on the shard that owns their slot.",
        parse: Parser::Node(parse_exec),
    },
    command! {
        name: "discard",
        arity: 1,
        flags: ["noscript", "loading", "stale", "fast", "allow_busy"],
        keys: (0, 0, 0),
        acl: ["@fast", "@transaction"],
        group: "transactions",
        summary: "Drops the queued commands.",
        parse: Parser::Node(parse_discard),
    },
    command! {
        name: "watch",
        arity: -2,
        flags: ["noscript", "loading", "stale", "fast", "allow_busy"],
        keys: (1, -1, 1),
        acl: ["@fast", "@transaction"],
        group: "transactions",
        summary: "Not supported: transactions on one slot are already atomic.",
        parse: Parser::Node(parse_watch),
    },
    command! {
        name: "unwatch",
        arity: 1,
        flags: ["noscript", "loading", "stale", "fast", "allow_busy"],
        keys: (0, 0, 0),
        acl: ["@fast", "@transaction"],
        group: "transactions",
        summary: "Forgets watched keys (none are ever watched).",
        parse: Parser::Node(parse_unwatch),
    },
];

// WATCH's keys are not read: nothing is ever watched.
fn parse_multi(_: &mut Args) -> Result<NodeCmd, ArgError> {
    Ok(NodeCmd::Transaction(TxnCmd::Multi))
}

fn parse_exec(_: &mut Args) -> Result<NodeCmd, ArgError> {
    Ok(NodeCmd::Transaction(TxnCmd::Exec))
}

fn parse_discard(_: &mut Args) -> Result<NodeCmd, ArgError> {
    Ok(NodeCmd::Transaction(TxnCmd::Discard))
}

fn parse_watch(_: &mut Args) -> Result<NodeCmd, ArgError> {
    Ok(NodeCmd::Transaction(TxnCmd::Watch))
}

fn parse_unwatch(_: &mut Args) -> Result<NodeCmd, ArgError> {
    Ok(NodeCmd::Transaction(TxnCmd::Unwatch))
}
