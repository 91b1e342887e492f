//! Server commands: COMMAND, INFO, CONFIG, DBSIZE, FLUSHALL, FLUSHDB, TIME, KEYS. Their
//! entries, how their arguments parse into a `ServerCmd` (which the server runs), and the
//! share of DBSIZE, FLUSHALL and KEYS each shard runs.

use super::keyed::Reply;
use super::table::{self, CommandSpec, Parser, command, subcommand};
use super::{Finish, NodeCmd, Trailing, msg};
use crate::protocol::{ArgError, Args};
use crate::store::Store;
use bytes::Bytes;

/// A server command, parsed.
pub enum ServerCmd {
    Command(CommandCmd),
    /// INFO [section ...], sections lowercased.
    Info(Vec<String>),
    /// CONFIG subcommand ...: `sub` as in `ConnectionCmd::Client`.
    Config {
        sub: usize,
        cmd: Result<ConfigCmd, ArgError>,
    },
    DbSize,
    /// FLUSHALL / FLUSHDB [ASYNC | SYNC]
    Flush,
    Time,
    /// KEYS pattern
    Keys(Bytes),
}

/// COMMAND and its subcommands.
pub enum CommandCmd {
    /// COMMAND: every command's details.
    All,
    Sub {
        sub: usize,
        cmd: Result<CommandSub, ArgError>,
    },
}

pub enum CommandSub {
    Count,
    List(Option<ListFilter>),
    /// INFO [name ...]
    Info(Vec<Bytes>),
    /// DOCS [name ...]
    Docs(Vec<Bytes>),
    /// GETKEYS full-command: the keys it names, found when parsed.
    GetKeys(Vec<Bytes>),
    Help,
}

/// COMMAND LIST FILTERBY.
pub enum ListFilter {
    Module,
    AclCat(Bytes),
    Pattern(Bytes),
}

pub enum ConfigCmd {
    /// GET pattern [pattern ...]
    Get(Vec<Bytes>),
    /// SET name value [name value ...]
    Set(Vec<(Bytes, Bytes)>),
    ResetStat,
    Help,
}

pub(super) const COMMANDS: &[CommandSpec] = &[
    command! {
        name: "command",
        arity: -1,
        flags: ["loading", "stale"],
        keys: (0, 0, 0),
        acl: ["@slow", "@connection"],
        group: "server",
        summary: "Returns details about commands: COUNT, INFO, DOCS, LIST.",
        parse: Parser::Node(parse_command),
    },
    command! {
        name: "info",
        arity: -1,
        flags: ["loading", "stale"],
        keys: (0, 0, 0),
        acl: ["@slow", "@dangerous"],
        group: "server",
        summary: "Returns information and statistics about the server.",
        parse: Parser::Node(parse_info),
    },
    command! {
        name: "config",
        arity: -2,
        flags: ["admin", "noscript", "loading", "stale"],
        keys: (0, 0, 0),
        acl: ["@admin", "@slow", "@dangerous"],
        group: "server",
        summary: "Reads settings: CONFIG GET; CONFIG RESETSTAT.",
        parse: Parser::Node(parse_config),
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
        parse: Parser::Node(parse_dbsize),
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
        parse: Parser::Node(parse_flushall),
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
        parse: Parser::Node(parse_flushall),
    },
    command! {
        name: "time",
        arity: 1,
        flags: ["loading", "stale", "fast"],
        keys: (0, 0, 0),
        acl: ["@fast"],
        group: "server",
        summary: "Returns the server time.",
        parse: Parser::Node(parse_time),
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
        parse: Parser::Node(parse_keys),
    },
];

fn server(cmd: ServerCmd) -> Result<NodeCmd, ArgError> {
    Ok(NodeCmd::Server(cmd))
}

fn parse_command(a: &mut Args) -> Result<NodeCmd, ArgError> {
    if a.remaining() == 0 {
        return server(ServerCmd::Command(CommandCmd::All));
    }
    let sub = a.next_keyword()?;
    server(ServerCmd::Command(CommandCmd::Sub {
        sub: subcommand("command", &sub),
        cmd: parse_command_sub(a, &sub),
    }))
}

