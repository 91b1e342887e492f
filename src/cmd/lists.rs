//! The list commands: LPUSH, RPUSH, LPUSHX, RPUSHX, LPOP, RPOP, LINDEX, LRANGE, LTRIM, LLEN,
//! LSET, LREM, LINSERT, LPOS. Their entries, how their arguments parse, and how a shard runs
//! them on the list under a key (`store::Coll::List`), changed in place.
//!
//! Replies and errors are Redis 7.0's, word for word, checked in the order Redis checks them:
//! LRANGE's, LTRIM's and LREM's integers and LPOS's options before the key, LINDEX's and
//! LSET's index after the key's type (so an index that is not an integer travels to the shard
//! and is reported there). A command that leaves a list empty deletes the key.

use super::keyed::{KeyCmd, MAX_REPLY_BYTES, NOT_INT, OOM, Reply, TOO_LARGE, WRONGTYPE};
use super::table::{CommandSpec, Parser, command};
use super::{ParseError, Parsed, c_str, msg};
use crate::protocol::{ArgError, Args, parse_i64};
use crate::rules::RuleSet;
use crate::store::{Coll, List, Slot, Store, StoreFull, Value};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

const NO_SUCH_KEY: &str = "ERR no such key";
const OUT_OF_RANGE: &str = "ERR index out of range";
const NOT_POSITIVE: &str = "ERR value is out of range, must be positive";
const RANK_ZERO: &str = "ERR RANK can't be zero: use 1 to start from the first match, 2 from the second ... or use negative to start from the end of the list";
const COUNT_NEGATIVE: &str = "ERR COUNT can't be negative";
const MAXLEN_NEGATIVE: &str = "ERR MAXLEN can't be negative";

