//! bucketd's limit commands: BK.CHECK, BK.CHECKALL, BK.LEASE, BK.RESET. Their entries, how
//! their arguments parse (a limit is an inline spec or a rule's name), and how a shard runs
//! them. The algorithms themselves are `limiter`.

use super::keyed::{CheckKind, ExecStats, KeyCmd, LimitReply, OOM, Reply, WRONGTYPE, limit_reply};
use super::table::{CommandSpec, Parser, command};
use super::{MultiCmd, ParseError, Parsed, keyspace, truncate};
use crate::limiter::{self, Decision, Rule, State, parse_spec};
use crate::protocol::{ArgError, Args};
use crate::rules::RuleSet;
use crate::store::{Slot, Store, StoreFull, Value};
use bytes::Bytes;

pub(super) const COMMANDS: &[CommandSpec] = &[
    command! {
        name: "bk.check",
        arity: -3,
        flags: ["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@fast", "@ratelimit"],
        group: "ratelimit",
        summary: "Checks and consumes one limit: BK.CHECK key spec [COST n] [PEEK].",
        parse: Parser::Key(parse_check),
    },
    command! {
        name: "bk.checkall",
        arity: -4,
        flags: ["write", "denyoom", "fast", "movablekeys"],
        keys: (2, 2, 1),
        acl: ["@write", "@fast", "@ratelimit"],
        group: "ratelimit",
        summary: "Checks several limits, consuming all or none: BK.CHECKALL numkeys key... spec... [COST n] [PEEK].",
        parse: Parser::Key(parse_checkall),
    },
    command! {
        name: "bk.lease",
        arity: 4,
        flags: ["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@fast", "@ratelimit"],
        group: "ratelimit",
        summary: "Takes up to n units at once: BK.LEASE key spec n.",
        parse: Parser::Key(parse_lease),
    },
    command! {
        name: "bk.reset",
        arity: -2,
        flags: ["write"],
        keys: (1, -1, 1),
        acl: ["@write", "@ratelimit"],
        group: "ratelimit",
        summary: "Forgets buckets, refilling them: BK.RESET key [key ...].",
        parse: Parser::Key(keyspace::parse_del),
    },
];

/// BK.CHECK key spec [COST n] [PEEK]
fn parse_check(a: &mut Args, rules: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let rule = resolve_spec(&a.next_bytes()?, rules)?;
    let (cost, peek) = parse_cost_peek(a)?;
    Ok(Parsed::Keyed(KeyCmd::Check {
        key,
        rule,
        cost,
        peek,
    }))
}

/// BK.CHECKALL numkeys key [key ...] spec [spec ...] [COST n] [PEEK]
fn parse_checkall(a: &mut Args, rules: &RuleSet) -> Result<Parsed, ParseError> {
    let n = a.next_i64()?;
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| n >= 1 && n * 2 <= a.remaining())
        .ok_or_else(|| {
            ArgError::Msg(
                "ERR numkeys must be at least 1 and match the keys and specs given".into(),
            )
        })?;
    let keys: Vec<Bytes> = (0..n).map(|_| a.next_bytes()).collect::<Result<_, _>>()?;
    let mut rules_v = Vec::with_capacity(n);
    let mut shadow = Vec::with_capacity(n);
    for _ in 0..n {
        let spec = a.next_bytes()?;
        shadow.push(rules.is_shadow(&spec));
        rules_v.push(resolve_spec(&spec, rules)?);
    }
    let (cost, peek) = parse_cost_peek(a)?;
    Ok(Parsed::Multi(MultiCmd::CheckAll {
        keys,
        rules: rules_v,
        shadow,
        cost,
        peek,
    }))
}

/// BK.LEASE key spec n
fn parse_lease(a: &mut Args, rules: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let rule = resolve_spec(&a.next_bytes()?, rules)?;
    let max = a.next_u64()?;
    if max == 0 {
        return Err(ArgError::Msg("ERR lease size must be positive".into()).into());
    }
    Ok(Parsed::Keyed(KeyCmd::Lease { key, rule, max }))
}

/// `[COST n] [PEEK]` in any order.
fn parse_cost_peek(a: &mut Args) -> Result<(u64, bool), ArgError> {
    let mut cost = 1;
    let mut peek = false;
    while a.remaining() > 0 {
        if a.next_is("COST") {
            cost = a.next_u64()?;
        } else if a.next_is("PEEK") {
            peek = true;
        } else {
            return Err(ArgError::Syntax);
        }
    }
    Ok((cost, peek))
}