fn parse_command_sub(a: &mut Args, sub: &str) -> Result<CommandSub, ArgError> {
    Ok(match sub {
        "COUNT" => {
            a.finish_as(Trailing::SubArity("command|count"))?;
            CommandSub::Count
        }
        "LIST" => {
            let rest = a.rest();
            CommandSub::List(match rest.as_slice() {
                [] => None,
                [by, kind, arg] if by.eq_ignore_ascii_case(b"FILTERBY") => {
                    match kind.to_ascii_uppercase().as_slice() {
                        b"MODULE" => Some(ListFilter::Module),
                        b"ACLCAT" => Some(ListFilter::AclCat(arg.clone())),
                        b"PATTERN" => Some(ListFilter::Pattern(arg.clone())),
                        _ => return Err(ArgError::Syntax),
                    }
                }
                _ => return Err(ArgError::Syntax),
            })
        }
        "INFO" => CommandSub::Info(a.rest()),
        "DOCS" => CommandSub::Docs(a.rest()),
        "GETKEYS" => CommandSub::GetKeys(command_keys(&a.rest())?),
        "HELP" => CommandSub::Help,
        other => {
            return Err(msg(format!(
                "ERR unknown subcommand '{other}'. Try COMMAND HELP."
            )));
        }
    })
}

/// The keys a full command names (COMMAND GETKEYS), from its entry's key positions.
fn command_keys(args: &[Bytes]) -> Result<Vec<Bytes>, ArgError> {
    let Some(cmd) = args.first().and_then(|n| table::lookup(n)) else {
        return Err(msg("ERR Invalid command specified"));
    };
    if !table::arity_ok(cmd, args.len()) {
        return Err(msg("ERR Invalid number of arguments specified for command"));
    }
    if cmd.name == "bk.checkall" {
        // Its keys are counted by its numkeys argument, like EVAL's.
        let n = args
            .get(1)
            .and_then(|b| crate::protocol::parse_i64(b))
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n >= 1 && 2 + n <= args.len())
            .ok_or_else(|| msg("ERR Invalid arguments specified for command"))?;
        return Ok(args[2..2 + n].to_vec());
    }
    if cmd.first_key <= 0 {
        return Err(msg("ERR The command has no key arguments"));
    }
    let first = cmd.first_key as usize;
    let last = if cmd.last_key < 0 {
        (args.len() as i64 + cmd.last_key) as usize
    } else {
        cmd.last_key as usize
    };
    Ok((first..=last.min(args.len() - 1))
        .step_by(cmd.step.max(1) as usize)
        .map(|i| args[i].clone())
        .collect())
}

fn parse_info(a: &mut Args) -> Result<NodeCmd, ArgError> {
    let sections = a
        .rest()
        .iter()
        .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase())
        .collect();
    server(ServerCmd::Info(sections))
}

fn parse_config(a: &mut Args) -> Result<NodeCmd, ArgError> {
    let sub = a.next_keyword()?;
    server(ServerCmd::Config {
        sub: subcommand("config", &sub),
        cmd: parse_config_sub(a, &sub),
    })
}

fn parse_config_sub(a: &mut Args, sub: &str) -> Result<ConfigCmd, ArgError> {
    Ok(match sub {
        "GET" => {
            let patterns = a.rest();
            if patterns.is_empty() {
                return Err(ArgError::WrongArity("config|get".into()));
            }
            ConfigCmd::Get(patterns)
        }
        "SET" => {
            let rest = a.rest();
            if rest.len() < 2 {
                return Err(ArgError::WrongArity("config|set".into()));
            }
            if !rest.len().is_multiple_of(2) {
                return Err(ArgError::Syntax);
            }
            ConfigCmd::Set(
                rest.chunks_exact(2)
                    .map(|p| (p[0].clone(), p[1].clone()))
                    .collect(),
            )
        }
        "RESETSTAT" => {
            a.finish_as(Trailing::SubArity("config|resetstat"))?;
            ConfigCmd::ResetStat
        }
        "HELP" => ConfigCmd::Help,
        other => {
            return Err(msg(format!(
                "ERR unknown subcommand '{other}'. Try CONFIG HELP."
            )));
        }
    })
}

fn parse_dbsize(_: &mut Args) -> Result<NodeCmd, ArgError> {
    server(ServerCmd::DbSize)
}

/// FLUSHALL and FLUSHDB (one database: the same thing).
fn parse_flushall(a: &mut Args) -> Result<NodeCmd, ArgError> {
    if let Some(mode) = a.next_opt() {
        let m = mode.to_ascii_uppercase();
        if m != b"ASYNC" && m != b"SYNC" {
            return Err(ArgError::Syntax);
        }
    }
    a.finish_as(Trailing::Syntax)?;
    server(ServerCmd::Flush)
}

fn parse_time(_: &mut Args) -> Result<NodeCmd, ArgError> {
    server(ServerCmd::Time)
}

fn parse_keys(a: &mut Args) -> Result<NodeCmd, ArgError> {
    server(ServerCmd::Keys(a.next_bytes()?))
}

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
