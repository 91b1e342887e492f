//! The sorted set commands: ZADD, ZINCRBY, ZREM, ZCARD, ZCOUNT, ZLEXCOUNT, ZSCORE, ZMSCORE,
//! ZRANGE and its older forms (ZRANGEBYSCORE, ZREVRANGEBYSCORE, ZREVRANGE, ZRANGEBYLEX,
//! ZREVRANGEBYLEX), ZRANK, ZREVRANK, ZREMRANGEBYSCORE, ZREMRANGEBYRANK, ZREMRANGEBYLEX,
//! ZPOPMIN and ZPOPMAX. Their entries, how their arguments parse, and how a shard runs them on
//! the collection under a key (`store::Coll::ZSet`).
//!
//! Replies and errors are Redis 7.0's, word for word, checked in the order Redis checks them:
//! everything Redis rejects before it looks the key up (options, scores, ranges) is rejected
//! here when the command parses, and the key's type only on the shard.

use super::keyed::{KeyCmd, MAX_REPLY_BYTES, NOT_FLOAT, OOM, Reply, TOO_LARGE, WRONGTYPE};
use super::table::{CommandSpec, Parser, command};
pub use super::zscore::{AddFlags, LexBound, LexRange, RangeBy, ScoreRange};
use super::zscore::{add, count, lex_window, parse_score, score_double, score_window, select};
use super::{ParseError, Parsed, c_str, msg};
use crate::protocol::{ArgError, Args, parse_i64};
use crate::rules::RuleSet;
use crate::store::{Coll, Encodings, PackLimits, Slot, Store, StoreFull, Value, ZSet};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

const XX_AND_NX: &str = "ERR XX and NX options at the same time are not compatible";
const GT_LT_NX: &str = "ERR GT, LT, and/or NX options at the same time are not compatible";
const INCR_ONE_PAIR: &str = "ERR INCR option supports a single increment-element pair";
const NOT_FLOAT_RANGE: &str = "ERR min or max is not a float";
const NOT_LEX_RANGE: &str = "ERR min or max not valid string range item";
const LIMIT_NEEDS_BY: &str =
    "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX";
const WITHSCORES_BYLEX: &str =
    "ERR syntax error, WITHSCORES not supported in combination with BYLEX";
const NOT_POSITIVE: &str = "ERR value is out of range, must be positive";

macro_rules! zcommand {
    ($name:literal, $arity:expr, [$($flag:literal),*], [$($acl:literal),*], $summary:literal, $parse:expr) => {
        command! {
            name: $name,
            arity: $arity,
            flags: [$($flag),*],
            keys: (1, 1, 1),
            acl: [$($acl),*],
            group: "sorted_set",
            summary: $summary,
            parse: Parser::Key($parse),
        }
    };
}

