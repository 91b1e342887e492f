//! The window algorithms: edge cases by hand, and random sequences against reference models.

use crate::limiter::{Algorithm, Decision, Rule, State, check, expires_at, parse_spec, refund};
use proptest::prelude::*;
use std::collections::BTreeMap;

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;
// A multiple of one second, so sliding windows of whole seconds start here.
const NOW: u64 = 1_700_000_000 * SEC;

fn fixed(limit: u64, period_ns: u64) -> Rule {
    Rule::new(Algorithm::Fixed, limit, period_ns, None).unwrap()
}

fn sliding(limit: u64, period_ns: u64) -> Rule {
    Rule::new(Algorithm::Sliding, limit, period_ns, None).unwrap()
}

#[test]
fn fixed_window_opens_at_first_request() {
    let r = fixed(3, SEC);
    let t0 = NOW + 123;
    let out = check(&r, None, 1, t0);
    assert_eq!(
        out.decision,
        Decision {
            allowed: true,
            limit: 3,
            remaining: 2,
            retry_after_ns: None,
            reset_after_ns: SEC,
        }
    );
    assert_eq!(
        out.new_state,
        Some(State::Fixed {
            start: t0,
            count: 1
        })
    );
    assert_eq!(out.expires_at, t0 + SEC);
    let out = check(&r, out.new_state, 2, t0 + 400 * MS);
    assert_eq!(out.decision.remaining, 0);
    assert_eq!(out.decision.reset_after_ns, 600 * MS);
    let state = out.new_state;
    let denied = check(&r, state, 1, t0 + 500 * MS);
    assert_eq!(
        denied.decision,
        Decision {
            allowed: false,
            limit: 3,
            remaining: 0,
            retry_after_ns: Some(500 * MS),
            reset_after_ns: 500 * MS,
        }
    );
    assert_eq!(denied.expires_at, t0 + SEC);
    assert!(!check(&r, state, 1, t0 + SEC - 1).decision.allowed);
    let next = check(&r, state, 3, t0 + SEC);
    assert!(next.decision.allowed);
    assert_eq!(
        next.new_state,
        Some(State::Fixed {
            start: t0 + SEC,
            count: 3
        })
    );
}

#[test]
fn aligned_window_turns_over_at_multiples_of_the_period() {
    let r = Rule::new(Algorithm::Aligned, 2, SEC, None).unwrap();
    // Opened 700 ms into a second: the window still ends at the next whole second.
    let t0 = (NOW / SEC) * SEC + 700 * MS;
    let out = check(&r, None, 1, t0);
    assert!(out.decision.allowed);
    assert_eq!(out.decision.reset_after_ns, 300 * MS);
    assert_eq!(
        out.new_state,
        Some(State::Aligned {
            start: t0 - 700 * MS,
            count: 1
        })
    );
    assert_eq!(out.expires_at, t0 + 300 * MS);
    let state = check(&r, out.new_state, 1, t0 + 100 * MS).new_state;
    let denied = check(&r, state, 1, t0 + 299 * MS);
    assert!(!denied.decision.allowed);
    assert_eq!(denied.decision.retry_after_ns, Some(MS));
    // The next second is a new window, however recently the last one filled.
    let next = check(&r, state, 2, t0 + 300 * MS);
    assert!(next.decision.allowed);
    assert_eq!(next.decision.remaining, 0);
    // A fixed window's state is not an aligned one's, and the other way round.
    let fixed_state = check(&fixed(2, SEC), None, 2, t0).new_state;
    assert_eq!(check(&r, fixed_state, 0, t0).decision.remaining, 2);
    let back = refund(&r, next.new_state.unwrap(), 1, t0 + 400 * MS);
    assert_eq!(
        back,
        Some(State::Aligned {
            start: t0 + 300 * MS,
            count: 1
        })
    );
    assert_eq!(
        parse_spec("aligned:5/1m").unwrap().to_string(),
        "aligned:5/60000ms"
    );
}

