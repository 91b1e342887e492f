//! Commands: the registry of every command, and each family's parsing and execution.
//!
//! A command is declared once, in its family's file under `src/cmd/`: the file holds the
//! family's registry entries (`table::command!`: name, arity, flags, key positions, `COMMAND`
//! metadata, parser), the functions that turn arguments into typed work, and, for key
//! commands, the functions that run it against a store. A key command runs on the shard that
//! owns its key. A node command (connection state, server information, work over every shard)
//! parses here into plain data, a variant of its family's node command type, and runs at the
//! server layer (`server::commands`), which knows connections, shards and the cluster; `cmd`
//! knows none of them. `table` gathers the families into one registry that `parse` looks up
//! by name.
//!
//! - Adding a key command: its entry, parse function and execution in its family file, one
//!   variant appended at the end of `KeyCmd` (`keyed.rs`; the enum is encoded into the Raft
//!   log, so its variants are append-only), and that variant's arm in `keyed::execute`.
//! - Adding a node command: its entry, parse function and a variant of the family's node
//!   command type in its family file, and that variant's arm in the family's `run` under
//!   `server::commands`. A new family also needs its slice in `table.rs`, a `NodeCmd` variant
//!   and its arm in `server::commands::dispatch`; a new subcommand of a container command
//!   (CLIENT, CONFIG...) its name in `table::SUBCOMMANDS`.
//!   Transaction commands are the exception: the connection runs them itself, matching on
//!   `TxnCmd`.
//!
//! Parsing checks arity and every argument, so shards only ever see well-formed work.
pub(crate) mod acl;
pub(crate) mod across;
pub(crate) mod cell;
pub(crate) mod cluster;
pub(crate) mod concurrency;
pub(crate) mod connection;
pub(crate) mod expiry;
pub(crate) mod float;
pub(crate) mod hashes;
pub(crate) mod keyed;
pub(crate) mod keyspace;
pub(crate) mod limits;
pub(crate) mod lists;
pub(crate) mod packed;
pub(crate) mod rules;
pub(crate) mod scan;
pub(crate) mod script;
pub(crate) mod server;
pub(crate) mod sets;
pub(crate) mod strings;
pub(crate) mod table;
pub(crate) mod transactions;
mod zscore;
pub(crate) mod zsets;

// What other modules use of the commands, named here so they import the folder, not its
// files: the log format and replies, the registry, the node commands' parsed forms, and the
// script cache and engine.
pub(crate) use acl::readonly_refusal;
pub(crate) use across::{Stores, is_escalate, keys_of};
pub(crate) use cluster::{BkCluster, ClusterCmd, ClusterSub, ClusterView};
pub(crate) use connection::{ClientCmd, ClientKill, ClientList, ConnectionCmd, Hello, LibAttr};
pub(crate) use keyed::{
    CheckKind, ExecStats, KeyCmd, LimitReply, MISSING_REPLY, Reply, encode, execute, summarize,
};
#[cfg(test)]
pub(crate) use keyed::{SetCond, SetExpiry};
pub(crate) use packed::{commands, slicing};
pub(crate) use rules::RuleCmd;
pub(crate) use scan::{Cursor, ScanCmd, scan_reply};
pub(crate) use script::{
    Eval, MAX_SCRIPT_BYTES, REDIS_VERSION, ScriptCache, ScriptCmd, ShebangError, check_compiles,
    eval_in, sha1_hex,
};
pub(crate) use server::{CommandCmd, CommandSub, ConfigCmd, ListFilter, ServerCmd};
pub(crate) use table::{
    COMMANDS, CommandSpec, SUBCOMMANDS, index_of, lookup, write_docs, write_info,
};
pub(crate) use transactions::TxnCmd;

use crate::limiter::Rule;
use crate::protocol::{ArgError, Args, Request};
use crate::rules::RuleSet;
use bytes::Bytes;
use table::Parser;

