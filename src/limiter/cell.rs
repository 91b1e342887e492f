//! redis-cell's `CL.THROTTLE key max_burst count period [quantity]`: argument checks, its GCRA step
//! in nanoseconds, and the five-integer reply `[limited, limit, remaining, retry_after, reset_after]`.
//!
//! This is kept apart from [`crate::limiter::gcra`] because redis-cell's inputs are signed and
//! unbounded (`period * 1e9` alone can exceed 64 bits), and its reply has its own rounding rules.

use serde::{Deserialize, Serialize};
use std::fmt;

const NS_PER_S: u128 = 1_000_000_000;

/// The numeric arguments of CL.THROTTLE, as parsed from the wire (quantity defaults to 1 there).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CellArgs {
    pub max_burst: i64,
    pub count: i64,
    pub period_s: i64,
    pub quantity: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellError {
    NegativeMaxBurst,
    NonPositiveCount,
    NonPositivePeriod,
    NegativeQuantity,
    /// More than one request per nanosecond: the emission interval would be 0.
    RateTooHigh,
}

impl fmt::Display for CellError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            CellError::NegativeMaxBurst => "invalid max_burst: must not be negative",
            CellError::NonPositiveCount => "invalid count: must be greater than zero",
            CellError::NonPositivePeriod => "invalid period: must be greater than zero",
            CellError::NegativeQuantity => "invalid quantity: must not be negative",
            CellError::RateTooHigh => "invalid rate: count per period exceeds one per nanosecond",
        };
        f.write_str(text)
    }
}