#[test]
fn fixed_window_edges() {
    let r = fixed(3, SEC);
    let out = check(&r, None, 4, NOW);
    assert!(!out.decision.allowed);
    assert_eq!(out.decision.retry_after_ns, None);
    assert_eq!(out.decision.reset_after_ns, 0);
    assert_eq!(out.decision.remaining, 3);
    let peek = check(&r, None, 0, NOW);
    assert_eq!(
        (peek.decision.remaining, peek.decision.reset_after_ns),
        (3, 0)
    );
    // Counts above the limit (rule lowered) read as nothing left.
    let over = Some(State::Fixed {
        start: NOW,
        count: 10,
    });
    let out = check(&r, over, 1, NOW + 1);
    assert_eq!(out.decision.remaining, 0);
    assert_eq!(out.decision.retry_after_ns, Some(SEC - 1));
    // u64 overflow of count + cost must not wrap into an allowance.
    let huge = Rule::new(Algorithm::Fixed, u64::MAX, 1, None).unwrap();
    let s = check(&huge, None, u64::MAX, NOW).new_state;
    assert!(!check(&huge, s, 1, NOW).decision.allowed);
}

#[test]
fn fixed_refund() {
    let r = fixed(5, SEC);
    let s = check(&r, None, 3, NOW).new_state.unwrap();
    assert_eq!(
        refund(&r, s, 1, NOW),
        Some(State::Fixed {
            start: NOW,
            count: 2
        })
    );
    assert_eq!(refund(&r, s, 3, NOW), None);
    assert_eq!(refund(&r, s, 9, NOW), None);
    assert_eq!(refund(&r, s, 1, NOW + SEC), None);
}

#[test]
fn sliding_weights_previous_window() {
    let r = sliding(10, SEC);
    // Previous window used 10, current 2, a quarter into the current window.
    let state = Some(State::Sliding {
        start: NOW,
        prev: 10,
        cur: 2,
    });
    let t = NOW + 250 * MS;
    let peek = check(&r, state, 0, t);
    // ceil(10 * 0.75) + 2 = 10
    assert_eq!(peek.decision.remaining, 0);
    assert_eq!(peek.decision.reset_after_ns, 2 * SEC - 250 * MS);
    assert_eq!(peek.expires_at, NOW + 2 * SEC);
    let denied = check(&r, state, 1, t);
    assert!(!denied.decision.allowed);
    // Needs ceil(10 * (1 - e)) <= 7: e >= 0.3.
    assert_eq!(denied.decision.retry_after_ns, Some(50 * MS));
    assert!(check(&r, state, 1, NOW + 300 * MS).decision.allowed);
    assert!(!check(&r, state, 1, NOW + 300 * MS - 1).decision.allowed);
    // 9 does not fit before the boundary (2 already used); after it the 2 weigh in fully and
    // need ceil(2 * (1 - e)) <= 1: e >= 0.5.
    let denied = check(&r, state, 9, t);
    assert_eq!(
        denied.decision.retry_after_ns,
        Some(SEC + 500 * MS - 250 * MS)
    );
    assert!(
        !check(&r, state, 9, NOW + SEC + 500 * MS - 1)
            .decision
            .allowed
    );
    let ok = check(&r, state, 9, NOW + SEC + 500 * MS);
    assert!(ok.decision.allowed);
    assert_eq!(
        ok.new_state,
        Some(State::Sliding {
            start: NOW + SEC,
            prev: 2,
            cur: 9
        })
    );
    assert_eq!(ok.expires_at, NOW + 3 * SEC);
    // Too much for the limit at all.
    assert_eq!(check(&r, state, 11, t).decision.retry_after_ns, None);
}

