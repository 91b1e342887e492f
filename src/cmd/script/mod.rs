//! Lua scripting as Redis has it: EVAL, EVALSHA, EVAL_RO, EVALSHA_RO and SCRIPT, so the
//! token-bucket scripts gateways already run work unchanged.
//!
//! A script runs on the shard that owns its keys, to completion, with nothing interleaved: the
//! shard runs it as one command. Each shard thread keeps one Lua 5.1 interpreter and the
//! scripts it has compiled. In a cluster the script's text and arguments go into the log, and
//! every replica runs it at the entry's time, so they all compute the same state:
//!
//! - `TIME` inside a script is the command's time (the entry's timestamp in a cluster);
//! - nothing that reads a random source, the clock, the file system, the network or the
//!   process is there to be called (`math.random`, `os`, `io`, `require`, `loadfile`...);
//! - a runaway script is stopped after a number of Lua instructions (the same count on every
//!   replica), not after a time that would differ between them.
//!
//! A script may only touch the keys it declares (`KEYS`), and only the commands that work on
//! keys (and `TIME`) can be called from it.
//!
//! This module holds the scripting commands' entries and parsing, the script that travels to a
//! shard (`Eval`) and the node's cache of scripts; `engine` runs a script against a store,
//! `lua_api` is what a script can call (`redis.call` and its state), `redis_lib` the rest of
//! the `redis` table, `convert` turns values between Lua, RESP and replies, `shebang` reads a
//! script's `#!lua flags=...` line, and `cjson`, `bitop` (`bit`), `structlib` (`struct`) and
//! `msgpack` (`cmsgpack`) are the libraries scripts see.

mod bitop;
mod cjson;
mod convert;
mod engine;
mod lib_args;
mod lua_api;
mod msgpack;
mod redis_lib;
mod shebang;
mod structlib;

pub(crate) use engine::{check_compiles, eval, eval_in};
pub(crate) use redis_lib::REDIS_VERSION;
pub(crate) use shebang::{ScriptFlags, ShebangError};

use super::keyed::KeyCmd;
use super::table::{CommandSpec, Parser, command};
use super::{Finish, NodeCmd, ParseError, Parsed, Trailing, msg};
use crate::protocol::{ArgError, Args};
use crate::rules::RuleSet;
use ahash::AHashMap;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::sync::Mutex;

/// Largest script accepted, in bytes.
pub(crate) const MAX_SCRIPT_BYTES: usize = 1024 * 1024;
/// Scripts a node keeps for EVALSHA, at most, and their bytes: past either, the oldest half
/// is forgotten (a client that meets NOSCRIPT sends EVAL again).
const MAX_SCRIPTS: usize = 10_000;
const MAX_SCRIPTS_BYTES: usize = 64 * 1024 * 1024;

pub(super) const COMMANDS: &[CommandSpec] = &[
    command! {
        name: "eval",
        arity: -3,
        flags: ["noscript", "stale", "skip_monitor", "no_mandatory_keys", "movablekeys"],
        keys: (0, 0, 0),
        acl: ["@slow", "@scripting"],
        group: "scripting",
        summary: "Runs a Lua script: EVAL script numkeys key... arg...",
        parse: Parser::Key(parse_eval),
    },
    command! {
        name: "evalsha",
        arity: -3,
        flags: ["noscript", "stale", "skip_monitor", "no_mandatory_keys", "movablekeys"],
        keys: (0, 0, 0),
        acl: ["@slow", "@scripting"],
        group: "scripting",
        summary: "Runs a script loaded before, by its SHA1: EVALSHA sha1 numkeys key... arg...",
        parse: Parser::Key(parse_evalsha),
    },
    command! {
        name: "eval_ro",
        arity: -3,
        flags: ["readonly", "noscript", "stale", "skip_monitor", "no_mandatory_keys", "movablekeys"],
        keys: (0, 0, 0),
        acl: ["@slow", "@scripting"],
        group: "scripting",
        summary: "Runs a read-only Lua script: EVAL_RO script numkeys key... arg...",
        parse: Parser::Key(parse_eval_ro),
    },
    command! {
        name: "evalsha_ro",
        arity: -3,
        flags: ["readonly", "noscript", "stale", "skip_monitor", "no_mandatory_keys", "movablekeys"],
        keys: (0, 0, 0),
        acl: ["@slow", "@scripting"],
        group: "scripting",
        summary: "Runs a read-only script loaded before: EVALSHA_RO sha1 numkeys key... arg...",
        parse: Parser::Key(parse_evalsha_ro),
    },
    command! {
        name: "script",
        arity: -2,
        flags: ["noscript"],
        keys: (0, 0, 0),
        acl: ["@slow", "@scripting"],
        group: "scripting",
        summary: "The script cache: SCRIPT LOAD|EXISTS|FLUSH.",
        parse: Parser::Node(parse_script),
    },
];