pub(super) const COMMANDS: &[CommandSpec] = &[
    command! {
        name: "lpush",
        arity: -3,
        flags: ["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@list", "@fast"],
        group: "list",
        summary: "Prepends one or more elements to a list. Creates the key if it doesn't exist.",
        parse: Parser::Key(parse_lpush),
    },
    command! {
        name: "rpush",
        arity: -3,
        flags: ["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@list", "@fast"],
        group: "list",
        summary: "Appends one or more elements to a list. Creates the key if it doesn't exist.",
        parse: Parser::Key(parse_rpush),
    },
    command! {
        name: "lpushx",
        arity: -3,
        flags: ["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@list", "@fast"],
        group: "list",
        summary: "Prepends one or more elements to a list only when the list exists.",
        parse: Parser::Key(parse_lpushx),
    },
    command! {
        name: "rpushx",
        arity: -3,
        flags: ["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@list", "@fast"],
        group: "list",
        summary: "Appends an element to a list only when the list exists.",
        parse: Parser::Key(parse_rpushx),
    },
    command! {
        name: "lpop",
        arity: -2,
        flags: ["write", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@list", "@fast"],
        group: "list",
        summary: "Returns the first elements in a list after removing it. Deletes the list if the last element was popped.",
        parse: Parser::Key(parse_lpop),
    },
    command! {
        name: "rpop",
        arity: -2,
        flags: ["write", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@list", "@fast"],
        group: "list",
        summary: "Returns and removes the last elements of a list. Deletes the list if the last element was popped.",
        parse: Parser::Key(parse_rpop),
    },
    command! {
        name: "lindex",
        arity: 3,
        flags: ["readonly"],
        keys: (1, 1, 1),
        acl: ["@read", "@list", "@slow"],
        group: "list",
        summary: "Returns an element from a list by its index.",
        parse: Parser::Key(parse_lindex),
    },
    command! {
        name: "lrange",
        arity: 4,
        flags: ["readonly"],
        keys: (1, 1, 1),
        acl: ["@read", "@list", "@slow"],
        group: "list",
        summary: "Returns a range of elements from a list.",
        parse: Parser::Key(parse_lrange),
    },
    command! {
        name: "ltrim",
        arity: 4,
        flags: ["write"],
        keys: (1, 1, 1),
        acl: ["@write", "@list", "@slow"],
        group: "list",
        summary: "Removes elements from both ends a list. Deletes the list if all elements were trimmed.",
        parse: Parser::Key(parse_ltrim),
    },
    command! {
        name: "llen",
        arity: 2,
        flags: ["readonly", "fast"],
        keys: (1, 1, 1),
        acl: ["@read", "@list", "@fast"],
        group: "list",
        summary: "Returns the length of a list.",
        parse: Parser::Key(parse_llen),
    },
    command! {
        name: "lset",
        arity: 4,
        flags: ["write", "denyoom"],
        keys: (1, 1, 1),
        acl: ["@write", "@list", "@slow"],
        group: "list",
        summary: "Sets the value of an element in a list by its index.",
        parse: Parser::Key(parse_lset),
    },
    command! {
        name: "lrem",
        arity: 4,
        flags: ["write"],
        keys: (1, 1, 1),
        acl: ["@write", "@list", "@slow"],
        group: "list",
        summary: "Removes elements from a list. Deletes the list if the last element was removed.",
        parse: Parser::Key(parse_lrem),
    },
    command! {
        name: "linsert",
        arity: 5,
        flags: ["write", "denyoom"],
        keys: (1, 1, 1),
        acl: ["@write", "@list", "@slow"],
        group: "list",
        summary: "Inserts an element before or after another element in a list.",
        parse: Parser::Key(parse_linsert),
    },
    command! {
        name: "lpos",
        arity: -3,
        flags: ["readonly"],
        keys: (1, 1, 1),
        acl: ["@read", "@list", "@slow"],
        group: "list",
        summary: "Returns the index of matching elements in a list.",
        parse: Parser::Key(parse_lpos),
    },
];

/// One list command's work on its key.
///
/// On-disk format: bincode-encoded into the Raft log inside `KeyCmd` (golden bytes in
/// tests/encoding.rs). Variants are append-only: add new ones at the end, never reorder or
/// change existing ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ListOp {
    /// LLEN
    Card,
    /// LPUSH (`head`), RPUSH; with `existing`, LPUSHX and RPUSHX: elements pushed one by one,
    /// so LPUSH's last argument ends at the head. Answers the new length.
    Push {
        head: bool,
        existing: bool,
        items: Vec<Bytes>,
    },
    /// LPOP (`head`), RPOP. Without a count the reply is one element (or nil); with one, an
    /// array (or the null array for a missing key).
    Pop { head: bool, count: Option<u64> },
    /// LINDEX; None when the index is not an integer.
    Index(Option<i64>),
    /// LRANGE, indexes as given (negative from the tail).
    Range { start: i64, stop: i64 },
    /// LTRIM
    Trim { start: i64, stop: i64 },
    /// LSET; `index` None when it is not an integer.
    Set { index: Option<i64>, value: Bytes },
    /// LREM: `count` > 0 removes that many from the head, < 0 from the tail, 0 all.
    Rem { count: i64, value: Bytes },
    /// LINSERT: `value` before (or `after`) the first element equal to `pivot`.
    Insert {
        after: bool,
        pivot: Bytes,
        value: Bytes,
    },
    /// LPOS: `rank` is never 0; `count` None when COUNT was not given (0: every match);
    /// `maxlen` 0 scans the whole list.
    Pos {
        value: Bytes,
        rank: i64,
        count: Option<u64>,
        maxlen: u64,
    },
}

impl ListOp {
    /// Whether the reply can carry stored elements (and so be as large as the list).
    pub(crate) fn returns_values(&self) -> bool {
        matches!(
            self,
            ListOp::Pop { .. } | ListOp::Index(_) | ListOp::Range { .. }
        )
    }

    /// Redis's `denyoom` commands: refused while the node is at `maxmemory`.
    fn grows(&self) -> bool {
        matches!(
            self,
            ListOp::Push { .. } | ListOp::Set { .. } | ListOp::Insert { .. }
        )
    }
}

fn keyed(key: Bytes, op: ListOp) -> Result<Parsed, ParseError> {
    Ok(Parsed::Keyed(KeyCmd::List { key, op }))
}

fn push(a: &mut Args, head: bool, existing: bool) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let items = a.rest();
    keyed(
        key,
        ListOp::Push {
            head,
            existing,
            items,
        },
    )
}

/// LPUSH key element [element ...]
fn parse_lpush(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    push(a, true, false)
}

/// RPUSH key element [element ...]
fn parse_rpush(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    push(a, false, false)
}

/// LPUSHX key element [element ...]
fn parse_lpushx(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    push(a, true, true)
}

/// RPUSHX key element [element ...]
fn parse_rpushx(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    push(a, false, true)
}