/// Resolves a limit argument: an inline spec (it contains '/') or the name of a rule.
pub(crate) fn resolve_spec(spec: &[u8], rules: &RuleSet) -> Result<Rule, ArgError> {
    let s =
        std::str::from_utf8(spec).map_err(|_| ArgError::Msg("ERR invalid limit spec".into()))?;
    if s.contains('/') {
        parse_spec(s)
            .map_err(|e| ArgError::Msg(format!("ERR invalid limit spec '{}': {e}", truncate(s))))
    } else {
        rules
            .get(s)
            .copied()
            .ok_or_else(|| ArgError::Msg(format!("ERR no such rule '{}'", truncate(s))))
    }
}

/// BK.CHECK on one key.
pub(super) fn check(
    store: &mut Store,
    key: &[u8],
    rule: &Rule,
    cost: u64,
    peek: bool,
    now: u64,
    stats: &mut ExecStats,
) -> Reply {
    stats.checks += 1;
    match check_one(store, key, rule, cost, peek, now) {
        Ok(d) => {
            stats.decision(CheckKind::Check, d.allowed);
            Reply::Limit(limit_reply(&d))
        }
        Err(e) => e,
    }
}

/// BK.CHECKALL on the keys this shard owns (all of them, or its share of a split check).
pub(super) fn check_all(
    store: &mut Store,
    keys: &[Bytes],
    rules: &[Rule],
    cost: u64,
    peek: bool,
    now: u64,
    stats: &mut ExecStats,
) -> Reply {
    stats.checks += 1;
    let r = check_all_once(store, keys, rules, |_| cost, |_| false, peek, now);
    if let Reply::LimitAll(summary, _) = &r {
        stats.decision(CheckKind::CheckAll, summary[0] != 0);
    }
    r
}

/// A set of limits with a cost each, some of them in shadow mode (see `KeyCmd::CheckSet`).
/// Its decisions are counted where the set was asked for, once, not per shard.
#[allow(clippy::too_many_arguments)]
pub(super) fn check_set(
    store: &mut Store,
    keys: &[Bytes],
    rules: &[Rule],
    costs: &[u64],
    shadow: &[bool],
    peek: bool,
    now: u64,
    stats: &mut ExecStats,
) -> Reply {
    if costs.len() != keys.len() || shadow.len() != keys.len() || rules.len() != keys.len() {
        return Reply::err("ERR internal error: a limit set's parts differ in length");
    }
    stats.checks += 1;
    check_all_once(store, keys, rules, |i| costs[i], |i| shadow[i], peek, now)
}

/// Gives back what a `CheckAll` or a `CheckSet` on this shard took (`cost(i)` on `keys[i]`),
/// when a sibling shard refused.
pub(super) fn refund(
    store: &mut Store,
    keys: &[Bytes],
    rules: &[Rule],
    cost: impl Fn(usize) -> u64,
    now: u64,
) -> Reply {
    for (i, (key, rule)) in keys.iter().zip(rules).enumerate() {
        let cost = cost(i);
        if let Slot::Live(mut live) = store.slot(key, now)
            && let Value::Bucket(state) = live.get().value
        {
            match limiter::refund(rule, state, cost, now) {
                Some(s) => live.set(Value::Bucket(s), limiter::expires_at(rule, &s)),
                // Back to full: a full bucket is no bucket.
                None => live.remove(),
            }
        }
    }
    Reply::Ok
}

fn check_one(
    store: &mut Store,
    key: &[u8],
    rule: &Rule,
    cost: u64,
    peek: bool,
    now: u64,
) -> Result<Decision, Reply> {
    let slot = store.slot(key, now);
    let state = bucket_state(&slot)?;
    let out = limiter::check(rule, state, cost, now);
    if out.decision.allowed
        && !peek
        && let Some(s) = out.new_state
    {
        store_state(slot, s, out.expires_at)?;
    }
    Ok(out.decision)
}