pub(super) const COMMANDS: &[CommandSpec] = &[
    zcommand!(
        "zcard",
        2,
        ["readonly", "fast"],
        ["@read", "@sortedset", "@fast"],
        "Returns the number of members in a sorted set.",
        parse_zcard
    ),
    zcommand!(
        "zadd",
        -4,
        ["write", "denyoom", "fast"],
        ["@write", "@sortedset", "@fast"],
        "Adds one or more members to a sorted set, or updates their scores. Creates the key if it doesn't exist.",
        parse_zadd
    ),
    zcommand!(
        "zincrby",
        4,
        ["write", "denyoom", "fast"],
        ["@write", "@sortedset", "@fast"],
        "Increments the score of a member in a sorted set.",
        parse_zincrby
    ),
    zcommand!(
        "zrem",
        -3,
        ["write", "fast"],
        ["@write", "@sortedset", "@fast"],
        "Removes one or more members from a sorted set. Deletes the sorted set if all members were removed.",
        parse_zrem
    ),
    zcommand!(
        "zcount",
        4,
        ["readonly", "fast"],
        ["@read", "@sortedset", "@fast"],
        "Returns the count of members in a sorted set that have scores within a range.",
        parse_zcount
    ),
    zcommand!(
        "zlexcount",
        4,
        ["readonly", "fast"],
        ["@read", "@sortedset", "@fast"],
        "Returns the number of members in a sorted set within a lexicographical range.",
        parse_zlexcount
    ),
    zcommand!(
        "zscore",
        3,
        ["readonly", "fast"],
        ["@read", "@sortedset", "@fast"],
        "Returns the score of a member in a sorted set.",
        parse_zscore
    ),
    zcommand!(
        "zmscore",
        -3,
        ["readonly", "fast"],
        ["@read", "@sortedset", "@fast"],
        "Returns the score of one or more members in a sorted set.",
        parse_zmscore
    ),
    zcommand!(
        "zrange",
        -4,
        ["readonly"],
        ["@read", "@sortedset", "@slow"],
        "Returns members in a sorted set within a range of indexes.",
        parse_zrange
    ),
    zcommand!(
        "zrangebyscore",
        -4,
        ["readonly"],
        ["@read", "@sortedset", "@slow"],
        "Returns members in a sorted set within a range of scores.",
        parse_zrangebyscore
    ),
    zcommand!(
        "zrevrangebyscore",
        -4,
        ["readonly"],
        ["@read", "@sortedset", "@slow"],
        "Returns members in a sorted set within a range of scores in reverse order.",
        parse_zrevrangebyscore
    ),
    zcommand!(
        "zrevrange",
        -4,
        ["readonly"],
        ["@read", "@sortedset", "@slow"],
        "Returns members in a sorted set within a range of indexes in reverse order.",
        parse_zrevrange
    ),
    zcommand!(
        "zrangebylex",
        -4,
        ["readonly"],
        ["@read", "@sortedset", "@slow"],
        "Returns members in a sorted set within a lexicographical range.",
        parse_zrangebylex
    ),
    zcommand!(
        "zrevrangebylex",
        -4,
        ["readonly"],
        ["@read", "@sortedset", "@slow"],
        "Returns members in a sorted set within a lexicographical range in reverse order.",
        parse_zrevrangebylex
    ),
    zcommand!(
        "zrank",
        3,
        ["readonly", "fast"],
        ["@read", "@sortedset", "@fast"],
        "Returns the index of a member in a sorted set ordered by ascending scores.",
        parse_zrank
    ),
    zcommand!(
        "zrevrank",
        3,
        ["readonly", "fast"],
        ["@read", "@sortedset", "@fast"],
        "Returns the index of a member in a sorted set ordered by descending scores.",
        parse_zrevrank
    ),
    zcommand!(
        "zremrangebyscore",
        4,
        ["write"],
        ["@write", "@sortedset", "@slow"],
        "Removes members in a sorted set within a range of scores. Deletes the sorted set if all members were removed.",
        parse_zremrangebyscore
    ),
    zcommand!(
        "zremrangebyrank",
        4,
        ["write"],
        ["@write", "@sortedset", "@slow"],
        "Removes members in a sorted set within a range of indexes. Deletes the sorted set if all members were removed.",
        parse_zremrangebyrank
    ),
    zcommand!(
        "zremrangebylex",
        4,
        ["write"],
        ["@write", "@sortedset", "@slow"],
        "Removes members in a sorted set within a lexicographical range. Deletes the sorted set if all members were removed.",
        parse_zremrangebylex
    ),
    zcommand!(
        "zpopmin",
        -2,
        ["write", "fast"],
        ["@write", "@sortedset", "@fast"],
        "Returns the lowest-scoring members from a sorted set after removing them. Deletes the sorted set if the last member was popped.",
        parse_zpopmin
    ),
    zcommand!(
        "zpopmax",
        -2,
        ["write", "fast"],
        ["@write", "@sortedset", "@fast"],
        "Returns the highest-scoring members from a sorted set after removing them. Deletes the sorted set if the last member was popped.",
        parse_zpopmax
    ),
];

