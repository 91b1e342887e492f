//! The set commands: SADD, SREM, SISMEMBER, SMISMEMBER, SCARD, SMEMBERS. Their entries, how
//! their arguments parse, and how a shard runs them on the set under a key
//! (`store::Coll::Set`), changed in place.
//!
//! Replies and errors are Redis 7.0's, word for word. SMEMBERS answers a set in RESP3, and
//! lists an intset's members in ascending order as Redis does; a hashtable's in the order
//! they were added (Redis's hash order is not something a client may rely on). A command that
//! leaves a set empty deletes the key.

use super::keyed::{KeyCmd, MAX_REPLY_BYTES, OOM, Reply, TOO_LARGE, WRONGTYPE};
use super::table::{CommandSpec, Parser, command};
use super::{ParseError, Parsed};
use crate::protocol::Args;
use crate::rules::RuleSet;
use crate::store::{Coll, Encodings, MemberSet, SetFull, Slot, Store, StoreFull, Value};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

pub(super) const COMMANDS: &[CommandSpec] = &[
    command! {
        name: "sadd",
        arity: -3,
        flags: ["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@set", "@fast"],
        group: "set",
        summary: "Adds one or more members to a set. Creates the key if it doesn't exist.",
        parse: Parser::Key(parse_sadd),
    },
    command! {
        name: "srem",
        arity: -3,
        flags: ["write", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@set", "@fast"],
        group: "set",
        summary: "Removes one or more members from a set. Deletes the set if the last member was removed.",
        parse: Parser::Key(parse_srem),
    },
    command! {
        name: "sismember",
        arity: 3,
        flags: ["readonly", "fast"],
        keys: (1, 1, 1),
        acl: ["@read", "@set", "@fast"],
        group: "set",
        summary: "Determines whether a member belongs to a set.",
        parse: Parser::Key(parse_sismember),
    },
    command! {
        name: "smismember",
        arity: -3,
        flags: ["readonly", "fast"],
        keys: (1, 1, 1),
        acl: ["@read", "@set", "@fast"],
        group: "set",
        summary: "Determines whether multiple members belong to a set.",
        parse: Parser::Key(parse_smismember),
    },
    command! {
        name: "scard",
        arity: 2,
        flags: ["readonly", "fast"],
        keys: (1, 1, 1),
        acl: ["@read", "@set", "@fast"],
        group: "set",
        summary: "Returns the number of members in a set.",
        parse: Parser::Key(parse_scard),
    },
    command! {
        name: "smembers",
        arity: 2,
        flags: ["readonly"],
        keys: (1, 1, 1),
        acl: ["@read", "@set", "@slow"],
        group: "set",
        summary: "Returns all members of a set.",
        parse: Parser::Key(parse_smembers),
    },
];

/// One set command's work on its key.
///
/// On-disk format: bincode-encoded into the Raft log inside `KeyCmd` (golden bytes in
/// tests/encoding.rs). Variants are append-only: add new ones at the end, never reorder or
/// change existing ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetOp {
    /// SCARD
    Card,
    /// SADD: answers how many members were new.
    Add(Vec<Bytes>),
    /// SREM: answers how many members were there.
    Rem(Vec<Bytes>),
    /// SISMEMBER
    IsMember(Bytes),
    /// SMISMEMBER
    MIsMember(Vec<Bytes>),
    /// SMEMBERS
    Members,
}

impl SetOp {
    /// Whether the reply can carry stored members (and so be as large as the collection).
    pub(crate) fn returns_values(&self) -> bool {
        matches!(self, SetOp::Members)
    }
}

fn keyed(key: Bytes, op: SetOp) -> Result<Parsed, ParseError> {
    Ok(Parsed::Keyed(KeyCmd::Members { key, op }))
}

/// SADD key member [member ...]
fn parse_sadd(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    keyed(key, SetOp::Add(a.rest()))
}

/// SREM key member [member ...]
fn parse_srem(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    keyed(key, SetOp::Rem(a.rest()))
}

/// SISMEMBER key member
fn parse_sismember(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    keyed(key, SetOp::IsMember(a.next_bytes()?))
}

/// SMISMEMBER key member [member ...]
fn parse_smismember(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    keyed(key, SetOp::MIsMember(a.rest()))
}

/// SCARD key
fn parse_scard(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    keyed(a.next_bytes()?, SetOp::Card)
}

/// SMEMBERS key
fn parse_smembers(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    keyed(a.next_bytes()?, SetOp::Members)
}