/// A parsed request.
pub enum Parsed {
    /// Touches one key; `KeyCmd::route_key` decides the shard.
    Keyed(KeyCmd),
    /// Touches several keys, possibly owned by several shards.
    Multi(MultiCmd),
    /// Handled by the node itself (connection state, server info, all-shard operations). A
    /// node command whose arguments are refused is still queued in a transaction, as Redis
    /// queues it, and answers its error when it runs.
    Node(&'static CommandSpec, Result<NodeCmd, ArgError>),
}

/// A command the node runs itself, by family.
pub enum NodeCmd {
    Connection(connection::ConnectionCmd),
    Server(server::ServerCmd),
    Scan(scan::ScanCmd),
    Rule(rules::RuleCmd),
    Cluster(cluster::ClusterCmd),
    Script(script::ScriptCmd),
    /// MULTI, EXEC, DISCARD, WATCH, UNWATCH: the connection runs these itself.
    Transaction(transactions::TxnCmd),
}

pub enum MultiCmd {
    /// RENAME / RENAMENX: source and destination.
    Rename {
        from: Bytes,
        to: Bytes,
        nx: bool,
    },
    /// COPY: source and destination.
    Copy {
        from: Bytes,
        to: Bytes,
        replace: bool,
    },
    Del(Vec<Bytes>),
    Exists(Vec<Bytes>),
    MGet(Vec<Bytes>),
    /// `keys[i]` gets `values[i]`. On one shard MSET is atomic (every key or none); keys on
    /// several shards are set shard by shard, each shard's share atomically, with no isolation
    /// between the shares: a reader may see one shard's keys set before another's.
    MSet {
        keys: Vec<Bytes>,
        values: Vec<Bytes>,
    },
    /// `shadow[i]`: `rules[i]` is a rule in shadow mode, which never refuses the others.
    CheckAll {
        keys: Vec<Bytes>,
        rules: Vec<Rule>,
        shadow: Vec<bool>,
        cost: u64,
        peek: bool,
    },
}

impl MultiCmd {
    /// True for the limit commands among them.
    pub fn is_check(&self) -> bool {
        matches!(self, MultiCmd::CheckAll { .. })
    }

    /// The command a single shard runs when it owns every key.
    pub fn into_key_cmd(self) -> KeyCmd {
        match self {
            MultiCmd::Rename { from, to, nx } => KeyCmd::Rename { from, to, nx },
            MultiCmd::Copy { from, to, replace } => KeyCmd::Copy { from, to, replace },
            MultiCmd::Del(k) => KeyCmd::Del(k),
            MultiCmd::Exists(k) => KeyCmd::Exists(k),
            MultiCmd::MGet(k) => KeyCmd::MGet(k),
            MultiCmd::MSet { keys, values } => KeyCmd::MSet { keys, values },
            MultiCmd::CheckAll {
                keys,
                rules,
                shadow,
                cost,
                peek,
            } => {
                if shadow.contains(&true) {
                    KeyCmd::CheckSet {
                        costs: vec![cost; keys.len()],
                        keys,
                        rules,
                        shadow,
                        peek,
                    }
                } else {
                    KeyCmd::CheckAll {
                        keys,
                        rules,
                        cost,
                        peek,
                    }
                }
            }
        }
    }

    pub fn keys(&self) -> std::borrow::Cow<'_, [Bytes]> {
        use std::borrow::Cow;
        match self {
            MultiCmd::Rename { from, to, .. } | MultiCmd::Copy { from, to, .. } => {
                Cow::Owned(vec![from.clone(), to.clone()])
            }
            MultiCmd::Del(k) | MultiCmd::Exists(k) | MultiCmd::MGet(k) => Cow::Borrowed(k),
            MultiCmd::MSet { keys, .. } | MultiCmd::CheckAll { keys, .. } => Cow::Borrowed(keys),
        }
    }
}

/// Why a request was refused before reaching any shard.
pub enum ParseError {
    Unknown(String),
    Arg(ArgError),
}

impl From<ArgError> for ParseError {
    fn from(e: ArgError) -> Self {
        ParseError::Arg(e)
    }
}

impl ParseError {
    pub fn message(&self) -> String {
        match self {
            ParseError::Unknown(m) => m.clone(),
            ParseError::Arg(e) => e.to_string(),
        }
    }
}

fn unknown_command(req: &Request) -> ParseError {
    let name = String::from_utf8_lossy(req.name());
    let mut msg = format!(
        "ERR unknown command '{}', with args beginning with: ",
        truncate(&name)
    );
    for a in (1..req.len().min(9)).filter_map(|i| req.get(i)) {
        msg.push_str(&format!("'{}' ", truncate(&String::from_utf8_lossy(a))));
    }
    ParseError::Unknown(msg)
}

fn truncate(s: &str) -> String {
    s.chars().take(128).collect()
}