/// [LR]POP key [count]: a count that is not a non-negative integer is refused before the key
/// is looked at; more arguments are the arity error.
fn pop(a: &mut Args, head: bool) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    if a.remaining() > 1 {
        return Err(a.arity_error().into());
    }
    let count = match a.next_opt() {
        None => None,
        Some(c) => match parse_i64(&c).and_then(|v| u64::try_from(v).ok()) {
            Some(v) => Some(v),
            None => return Err(msg(NOT_POSITIVE).into()),
        },
    };
    keyed(key, ListOp::Pop { head, count })
}

/// LPOP key [count]
fn parse_lpop(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    pop(a, true)
}

/// RPOP key [count]
fn parse_rpop(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    pop(a, false)
}

/// LINDEX key index
fn parse_lindex(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let index = parse_i64(a.next_slice()?);
    keyed(key, ListOp::Index(index))
}

/// LRANGE key start stop
fn parse_lrange(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let (start, stop) = (a.next_i64()?, a.next_i64()?);
    keyed(key, ListOp::Range { start, stop })
}

/// LTRIM key start stop
fn parse_ltrim(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let (start, stop) = (a.next_i64()?, a.next_i64()?);
    keyed(key, ListOp::Trim { start, stop })
}

/// LLEN key
fn parse_llen(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    keyed(a.next_bytes()?, ListOp::Card)
}

/// LSET key index element
fn parse_lset(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let index = parse_i64(a.next_slice()?);
    let value = a.next_bytes()?;
    keyed(key, ListOp::Set { index, value })
}

/// LREM key count element
fn parse_lrem(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let count = a.next_i64()?;
    let value = a.next_bytes()?;
    keyed(key, ListOp::Rem { count, value })
}

/// LINSERT key BEFORE|AFTER pivot element
fn parse_linsert(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let side = a.next_bytes()?;
    let after = match c_str(&side) {
        s if s.eq_ignore_ascii_case(b"after") => true,
        s if s.eq_ignore_ascii_case(b"before") => false,
        _ => return Err(ArgError::Syntax.into()),
    };
    let pivot = a.next_bytes()?;
    let value = a.next_bytes()?;
    keyed(
        key,
        ListOp::Insert {
            after,
            pivot,
            value,
        },
    )
}

/// LPOS's COUNT and MAXLEN: a non-negative integer, or the option's own error.
fn non_negative(arg: &[u8], err: &'static str) -> Result<u64, ParseError> {
    parse_i64(arg)
        .and_then(|v| u64::try_from(v).ok())
        .ok_or_else(|| msg(err).into())
}

/// LPOS key element [RANK rank] [COUNT num-matches] [MAXLEN len]: options in any order, the
/// last of each winning; an option without its value is a syntax error.
fn parse_lpos(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let value = a.next_bytes()?;
    let (mut rank, mut count, mut maxlen) = (1, None, 0);
    while a.remaining() > 0 {
        let opt = a.next_bytes()?;
        let opt = c_str(&opt);
        let more = a.remaining() > 0;
        if opt.eq_ignore_ascii_case(b"rank") && more {
            rank = a.next_i64()?;
            if rank == 0 {
                return Err(msg(RANK_ZERO).into());
            }
        } else if opt.eq_ignore_ascii_case(b"count") && more {
            count = Some(non_negative(a.next_slice()?, COUNT_NEGATIVE)?);
        } else if opt.eq_ignore_ascii_case(b"maxlen") && more {
            maxlen = non_negative(a.next_slice()?, MAXLEN_NEGATIVE)?;
        } else {
            return Err(ArgError::Syntax.into());
        }
    }
    keyed(
        key,
        ListOp::Pos {
            value,
            rank,
            count,
            maxlen,
        },
    )
}

