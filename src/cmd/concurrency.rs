//! Concurrency limits: BK.ACQUIRE, BK.RELEASE, BK.INFLIGHT. Their entries, how their
//! arguments parse, the pure step that takes and gives back slots (`Slots`), and how a shard
//! runs them.
//!
//! A key holds a semaphore: the holders of its slots, each a token and a deadline. A holder
//! that never gives its slot back (a gateway that crashed mid-request) loses it at its
//! deadline, so slots cannot leak. Expired holders are dropped whenever a write touches the
//! key, and the key itself expires with its last holder, so an idle key disappears; a
//! semaphore with no holders is no key at all.
//!
//! Replicas apply the same commands at the same `now`, so everything here is a function of
//! the stored state and `now` alone: the token is `max(next_token, now)`, and `next_token`
//! moves past it. Tokens therefore only grow while the key lives. Across the key's lifetimes
//! they repeat only if it empties and fills again before the clock has caught up with the
//! last token handed out, which takes more acquires at one timestamp (a cluster stamps a whole
//! log entry with one) than nanoseconds pass before the key is next taken; a stale release of
//! such a token could then free a later holder's slot.

use super::keyed::{KeyCmd, OOM, Reply, WRONGTYPE, ceil_ms};
use super::table::{CommandSpec, Parser, command};
use super::{ParseError, Parsed, msg, truncate};
use crate::limiter::{RuleError, parse_period};
use crate::protocol::{ArgError, Args};
use crate::rules::RuleSet;
use crate::store::{Holder, Holders, Semaphore, Slot, Store, StoreFull, Value};
use bytes::Bytes;

/// The most slots one key may have: bounds a semaphore's value to about 2 MiB (16 bytes per
/// holder, with room to spare; see `store::record`).
pub(crate) const MAX_LIMIT: i64 = 100_000;

pub(super) const COMMANDS: &[CommandSpec] = &[
    command! {
        name: "bk.acquire",
        arity: 4,
        flags: ["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@fast", "@ratelimit"],
        group: "ratelimit",
        summary: "Takes one of limit in-flight slots for ttl (ms, or 500ms, 30s, 2m...): BK.ACQUIRE key limit ttl. Replies [allowed 1|0, token or nil, in_flight, limit, retry_after_ms].",
        parse: Parser::Key(parse_acquire),
    },
    command! {
        name: "bk.release",
        arity: 3,
        flags: ["write", "fast"],
        keys: (1, 1, 1),
        acl: ["@write", "@fast", "@ratelimit"],
        group: "ratelimit",
        summary: "Gives back the slot a BK.ACQUIRE token holds: BK.RELEASE key token. Replies 1, or 0 if the token holds none (unknown, released or expired).",
        parse: Parser::Key(parse_release),
    },
    command! {
        name: "bk.inflight",
        arity: 2,
        flags: ["readonly", "fast"],
        keys: (1, 1, 1),
        acl: ["@read", "@fast", "@ratelimit"],
        group: "ratelimit",
        summary: "Returns how many slots of a concurrency limit are held now: BK.INFLIGHT key.",
        parse: Parser::Key(parse_in_flight),
    },
];

/// BK.ACQUIRE key limit ttl
fn parse_acquire(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let limit = a.next_i64()?;
    let limit = u64::try_from(limit)
        .ok()
        .filter(|_| (1..=MAX_LIMIT).contains(&limit))
        .ok_or_else(|| msg(format!("ERR limit must be between 1 and {MAX_LIMIT}")))?;
    let ttl_ns = parse_ttl(&a.next_bytes()?)?;
    Ok(Parsed::Keyed(KeyCmd::Acquire { key, limit, ttl_ns }))
}

/// BK.RELEASE key token
fn parse_release(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let token = parse_token(&a.next_bytes()?).ok_or_else(|| msg("ERR invalid token"))?;
    Ok(Parsed::Keyed(KeyCmd::Release { key, token }))
}

