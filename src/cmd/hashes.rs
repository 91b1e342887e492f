//! The hash commands: HSET, HMSET, HSETNX, HGET, HMGET, HINCRBY, HINCRBYFLOAT, HDEL, HGETALL,
//! HKEYS, HVALS, HEXISTS, HLEN, HSTRLEN. Their entries, how their arguments parse, and how a
//! shard runs them.
//!
//! These are what Redis token-bucket scripts keep their state in, so only small hashes are
//! kept: a hash is one record (`store::Fields`) that every command reads, and every write
//! rewrites whole. That is what bounds a hash to `MAX_FIELDS` fields and `MAX_BYTES` bytes of
//! names and values; a write that would pass either is refused and changes nothing. Fields keep
//! the order they were added in, as Redis's small-hash encoding (listpack) keeps them, so
//! HGETALL, HKEYS and HVALS list them as Redis does for hashes of values up to 64 bytes.
//!
//! Replies and errors are Redis 7.0's, checked in the order Redis checks them: HINCRBY's and
//! HINCRBYFLOAT's increment before the key's type, the type before the field.

use super::keyed::{KeyCmd, NAN_OR_INF, NOT_FLOAT, OOM, OVERFLOW, Reply, WRONGTYPE};
use super::table::{CommandSpec, Parser, command};
use super::{ParseError, Parsed, float, msg};
use crate::protocol::{ArgError, Args};
use crate::rules::RuleSet;
use crate::store::{Fields, Slot, Store, StoreFull, Value};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The most fields one hash holds (Redis keeps hashes this small as a listpack by default).
pub(crate) const MAX_FIELDS: usize = 128;
/// The most bytes of field names and values, together, one hash holds.
pub(crate) const MAX_BYTES: usize = 64 * 1024;

pub(crate) const TOO_MANY_FIELDS: &str = "ERR hash would have more than 128 fields";
pub(crate) const TOO_MANY_BYTES: &str =
    "ERR hash would have more than 65536 bytes of fields and values";
const NOT_INT_VALUE: &str = "ERR hash value is not an integer";
const NOT_FLOAT_VALUE: &str = "ERR hash value is not a float";
const NAN_OR_INF_INCR: &str = "ERR value is NaN or Infinity";