/// Runs one command on the list under `key`.
pub(super) fn execute(store: &mut Store, key: &[u8], op: &ListOp, now: u64) -> Reply {
    if op.grows() && store.usage.caps.memory_full() {
        return Reply::err(OOM);
    }
    match op {
        ListOp::Card => read(store, key, now, Reply::Int(0), |l| count(l.len())),
        ListOp::Push {
            head,
            existing,
            items,
        } => push_items(store, key, *head, *existing, items, now),
        ListOp::Pop { head, count: None } => write(store, key, now, Reply::Nil, |l| {
            let e = if *head {
                l.iter().next()
            } else {
                l.iter_rev().next()
            };
            let Some(reply) = e.map(bulk) else {
                return Reply::Nil;
            };
            pop_n(l, *head, 1);
            reply
        }),
        ListOp::Pop {
            head,
            count: Some(n),
        } => write(store, key, now, Reply::NilArray, |l| {
            let n = usize::try_from(*n).unwrap_or(usize::MAX).min(l.len());
            let reply = if *head {
                bulk_array(l.iter().take(n))
            } else {
                bulk_array(l.iter_rev().take(n))
            };
            if !matches!(reply, Reply::Error(_)) {
                pop_n(l, *head, n);
            }
            reply
        }),
        ListOp::Index(index) => read(store, key, now, Reply::Nil, |l| match index {
            None => Reply::err(NOT_INT),
            Some(i) => position(l.len(), *i)
                .and_then(|i| l.get(i))
                .map_or(Reply::Nil, bulk),
        }),
        ListOp::Range { start, stop } => read(store, key, now, Reply::Array(Vec::new()), |l| {
            match span(l.len(), *start, *stop) {
                None => Reply::Array(Vec::new()),
                Some((from, to)) => bulk_array(l.iter_from(from).take(to - from + 1)),
            }
        }),
        ListOp::Trim { start, stop } => write(store, key, now, Reply::Ok, |l| {
            let len = l.len();
            match span(len, *start, *stop) {
                None => l.drain_front(len),
                Some((from, to)) => {
                    l.drain_back(len - 1 - to);
                    l.drain_front(from);
                }
            }
            Reply::Ok
        }),
        ListOp::Set { index, value } => {
            write(store, key, now, Reply::err(NO_SUCH_KEY), |l| match index {
                None => Reply::err(NOT_INT),
                Some(i) => match position(l.len(), *i) {
                    Some(i) if l.set(i, value) => Reply::Ok,
                    _ => Reply::err(OUT_OF_RANGE),
                },
            })
        }
        ListOp::Rem { count: n, value } => write(store, key, now, Reply::Int(0), |l| {
            let limit = usize::try_from(n.unsigned_abs()).unwrap_or(usize::MAX);
            let removed = match n {
                0 => l.remove_matches(value, 0, usize::MAX),
                n if *n > 0 => l.remove_matches(value, 0, limit),
                // The last `limit` matches: those after the first `matches - limit`.
                _ => {
                    let skip = l.count_matches(value).saturating_sub(limit);
                    l.remove_matches(value, skip, usize::MAX)
                }
            };
            count(removed)
        }),
        ListOp::Insert {
            after,
            pivot,
            value,
        } => write(store, key, now, Reply::Int(0), |l| {
            match l.iter().position(|e| e == &pivot[..]) {
                None => Reply::Int(-1),
                Some(i) => {
                    l.insert(i + usize::from(*after), value);
                    count(l.len())
                }
            }
        }),
        ListOp::Pos {
            value,
            rank,
            count: n,
            maxlen,
        } => {
            let missing = match n {
                Some(_) => Reply::Array(Vec::new()),
                None => Reply::Nil,
            };
            read(store, key, now, missing, |l| {
                lpos(l, value, *rank, *n, *maxlen)
            })
        }
    }
}

/// LPOS on a list, as Redis scans: from the head for a positive rank, from the tail for a
/// negative one, at most `maxlen` elements (0: all). Redis negates and subtracts in C
/// `long`s; the wrapping arithmetic here gives what it gives for a rank of `i64::MIN`.
fn lpos(l: &List, value: &[u8], rank: i64, n: Option<u64>, maxlen: u64) -> Reply {
    let from_tail = rank < 0;
    let rank = if from_tail { rank.wrapping_neg() } else { rank };
    let len = l.len();
    let scan: Box<dyn Iterator<Item = &[u8]>> = if from_tail {
        Box::new(l.iter_rev())
    } else {
        Box::new(l.iter())
    };
    let limit = if maxlen == 0 {
        usize::MAX
    } else {
        usize::try_from(maxlen).unwrap_or(usize::MAX)
    };
    let want = n.map(|c| i64::try_from(c).unwrap_or(i64::MAX));
    let mut matches: i64 = 0;
    let mut found = Vec::new();
    for (i, e) in scan.take(limit).enumerate() {
        if e != value {
            continue;
        }
        matches += 1;
        if matches < rank {
            continue;
        }
        let at = count(if from_tail { len - i - 1 } else { i });
        match want {
            None => return at,
            Some(c) => {
                found.push(at);
                if c != 0 && matches.wrapping_sub(rank).wrapping_add(1) >= c {
                    break;
                }
            }
        }
    }
    match want {
        None => Reply::Nil,
        Some(_) => Reply::Array(found),
    }
}