/// A script to run, as it travels to a shard and into a cluster's log: its text, so every
/// replica can run it whether or not it was loaded there.
///
/// On-disk format: part of `KeyCmd::Eval` (golden bytes in tests/encoding.rs); fields are
/// append-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Eval {
    /// The SHA1 of `body`, in lower-case hex.
    pub sha: Bytes,
    /// The script's text; empty until the connection finds it for an EVALSHA.
    pub body: Bytes,
    pub keys: Vec<Bytes>,
    pub args: Vec<Bytes>,
    /// EVAL_RO and EVALSHA_RO: the script may not write.
    pub read_only: bool,
}

impl Eval {
    /// What the script's `#!lua` line declares; the legacy rules (no flags) for a script
    /// without one, or whose text has not been found yet (an EVALSHA before the connection
    /// looks it up).
    pub fn flags(&self) -> Result<ScriptFlags, ShebangError> {
        shebang::read(&self.body).map(|(flags, _)| flags)
    }
}

fn parse_eval(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    parse_script_call(a, false, false)
}

fn parse_evalsha(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    parse_script_call(a, true, false)
}

fn parse_eval_ro(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    parse_script_call(a, false, true)
}

fn parse_evalsha_ro(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    parse_script_call(a, true, true)
}

fn parse_script_call(a: &mut Args, by_sha: bool, read_only: bool) -> Result<Parsed, ParseError> {
    let first = a.next_bytes()?;
    let n = a
        .next_i64()
        .map_err(|_| ArgError::Msg("ERR value is not an integer or out of range".into()))?;
    if n < 0 {
        return Err(ArgError::Msg("ERR Number of keys can't be negative".into()).into());
    }
    let n = usize::try_from(n).unwrap_or(usize::MAX);
    if n > a.remaining() {
        return Err(ArgError::Msg(
            "ERR Number of keys can't be greater than number of args".into(),
        )
        .into());
    }
    let keys: Vec<Bytes> = (0..n).map(|_| a.next_bytes()).collect::<Result<_, _>>()?;
    let args = a.rest();
    let (sha, body) = if by_sha {
        (Bytes::from(first.to_ascii_lowercase()), Bytes::new())
    } else {
        if first.len() > MAX_SCRIPT_BYTES {
            return Err(ArgError::Msg(format!(
                "ERR scripts are limited to {MAX_SCRIPT_BYTES} bytes"
            ))
            .into());
        }
        shebang::read(&first).map_err(|e| ArgError::Msg(e.to_string()))?;
        (sha1_hex(&first), first)
    };
    // A script with no keys runs on any shard; with keys, on the one that owns the first
    // (`KeyCmd::route_key`).
    Ok(Parsed::Keyed(KeyCmd::Eval(Box::new(Eval {
        sha,
        body,
        keys,
        args,
        read_only,
    }))))
}