/// One sorted set command's work on its key.
///
/// On-disk format: bincode-encoded into the Raft log inside `KeyCmd` (golden bytes in
/// tests/encoding.rs). Variants are append-only: add new ones at the end, never reorder or
/// change existing ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ZOp {
    /// ZCARD
    Card,
    /// ZADD and ZINCRBY: (score as `f64::to_bits`, member) pairs, in order.
    Add {
        flags: AddFlags,
        pairs: Vec<(u64, Bytes)>,
    },
    Rem(Vec<Bytes>),
    Count(ScoreRange),
    LexCount(LexRange),
    Score(Bytes),
    MScore(Vec<Bytes>),
    /// ZRANGE and its older forms. `offset` and `count` are LIMIT's (0 and -1 without it).
    Range {
        by: RangeBy,
        rev: bool,
        with_scores: bool,
        offset: i64,
        count: i64,
    },
    Rank {
        member: Bytes,
        rev: bool,
    },
    /// ZREMRANGEBYRANK, ZREMRANGEBYSCORE, ZREMRANGEBYLEX.
    RemRange(RangeBy),
    /// ZPOPMIN and ZPOPMAX; `count` None when not given (a flat reply of one pair).
    Pop {
        max: bool,
        count: Option<u64>,
    },
}

impl ZOp {
    /// Whether the reply can carry stored members (and so be as large as the collection).
    pub(crate) fn returns_values(&self) -> bool {
        matches!(self, ZOp::Range { .. } | ZOp::Pop { .. })
    }
}

fn keyed(key: Bytes, op: ZOp) -> Result<Parsed, ParseError> {
    Ok(Parsed::Keyed(KeyCmd::ZSet { key, op }))
}

fn is(arg: &[u8], kw: &str) -> bool {
    c_str(arg).eq_ignore_ascii_case(kw.as_bytes())
}

/// ZCARD key
fn parse_zcard(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    keyed(a.next_bytes()?, ZOp::Card)
}

/// ZADD key [NX | XX] [GT | LT] [CH] [INCR] score member [score member ...]
fn parse_zadd(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    parse_add(a, AddFlags::default())
}

/// ZINCRBY key increment member: ZADD INCR, options included, as Redis parses it.
fn parse_zincrby(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    parse_add(
        a,
        AddFlags {
            incr: true,
            ..AddFlags::default()
        },
    )
}

fn parse_add(a: &mut Args, mut f: AddFlags) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let mut rest = a.rest().into_iter().peekable();
    while let Some(opt) = rest.peek() {
        let flag = match () {
            _ if is(opt, "nx") => &mut f.nx,
            _ if is(opt, "xx") => &mut f.xx,
            _ if is(opt, "ch") => &mut f.ch,
            _ if is(opt, "incr") => &mut f.incr,
            _ if is(opt, "gt") => &mut f.gt,
            _ if is(opt, "lt") => &mut f.lt,
            _ => break,
        };
        *flag = true;
        rest.next();
    }
    let rest: Vec<Bytes> = rest.collect();
    if rest.is_empty() || !rest.len().is_multiple_of(2) {
        return Err(ArgError::Syntax.into());
    }
    if f.nx && f.xx {
        return Err(msg(XX_AND_NX).into());
    }
    if (f.nx && (f.gt || f.lt)) || (f.gt && f.lt) {
        return Err(msg(GT_LT_NX).into());
    }
    if f.incr && rest.len() > 2 {
        return Err(msg(INCR_ONE_PAIR).into());
    }
    let mut pairs = Vec::with_capacity(rest.len() / 2);
    for p in rest.chunks_exact(2) {
        let score = parse_score(&p[0]).ok_or_else(|| msg(NOT_FLOAT))?;
        pairs.push((score.to_bits(), p[1].clone()));
    }
    keyed(key, ZOp::Add { flags: f, pairs })
}

/// ZREM key member [member ...]
fn parse_zrem(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    keyed(key, ZOp::Rem(a.rest()))
}

fn score_range(a: &mut Args) -> Result<ScoreRange, ArgError> {
    let min = a.next_bytes()?;
    let max = a.next_bytes()?;
    ScoreRange::parse(&min, &max).ok_or_else(|| msg(NOT_FLOAT_RANGE))
}