/// Removes `n` elements from the head, or from the tail.
fn pop_n(l: &mut List, head: bool, n: usize) {
    if head {
        l.drain_front(n);
    } else {
        l.drain_back(n);
    }
}

/// LINDEX's and LSET's index as a place in a list of `len` (negative from the tail).
fn position(len: usize, index: i64) -> Option<usize> {
    let len = i64::try_from(len).ok()?;
    let i = if index < 0 { len + index } else { index };
    (0..len).contains(&i).then_some(i as usize)
}

/// LRANGE's and LTRIM's range as Redis clamps it: inclusive places, None when empty.
fn span(len: usize, start: i64, stop: i64) -> Option<(usize, usize)> {
    let len = i64::try_from(len).ok()?;
    let mut start = if start < 0 { len + start } else { start };
    let mut stop = if stop < 0 { len + stop } else { stop };
    start = start.max(0);
    if start > stop || start >= len {
        return None;
    }
    stop = stop.min(len - 1);
    Some((start as usize, stop as usize))
}

fn push_items(
    store: &mut Store,
    key: &[u8],
    head: bool,
    existing: bool,
    items: &[Bytes],
    now: u64,
) -> Reply {
    let add = |l: &mut List| {
        for e in items {
            if head {
                l.push_front(e);
            } else {
                l.push_back(e);
            }
        }
        count(l.len())
    };
    match store.slot(key, now) {
        Slot::Empty(_) if existing => Reply::Int(0),
        Slot::Empty(empty) => {
            let mut l = List::new();
            let reply = add(&mut l);
            if l.is_empty() {
                return reply;
            }
            match empty.insert_coll(Coll::List(l), 0) {
                Ok(()) => reply,
                Err(StoreFull) => Reply::err(OOM),
            }
        }
        Slot::Live(mut live) => live
            .coll_mut(|c| match c {
                Coll::List(l) => add(l),
                _ => Reply::err(WRONGTYPE),
            })
            .unwrap_or(Reply::err(WRONGTYPE)),
    }
}

fn bulk(b: &[u8]) -> Reply {
    Reply::Bulk(Bytes::copy_from_slice(b))
}

fn count(n: usize) -> Reply {
    Reply::Int(i64::try_from(n).unwrap_or(i64::MAX))
}

/// The elements as an array reply, or the error for one past `MAX_REPLY_BYTES`.
fn bulk_array<'a>(items: impl Iterator<Item = &'a [u8]>) -> Reply {
    let mut total = 0usize;
    let mut out = Vec::new();
    for e in items {
        total += e.len() + 16;
        if total > MAX_REPLY_BYTES {
            return Reply::err(TOO_LARGE);
        }
        out.push(bulk(e));
    }
    Reply::Array(out)
}

/// Answers a read: `missing` for no key, WRONGTYPE for a key of another kind, else `f`.
fn read(
    store: &Store,
    key: &[u8],
    now: u64,
    missing: Reply,
    f: impl FnOnce(&List) -> Reply,
) -> Reply {
    match store.get(key, now).map(|e| e.value) {
        None => missing,
        Some(Value::Coll(Coll::List(l))) => f(l),
        Some(_) => Reply::err(WRONGTYPE),
    }
}

/// Runs a change on the list under `key`, in place: `missing` for no key, WRONGTYPE for a
/// key of another kind, else `f`'s answer. A list left empty is no key at all; the key keeps
/// its expiry otherwise.
fn write(
    store: &mut Store,
    key: &[u8],
    now: u64,
    missing: Reply,
    f: impl FnOnce(&mut List) -> Reply,
) -> Reply {
    let Slot::Live(mut live) = store.slot(key, now) else {
        return missing;
    };
    let done = live.coll_mut(|c| match c {
        Coll::List(l) => Some((f(l), l.is_empty())),
        _ => None,
    });
    match done.flatten() {
        None => Reply::err(WRONGTYPE),
        Some((reply, empty)) => {
            if empty {
                live.remove();
            }
            reply
        }
    }
}

#[cfg(test)]
#[path = "lists_tests.rs"]
mod tests;