/// SCRIPT LOAD|EXISTS|FLUSH, parsed.
pub enum ScriptCmd {
    Load(Bytes),
    Exists(Vec<Bytes>),
    Flush,
}

fn parse_script(a: &mut Args) -> Result<NodeCmd, ArgError> {
    let sub = a.next_keyword()?;
    let cmd = match sub.as_str() {
        "LOAD" => {
            let body = a.next_bytes()?;
            a.finish_as(Trailing::SubArity("script|load"))?;
            if body.len() > MAX_SCRIPT_BYTES {
                return Err(msg(format!(
                    "ERR scripts are limited to {MAX_SCRIPT_BYTES} bytes"
                )));
            }
            shebang::read(&body).map_err(|e| msg(e.to_string()))?;
            ScriptCmd::Load(body)
        }
        "EXISTS" => {
            let shas = a.rest();
            if shas.is_empty() {
                return Err(ArgError::WrongArity("script|exists".into()));
            }
            ScriptCmd::Exists(shas)
        }
        "FLUSH" => {
            // ASYNC and SYNC are the same here: the cache is small.
            if a.remaining() > 0 && !(a.next_is("ASYNC") || a.next_is("SYNC")) {
                return Err(msg("ERR SCRIPT FLUSH only support SYNC|ASYNC option"));
            }
            a.finish_as(Trailing::Syntax)?;
            ScriptCmd::Flush
        }
        other => {
            return Err(msg(format!(
                "ERR unknown subcommand '{other}'. Try SCRIPT HELP."
            )));
        }
    };
    Ok(NodeCmd::Script(cmd))
}

/// The scripts a node knows, for EVALSHA: loaded with SCRIPT LOAD or run once with EVAL.
#[derive(Default)]
pub(crate) struct ScriptCache {
    inner: Mutex<CacheInner>,
}

#[derive(Default)]
struct CacheInner {
    by_sha: AHashMap<Bytes, (Bytes, u64)>,
    bytes: usize,
    next: u64,
}

impl std::fmt::Debug for ScriptCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = crate::sync::lock(&self.inner);
        f.debug_struct("ScriptCache")
            .field("scripts", &c.by_sha.len())
            .field("bytes", &c.bytes)
            .finish()
    }
}

impl ScriptCache {
    pub(crate) fn get(&self, sha: &[u8]) -> Option<Bytes> {
        crate::sync::lock(&self.inner)
            .by_sha
            .get(sha)
            .map(|(b, _)| b.clone())
    }

    pub(crate) fn insert(&self, sha: Bytes, body: Bytes) {
        let mut c = crate::sync::lock(&self.inner);
        if c.by_sha.contains_key(&sha) {
            return;
        }
        if c.by_sha.len() >= MAX_SCRIPTS || c.bytes + body.len() > MAX_SCRIPTS_BYTES {
            // Forget the older half: scripts are few, and a forgotten one costs its client
            // one EVAL.
            let mut ages: Vec<u64> = c.by_sha.values().map(|(_, age)| *age).collect();
            ages.sort_unstable();
            let cut = ages.get(ages.len() / 2).copied().unwrap_or(0);
            c.by_sha.retain(|_, (_, age)| *age >= cut);
            c.bytes = c.by_sha.values().map(|(b, _)| b.len()).sum();
        }
        c.bytes += body.len();
        c.next += 1;
        let age = c.next;
        c.by_sha.insert(sha, (body, age));
    }

    pub(crate) fn clear(&self) {
        let mut c = crate::sync::lock(&self.inner);
        c.by_sha.clear();
        c.bytes = 0;
    }
}

/// The SHA1 of a script, in lower-case hex, as Redis names scripts.
pub(crate) fn sha1_hex(body: &[u8]) -> Bytes {
    use sha1::Digest;
    let d = sha1::Sha1::digest(body);
    let mut s = String::with_capacity(40);
    for b in d {
        s.push_str(&format!("{b:02x}"));
    }
    Bytes::from(s)
}