/// Decides every limit, then takes them only if all pass (a limit for which `shadow(i)` holds
/// never stops the others, and is taken only when it passes itself); `cost(i)` is what
/// `keys[i]` costs.
fn check_all_once(
    store: &mut Store,
    keys: &[Bytes],
    rules: &[Rule],
    cost: impl Fn(usize) -> u64,
    shadow: impl Fn(usize) -> bool,
    peek: bool,
    now: u64,
) -> Reply {
    // Evaluate every limit first, commit only if all pass: within one shard nothing can
    // interleave, so this is atomic.
    let mut outcomes = Vec::with_capacity(keys.len());
    for (i, (key, rule)) in keys.iter().zip(rules).enumerate() {
        let state = match store.get(key, now).map(|e| e.value) {
            None => None,
            Some(Value::Bucket(s)) => Some(s),
            Some(_) => return Reply::err(WRONGTYPE),
        };
        outcomes.push((state, limiter::check(rule, state, cost(i), now)));
    }
    let allowed = outcomes
        .iter()
        .enumerate()
        .all(|(i, (_, o))| o.decision.allowed || shadow(i));
    if allowed && !peek {
        for (key, (_, out)) in keys.iter().zip(&outcomes) {
            if out.decision.allowed
                && let Some(s) = out.new_state
                && let Err(e) = store_state(store.slot(key, now), s, out.expires_at)
            {
                return e;
            }
        }
    }
    let each: Vec<LimitReply> = outcomes
        .iter()
        .zip(rules)
        .map(|((state, out), rule)| {
            if allowed || !out.decision.allowed {
                limit_reply(&out.decision)
            } else {
                // This limit would have passed but nothing was taken: report what it has now.
                let mut r = limit_reply(&limiter::check(rule, *state, 0, now).decision);
                r[0] = 1;
                r
            }
        })
        .collect();
    Reply::LimitAll(summarize(&each, allowed), each)
}

/// Picks the limit that decides a multi-limit check: when allowed, the one with the least
/// remaining; when denied, the refusing one with the longest wait (-1, never, longest of all).
pub(crate) fn summarize(each: &[LimitReply], allowed: bool) -> LimitReply {
    let pick = if allowed {
        each.iter().min_by_key(|r| (r[2], -r[4]))
    } else {
        each.iter()
            .filter(|r| r[0] == 0)
            .max_by_key(|r| if r[3] < 0 { i64::MAX } else { r[3] })
    };
    let mut s = pick.copied().unwrap_or([i64::from(allowed), 0, 0, -1, 0]);
    s[0] = i64::from(allowed);
    if allowed {
        s[3] = -1;
    }
    s
}

pub(super) fn lease(
    store: &mut Store,
    key: &[u8],
    rule: &Rule,
    max: u64,
    now: u64,
    stats: &mut ExecStats,
) -> Reply {
    stats.checks += 1;
    let slot = store.slot(key, now);
    let state = match bucket_state(&slot) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let available = limiter::check(rule, state, 0, now).decision.remaining;
    let take = available.min(max);
    if take == 0 {
        stats.decision(CheckKind::Lease, false);
        let d = limiter::check(rule, state, 1, now).decision;
        let mut r = limit_reply(&d);
        r[0] = 0;
        return Reply::Limit(r);
    }
    let out = limiter::check(rule, state, take, now);
    if let Some(s) = out.new_state
        && let Err(e) = store_state(slot, s, out.expires_at)
    {
        return e;
    }
    stats.decision(CheckKind::Lease, true);
    let mut r = limit_reply(&out.decision);
    r[0] = i64::try_from(take).unwrap_or(i64::MAX);
    Reply::Limit(r)
}

pub(super) fn bucket_state(slot: &Slot<'_>) -> Result<Option<State>, Reply> {
    match slot {
        Slot::Live(l) => match l.get().value {
            Value::Bucket(s) => Ok(Some(s)),
            _ => Err(Reply::err(WRONGTYPE)),
        },
        Slot::Empty(_) => Ok(None),
    }
}

/// Stores a new limiter state in `slot`. A full store refuses new keys with an error, and
/// never drops a live bucket to make room.
pub(super) fn store_state(slot: Slot<'_>, state: State, expires_at: u64) -> Result<(), Reply> {
    match slot {
        Slot::Live(mut live) => {
            live.set(Value::Bucket(state), expires_at);
            Ok(())
        }
        Slot::Empty(empty) => empty
            .insert(Value::Bucket(state), expires_at)
            .map_err(|StoreFull| Reply::err(OOM)),
    }
}