/// BK.INFLIGHT key
fn parse_in_flight(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    Ok(Parsed::Keyed(KeyCmd::InFlight(key)))
}

/// How long a slot may be held, in ns: integer milliseconds, or a duration written as limit
/// specs write periods (`500ms`, `30s`, `2m`, also `ns`, `us`, `h`, `d`).
fn parse_ttl(arg: &[u8]) -> Result<u64, ArgError> {
    let bad = |why: &str| {
        msg(format!(
            "ERR invalid ttl '{}': {why}",
            truncate(&String::from_utf8_lossy(arg))
        ))
    };
    let text = std::str::from_utf8(arg).unwrap_or("");
    // A bare number is milliseconds here (a spec's bare period is seconds).
    let period = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        parse_period(&format!("{text}ms"))
    } else {
        parse_period(text)
    };
    match period {
        Ok(0) => Err(bad("it must be positive")),
        Ok(ns) => Ok(ns),
        Err(RuleError::TooLarge) => Err(bad("too large")),
        Err(_) => Err(bad(
            "expected milliseconds or a duration such as 500ms, 30s or 2m",
        )),
    }
}

/// A token as BK.ACQUIRE writes it: a decimal u64.
fn parse_token(arg: &[u8]) -> Option<u64> {
    if arg.is_empty() || !arg.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(arg).ok()?.parse().ok()
}

/// A semaphore's live holders, detached from the store while a command changes them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Slots {
    next_token: u64,
    holders: Vec<Holder>,
}

impl Slots {
    /// The stored semaphore's holders whose time is not up at `now`, and whether any were
    /// dropped.
    fn live(sem: &Semaphore<'_>, now: u64) -> (Slots, bool) {
        let holders: Vec<Holder> = sem.holders.iter().filter(|h| h.deadline > now).collect();
        let dropped = holders.len() < sem.holders.len();
        let slots = Slots {
            next_token: sem.next_token,
            holders,
        };
        (slots, dropped)
    }

    fn in_flight(&self) -> u64 {
        self.holders.len() as u64
    }

    /// Takes a slot until `now + ttl_ns` if fewer than `limit` are held, returning its token;
    /// otherwise how long (ns) until enough holders' time is up for a slot to free itself.
    fn acquire(&mut self, limit: u64, ttl_ns: u64, now: u64) -> Result<u64, u64> {
        if self.in_flight() >= limit {
            return Err(self.wait_ns(limit, now));
        }
        let token = self.next_token.max(now);
        self.next_token = token.saturating_add(1);
        self.holders.push(Holder {
            token,
            deadline: now.saturating_add(ttl_ns),
        });
        Ok(token)
    }

