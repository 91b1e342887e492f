//! SCAN: its entry, how its arguments parse into a `ScanCmd` (the server walks the shards
//! with it), and the step of it each shard runs. The cursor names a shard in its top bits and
//! the shard store's scan position below.

use super::keyed::{KeyCmd, Reply};
use super::table::{CommandSpec, Parser, command};
use super::{NodeCmd, keyspace, msg};
use crate::protocol::{ArgError, Args};
use crate::store::{SCAN_POSITION_BITS, Store};
use bytes::Bytes;

/// SCAN cursor [MATCH pattern] [COUNT n] [TYPE type]
#[derive(Debug, Clone)]
pub struct ScanCmd {
    pub cursor: u64,
    /// At least 1.
    pub count: u64,
    /// None: every key (a pattern of `*` is None too).
    pub pattern: Option<Bytes>,
    pub type_name: Option<Bytes>,
}

/// Where a node-wide SCAN is: the shard it is in, in the cursor's top bits, and the shard
/// store's scan position below them, so a scan walks the shards in order and each shard's
/// keys in the order of their hash (see `Store::scan` for the guarantee).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cursor {
    pub shard: usize,
    pub from: u64,
}

impl Cursor {
    pub(crate) fn of(cursor: u64) -> Cursor {
        Cursor {
            shard: usize::try_from(cursor >> SCAN_POSITION_BITS).unwrap_or(usize::MAX),
            from: cursor & ((1u64 << SCAN_POSITION_BITS) - 1),
        }
    }

    /// The cursor a client is given: 0 once every one of `shards` is done.
    pub(crate) fn wire(self, shards: usize) -> u64 {
        if self.shard >= shards {
            0
        } else {
            ((self.shard as u64) << SCAN_POSITION_BITS) | self.from
        }
    }

    /// The next step on the current shard (`examined` keys so far of `scan.count`).
    pub(crate) fn step_cmd(self, scan: &ScanCmd, examined: u64) -> KeyCmd {
        KeyCmd::Scan {
            from: self.from,
            count: scan.count - examined,
            pattern: scan.pattern.clone(),
            type_name: scan.type_name.clone(),
        }
    }

    /// Takes a shard's answer to `step_cmd`: moves on (to the next shard once this one is
    /// done), adds its keys to `keys`, and returns how many keys it examined.
    pub(crate) fn advance(
        &mut self,
        reply: Reply,
        keys: &mut Vec<Reply>,
    ) -> Result<u64, &'static str> {
        let Reply::Array(mut parts) = reply else {
            return Err("ERR internal error: missing scan reply");
        };
        let (Some(Reply::Array(found)), Some(Reply::Int(seen)), Some(Reply::Int(next))) =
            (parts.pop(), parts.pop(), parts.pop())
        else {
            return Err("ERR internal error: malformed scan reply");
        };
        keys.extend(found);
        match u64::try_from(next) {
            Ok(pos) => self.from = pos,
            Err(_) => {
                self.shard += 1;
                self.from = 0;
            }
        }
        Ok(seen.unsigned_abs())
    }
}

/// SCAN's reply: the next cursor, as a bulk string, and the keys.
pub(crate) fn scan_reply(next: u64, keys: Vec<Reply>) -> Reply {
    Reply::Array(vec![
        Reply::Bulk(Bytes::from(next.to_string())),
        Reply::Array(keys),
    ])
}

pub(super) const COMMANDS: &[CommandSpec] = &[command! {
    name: "scan",
    arity: -2,
    flags: ["readonly"],
    keys: (0, 0, 0),
    acl: ["@keyspace", "@read", "@slow"],
    group: "generic",
    summary: "Iterates over the key names: SCAN cursor [MATCH pattern] [COUNT n] [TYPE type].",
    barrier: true,
    parse: Parser::Node(parse_scan),
}];

fn parse_scan(a: &mut Args) -> Result<NodeCmd, ArgError> {
    let cursor = parse_cursor(&a.next_bytes()?).ok_or_else(|| msg("ERR invalid cursor"))?;
    let mut count: u64 = 10;
    let (mut pattern, mut type_name) = (None, None);
    while a.remaining() > 0 {
        if a.remaining() < 2 {
            return Err(ArgError::Syntax);
        }
        let opt = a.next_keyword()?;
        match opt.as_str() {
            "COUNT" => {
                let n = a.next_i64()?;
                count = u64::try_from(n)
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or(ArgError::Syntax)?;
            }
            "MATCH" => {
                let p = a.next_bytes()?;
                // "*" matches everything: skip the matching.
                pattern = (p.as_ref() != b"*").then_some(p);
            }
            "TYPE" => type_name = Some(a.next_bytes()?),
            _ => return Err(ArgError::Syntax),
        }
    }
    Ok(NodeCmd::Scan(ScanCmd {
        cursor,
        count,
        pattern,
        type_name,
    }))
}

/// A SCAN cursor as Redis 7.0 reads one (`strtoul`): an optional sign (a minus wraps), then
/// decimal digits; an empty string is 0; spaces, other characters and overflow are refused.
fn parse_cursor(b: &[u8]) -> Option<u64> {
    let (neg, digits) = match b.first() {
        None => return Some(0),
        Some(b'-') => (true, &b[1..]),
        Some(b'+') => (false, &b[1..]),
        Some(_) => (false, b),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let v = digits.iter().try_fold(0u64, |acc, d| {
        acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })?;
    Some(if neg { v.wrapping_neg() } else { v })
}

/// One shard's step of SCAN from scan position `from`: replies
/// `[next position or -1 when done, keys examined, [keys...]]`. `type_name` is matched as
/// TYPE names it (`string`, `hash`, `bucket`, `semaphore`), in any case.
pub(super) fn step(
    store: &Store,
    from: u64,
    count: u64,
    pattern: Option<&[u8]>,
    type_name: Option<&[u8]>,
    now: u64,
) -> Reply {
    let mut keys = Vec::new();
    let count = usize::try_from(count).unwrap_or(usize::MAX);
    let step = store.scan(from, count, now, |k, v| {
        let kind = keyspace::type_name(&v).as_bytes();
        if pattern.is_none_or(|p| crate::glob::matches(p, k))
            && type_name.is_none_or(|t| t.eq_ignore_ascii_case(kind))
        {
            keys.push(Reply::Bulk(Bytes::copy_from_slice(k)));
        }
    });
    let next = step.next.and_then(|n| i64::try_from(n).ok()).unwrap_or(-1);
    let examined = i64::try_from(step.examined).unwrap_or(i64::MAX);
    Reply::Array(vec![
        Reply::Int(next),
        Reply::Int(examined),
        Reply::Array(keys),
    ])
}