/// Parses `req` (non-empty) into a command.
pub fn parse(req: Request, rules: &RuleSet) -> Result<Parsed, ParseError> {
    let Some(spec) = table::lookup(req.name()) else {
        return Err(unknown_command(&req));
    };
    if !table::arity_ok(spec, req.len()) {
        return Err(ArgError::WrongArity(spec.name.to_string()).into());
    }
    let mut a = Args::new(spec.name, req);
    match spec.parse {
        Parser::Key(parse) => parse(&mut a, rules),
        Parser::Node(parse) => Ok(Parsed::Node(spec, parse(&mut a))),
    }
}

/// What a command answers when arguments are left over after its last one: Redis words it
/// per command.
#[derive(Clone, Copy)]
pub(crate) enum Trailing {
    /// `ERR syntax error`
    Syntax,
    /// The command's own wrong-number-of-arguments error.
    Arity,
    /// A subcommand's (`container|sub`) wrong-number-of-arguments error.
    SubArity(&'static str),
}

/// How every parser ends: `finish_as` refuses leftover arguments with the command's error.
pub(crate) trait Finish {
    fn finish_as(&self, trailing: Trailing) -> Result<(), ArgError>;
}

impl Finish for Args {
    fn finish_as(&self, trailing: Trailing) -> Result<(), ArgError> {
        if self.remaining() == 0 {
            return Ok(());
        }
        Err(match trailing {
            Trailing::Syntax => ArgError::Syntax,
            Trailing::Arity => self.arity_error(),
            Trailing::SubArity(name) => ArgError::WrongArity(name.to_string()),
        })
    }
}

/// An error reply, as given.
fn msg(m: impl Into<String>) -> ArgError {
    ArgError::Msg(m.into())
}

/// An argument as Redis's C code compares it: up to its first NUL byte.
fn c_str(arg: &[u8]) -> &[u8] {
    arg.split(|&b| b == 0).next().unwrap_or(arg)
}

#[cfg(test)]
mod tests {
    use super::cluster::{ClusterCmd, ClusterSub};
    use super::connection::ConnectionCmd;
    use super::*;

    fn node(args: &[&str]) -> (&'static str, Result<NodeCmd, ArgError>) {
        match parse(Request::from_args(args), &RuleSet::default()) {
            Ok(Parsed::Node(spec, cmd)) => (spec.name, cmd),
            _ => panic!("{args:?} is not a node command"),
        }
    }

    #[test]
    fn a_node_command_keeps_its_argument_error_for_when_it_runs() {
        let (name, cmd) = node(&["PING", "a", "b"]);
        assert_eq!(name, "ping");
        assert_eq!(
            cmd.err().map(|e| e.to_string()).as_deref(),
            Some("ERR wrong number of arguments for 'ping' command")
        );
    }

    #[test]
    fn hello_tries_its_auth_options_before_the_one_that_did_not_parse() {
        let (_, cmd) = node(&["HELLO", "3", "AUTH", "default", "pw", "BOGUS"]);
        let Ok(NodeCmd::Connection(ConnectionCmd::Hello(h))) = cmd else {
            panic!("not HELLO");
        };
        assert_eq!(h.proto, Some(3));
        assert_eq!(h.auth.len(), 1);
        assert_eq!(h.refused, Some(ArgError::Syntax));
    }

    #[test]
    fn a_cluster_subcommand_is_recorded_and_its_arguments_checked_after_the_mode() {
        let (_, cmd) = node(&["CLUSTER", "myid", "extra"]);
        let Ok(NodeCmd::Cluster(ClusterCmd::Cluster { sub, cmd })) = cmd else {
            panic!("not CLUSTER");
        };
        assert_eq!(table::SUBCOMMANDS.get(sub - 1), Some(&"cluster|myid"));
        assert!(matches!(cmd, Ok(ClusterSub::View(Err(ArgError::Syntax)))));
    }

    #[test]
    fn trailing_arguments_are_refused_with_the_error_asked_for() {
        let mut a = Args::new("ping", Request::from_args(&["ping", "x"]));
        assert_eq!(a.finish_as(Trailing::Syntax), Err(ArgError::Syntax));
        assert_eq!(
            a.finish_as(Trailing::SubArity("command|count")),
            Err(ArgError::WrongArity("command|count".into()))
        );
        assert_eq!(a.finish_as(Trailing::Arity), Err(a.arity_error()));
        assert!(a.next_opt().is_some());
        assert_eq!(a.finish_as(Trailing::Syntax), Ok(()));
    }
}