    /// Gives back the slot `token` holds; false if it holds none.
    fn release(&mut self, token: u64) -> bool {
        match self.holders.iter().position(|h| h.token == token) {
            Some(i) => {
                self.holders.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// How long until the holders' deadlines alone bring the count below `limit`: the
    /// (in_flight - limit + 1)-th deadline to come. A limit lowered below the count needs
    /// several holders gone, not just the first.
    fn wait_ns(&self, limit: u64, now: u64) -> u64 {
        let mut deadlines: Vec<u64> = self.holders.iter().map(|h| h.deadline).collect();
        let k = (self.in_flight() + 1).saturating_sub(limit.max(1));
        let Some(nth) = usize::try_from(k).ok().and_then(|k| k.checked_sub(1)) else {
            return 0;
        };
        if nth >= deadlines.len() {
            return 0;
        }
        let (_, at, _) = deadlines.select_nth_unstable(nth);
        at.saturating_sub(now)
    }

    /// When the key expires: with its last holder.
    fn expires_at(&self) -> u64 {
        self.holders.iter().map(|h| h.deadline).max().unwrap_or(0)
    }
}

/// The semaphore in `slot`, live holders only, and whether expired ones were dropped; a
/// missing key is an empty semaphore.
fn load(slot: &Slot<'_>, now: u64) -> Result<(Slots, bool), Reply> {
    match slot {
        Slot::Empty(_) => Ok((Slots::default(), false)),
        Slot::Live(live) => match live.get().value {
            Value::Semaphore(sem) => Ok(Slots::live(&sem, now)),
            _ => Err(Reply::err(WRONGTYPE)),
        },
    }
}

/// Writes `slots` back; with no holders left the key goes. A full store refuses a new key
/// with OOM, and never drops a live one to make room.
fn save(slot: Slot<'_>, slots: &Slots) -> Result<(), Reply> {
    if slots.holders.is_empty() {
        if let Slot::Live(live) = slot {
            live.remove();
        }
        return Ok(());
    }
    let mut packed = Vec::new();
    let value = Value::Semaphore(Semaphore {
        next_token: slots.next_token,
        holders: Holders::pack(&slots.holders, &mut packed),
    });
    match slot {
        Slot::Live(mut live) => {
            live.set(value, slots.expires_at());
            Ok(())
        }
        Slot::Empty(empty) => empty
            .insert(value, slots.expires_at())
            .map_err(|StoreFull| Reply::err(OOM)),
    }
}

fn int(v: u64) -> Reply {
    Reply::Int(i64::try_from(v).unwrap_or(i64::MAX))
}

/// BK.ACQUIRE: `[1, token, in_flight, limit, -1]` when a slot was taken, else
/// `[0, nil, in_flight, limit, retry_after_ms]`.
pub(super) fn acquire(store: &mut Store, key: &[u8], limit: u64, ttl_ns: u64, now: u64) -> Reply {
    let slot = store.slot(key, now);
    let (mut slots, dropped) = match load(&slot, now) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let taken = slots.acquire(limit, ttl_ns, now);
    if (taken.is_ok() || dropped)
        && let Err(e) = save(slot, &slots)
    {
        return e;
    }
    let (allowed, token, retry_ms) = match taken {
        Ok(token) => (1, Reply::Bulk(Bytes::from(token.to_string())), -1),
        Err(wait_ns) => (0, Reply::Nil, ceil_ms(wait_ns)),
    };
    Reply::Array(vec![
        Reply::Int(allowed),
        token,
        int(slots.in_flight()),
        int(limit),
        Reply::Int(retry_ms),
    ])
}

/// BK.RELEASE: 1 if `token` held a slot of `key`, else 0.
pub(super) fn release(store: &mut Store, key: &[u8], token: u64, now: u64) -> Reply {
    let slot = store.slot(key, now);
    if matches!(slot, Slot::Empty(_)) {
        return Reply::Int(0);
    }
    let (mut slots, dropped) = match load(&slot, now) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let released = slots.release(token);
    if (released || dropped)
        && let Err(e) = save(slot, &slots)
    {
        return e;
    }
    Reply::Int(i64::from(released))
}

/// BK.INFLIGHT: the holders whose time is not up. Reads only: a read stores nothing, so
/// expired holders are left for the next write (or the key's expiry) to drop.
pub(super) fn in_flight(store: &Store, key: &[u8], now: u64) -> Reply {
    match store.get(key, now).map(|e| e.value) {
        None => Reply::Int(0),
        Some(Value::Semaphore(sem)) => {
            int(sem.holders.iter().filter(|h| h.deadline > now).count() as u64)
        }
        Some(_) => Reply::err(WRONGTYPE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::keyed::NS_PER_MS;

    const T0: u64 = 1_700_000_000_000_000_000;

    #[test]
    fn ttl_is_milliseconds_or_a_duration() {
        assert_eq!(parse_ttl(b"1500"), Ok(1_500 * NS_PER_MS));
        assert_eq!(parse_ttl(b"30s"), Ok(30_000 * NS_PER_MS));
        assert_eq!(parse_ttl(b"500ms"), Ok(500 * NS_PER_MS));
        assert_eq!(parse_ttl(b"2m"), Ok(120_000 * NS_PER_MS));
        assert_eq!(parse_ttl(b"250us"), Ok(250_000));
        for (bad, why) in [
            (&b"0"[..], "it must be positive"),
            (b"0s", "it must be positive"),
            (b"99999999999999999999", "too large"),
            (b"999999999999999d", "too large"),
            (b"-5", "expected milliseconds"),
            (b"1.5s", "expected milliseconds"),
            (b"10w", "expected milliseconds"),
            (b"", "expected milliseconds"),
            (b"\xff", "expected milliseconds"),
        ] {
            let e = parse_ttl(bad).unwrap_err().to_string();
            assert!(e.starts_with("ERR invalid ttl '") && e.contains(why), "{e}");
        }
    }

    #[test]
    fn tokens_are_decimal_u64s() {
        assert_eq!(parse_token(b"0"), Some(0));
        assert_eq!(parse_token(b"18446744073709551615"), Some(u64::MAX));
        for bad in [&b""[..], b"+1", b"-1", b"1 ", b"18446744073709551616", b"x"] {
            assert_eq!(parse_token(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn slots_are_taken_up_to_the_limit_and_given_back() {
        let mut s = Slots::default();
        let a = s.acquire(2, 10, T0).unwrap();
        let b = s.acquire(2, 20, T0).unwrap();
        assert_ne!(a, b);
        assert_eq!(
            s.acquire(2, 10, T0),
            Err(10),
            "the first holder frees first"
        );
        assert_eq!(s.expires_at(), T0 + 20);
        assert!(s.release(a));
        assert!(!s.release(a), "a slot is given back once");
        assert!(!s.release(12345));
        let c = s.acquire(2, 10, T0 + 1).unwrap();
        assert!(c > b, "tokens only grow");
        assert_eq!(s.in_flight(), 2);
    }

    #[test]
    fn a_lowered_limit_waits_for_enough_holders_to_go() {
        let mut s = Slots::default();
        for ttl in [50, 10, 40, 30] {
            s.acquire(10, ttl, T0).unwrap();
        }
        // 4 held, limit 2: three must go, the third deadline to come is at 40.
        assert_eq!(s.acquire(2, 5, T0), Err(40));
        assert_eq!(s.acquire(4, 5, T0), Err(10));
        assert_eq!(s.acquire(1, 5, T0 + 20), Err(30));
    }

    #[test]
    fn tokens_depend_only_on_the_state_and_the_time() {
        let run = || {
            let mut s = Slots::default();
            let mut out = Vec::new();
            for (i, now) in [T0, T0, T0, T0 + 1, T0 + 1_000].into_iter().enumerate() {
                out.push(s.acquire(100, 1_000, now));
                if i == 1 {
                    s.release(T0);
                }
            }
            (out, s)
        };
        let (tokens, slots) = run();
        assert_eq!(run(), (tokens.clone(), slots));
        // Within one instant tokens count up from the clock; a later clock jumps ahead.
        assert_eq!(
            tokens,
            [Ok(T0), Ok(T0 + 1), Ok(T0 + 2), Ok(T0 + 3), Ok(T0 + 1_000)]
        );
    }

    #[test]
    fn expired_holders_are_dropped_on_load() {
        let mut packed = Vec::new();
        let holders = [
            Holder {
                token: 1,
                deadline: T0 + 5,
            },
            Holder {
                token: 2,
                deadline: T0 + 9,
            },
        ];
        let sem = Semaphore {
            next_token: 3,
            holders: Holders::pack(&holders, &mut packed),
        };
        assert_eq!(Slots::live(&sem, T0 + 4).0.holders, holders);
        assert!(!Slots::live(&sem, T0 + 4).1);
        let (s, dropped) = Slots::live(&sem, T0 + 5);
        assert!(dropped);
        assert_eq!(s.holders, [holders[1]]);
        assert_eq!(s.next_token, 3);
        assert!(Slots::live(&sem, T0 + 9).0.holders.is_empty());
    }
}