#[test]
fn sliding_aligns_and_forgets() {
    let r = sliding(4, SEC);
    let out = check(&r, None, 1, NOW + 700 * MS);
    assert_eq!(
        out.new_state,
        Some(State::Sliding {
            start: NOW,
            prev: 0,
            cur: 1
        })
    );
    assert_eq!(out.decision.reset_after_ns, 2 * SEC - 700 * MS);
    let s = out.new_state;
    let far = check(&r, s, 0, NOW + 2 * SEC);
    assert_eq!(
        (far.decision.remaining, far.decision.reset_after_ns),
        (4, 0)
    );
    assert_eq!(far.expires_at, NOW + 2 * SEC);
    let gone = check(&r, s, 4, NOW + 5 * SEC + 1);
    assert_eq!(
        gone.new_state,
        Some(State::Sliding {
            start: NOW + 5 * SEC,
            prev: 0,
            cur: 4
        })
    );
    let only_prev = State::Sliding {
        start: NOW,
        prev: 3,
        cur: 0,
    };
    assert_eq!(expires_at(&r, &only_prev), NOW + SEC);
    assert_eq!(
        check(&r, Some(only_prev), 0, NOW + 1)
            .decision
            .reset_after_ns,
        SEC - 1
    );
}

#[test]
fn sliding_refund() {
    let r = sliding(10, SEC);
    let s = State::Sliding {
        start: NOW,
        prev: 4,
        cur: 3,
    };
    assert_eq!(
        refund(&r, s, 2, NOW),
        Some(State::Sliding {
            start: NOW,
            prev: 4,
            cur: 1
        })
    );
    assert_eq!(
        refund(&r, s, 5, NOW),
        Some(State::Sliding {
            start: NOW,
            prev: 2,
            cur: 0
        })
    );
    assert_eq!(refund(&r, s, 7, NOW), None);
    // After the boundary the current count became the previous one.
    assert_eq!(
        refund(&r, s, 1, NOW + SEC),
        Some(State::Sliding {
            start: NOW + SEC,
            prev: 2,
            cur: 0
        })
    );
    assert_eq!(refund(&r, s, 1, NOW + 2 * SEC), None);
}

#[test]
fn window_extremes_do_not_panic() {
    let rules = [
        fixed(1, 1),
        fixed(u64::MAX, u64::MAX),
        sliding(1, 1),
        sliding(u64::MAX, u64::MAX),
        Rule {
            algorithm: Algorithm::Sliding,
            limit: 0,
            period_ns: 0,
            burst: 0,
        },
        Rule {
            algorithm: Algorithm::Fixed,
            limit: 0,
            period_ns: 0,
            burst: 0,
        },
    ];
    let states = [
        None,
        Some(State::Fixed {
            start: u64::MAX,
            count: u64::MAX,
        }),
        Some(State::Fixed { start: 0, count: 0 }),
        Some(State::Sliding {
            start: u64::MAX,
            prev: u64::MAX,
            cur: u64::MAX,
        }),
        Some(State::Sliding {
            start: 0,
            prev: u64::MAX,
            cur: 0,
        }),
    ];
    for r in &rules {
        for s in states {
            for now in [0, 1, u64::MAX / 2, u64::MAX] {
                for cost in [0, 1, u64::MAX] {
                    let _ = check(r, s, cost, now);
                    if let Some(s) = s {
                        let _ = refund(r, s, cost, now);
                        let _ = expires_at(r, &s);
                    }
                }
            }
        }
    }
}

// ---- Reference models, kept deliberately naive. ----

/// Counts every admitted unit by aligned window index and recomputes the estimate from scratch.
struct SlidingModel {
    limit: u64,
    period: u64,
    counts: BTreeMap<u64, u64>,
}

impl SlidingModel {
    fn estimate(&self, t: u64) -> u64 {
        let idx = t / self.period;
        let elapsed = t % self.period;
        let cur = self.counts.get(&idx).copied().unwrap_or(0);
        let prev = match idx.checked_sub(1) {
            Some(i) => self.counts.get(&i).copied().unwrap_or(0),
            None => 0,
        };
        let weighted = (u128::from(prev) * u128::from(self.period - elapsed))
            .div_ceil(u128::from(self.period));
        u64::try_from(weighted).unwrap() + cur
    }

