//! redis-cell's CL.THROTTLE: its entry, how its arguments parse (with redis-cell's own checks
//! and words), and how a shard runs it. The GCRA itself is `limiter::cell`.

use super::keyed::{CheckKind, ExecStats, KeyCmd, Reply};
use super::limits::{bucket_state, store_state};
use super::table::{CommandSpec, Parser, command};
use super::{ParseError, Parsed};
use crate::limiter::State;
use crate::limiter::{
    CellArgs, CellError, CellWrite, parse_cell_arg, throttle_cell, validate_cell,
};
use crate::protocol::{ArgError, Args};
use crate::rules::RuleSet;
use crate::store::{Slot, Store};
use std::borrow::Cow;

pub(super) const COMMANDS: &[CommandSpec] = &[command! {
    name: "cl.throttle",
    // As redis-cell registers it: the module checks its argument count itself.
    arity: -1,
    flags: ["write", "denyoom", "fast"],
    keys: (1, 1, 1),
    acl: ["@write", "@fast", "@ratelimit"],
    group: "ratelimit",
    summary: "redis-cell's GCRA rate limit: CL.THROTTLE key max_burst count period [quantity].",
    parse: Parser::Key(parse_throttle),
}];

/// CL.THROTTLE key max_burst count period [quantity]
fn parse_throttle(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    // redis-cell's own checks and words, in its order: the argument count, each number
    // as Rust parses an i64, then the rate.
    let cell_err = |e: CellError| ParseError::Arg(ArgError::Msg(e.to_string()));
    if !matches!(a.remaining(), 4 | 5) {
        return Err(cell_err(CellError::Usage));
    }
    let key = a.next_bytes()?;
    let num = |a: &mut Args| -> Result<i64, ParseError> {
        parse_cell_arg(a.next_slice()?).map_err(cell_err)
    };
    let max_burst = num(a)?;
    let count = num(a)?;
    let period_s = num(a)?;
    let quantity = if a.remaining() > 0 { num(a)? } else { 1 };
    let args = CellArgs {
        max_burst,
        count,
        period_s,
        quantity,
    };
    validate_cell(&args).map_err(cell_err)?;
    Ok(Parsed::Keyed(KeyCmd::Throttle { key, args }))
}

pub(super) fn throttle(
    store: &mut Store,
    key: &[u8],
    args: &CellArgs,
    now: u64,
    stats: &mut ExecStats,
) -> Reply {
    stats.checks += 1;
    let slot = store.slot(key, now);
    let tat = match bucket_state(&slot) {
        Ok(Some(State::Gcra { tat })) => Some(tat),
        Ok(_) => None,
        Err(e) => return e,
    };
    let out = throttle_cell(tat, args, now);
    match (out.write, slot) {
        (CellWrite::Keep, _) | (CellWrite::Remove, Slot::Empty(_)) => {}
        // Only a tat is dropped; another algorithm's state on the key stays.
        (CellWrite::Remove, Slot::Live(live)) if tat.is_some() => live.remove(),
        (CellWrite::Remove, Slot::Live(_)) => {}
        (CellWrite::Store { tat, expires_at }, slot) => {
            if let Err(e) = store_state(slot, State::Gcra { tat }, expires_at) {
                return e;
            }
        }
    }
    match out.reply {
        Ok(reply) => {
            stats.decision(CheckKind::Throttle, reply[0] == 0);
            Reply::Limit(reply)
        }
        Err(e) => Reply::Error(Cow::Owned(e.to_string())),
    }
}