fn lex_range(a: &mut Args) -> Result<LexRange, ArgError> {
    let min = a.next_bytes()?;
    let max = a.next_bytes()?;
    LexRange::parse(&min, &max).ok_or_else(|| msg(NOT_LEX_RANGE))
}

/// ZCOUNT key min max
fn parse_zcount(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    keyed(key, ZOp::Count(score_range(a)?))
}

/// ZLEXCOUNT key min max
fn parse_zlexcount(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    keyed(key, ZOp::LexCount(lex_range(a)?))
}

/// ZSCORE key member
fn parse_zscore(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    keyed(key, ZOp::Score(a.next_bytes()?))
}

/// ZMSCORE key member [member ...]
fn parse_zmscore(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    keyed(key, ZOp::MScore(a.rest()))
}

/// How the range is given, before the options say.
#[derive(Clone, Copy, PartialEq, Eq)]
enum By {
    Auto,
    Rank,
    Score,
    Lex,
}

/// The ZRANGE family, as Redis's `zrangeGenericCommand`: `by` and `rev` fixed by the older
/// commands, chosen by options for ZRANGE.
fn parse_range(a: &mut Args, mut by: By, rev: Option<bool>) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let min = a.next_bytes()?;
    let max = a.next_bytes()?;
    let opts = a.rest();
    let (mut with_scores, mut offset, mut count, mut reverse) = (false, 0, -1, rev);
    let mut i = 0;
    while let Some(opt) = opts.get(i) {
        let left = opts.len() - i - 1;
        if is(opt, "withscores") {
            with_scores = true;
        } else if is(opt, "limit") && left >= 2 {
            offset = parse_i64(&opts[i + 1]).ok_or(ArgError::NotInteger)?;
            count = parse_i64(&opts[i + 2]).ok_or(ArgError::NotInteger)?;
            i += 2;
        } else if reverse.is_none() && is(opt, "rev") {
            reverse = Some(true);
        } else if by == By::Auto && is(opt, "bylex") {
            by = By::Lex;
        } else if by == By::Auto && is(opt, "byscore") {
            by = By::Score;
        } else {
            return Err(ArgError::Syntax.into());
        }
        i += 1;
    }
    let rev = reverse.unwrap_or(false);
    if count != -1 && matches!(by, By::Auto | By::Rank) {
        return Err(msg(LIMIT_NEEDS_BY).into());
    }
    if with_scores && by == By::Lex {
        return Err(msg(WITHSCORES_BYLEX).into());
    }
    // The older reverse forms, and REV with BYSCORE or BYLEX, take the range as max, min.
    let (min, max) = if rev && matches!(by, By::Score | By::Lex) {
        (max, min)
    } else {
        (min, max)
    };
    let by = match by {
        By::Auto | By::Rank => RangeBy::Rank {
            start: parse_i64(&min).ok_or(ArgError::NotInteger)?,
            stop: parse_i64(&max).ok_or(ArgError::NotInteger)?,
        },
        By::Score => {
            RangeBy::Score(ScoreRange::parse(&min, &max).ok_or_else(|| msg(NOT_FLOAT_RANGE))?)
        }
        By::Lex => RangeBy::Lex(LexRange::parse(&min, &max).ok_or_else(|| msg(NOT_LEX_RANGE))?),
    };
    let op = ZOp::Range {
        by,
        rev,
        with_scores,
        offset,
        count,
    };
    keyed(key, op)
}

/// ZRANGE key start stop [BYSCORE | BYLEX] [REV] [LIMIT offset count] [WITHSCORES]
fn parse_zrange(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    parse_range(a, By::Auto, None)
}

/// ZRANGEBYSCORE key min max [WITHSCORES] [LIMIT offset count]
fn parse_zrangebyscore(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    parse_range(a, By::Score, Some(false))
}

/// ZREVRANGEBYSCORE key max min [WITHSCORES] [LIMIT offset count]
fn parse_zrevrangebyscore(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    parse_range(a, By::Score, Some(true))
}

/// ZREVRANGE key start stop [WITHSCORES]
fn parse_zrevrange(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    parse_range(a, By::Rank, Some(true))
}