    fn fits(&self, t: u64, cost: u64) -> bool {
        self.estimate(t) + cost <= self.limit
    }

    /// Scans forward one nanosecond at a time.
    fn first_fit(&self, t: u64, cost: u64) -> Option<u64> {
        (1..=2 * self.period + 1).find(|&d| self.fits(t + d, cost))
    }

    fn first_empty(&self, t: u64) -> u64 {
        (0..=2 * self.period + 1)
            .find(|&d| self.estimate(t + d) == 0)
            .unwrap()
    }
}

/// Fixed windows as a list of (start, total) in arrival order.
struct FixedModel {
    limit: u64,
    period: u64,
    windows: Vec<(u64, u64)>,
}

impl FixedModel {
    fn current(&self, t: u64) -> Option<(u64, u64)> {
        self.windows
            .last()
            .copied()
            .filter(|&(start, _)| t < start + self.period)
    }

    fn fits(&self, t: u64, cost: u64) -> bool {
        self.current(t).map_or(0, |(_, n)| n) + cost <= self.limit
    }

    fn first_fit(&self, t: u64, cost: u64) -> Option<u64> {
        (1..=self.period + 1).find(|&d| self.fits(t + d, cost))
    }

    fn admit(&mut self, t: u64, cost: u64) {
        match self.current(t) {
            Some(_) => self.windows.last_mut().unwrap().1 += cost,
            None => self.windows.push((t, cost)),
        }
    }
}

type Events = Vec<(u64, u64)>;

fn window_case(algorithm: Algorithm) -> impl Strategy<Value = (Rule, u64, Events)> {
    (1u64..=10, 1u64..=48, 0u64..10_000)
        .prop_map(move |(limit, period, offset)| {
            let r = Rule::new(algorithm, limit, period, None).unwrap();
            (r, NOW + offset)
        })
        .prop_flat_map(|(r, start)| {
            let p = r.period_ns;
            let events = proptest::collection::vec(
                (
                    prop_oneof![Just(0), 0..=p / 4 + 1, 0..=3 * p],
                    prop_oneof![0u64..=2, 0..=r.limit + 1],
                ),
                1..80,
            );
            (Just(r), Just(start), events)
        })
}

/// A peek (cost 0) from `state` at `now`: always allowed, and it never proposes a state.
fn peek_at(r: &Rule, state: Option<State>, now: u64) -> Result<Decision, TestCaseError> {
    let out = check(r, state, 0, now);
    prop_assert!(out.decision.allowed);
    prop_assert_eq!(out.new_state, None);
    Ok(out.decision)
}