pub(super) const COMMANDS: &[CommandSpec] = &[
    command! {
        name: "hset",
        arity: -4,
        flags: ["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@hash", "@fast"],
        group: "hash",
        summary: "Creates or modifies the value of a field in a hash.",
        parse: Parser::Key(parse_hset),
    },
    command! {
        name: "hmset",
        arity: -4,
        flags: ["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@hash", "@fast"],
        group: "hash",
        summary: "Sets the values of multiple fields.",
        parse: Parser::Key(parse_hmset),
    },
    command! {
        name: "hsetnx",
        arity: 4,
        flags: ["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@hash", "@fast"],
        group: "hash",
        summary: "Sets the value of a field in a hash only when the field doesn't exist.",
        parse: Parser::Key(parse_hsetnx),
    },
    command! {
        name: "hget",
        arity: 3,
        flags: ["readonly", "fast"],
        keys: (1, 1, 1),
        acl: ["@read", "@hash", "@fast"],
        group: "hash",
        summary: "Returns the value of a field in a hash.",
        parse: Parser::Key(parse_hget),
    },
    command! {
        name: "hmget",
        arity: -3,
        flags: ["readonly", "fast"],
        keys: (1, 1, 1),
        acl: ["@read", "@hash", "@fast"],
        group: "hash",
        summary: "Returns the values of all fields in a hash.",
        parse: Parser::Key(parse_hmget),
    },
    command! {
        name: "hincrby",
        arity: 4,
        flags: ["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@hash", "@fast"],
        group: "hash",
        summary: "Increments the integer value of a field in a hash by a number.",
        parse: Parser::Key(parse_hincrby),
    },
    command! {
        name: "hincrbyfloat",
        arity: 4,
        flags: ["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@hash", "@fast"],
        group: "hash",
        summary: "Increments the floating point value of a field by a number.",
        parse: Parser::Key(parse_hincrbyfloat),
    },
    command! {
        name: "hdel",
        arity: -3,
        flags: ["write", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@hash", "@fast"],
        group: "hash",
        summary: "Deletes one or more fields and their values from a hash. Deletes the hash if no fields remain.",
        parse: Parser::Key(parse_hdel),
    },
    command! {
        name: "hgetall",
        arity: 2,
        flags: ["readonly"],
        keys: (1, 1, 1),
        acl: ["@read", "@hash", "@slow"],
        group: "hash",
        summary: "Returns all fields and values in a hash.",
        parse: Parser::Key(parse_hgetall),
    },
    command! {
        name: "hkeys",
        arity: 2,
        flags: ["readonly"],
        keys: (1, 1, 1),
        acl: ["@read", "@hash", "@slow"],
        group: "hash",
        summary: "Returns all fields in a hash.",
        parse: Parser::Key(parse_hkeys),
    },
    command! {
        name: "hvals",
        arity: 2,
        flags: ["readonly"],
        keys: (1, 1, 1),
        acl: ["@read", "@hash", "@slow"],
        group: "hash",
        summary: "Returns all values in a hash.",
        parse: Parser::Key(parse_hvals),
    },
    command! {
        name: "hexists",
        arity: 3,
        flags: ["readonly", "fast"],
        keys: (1, 1, 1),
        acl: ["@read", "@hash", "@fast"],
        group: "hash",
        summary: "Determines whether a field exists in a hash.",
        parse: Parser::Key(parse_hexists),
    },
    command! {
        name: "hlen",
        arity: 2,
        flags: ["readonly", "fast"],
        keys: (1, 1, 1),
        acl: ["@read", "@hash", "@fast"],
        group: "hash",
        summary: "Returns the number of fields in a hash.",
        parse: Parser::Key(parse_hlen),
    },
    command! {
        name: "hstrlen",
        arity: 3,
        flags: ["readonly", "fast"],
        keys: (1, 1, 1),
        acl: ["@read", "@hash", "@fast"],
        group: "hash",
        summary: "Returns the length of the value of a field.",
        parse: Parser::Key(parse_hstrlen),
    },
];

/// What a hash command does to the hash under its key (`KeyCmd::Hash`).
///
/// On-disk format: bincode-encoded into the Raft log inside `KeyCmd` (golden bytes in
/// tests/encoding.rs). Variants are append-only: add new ones at the end, never reorder or
/// change existing ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HashOp {
    /// HSET: sets each field in order (a repeated field ends with its last value); answers
    /// how many fields were new.
    Set(Vec<(Bytes, Bytes)>),
    /// HMSET: HSET answering OK.
    MSet(Vec<(Bytes, Bytes)>),
    /// HSETNX: sets the field only if the hash lacks it; answers 1 or 0.
    SetNx {
        field: Bytes,
        value: Bytes,
    },
    Get(Bytes),
    MGet(Vec<Bytes>),
    IncrBy {
        field: Bytes,
        delta: i64,
    },
    /// The increment was found to be a finite float when parsed; it is read again here.
    IncrByFloat {
        field: Bytes,
        incr: Bytes,
    },
    Del(Vec<Bytes>),
    GetAll,
    Keys,
    Vals,
    Exists(Bytes),
    Len,
    StrLen(Bytes),
}

impl HashOp {
    /// Whether the reply carries stored values (and so can be as large as a hash).
    pub(crate) fn returns_values(&self) -> bool {
        matches!(
            self,
            HashOp::Get(_) | HashOp::MGet(_) | HashOp::GetAll | HashOp::Keys | HashOp::Vals
        )
    }
}

fn keyed(key: Bytes, op: HashOp) -> Result<Parsed, ParseError> {
    Ok(Parsed::Keyed(KeyCmd::Hash { key, op }))
}