/// ZRANGEBYLEX key min max [LIMIT offset count]
fn parse_zrangebylex(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    parse_range(a, By::Lex, Some(false))
}

/// ZREVRANGEBYLEX key max min [LIMIT offset count]
fn parse_zrevrangebylex(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    parse_range(a, By::Lex, Some(true))
}

/// ZRANK key member
fn parse_zrank(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let member = a.next_bytes()?;
    keyed(key, ZOp::Rank { member, rev: false })
}

/// ZREVRANK key member
fn parse_zrevrank(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let member = a.next_bytes()?;
    keyed(key, ZOp::Rank { member, rev: true })
}

/// ZREMRANGEBYSCORE key min max
fn parse_zremrangebyscore(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    keyed(key, ZOp::RemRange(RangeBy::Score(score_range(a)?)))
}

/// ZREMRANGEBYRANK key start stop
fn parse_zremrangebyrank(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let start = a.next_i64()?;
    let stop = a.next_i64()?;
    keyed(key, ZOp::RemRange(RangeBy::Rank { start, stop }))
}

/// ZREMRANGEBYLEX key min max
fn parse_zremrangebylex(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    keyed(key, ZOp::RemRange(RangeBy::Lex(lex_range(a)?)))
}

fn parse_pop(a: &mut Args, max: bool) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    if a.remaining() > 1 {
        return Err(ArgError::Syntax.into());
    }
    let count = match a.remaining() {
        0 => None,
        _ => {
            // Redis gives the same answer for a count that is not an integer.
            let n = parse_i64(a.next_slice()?).and_then(|n| u64::try_from(n).ok());
            Some(n.ok_or_else(|| msg(NOT_POSITIVE))?)
        }
    };
    keyed(key, ZOp::Pop { max, count })
}

/// ZPOPMIN key [count]
fn parse_zpopmin(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    parse_pop(a, false)
}

/// ZPOPMAX key [count]
fn parse_zpopmax(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    parse_pop(a, true)
}

/// Runs one command on the sorted set under `key`.
pub(super) fn execute(store: &mut Store, key: &[u8], op: &ZOp, now: u64) -> Reply {
    match op {
        ZOp::Card => read(store, key, now, Reply::Int(0), |z| count(z.len())),
        ZOp::Add { flags, pairs } => {
            if store.usage.caps.memory_full() {
                return Reply::err(OOM);
            }
            let missing = if flags.incr {
                Reply::Nil
            } else {
                Reply::Int(0)
            };
            let e = &store.usage.caps.encodings;
            let limits = PackLimits {
                entries: Encodings::get(&e.zset_max_listpack_entries),
                value: Encodings::get(&e.zset_max_listpack_value),
            };
            write(store, key, now, (missing, true), |z| {
                add(z, *flags, pairs, limits)
            })
        }
        ZOp::Rem(members) => write(store, key, now, (Reply::Int(0), false), |z| {
            let mut removed = 0;
            for m in members {
                removed += usize::from(z.remove(m).is_some());
                if z.is_empty() {
                    break;
                }
            }
            count(removed)
        }),
        ZOp::Count(r) => read(store, key, now, Reply::Int(0), |z| {
            let (lo, hi) = score_window(z, r);
            count(hi - lo)
        }),
        ZOp::LexCount(r) => read(store, key, now, Reply::Int(0), |z| {
            let (lo, hi) = lex_window(z, r);
            count(hi - lo)
        }),
        ZOp::Score(m) => read(store, key, now, Reply::Nil, |z| score_reply(z.score(m))),
        ZOp::MScore(ms) => {
            let nils = Reply::Array(vec![Reply::Nil; ms.len()]);
            read(store, key, now, nils, |z| {
                Reply::Array(ms.iter().map(|m| score_reply(z.score(m))).collect())
            })
        }
        ZOp::Range {
            by,
            rev,
            with_scores,
            offset,
            count,
        } => read(store, key, now, Reply::Array(Vec::new()), |z| {
            let (lo, hi) = select(z, by, *rev, *offset, *count);
            listing(z, lo, hi, *rev, *with_scores)
        }),
        ZOp::Rank { member, rev } => read(store, key, now, Reply::Nil, |z| match z.rank(member) {
            Some(r) if *rev => count(z.len() - 1 - r),
            Some(r) => count(r),
            None => Reply::Nil,
        }),
        ZOp::RemRange(by) => write(store, key, now, (Reply::Int(0), false), |z| {
            let (lo, hi) = select(z, by, false, 0, -1);
            count(z.remove_range(lo, hi))
        }),
        ZOp::Pop { max, count } => write(store, key, now, (Reply::Array(Vec::new()), false), |z| {
            let n = count.map_or(1, |c| usize::try_from(c).unwrap_or(usize::MAX));
            let n = n.min(z.len());
            let (lo, hi) = if *max { (z.len() - n, z.len()) } else { (0, n) };
            let reply = listing(z, lo, hi, *max, true);
            if matches!(reply, Reply::Error(_)) {
                return reply;
            }
            z.remove_range(lo, hi);
            match (count, reply) {
                (None, Reply::Scored(pairs)) => Reply::Array(
                    pairs
                        .into_iter()
                        .flat_map(|(m, s)| [Reply::Bulk(m), score_double(f64::from_bits(s))])
                        .collect(),
                ),
                (_, reply) => reply,
            }
        }),
    }
}