/// Checks that hold for both windows, given the decision just made from `state` at `now`.
fn common_checks(
    r: &Rule,
    state: Option<State>,
    cost: u64,
    now: u64,
    peek_before: Decision,
) -> Result<Option<State>, TestCaseError> {
    let out = check(r, state, cost, now);
    if !out.decision.allowed {
        prop_assert_eq!(out.new_state, None);
        // (b) The advertised wait is exact.
        if let Some(d) = out.decision.retry_after_ns {
            prop_assert!(d > 0);
            prop_assert!(check(r, state, cost, now + d).decision.allowed);
            prop_assert!(!check(r, state, cost, now + d - 1).decision.allowed);
        }
        return Ok(state);
    }
    if cost == 0 {
        prop_assert_eq!(out.new_state, None);
        return Ok(state);
    }
    let stored = out.new_state.unwrap();
    prop_assert_eq!(out.expires_at, expires_at(r, &stored));
    // The stored state stops mattering exactly when the reported reset has passed.
    prop_assert_eq!(out.expires_at, now + out.decision.reset_after_ns);

    // (d) Exactly `remaining` more single units fit at this instant.
    let mut s = Some(stored);
    for _ in 0..out.decision.remaining {
        let o = check(r, s, 1, now);
        prop_assert!(o.decision.allowed);
        s = o.new_state;
    }
    prop_assert!(!check(r, s, 1, now).decision.allowed);

    // (e) Refunding restores the earlier capacity, and never more than full.
    let back = refund(r, stored, cost, now);
    prop_assert_eq!(
        check(r, back, 0, now).decision.remaining,
        peek_before.remaining
    );
    prop_assert!(check(r, back, 0, now).decision.remaining <= r.limit);
    prop_assert_eq!(refund(r, stored, u64::MAX, now), None);
    Ok(Some(stored))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn sliding_matches_model((r, start, events) in window_case(Algorithm::Sliding)) {
        let mut model = SlidingModel { limit: r.limit, period: r.period_ns, counts: BTreeMap::new() };
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        let mut state = None;
        let mut now = start;
        for (advance, cost) in events {
            now += advance;
            // (c) Peek reports the model's figures and never proposes a state.
            let peek = peek_at(&r, state, now)?;
            prop_assert_eq!(peek.remaining, r.limit.saturating_sub(model.estimate(now)));
            prop_assert_eq!(peek.reset_after_ns, model.first_empty(now));

            let out = check(&r, state, cost, now);
            let fits = model.fits(now, cost);
            prop_assert_eq!(out.decision.allowed, fits);
            if fits {
                *model.counts.entry(now / r.period_ns).or_default() += cost;
                prop_assert_eq!(out.decision.remaining, r.limit - model.estimate(now));
                prop_assert_eq!(out.decision.reset_after_ns, model.first_empty(now));
                if cost > 0 {
                    admitted.push((now, cost));
                }
            } else {
                let expected = (cost <= r.limit).then(|| model.first_fit(now, cost).unwrap());
                prop_assert_eq!(out.decision.retry_after_ns, expected);
            }
            state = common_checks(&r, state, cost, now, peek)?;
        }

        // (a) Each aligned window admits at most the limit; a span of one period straddling a
        // boundary can see up to 2 * limit - 1, since the previous window is only estimated.
        for total in model.counts.values() {
            prop_assert!(*total <= r.limit);
        }
        for (i, &(from, _)) in admitted.iter().enumerate() {
            let span: u64 = admitted[i..].iter().take_while(|(t, _)| *t < from + r.period_ns).map(|(_, c)| c).sum();
            prop_assert!(span < 2 * r.limit);
        }
    }

    #[test]
    fn fixed_matches_model((r, start, events) in window_case(Algorithm::Fixed)) {
        let mut model = FixedModel { limit: r.limit, period: r.period_ns, windows: Vec::new() };
        let mut state = None;
        let mut now = start;
        for (advance, cost) in events {
            now += advance;
            let peek = peek_at(&r, state, now)?;
            let (used, left) = model
                .current(now)
                .map_or((0, 0), |(s, n)| (n, s + r.period_ns - now));
            prop_assert_eq!(peek.remaining, r.limit.saturating_sub(used));
            prop_assert_eq!(peek.reset_after_ns, left);

            let out = check(&r, state, cost, now);
            let fits = model.fits(now, cost);
            prop_assert_eq!(out.decision.allowed, fits);
            if fits && cost > 0 {
                model.admit(now, cost);
                let (s, n) = model.current(now).unwrap();
                prop_assert_eq!(out.decision.remaining, r.limit - n);
                prop_assert_eq!(out.decision.reset_after_ns, s + r.period_ns - now);
            } else if !fits {
                let expected = (cost <= r.limit).then(|| model.first_fit(now, cost).unwrap());
                prop_assert_eq!(out.decision.retry_after_ns, expected);
            }
            state = common_checks(&r, state, cost, now, peek)?;
        }
        // (a) No window admits more than the limit.
        for &(_, total) in &model.windows {
            prop_assert!(total <= r.limit);
        }
    }
}
