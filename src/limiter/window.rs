//! Window limiters: the fixed window (what INCR + EXPIRE gives), the aligned window and the
//! sliding window counter.
//!
//! The fixed window opens at the first request and lasts one period. The aligned window is a
//! fixed window that opens at multiples of the period since the epoch, as envoyproxy/ratelimit's
//! counters do. The sliding window keeps the
//! counts of two windows aligned to multiples of the period since the epoch and weights the previous
//! one by how much of it still overlaps the last period. Sliding arithmetic runs in u128 so that
//! `start + 2 * period` and `count * period` never overflow.

use crate::limiter::{Decision, Rule, State, clamp_to_u64};

/// Decision for a fixed window stored as `(start, count)`, and the state to store if allowed.
pub(crate) fn check_fixed(
    rule: &Rule,
    window: Option<(u64, u64)>,
    cost: u64,
    now: u64,
) -> (Decision, Option<State>) {
    // Once a window is over, the next request opens a new one at its own time.
    let (d, w) = check_window(rule, window, cost, now, now);
    (d, w.map(|(start, count)| State::Fixed { start, count }))
}

/// Decision for a window aligned to multiples of the period since the epoch (the windows
/// envoyproxy/ratelimit counts in), stored as `(start, count)`.
pub(crate) fn check_aligned(
    rule: &Rule,
    window: Option<(u64, u64)>,
    cost: u64,
    now: u64,
) -> (Decision, Option<State>) {
    let opens = now - now % rule.period_ns.max(1);
    let (d, w) = check_window(rule, window, cost, now, opens);
    (d, w.map(|(start, count)| State::Aligned { start, count }))
}

/// One window of `rule.limit` units: the stored one while it lasts, else a new one opening at
/// `opens`. Gives the decision and, when allowed, the window to store.
fn check_window(
    rule: &Rule,
    window: Option<(u64, u64)>,
    cost: u64,
    now: u64,
    opens: u64,
) -> (Decision, Option<(u64, u64)>) {
    let period = rule.period_ns.max(1);
    // A window stored as starting ahead of now (at a time far ahead of this one) counts as
    // the window open now: no reply asks more than one period.
    let (start, count) = window
        .map(|(start, count)| (start.min(opens), count))
        .filter(|&(start, _)| now < start.saturating_add(period))
        .unwrap_or((opens, 0));
    let left = start.saturating_add(period).saturating_sub(now);
    let mut decision = Decision {
        allowed: true,
        limit: rule.limit,
        remaining: rule.limit.saturating_sub(count),
        retry_after_ns: None,
        // An unopened window is already at full capacity.
        reset_after_ns: if count == 0 { 0 } else { left },
    };
    if cost == 0 {
        return (decision, None);
    }
    match count.checked_add(cost).filter(|&used| used <= rule.limit) {
        Some(used) => {
            decision.remaining = rule.limit - used;
            decision.reset_after_ns = left;
            (decision, Some((start, used)))
        }
        None => {
            decision.allowed = false;
            // Nothing drains before the window ends, and then everything does at once.
            decision.retry_after_ns = (cost <= rule.limit).then_some(left);
            (decision, None)
        }
    }
}

/// Takes `cost` back from a live window; an ended or emptied window is as good as none.
pub(crate) fn refund_fixed(
    rule: &Rule,
    start: u64,
    count: u64,
    cost: u64,
    now: u64,
) -> Option<State> {
    let live = now < fixed_expiry(rule, start);
    let count = count.saturating_sub(cost);
    (live && count > 0).then_some(State::Fixed { start, count })
}

/// Takes `cost` back from a live aligned window.
pub(crate) fn refund_aligned(
    rule: &Rule,
    start: u64,
    count: u64,
    cost: u64,
    now: u64,
) -> Option<State> {
    refund_fixed(rule, start, count, cost, now).map(|s| match s {
        State::Fixed { start, count } => State::Aligned { start, count },
        other => other,
    })
}

pub(crate) fn fixed_expiry(rule: &Rule, start: u64) -> u64 {
    start.saturating_add(rule.period_ns.max(1))
}

/// A sliding-window state seen from a given instant: rolled forward so that `start` is the window
/// containing that instant (or a stored start still ahead of it, after a clock step back).
struct Sliding {
    period: u128,
    start: u128,
    prev: u128,
    cur: u128,
}

impl Sliding {
    fn at(rule: &Rule, window: Option<(u64, u64, u64)>, now: u128) -> Sliding {
        let period = u128::from(rule.period_ns.max(1));
        let fresh = Sliding {
            period,
            start: now - now % period,
            prev: 0,
            cur: 0,
        };
        let Some((start, prev, cur)) = window else {
            return fresh;
        };
        // A window stored as starting ahead of now (at a time far ahead of this one) counts as
        // the window that contains now: no reply asks more than two periods.
        let start = u128::from(start).min(fresh.start);
        if now >= start + 2 * period {
            fresh
        } else if now >= start + period {
            Sliding {
                period,
                start: start + period,
                prev: u128::from(cur),
                cur: 0,
            }
        } else {
            Sliding {
                period,
                start,
                prev: u128::from(prev),
                cur: u128::from(cur),
            }
        }
    }