fn score_reply(s: Option<f64>) -> Reply {
    s.map_or(Reply::Nil, score_double)
}

/// The entries of ranks `lo..hi` as a reply, highest first when `rev`; refused when the
/// members alone would pass `MAX_REPLY_BYTES`.
fn listing(z: &ZSet, lo: usize, hi: usize, rev: bool, with_scores: bool) -> Reply {
    let mut items = Vec::with_capacity(hi.saturating_sub(lo).min(1024));
    let mut bytes = 0usize;
    z.each(lo, hi, |(m, s)| {
        bytes += m.len();
        if bytes <= MAX_REPLY_BYTES {
            items.push((Bytes::copy_from_slice(m), s.to_bits()));
        }
    });
    if bytes > MAX_REPLY_BYTES {
        return Reply::err(TOO_LARGE);
    }
    if rev {
        items.reverse();
    }
    if with_scores {
        Reply::Scored(items)
    } else {
        Reply::Array(items.into_iter().map(|(m, _)| Reply::Bulk(m)).collect())
    }
}

/// Answers a read: `missing` for no key, WRONGTYPE for a key of another kind, else `f`.
fn read(
    store: &Store,
    key: &[u8],
    now: u64,
    missing: Reply,
    f: impl FnOnce(&ZSet) -> Reply,
) -> Reply {
    match store.get(key, now).map(|e| e.value) {
        None => missing,
        Some(Value::Coll(Coll::ZSet(z))) => f(z),
        Some(_) => Reply::err(WRONGTYPE),
    }
}

/// Runs a change on the set under `key`, in place. A missing key answers `missing`, unless
/// `create`: then `f` runs on a new set, stored if it ends with members. A set left empty is
/// no key at all; the key keeps its expiry otherwise.
fn write(
    store: &mut Store,
    key: &[u8],
    now: u64,
    (missing, create): (Reply, bool),
    f: impl FnOnce(&mut ZSet) -> Reply,
) -> Reply {
    match store.slot(key, now) {
        Slot::Live(mut live) => {
            let done = live.coll_mut(|c| match c {
                Coll::ZSet(z) => Some((f(z), z.is_empty())),
                _ => None,
            });
            match done.flatten() {
                None => Reply::err(WRONGTYPE),
                Some((reply, emptied)) => {
                    if emptied {
                        live.remove();
                    }
                    reply
                }
            }
        }
        Slot::Empty(empty) => {
            if !create {
                return missing;
            }
            let mut z = ZSet::new();
            let reply = f(&mut z);
            if z.is_empty() {
                return if matches!(reply, Reply::Error(_)) {
                    reply
                } else {
                    missing
                };
            }
            match empty.insert_coll(Coll::ZSet(z), 0) {
                Ok(()) => reply,
                Err(StoreFull) => Reply::err(OOM),
            }
        }
    }
}