impl std::error::Error for CellError {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CellOutcome {
    /// `[limited (0/1), limit, remaining, retry_after_s (-1 if none), reset_after_s]`.
    pub reply: [i64; 5],
    /// The tat to store, expiring at that same instant. None: leave the stored value as it is
    /// (the request was limited, or quantity 0 changed nothing).
    pub new_tat: Option<u64>,
}

fn clamp_u64(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

fn clamp_i64(x: u128) -> i64 {
    i64::try_from(x).unwrap_or(i64::MAX)
}

/// Whole seconds, rounded up so a client never retries before it may succeed.
fn seconds(ns: u128) -> i64 {
    clamp_i64(ns.div_ceil(NS_PER_S))
}

/// Applies CL.THROTTLE at `now` to the stored tat (None for a missing key).
pub fn throttle(tat: Option<u64>, args: &CellArgs, now: u64) -> Result<CellOutcome, CellError> {
    let max_burst = u128::try_from(args.max_burst).map_err(|_| CellError::NegativeMaxBurst)?;
    let count = u128::try_from(args.count)
        .ok()
        .filter(|&c| c > 0)
        .ok_or(CellError::NonPositiveCount)?;
    let period = u128::try_from(args.period_s)
        .ok()
        .filter(|&p| p > 0)
        .ok_or(CellError::NonPositivePeriod)?;
    let quantity = u128::try_from(args.quantity).map_err(|_| CellError::NegativeQuantity)?;

    // period < 2^63, so period * 1e9 < 2^93: exact in u128.
    let interval = period.saturating_mul(NS_PER_S) / count;
    if interval == 0 {
        return Err(CellError::RateTooHigh);
    }
    let limit = max_burst + 1;
    let tau = interval.saturating_mul(limit);
    let increment = interval.saturating_mul(quantity);

    let now_w = u128::from(now);
    // A tat in the past is a full bucket (redis would have expired the key by then).
    let start = tat.map_or(now_w, |t| u128::from(t).max(now_w));
    let new_tat = start.saturating_add(increment);
    let new_ttl = new_tat - now_w;

    // Allowed iff now >= new_tat - tau, i.e. the new debt fits within the tolerance.
    let (limited, ttl, retry_after, new_tat) = if new_ttl > tau {
        // An increment above the whole tolerance never fits, so there is no point retrying.
        let retry = if increment <= tau {
            seconds(new_ttl - tau)
        } else {
            -1
        };
        (1, start - now_w, retry, None)
    } else {
        let stored = (increment > 0).then(|| clamp_u64(new_tat));
        (0, new_ttl, -1, stored)
    };
    let remaining = tau.saturating_sub(ttl) / interval;
    Ok(CellOutcome {
        reply: [
            limited,
            clamp_i64(limit),
            clamp_i64(remaining),
            retry_after,
            seconds(ttl),
        ],
        new_tat,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, Rule, State, check};
    use proptest::prelude::*;

    const SEC: u64 = 1_000_000_000;
    const NOW: u64 = 1_700_000_000 * SEC;

    fn args(max_burst: i64, count: i64, period_s: i64, quantity: i64) -> CellArgs {
        CellArgs {
            max_burst,
            count,
            period_s,
            quantity,
        }
    }

    #[test]
    fn known_vectors() {
        let out = throttle(None, &args(15, 30, 60, 1), NOW).unwrap();
        assert_eq!(out.reply, [0, 16, 15, -1, 2]);
        assert_eq!(out.new_tat, Some(NOW + 2 * SEC));

        let first = throttle(None, &args(0, 1, 2, 1), NOW).unwrap();
        assert_eq!(first.reply, [0, 1, 0, -1, 2]);
        let second = throttle(first.new_tat, &args(0, 1, 2, 1), NOW).unwrap();
        assert_eq!(second.reply, [1, 1, 0, 2, 2]);
        assert_eq!(second.new_tat, None);

        let peek = throttle(None, &args(15, 30, 60, 0), NOW).unwrap();
        assert_eq!(peek.reply, [0, 16, 16, -1, 0]);
        assert_eq!(peek.new_tat, None);
    }

    #[test]
    fn sixteen_quick_calls_then_limited() {
        let a = args(15, 30, 60, 1);
        let mut tat = None;
        for left in (0..16).rev() {
            let out = throttle(tat, &a, NOW).unwrap();
            assert_eq!(out.reply[..3], [0, 16, left]);
            tat = out.new_tat;
        }
        let out = throttle(tat, &a, NOW).unwrap();
        assert_eq!(out.reply, [1, 16, 0, 2, 32]);
        let later = throttle(tat, &a, NOW + 2 * SEC).unwrap();
        assert_eq!(later.reply, [0, 16, 0, -1, 32]);
        let again = throttle(later.new_tat, &a, NOW + 2 * SEC).unwrap();
        assert_eq!(again.reply[0], 1);
    }

    #[test]
    fn fractions_round_up() {
        // 3 per second: an interval of 333_333_333ns reads as 1s.
        let out = throttle(None, &args(0, 3, 1, 1), NOW).unwrap();
        assert_eq!(out.reply, [0, 1, 0, -1, 1]);
        let out = throttle(out.new_tat, &args(0, 3, 1, 1), NOW + 1).unwrap();
        assert_eq!(out.reply, [1, 1, 0, 1, 1]);
    }

    #[test]
    fn quantity_above_limit_never_fits() {
        let out = throttle(None, &args(4, 1, 1, 6), NOW).unwrap();
        assert_eq!(out.reply, [1, 5, 5, -1, 0]);
        assert_eq!(out.new_tat, None);
        // Exactly the whole capacity does fit.
        let out = throttle(None, &args(4, 1, 1, 5), NOW).unwrap();
        assert_eq!(out.reply, [0, 5, 0, -1, 5]);
    }

    #[test]
    fn rejects_bad_arguments() {
        let cases = [
            (args(-1, 1, 1, 1), CellError::NegativeMaxBurst),
            (args(0, 0, 1, 1), CellError::NonPositiveCount),
            (args(0, -5, 1, 1), CellError::NonPositiveCount),
            (args(0, 1, 0, 1), CellError::NonPositivePeriod),
            (args(0, 1, -1, 1), CellError::NonPositivePeriod),
            (args(0, 1, 1, -1), CellError::NegativeQuantity),
            (args(0, 2_000_000_000, 1, 1), CellError::RateTooHigh),
        ];
        for (a, err) in cases {
            assert_eq!(throttle(None, &a, NOW), Err(err));
        }
        assert_eq!(
            CellError::NonPositiveCount.to_string(),
            "invalid count: must be greater than zero"
        );
    }

    #[test]
    fn extreme_arguments_do_not_panic() {
        let values = [0, 1, i64::MAX];
        for &b in &values {
            for &c in &values[1..] {
                for &p in &values[1..] {
                    for &q in &values {
                        for tat in [None, Some(0), Some(u64::MAX)] {
                            for now in [0, u64::MAX] {
                                let _ = throttle(tat, &args(b, c, p, q), now);
                            }
                        }
                    }
                }
            }
        }
        let out = throttle(None, &args(i64::MAX, 1, i64::MAX, 1), NOW).unwrap();
        assert_eq!(out.reply[0], 0);
        assert_eq!(out.reply[1], i64::MAX);
    }

    fn case() -> impl Strategy<Value = (i64, i64, i64, Vec<(u64, i64)>)> {
        (0i64..=20, 1i64..=50, 1i64..=5).prop_flat_map(|(b, c, p)| {
            let interval = u64::try_from(p).unwrap() * SEC / u64::try_from(c).unwrap();
            let tau = interval * u64::try_from(b + 1).unwrap();
            let events = proptest::collection::vec(
                (
                    prop_oneof![Just(0), 0..=interval * 2, 0..=tau * 2],
                    prop_oneof![0i64..=2, 0..=b + 2],
                ),
                1..60,
            );
            (Just(b), Just(c), Just(p), events)
        })
    }

    fn ceil_seconds(ns: u64) -> i64 {
        i64::try_from(ns.div_ceil(SEC)).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// max_burst B, count C, period P behaves like GCRA with limit C per P and burst B + 1.
        #[test]
        fn agrees_with_gcra((b, c, p, events) in case()) {
            let rule = Rule::new(
                Algorithm::Gcra,
                u64::try_from(c).unwrap(),
                u64::try_from(p).unwrap() * SEC,
                Some(u64::try_from(b + 1).unwrap()),
            )
            .unwrap();
            let mut now = NOW;
            let mut tat = None;
            for (advance, quantity) in events {
                now += advance;
                let cell = throttle(tat, &args(b, c, p, quantity), now).unwrap();
                let state = tat.map(|tat| State::Gcra { tat });
                let d = check(&rule, state, u64::try_from(quantity).unwrap(), now);
                let expected = [
                    i64::from(!d.decision.allowed),
                    i64::try_from(d.decision.limit).unwrap(),
                    i64::try_from(d.decision.remaining).unwrap(),
                    d.decision.retry_after_ns.map_or(-1, ceil_seconds),
                    ceil_seconds(d.decision.reset_after_ns),
                ];
                prop_assert_eq!(cell.reply, expected);
                let gcra_tat = d.new_state.map(|s| match s {
                    State::Gcra { tat } => tat,
                    other => panic!("unexpected state {other:?}"),
                });
                prop_assert_eq!(cell.new_tat, gcra_tat);
                if cell.new_tat.is_some() {
                    tat = cell.new_tat;
                }
            }
        }
    }
}