/// Runs one command on the set under `key`.
pub(super) fn execute(store: &mut Store, key: &[u8], op: &SetOp, now: u64) -> Reply {
    match op {
        SetOp::Card => read(store, key, now, Reply::Int(0), |s| count(s.len())),
        SetOp::IsMember(m) => read(store, key, now, Reply::Int(0), |s| {
            Reply::Int(i64::from(s.contains(m)))
        }),
        SetOp::MIsMember(ms) => {
            let zeros = Reply::Array(vec![Reply::Int(0); ms.len()]);
            read(store, key, now, zeros, |s| {
                Reply::Array(
                    ms.iter()
                        .map(|m| Reply::Int(i64::from(s.contains(m))))
                        .collect(),
                )
            })
        }
        SetOp::Members => read(store, key, now, Reply::Set(Vec::new()), members),
        SetOp::Add(ms) => add(store, key, ms, now),
        SetOp::Rem(ms) => {
            let Slot::Live(mut live) = store.slot(key, now) else {
                return Reply::Int(0);
            };
            let done = live.coll_mut(|c| match c {
                Coll::Set(s) => Some((ms.iter().filter(|m| s.remove(m)).count(), s.is_empty())),
                _ => None,
            });
            match done.flatten() {
                None => Reply::err(WRONGTYPE),
                Some((removed, empty)) => {
                    if empty {
                        live.remove();
                    }
                    count(removed)
                }
            }
        }
    }
}

/// SADD: refused at `maxmemory` (Redis's `denyoom`), and when a set cannot take more.
fn add(store: &mut Store, key: &[u8], ms: &[Bytes], now: u64) -> Reply {
    if store.usage.caps.memory_full() {
        return Reply::err(OOM);
    }
    let max_intset = Encodings::get(&store.usage.caps.encodings.set_max_intset_entries);
    let add_all = |s: &mut MemberSet| -> Result<usize, SetFull> {
        let mut added = 0;
        for m in ms {
            added += usize::from(s.add(m, max_intset)?);
        }
        Ok(added)
    };
    let added = match store.slot(key, now) {
        Slot::Empty(empty) => {
            let mut s = MemberSet::new();
            let added = add_all(&mut s);
            if s.is_empty() {
                return Reply::Int(0);
            }
            if let Err(StoreFull) = empty.insert_coll(Coll::Set(s), 0) {
                return Reply::err(OOM);
            }
            added
        }
        Slot::Live(mut live) => match live.coll_mut(|c| match c {
            Coll::Set(s) => Some(add_all(s)),
            _ => None,
        }) {
            Some(Some(added)) => added,
            _ => return Reply::err(WRONGTYPE),
        },
    };
    added.map_or(Reply::err(OOM), count)
}

/// SMEMBERS's reply, or the error for one past `MAX_REPLY_BYTES`.
fn members(s: &MemberSet) -> Reply {
    let mut total = 0usize;
    let mut out = Vec::with_capacity(s.len());
    s.for_each(|m| {
        total += m.len() + 16;
        if total <= MAX_REPLY_BYTES {
            out.push(Reply::Bulk(Bytes::copy_from_slice(m)));
        }
    });
    if total > MAX_REPLY_BYTES {
        return Reply::err(TOO_LARGE);
    }
    Reply::Set(out)
}

fn count(n: usize) -> Reply {
    Reply::Int(i64::try_from(n).unwrap_or(i64::MAX))
}

/// Answers a read: `missing` for no key, WRONGTYPE for a key of another kind, else `f`.
fn read(
    store: &Store,
    key: &[u8],
    now: u64,
    missing: Reply,
    f: impl FnOnce(&MemberSet) -> Reply,
) -> Reply {
    match store.get(key, now).map(|e| e.value) {
        None => missing,
        Some(Value::Coll(Coll::Set(s))) => f(s),
        Some(_) => Reply::err(WRONGTYPE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn add_op(ms: &[&str]) -> SetOp {
        SetOp::Add(ms.iter().map(|m| b(m)).collect())
    }

    #[test]
    fn members_come_back_in_the_sets_order_and_the_last_removal_deletes_the_key() {
        let mut s = Store::new(0, 0);
        assert_eq!(
            execute(&mut s, b"s", &add_op(&["3", "-1", "2", "3"]), 0),
            Reply::Int(3)
        );
        let ints = |v: &[&str]| Reply::Set(v.iter().map(|m| Reply::Bulk(b(m))).collect());
        assert_eq!(
            execute(&mut s, b"s", &SetOp::Members, 0),
            ints(&["-1", "2", "3"])
        );
        assert_eq!(
            execute(&mut s, b"s", &add_op(&["x", "0"]), 0),
            Reply::Int(2)
        );
        assert_eq!(
            execute(&mut s, b"s", &SetOp::Members, 0),
            ints(&["-1", "2", "3", "x", "0"])
        );
        let rem = SetOp::Rem(vec![b("-1"), b("2"), b("3"), b("x"), b("0"), b("0")]);
        assert_eq!(execute(&mut s, b"s", &rem, 0), Reply::Int(5));
        assert_eq!(s.len(), 0);
        assert_eq!(s.usage.bytes, 0);
    }
}
