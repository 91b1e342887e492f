//! The set commands: their entries, how their arguments parse, and how a shard runs
//! them on the collection under a key (`store::Coll::Set`).
//!
//! Replies and errors are Redis 7.0's, word for word.

use super::keyed::{KeyCmd, Reply, WRONGTYPE};
use super::table::{CommandSpec, Parser, command};
use super::{ParseError, Parsed};
use crate::protocol::Args;
use crate::rules::RuleSet;
use crate::store::{Coll, Store, Value};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

pub(super) const COMMANDS: &[CommandSpec] = &[command! {
    name: "scard",
    arity: 2,
    flags: ["readonly", "fast"],
    keys: (1, 1, 1),
    acl: ["@read", "@set", "@fast"],
    group: "set",
    summary: "Returns the number of members in a set.",
    parse: Parser::Key(parse_scard),
}];

/// One set command's work on its key.
///
/// On-disk format: bincode-encoded into the Raft log inside `KeyCmd` (golden bytes in
/// tests/encoding.rs). Variants are append-only: add new ones at the end, never reorder or
/// change existing ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetOp {
    /// SCARD
    Card,
}

impl SetOp {
    /// Whether the reply can carry stored members (and so be as large as the collection).
    pub(crate) fn returns_values(&self) -> bool {
        match self {
            SetOp::Card => false,
        }
    }
}

fn keyed(key: Bytes, op: SetOp) -> Result<Parsed, ParseError> {
    Ok(Parsed::Keyed(KeyCmd::Members { key, op }))
}

/// SCARD key
fn parse_scard(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    keyed(a.next_bytes()?, SetOp::Card)
}

/// Runs one command on the collection under `key`.
pub(super) fn execute(store: &mut Store, key: &[u8], op: &SetOp, now: u64) -> Reply {
    match op {
        SetOp::Card => match store.get(key, now).map(|e| e.value) {
            None => Reply::Int(0),
            Some(Value::Coll(Coll::Set(c))) => Reply::Int(c.len() as i64),
            Some(_) => Reply::err(WRONGTYPE),
        },
    }
}