    /// Weighted count at `now`. The previous window's share is rounded up so that the estimate
    /// never lets more through than the limit.
    fn estimate(&self, now: u128) -> u128 {
        let elapsed = now.saturating_sub(self.start).min(self.period);
        let weighted = self
            .prev
            .saturating_mul(self.period - elapsed)
            .div_ceil(self.period);
        weighted.saturating_add(self.cur)
    }

    /// First instant at which `cost` fits if nothing else arrives; `cost <= limit` is assumed.
    ///
    /// The estimate never rises with time: within the window the previous share decays, and at the
    /// boundary the estimate becomes exactly the current count, which then decays in turn. So the
    /// answer is the first instant in this window where it fits, else the first in the next one.
    fn fits_at(&self, limit: u128, cost: u128) -> u128 {
        // ceil(prev * (period - e) / period) <= room  <=>  prev * (period - e) <= room * period
        // <=>  e >= period - floor(room * period / prev)
        let earliest =
            |count: u128, room: u128| match room.saturating_mul(self.period).checked_div(count) {
                Some(keep) => self.period.saturating_sub(keep),
                None => 0,
            };
        match limit.checked_sub(self.cur.saturating_add(cost)) {
            Some(room) => self.start + earliest(self.prev, room),
            None => self.start + self.period + earliest(self.cur, limit.saturating_sub(cost)),
        }
    }

    /// First instant at which the estimate is 0: the current count only stops weighing once the
    /// next window has passed too.
    fn empty_at(&self) -> Option<u128> {
        if self.cur > 0 {
            Some(self.start + 2 * self.period)
        } else if self.prev > 0 {
            Some(self.start + self.period)
        } else {
            None
        }
    }
}

/// Decision for a sliding window stored as `(start, prev, cur)`, and the state to store if allowed.
pub(crate) fn check_sliding(
    rule: &Rule,
    window: Option<(u64, u64, u64)>,
    cost: u64,
    now: u64,
) -> (Decision, Option<State>) {
    let now_w = u128::from(now);
    let limit = u128::from(rule.limit);
    let cost_w = u128::from(cost);
    let w = Sliding::at(rule, window, now_w);
    let estimate = w.estimate(now_w);
    let mut decision = Decision {
        allowed: true,
        limit: rule.limit,
        remaining: clamp_to_u64(limit.saturating_sub(estimate)),
        retry_after_ns: None,
        reset_after_ns: w
            .empty_at()
            .map_or(0, |at| clamp_to_u64(at.saturating_sub(now_w))),
    };
    if cost == 0 {
        return (decision, None);
    }
    if estimate.saturating_add(cost_w) <= limit {
        let cur = w.cur + cost_w;
        decision.remaining = clamp_to_u64(limit - estimate - cost_w);
        decision.reset_after_ns = clamp_to_u64((w.start + 2 * w.period).saturating_sub(now_w));
        let state = State::Sliding {
            start: clamp_to_u64(w.start),
            prev: clamp_to_u64(w.prev),
            cur: clamp_to_u64(cur),
        };
        (decision, Some(state))
    } else {
        decision.allowed = false;
        decision.retry_after_ns =
            (cost_w <= limit).then(|| clamp_to_u64(w.fits_at(limit, cost_w).saturating_sub(now_w)));
        (decision, None)
    }
}

/// Takes `cost` back, first from the current window (where a just-made check put it), then from the
/// previous one in case the boundary passed in between.
pub(crate) fn refund_sliding(
    rule: &Rule,
    window: (u64, u64, u64),
    cost: u64,
    now: u64,
) -> Option<State> {
    let w = Sliding::at(rule, Some(window), u128::from(now));
    let cost = u128::from(cost);
    let from_cur = cost.min(w.cur);
    let cur = w.cur - from_cur;
    let prev = w.prev.saturating_sub(cost - from_cur);
    (cur > 0 || prev > 0).then(|| State::Sliding {
        start: clamp_to_u64(w.start),
        prev: clamp_to_u64(prev),
        cur: clamp_to_u64(cur),
    })
}

pub(crate) fn sliding_expiry(rule: &Rule, start: u64, prev: u64, cur: u64) -> u64 {
    let period = u128::from(rule.period_ns.max(1));
    let start = u128::from(start);
    let at = if cur > 0 {
        start + 2 * period
    } else if prev > 0 {
        start + period
    } else {
        start
    };
    clamp_to_u64(at)
}

#[cfg(test)]
mod tests;