/// The field/value pairs after the key; an odd count is the command's arity error, as Redis
/// words it.
fn pairs(a: &mut Args) -> Result<Vec<(Bytes, Bytes)>, ArgError> {
    if !a.remaining().is_multiple_of(2) {
        return Err(a.arity_error());
    }
    let rest = a.rest();
    Ok(rest
        .chunks_exact(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect())
}

/// HSET key field value [field value ...]
fn parse_hset(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    keyed(key, HashOp::Set(pairs(a)?))
}

/// HMSET key field value [field value ...]
fn parse_hmset(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    keyed(key, HashOp::MSet(pairs(a)?))
}

/// HSETNX key field value
fn parse_hsetnx(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let field = a.next_bytes()?;
    let value = a.next_bytes()?;
    keyed(key, HashOp::SetNx { field, value })
}

/// HGET key field
fn parse_hget(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    keyed(key, HashOp::Get(a.next_bytes()?))
}

/// HMGET key field [field ...]
fn parse_hmget(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    keyed(key, HashOp::MGet(a.rest()))
}

/// HINCRBY key field increment
fn parse_hincrby(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let field = a.next_bytes()?;
    let delta = a.next_i64()?;
    keyed(key, HashOp::IncrBy { field, delta })
}

/// HINCRBYFLOAT key field increment
fn parse_hincrbyfloat(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let field = a.next_bytes()?;
    let incr = a.next_bytes()?;
    match float::parse(&incr) {
        Some(float::Parsed::Finite(_)) => keyed(key, HashOp::IncrByFloat { field, incr }),
        Some(float::Parsed::Infinite) => Err(msg(NAN_OR_INF_INCR).into()),
        None => Err(msg(NOT_FLOAT).into()),
    }
}

/// HDEL key field [field ...]
fn parse_hdel(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    keyed(key, HashOp::Del(a.rest()))
}

/// HGETALL key
fn parse_hgetall(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    keyed(a.next_bytes()?, HashOp::GetAll)
}

/// HKEYS key
fn parse_hkeys(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    keyed(a.next_bytes()?, HashOp::Keys)
}

/// HVALS key
fn parse_hvals(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    keyed(a.next_bytes()?, HashOp::Vals)
}

/// HEXISTS key field
fn parse_hexists(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    keyed(key, HashOp::Exists(a.next_bytes()?))
}

/// HLEN key
fn parse_hlen(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    keyed(a.next_bytes()?, HashOp::Len)
}

/// HSTRLEN key field
fn parse_hstrlen(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    keyed(key, HashOp::StrLen(a.next_bytes()?))
}

/// Runs one hash command on the hash under `key`.
pub(super) fn execute(store: &mut Store, key: &[u8], op: &HashOp, now: u64) -> Reply {
    match op {
        HashOp::Get(field) => read(store, key, now, Reply::Nil, |h| {
            h.get(field).map_or(Reply::Nil, bulk)
        }),
        HashOp::MGet(fields) => {
            let nils = Reply::Array(vec![Reply::Nil; fields.len()]);
            read(store, key, now, nils, |h| {
                Reply::Array(
                    fields
                        .iter()
                        .map(|f| h.get(f).map_or(Reply::Nil, bulk))
                        .collect(),
                )
            })
        }
        HashOp::GetAll => read(store, key, now, Reply::Map(Vec::new()), |h| {
            Reply::Map(h.iter().map(|(f, v)| (bulk(f), bulk(v))).collect())
        }),
        HashOp::Keys => read(store, key, now, Reply::Array(Vec::new()), |h| {
            Reply::Array(h.iter().map(|(f, _)| bulk(f)).collect())
        }),
        HashOp::Vals => read(store, key, now, Reply::Array(Vec::new()), |h| {
            Reply::Array(h.iter().map(|(_, v)| bulk(v)).collect())
        }),
        HashOp::Exists(field) => read(store, key, now, Reply::Int(0), |h| {
            Reply::Int(i64::from(h.get(field).is_some()))
        }),
        HashOp::Len => read(store, key, now, Reply::Int(0), |h| count(h.len())),
        HashOp::StrLen(field) => read(store, key, now, Reply::Int(0), |h| {
            count(h.get(field).map_or(0, <[u8]>::len))
        }),
        HashOp::Set(pairs) => write(store, key, now, |h| {
            let added = pairs.iter().filter(|(f, v)| h.set(f, v)).count();
            Ok(count(added))
        }),
        HashOp::MSet(pairs) => write(store, key, now, |h| {
            for (f, v) in pairs {
                h.set(f, v);
            }
            Ok(Reply::Ok)
        }),
        HashOp::SetNx { field, value } => write(store, key, now, |h| {
            if h.get(field).is_some() {
                return Ok(Reply::Int(0));
            }
            h.set(field, value);
            Ok(Reply::Int(1))
        }),
        HashOp::IncrBy { field, delta } => write(store, key, now, |h| {
            let current = match h.get(field) {
                None => 0,
                Some(v) => crate::protocol::parse_i64(v).ok_or(Reply::err(NOT_INT_VALUE))?,
            };
            let next = current.checked_add(*delta).ok_or(Reply::err(OVERFLOW))?;
            h.set(field, next.to_string().as_bytes());
            Ok(Reply::Int(next))
        }),
        HashOp::IncrByFloat { field, incr } => write(store, key, now, |h| {
            let text = float_sum(h.get(field), incr)?;
            h.set(field, text.as_bytes());
            Ok(Reply::Bulk(Bytes::from(text)))
        }),
        HashOp::Del(fields) => write(store, key, now, |h| {
            Ok(count(fields.iter().filter(|f| h.del(f)).count()))
        }),
    }
}

/// HINCRBYFLOAT's new value, as Redis prints it: the field's value (0 when missing) plus
/// `incr` in `long double` arithmetic (see `cmd::float`).
fn float_sum(current: Option<&[u8]>, incr: &[u8]) -> Result<String, Reply> {
    // None: an infinite operand (a stored "inf"), which only makes the sum infinite or NaN.
    let current = match current.map(float::parse) {
        None => Some(float::LongDouble::from_i64(0)),
        Some(Some(float::Parsed::Finite(v))) => Some(v),
        Some(Some(float::Parsed::Infinite)) => None,
        Some(None) => return Err(Reply::err(NOT_FLOAT_VALUE)),
    };
    let incr = match float::parse(incr) {
        Some(float::Parsed::Finite(v)) => v,
        // Refused when parsed; kept here so a log entry is never trusted blindly.
        Some(float::Parsed::Infinite) => return Err(Reply::err(NAN_OR_INF_INCR)),
        None => return Err(Reply::err(NOT_FLOAT)),
    };
    current
        .and_then(|c| float::add(c, incr))
        .map(float::format)
        .ok_or(Reply::err(NAN_OR_INF))
}

fn bulk(b: &[u8]) -> Reply {
    Reply::Bulk(Bytes::copy_from_slice(b))
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
    f: impl FnOnce(Fields<'_>) -> Reply,
) -> Reply {
    match store.get(key, now).map(|e| e.value) {
        None => missing,
        Some(Value::Hash(h)) => f(h),
        Some(_) => Reply::err(WRONGTYPE),
    }
}

/// A hash detached from the store while a write changes it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Edit {
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Edit {
    fn of(h: Fields<'_>) -> Edit {
        Edit {
            pairs: h.iter().map(|(f, v)| (f.to_vec(), v.to_vec())).collect(),
        }
    }

    fn get(&self, field: &[u8]) -> Option<&[u8]> {
        self.pairs
            .iter()
            .find(|(f, _)| f == field)
            .map(|(_, v)| v.as_slice())
    }

    /// Sets `field` to `value` in its place, or at the end if it is new; true if it was new.
    fn set(&mut self, field: &[u8], value: &[u8]) -> bool {
        match self.pairs.iter_mut().find(|(f, _)| f == field) {
            Some((_, v)) => {
                v.clear();
                v.extend_from_slice(value);
                false
            }
            None => {
                self.pairs.push((field.to_vec(), value.to_vec()));
                true
            }
        }
    }

    /// Removes `field`; true if it was there.
    fn del(&mut self, field: &[u8]) -> bool {
        let before = self.pairs.len();
        self.pairs.retain(|(f, _)| f != field);
        self.pairs.len() < before
    }

    /// Bytes of names and values, what `MAX_BYTES` bounds.
    fn bytes(&self) -> usize {
        self.pairs.iter().map(|(f, v)| f.len() + v.len()).sum()
    }

    /// The error for a hash grown past a bound by this write; one already past it (kept
    /// from a time of other bounds) may still shrink or stay as it is.
    fn refusal(&self, before: &Edit) -> Option<Reply> {
        let fields = self.pairs.len();
        if fields > MAX_FIELDS && fields > before.pairs.len() {
            return Some(Reply::err(TOO_MANY_FIELDS));
        }
        let bytes = self.bytes();
        (bytes > MAX_BYTES && bytes > before.bytes()).then(|| Reply::err(TOO_MANY_BYTES))
    }
}

/// Runs a write on the hash under `key` (an empty one when the key is missing): `f` changes
/// it and answers, or refuses with the reply to give and nothing is stored. A change that
/// passes a bound is refused the same way. A hash left empty is no key at all; one left as it
/// was is not rewritten. The key keeps its expiry.
fn write(
    store: &mut Store,
    key: &[u8],
    now: u64,
    f: impl FnOnce(&mut Edit) -> Result<Reply, Reply>,
) -> Reply {
    let slot = store.slot(key, now);
    let before = match &slot {
        Slot::Empty(_) => Edit::default(),
        Slot::Live(live) => match live.get().value {
            Value::Hash(h) => Edit::of(h),
            _ => return Reply::err(WRONGTYPE),
        },
    };
    let mut edit = before.clone();
    let reply = match f(&mut edit) {
        Ok(r) => r,
        Err(e) => return e,
    };
    if edit == before {
        return reply;
    }
    if let Some(e) = edit.refusal(&before) {
        return e;
    }
    let mut packed = Vec::new();
    let value = Value::Hash(Fields::pack(
        edit.pairs.iter().map(|(f, v)| (f, v)),
        &mut packed,
    ));
    match slot {
        Slot::Live(live) if edit.pairs.is_empty() => live.remove(),
        Slot::Live(mut live) => {
            let exp = live.get().expires_at;
            live.set(value, exp);
        }
        // Nothing was added, so nothing is stored.
        Slot::Empty(_) if edit.pairs.is_empty() => {}
        Slot::Empty(empty) => {
            if let Err(StoreFull) = empty.insert(value, 0) {
                return Reply::err(OOM);
            }
        }
    }
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn run(store: &mut Store, op: HashOp) -> Reply {
        execute(store, b"h", &op, 0)
    }

    fn set(pairs: &[(&str, &str)]) -> HashOp {
        HashOp::Set(pairs.iter().map(|(f, v)| (b(f), b(v))).collect())
    }

    #[test]
    fn fields_keep_their_order_and_place() {
        let mut s = Store::new(0, 0);
        assert_eq!(
            run(&mut s, set(&[("a", "1"), ("b", "2"), ("a", "3")])),
            Reply::Int(2)
        );
        assert_eq!(run(&mut s, set(&[("c", "4"), ("a", "5")])), Reply::Int(1));
        assert_eq!(
            run(&mut s, HashOp::Del(vec![b("b"), b("b")])),
            Reply::Int(1)
        );
        assert_eq!(
            run(&mut s, HashOp::Keys),
            Reply::Array(vec![Reply::Bulk(b("a")), Reply::Bulk(b("c"))])
        );
        assert_eq!(
            run(&mut s, HashOp::Vals),
            Reply::Array(vec![Reply::Bulk(b("5")), Reply::Bulk(b("4"))])
        );
    }

    #[test]
    fn the_last_field_deleted_deletes_the_key() {
        let mut s = Store::new(0, 0);
        run(&mut s, set(&[("a", "1")]));
        assert_eq!(s.len(), 1);
        assert_eq!(run(&mut s, HashOp::Del(vec![b("x")])), Reply::Int(0));
        assert_eq!(
            run(&mut s, HashOp::Del(vec![b("a"), b("x")])),
            Reply::Int(1)
        );
        assert_eq!(s.len(), 0);
        assert_eq!(s.usage.bytes, 0);
        assert_eq!(run(&mut s, HashOp::Del(vec![b("a")])), Reply::Int(0));
        assert_eq!(run(&mut s, HashOp::GetAll), Reply::Map(Vec::new()));
    }

    #[test]
    fn a_write_past_a_bound_changes_nothing() {
        let mut s = Store::new(0, 0);
        let names: Vec<String> = (0..MAX_FIELDS).map(|i| format!("f{i}")).collect();
        let full: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
        assert_eq!(run(&mut s, set(&full)), count(MAX_FIELDS));
        let before = s.get(b"h", 0).map(|e| format!("{:?}", e.value));
        for op in [
            set(&[("new", "v")]),
            HashOp::SetNx {
                field: b("new"),
                value: b("v"),
            },
            HashOp::IncrBy {
                field: b("new"),
                delta: 1,
            },
            HashOp::IncrByFloat {
                field: b("new"),
                incr: b("1.5"),
            },
        ] {
            assert_eq!(run(&mut s, op), Reply::err(TOO_MANY_FIELDS));
        }
        assert_eq!(s.get(b"h", 0).map(|e| format!("{:?}", e.value)), before);
        // Existing fields still change, and a deletion makes room again.
        assert_eq!(run(&mut s, set(&[("f0", "w")])), Reply::Int(0));
        assert_eq!(run(&mut s, HashOp::Del(vec![b("f1")])), Reply::Int(1));
        assert_eq!(run(&mut s, set(&[("new", "v")])), Reply::Int(1));

        let mut s = Store::new(0, 0);
        let big = "x".repeat(MAX_BYTES - 2);
        assert_eq!(run(&mut s, set(&[("a", &big)])), Reply::Int(1));
        assert_eq!(run(&mut s, set(&[("b", "")])), Reply::Int(1));
        assert_eq!(run(&mut s, set(&[("b", "y")])), Reply::err(TOO_MANY_BYTES));
        assert_eq!(run(&mut s, set(&[("c", "")])), Reply::err(TOO_MANY_BYTES));
        assert_eq!(run(&mut s, HashOp::StrLen(b("b"))), Reply::Int(0));
        assert_eq!(run(&mut s, HashOp::Len), Reply::Int(2));
    }

    #[test]
    fn a_hash_already_past_a_bound_may_still_shrink() {
        let long = Edit {
            pairs: (0..MAX_FIELDS + 5)
                .map(|i| (i.to_string().into_bytes(), Vec::new()))
                .collect(),
        };
        let mut shorter = long.clone();
        shorter.del(b"0");
        assert_eq!(shorter.refusal(&long), None);
        let mut longer = long.clone();
        longer.set(b"new", b"");
        assert_eq!(longer.refusal(&long), Some(Reply::err(TOO_MANY_FIELDS)));
    }

    #[test]
    fn other_kinds_are_the_wrong_type() {
        let mut s = Store::new(0, 0);
        if let Slot::Empty(e) = s.slot(b"h", 0) {
            e.insert(Value::Str(b"text"), 0).unwrap();
        }
        for op in [
            set(&[("a", "1")]),
            HashOp::Get(b("a")),
            HashOp::Del(vec![b("a")]),
        ] {
            assert_eq!(run(&mut s, op), Reply::err(WRONGTYPE));
        }
    }

    #[test]
    fn a_full_store_refuses_a_new_hash() {
        let mut s = Store::new(1, 0);
        assert_eq!(
            execute(&mut s, b"one", &set(&[("a", "1")]), 0),
            Reply::Int(1)
        );
        assert_eq!(
            execute(&mut s, b"two", &set(&[("a", "1")]), 0),
            Reply::err(OOM)
        );
        assert_eq!(
            execute(&mut s, b"one", &set(&[("b", "2")]), 0),
            Reply::Int(1)
        );
    }

    #[test]
    fn a_hash_keeps_its_expiry_across_writes() {
        let mut s = Store::new(0, 0);
        run(&mut s, set(&[("a", "1")]));
        if let Slot::Live(mut l) = s.slot(b"h", 0) {
            l.set_expiry(500);
        }
        run(&mut s, set(&[("b", "2")]));
        run(
            &mut s,
            HashOp::IncrBy {
                field: b("a"),
                delta: 4,
            },
        );
        assert_eq!(s.get(b"h", 0).map(|e| e.expires_at), Some(500));
        assert!(s.get(b"h", 500).is_none());
    }
}
