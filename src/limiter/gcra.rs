//! GCRA, the default limiter: a token bucket stored as a single theoretical arrival time (tat).
//!
//! With emission interval `T = period / limit` and tolerance `tau = T * burst`, the bucket is full
//! when `tat <= now` and each unit pushes `tat` forward by `T`; a request fits while
//! `tat - now <= tau`. Arithmetic is widened to u128 so that `T * cost` and `tat + T * cost` can never
//! overflow, whatever the inputs.

use crate::limiter::{Decision, Rule, State, clamp_to_u64};

/// Emission interval and tolerance in nanoseconds.
fn params(rule: &Rule) -> (u128, u128) {
    let interval = u128::from(rule.emission_interval());
    (interval, interval.saturating_mul(u128::from(rule.burst)))
}

/// Decision for `cost` units at `now` given the stored `tat`, and the state to store if allowed.
pub(crate) fn check(
    rule: &Rule,
    tat: Option<u64>,
    cost: u64,
    now: u64,
) -> (Decision, Option<State>) {
    let (interval, tau) = params(rule);
    let now_w = u128::from(now);
    // A tat in the past only means the bucket is full: idle time beyond that earns nothing.
    // A debt beyond the capacity (a rule changed to a smaller one, or a state stored at a
    // time far ahead of this one) reads as an empty bucket: no reply asks more than the
    // limit itself can.
    let start = tat.map_or(now_w, |t| u128::from(t).max(now_w).min(now_w + tau));
    let debt = start - now_w;
    let available = clamp_to_u64(tau.saturating_sub(debt) / interval);
    let mut decision = Decision {
        allowed: true,
        limit: rule.burst,
        remaining: available,
        retry_after_ns: None,
        reset_after_ns: clamp_to_u64(debt),
    };
    if cost == 0 {
        return (decision, None);
    }
    let increment = interval.saturating_mul(u128::from(cost));
    let new_tat = start.saturating_add(increment);
    let new_debt = new_tat - now_w;
    if new_debt <= tau {
        decision.remaining = clamp_to_u64((tau - new_debt) / interval);
        decision.reset_after_ns = clamp_to_u64(new_debt);
        let tat = clamp_to_u64(new_tat);
        (decision, Some(State::Gcra { tat }))
    } else {
        decision.allowed = false;
        // Waiting `new_debt - tau` lets exactly enough debt drain; a cost above the whole
        // capacity never fits, and saying so spares the client a pointless retry loop.
        decision.retry_after_ns = (increment <= tau).then(|| clamp_to_u64(new_debt - tau));
        (decision, None)
    }
}

/// Moves `tat` back by `cost` units. A result at or before `now` is a full bucket, which is the same
/// as having no state, so it comes back as None rather than a tat in the past.
pub(crate) fn refund(rule: &Rule, tat: u64, cost: u64, now: u64) -> Option<State> {
    let (interval, _) = params(rule);
    let back = u128::from(tat).saturating_sub(interval.saturating_mul(u128::from(cost)));
    (back > u128::from(now)).then(|| State::Gcra {
        tat: clamp_to_u64(back),
    })
}

#[cfg(test)]
mod tests {
    use crate::limiter::{Algorithm, Decision, Rule, State, check, parse_spec, refund};
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;
    const SEC: u64 = 1_000 * MS;
    const NOW: u64 = 1_700_000_000 * SEC;

    fn rule(limit: u64, period_ns: u64, burst: Option<u64>) -> Rule {
        Rule::new(Algorithm::Gcra, limit, period_ns, burst).unwrap()
    }

    #[test]
    fn fresh_key_takes_from_a_full_bucket() {
        let r = rule(10, SEC, None);
        let out = check(&r, None, 1, NOW);
        assert_eq!(
            out.decision,
            Decision {
                allowed: true,
                limit: 10,
                remaining: 9,
                retry_after_ns: None,
                reset_after_ns: 100 * MS,
            }
        );
        assert_eq!(
            out.new_state,
            Some(State::Gcra {
                tat: NOW + 100 * MS
            })
        );
        assert_eq!(out.expires_at, NOW + 100 * MS);
    }

    #[test]
    fn burst_then_deny_then_refill() {
        let r = rule(10, SEC, None);
        let mut state = None;
        for left in (0..10).rev() {
            let out = check(&r, state, 1, NOW);
            assert!(out.decision.allowed);
            assert_eq!(out.decision.remaining, left);
            state = out.new_state;
        }
        let out = check(&r, state, 1, NOW);
        assert_eq!(
            out.decision,
            Decision {
                allowed: false,
                limit: 10,
                remaining: 0,
                retry_after_ns: Some(100 * MS),
                reset_after_ns: SEC,
            }
        );
        assert_eq!(out.new_state, None);
        assert!(!check(&r, state, 1, NOW + 100 * MS - 1).decision.allowed);
        let later = check(&r, state, 1, NOW + 100 * MS);
        assert!(later.decision.allowed);
        assert_eq!(later.decision.remaining, 0);
        // Asking for 3 needs 3 intervals of refill.
        let out = check(&r, state, 3, NOW);
        assert_eq!(out.decision.retry_after_ns, Some(300 * MS));
    }

    #[test]
    fn burst_is_the_capacity() {
        let r = parse_spec("gcra:10/1s:50").unwrap();
        let out = check(&r, None, 50, NOW);
        assert!(out.decision.allowed);
        assert_eq!(out.decision.limit, 50);
        assert_eq!(out.decision.remaining, 0);
        assert_eq!(out.decision.reset_after_ns, 5 * SEC);
        assert!(!check(&r, out.new_state, 1, NOW).decision.allowed);
    }

    #[test]
    fn cost_above_capacity_never_fits() {
        let r = rule(5, SEC, None);
        let out = check(&r, None, 6, NOW);
        assert!(!out.decision.allowed);
        assert_eq!(out.decision.retry_after_ns, None);
        assert_eq!(out.decision.remaining, 5);
        assert_eq!(out.decision.reset_after_ns, 0);
        assert_eq!(out.expires_at, NOW);
    }

    #[test]
    fn peek_reports_without_storing() {
        let r = rule(4, SEC, None);
        let fresh = check(&r, None, 0, NOW);
        assert!(fresh.decision.allowed);
        assert_eq!(fresh.decision.remaining, 4);
        assert_eq!(fresh.decision.reset_after_ns, 0);
        assert_eq!(fresh.new_state, None);
        let state = check(&r, None, 3, NOW).new_state;
        let peek = check(&r, state, 0, NOW + 250 * MS);
        assert_eq!(peek.decision.remaining, 2);
        assert_eq!(peek.decision.reset_after_ns, 500 * MS);
        assert_eq!(peek.new_state, None);
        assert_eq!(peek.expires_at, NOW + 750 * MS);
    }

    #[test]
    fn stale_tat_is_a_full_bucket() {
        let r = rule(4, SEC, None);
        let out = check(&r, Some(State::Gcra { tat: NOW - SEC }), 1, NOW);
        assert_eq!(out.decision.remaining, 3);
        assert_eq!(
            out.new_state,
            Some(State::Gcra {
                tat: NOW + 250 * MS
            })
        );
    }

    #[test]
    fn debt_beyond_a_shrunk_capacity_reads_as_empty() {
        // Stored under a larger burst, then the rule shrank.
        let r = rule(4, SEC, None);
        let out = check(
            &r,
            Some(State::Gcra {
                tat: NOW + 10 * SEC,
            }),
            1,
            NOW,
        );
        assert!(!out.decision.allowed);
        assert_eq!(out.decision.remaining, 0);
        // As long as an empty bucket of this rule waits for one unit, not the stored debt.
        assert_eq!(out.decision.retry_after_ns, Some(250 * MS));
        assert_eq!(out.decision.reset_after_ns, SEC);
    }

    #[test]
    fn refund_gives_back_but_not_beyond_full() {
        let r = rule(10, SEC, None);
        let taken = check(&r, None, 4, NOW).new_state.unwrap();
        assert_eq!(
            refund(&r, taken, 1, NOW),
            Some(State::Gcra {
                tat: NOW + 300 * MS
            })
        );
        assert_eq!(refund(&r, taken, 4, NOW), None);
        assert_eq!(refund(&r, taken, u64::MAX, NOW), None);
        assert_eq!(refund(&r, taken, 2, NOW + 300 * MS), None);
    }

    #[test]
    fn extreme_inputs_do_not_panic() {
        let big = rule(1, u64::MAX, Some(1));
        for now in [0, 1, u64::MAX - 1, u64::MAX] {
            for cost in [0, 1, 2, u64::MAX] {
                for tat in [None, Some(0), Some(u64::MAX)] {
                    let state = tat.map(|tat| State::Gcra { tat });
                    let out = check(&big, state, cost, now);
                    if let Some(s) = state {
                        let _ = refund(&big, s, cost, now);
                    }
                    let _ = out;
                }
            }
        }
        let out = check(&big, None, 1, u64::MAX);
        assert!(out.decision.allowed);
        assert_eq!(out.new_state, Some(State::Gcra { tat: u64::MAX }));
        // Hand-built rules that `Rule::new` would reject.
        for (limit, period_ns, burst) in [(0, 0, 0), (0, 5, 1), (9, 1, 0), (u64::MAX, 1, u64::MAX)]
        {
            let bad = Rule {
                algorithm: Algorithm::Gcra,
                limit,
                period_ns,
                burst,
            };
            for cost in [0, 1, u64::MAX] {
                let _ = check(&bad, Some(State::Gcra { tat: NOW }), cost, NOW);
                let _ = refund(&bad, State::Gcra { tat: NOW }, cost, NOW);
            }
        }
    }

    /// A plain token bucket holding credit in nanoseconds of refill, written independently of the
    /// tat formulation: credit grows with elapsed time up to the capacity, and a unit costs one
    /// emission interval of credit.
    struct Bucket {
        interval: u128,
        capacity: u128,
        credit: u128,
        at: u64,
    }

    impl Bucket {
        fn new(rule: &Rule, at: u64) -> Bucket {
            let interval = u128::from(rule.period_ns / rule.limit);
            let capacity = interval * u128::from(rule.burst);
            Bucket {
                interval,
                capacity,
                credit: capacity,
                at,
            }
        }

        fn advance(&mut self, now: u64) {
            self.credit = (self.credit + u128::from(now - self.at)).min(self.capacity);
            self.at = now;
        }

        fn units(&self) -> u64 {
            u64::try_from(self.credit / self.interval).unwrap()
        }

        fn take(&mut self, cost: u64, limit: u64) -> Decision {
            let need = self.interval * u128::from(cost);
            if need <= self.credit {
                self.credit -= need;
                Decision {
                    allowed: true,
                    limit,
                    remaining: self.units(),
                    retry_after_ns: None,
                    reset_after_ns: u64::try_from(self.capacity - self.credit).unwrap(),
                }
            } else {
                Decision {
                    allowed: false,
                    limit,
                    remaining: self.units(),
                    retry_after_ns: (need <= self.capacity)
                        .then(|| u64::try_from(need - self.credit).unwrap()),
                    reset_after_ns: u64::try_from(self.capacity - self.credit).unwrap(),
                }
            }
        }
    }

    fn case() -> impl Strategy<Value = (Rule, u64, Vec<(u64, u64)>)> {
        (1u64..=8, 1u64..=40, 0u64..8, 1u64..=12, 0u64..1_000_000)
            .prop_map(|(limit, interval, extra, burst, offset)| {
                let period = limit * interval + extra % limit;
                (rule(limit, period, Some(burst)), NOW + offset)
            })
            .prop_flat_map(|(r, start)| {
                let span = r.emission_interval() * r.burst;
                let events = proptest::collection::vec(
                    (
                        prop_oneof![Just(0), 0..=r.emission_interval() * 2, 0..=span * 2],
                        prop_oneof![0u64..=3, 0..=r.burst + 1],
                    ),
                    1..80,
                );
                (Just(r), Just(start), events)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn matches_token_bucket_model((r, start, events) in case()) {
            let mut now = start;
            let mut state = None;
            let mut model = Bucket::new(&r, now);
            let mut admitted: Vec<(u64, u64)> = Vec::new();
            for (advance, cost) in events {
                now += advance;
                model.advance(now);

                // (c) Peek reports the model's figures and never proposes a state.
                let peek = check(&r, state, 0, now);
                prop_assert!(peek.decision.allowed);
                prop_assert_eq!(peek.new_state, None);
                prop_assert_eq!(peek.decision.remaining, model.units());

                let out = check(&r, state, cost, now);
                let expected = model.take(cost, r.burst);
                prop_assert_eq!(out.decision, expected);

                if !out.decision.allowed {
                    prop_assert_eq!(out.new_state, None);
                    // (b) The advertised wait is exact.
                    if let Some(d) = out.decision.retry_after_ns {
                        prop_assert!(d > 0);
                        prop_assert!(check(&r, state, cost, now + d).decision.allowed);
                        prop_assert!(!check(&r, state, cost, now + d - 1).decision.allowed);
                    }
                    continue;
                }
                if cost == 0 {
                    prop_assert_eq!(out.new_state, None);
                    continue;
                }
                let stored = out.new_state.unwrap();
                prop_assert_eq!(out.expires_at, now + out.decision.reset_after_ns);

                // (d) Exactly `remaining` more single units fit at this instant.
                let mut s = Some(stored);
                for _ in 0..out.decision.remaining {
                    let o = check(&r, s, 1, now);
                    prop_assert!(o.decision.allowed);
                    s = o.new_state;
                }
                prop_assert!(!check(&r, s, 1, now).decision.allowed);

                // (e) Refunding restores the earlier capacity, and never more than full.
                let back = refund(&r, stored, cost, now);
                prop_assert_eq!(check(&r, back, 0, now).decision, peek.decision);
                prop_assert_eq!(refund(&r, stored, cost + r.burst, now), None);

                state = Some(stored);
                admitted.push((now, cost));
            }

            // (a) Over any span, admissions never exceed the burst plus what the span refills.
            let interval = r.emission_interval();
            for (i, &(from, _)) in admitted.iter().enumerate() {
                let mut total = 0;
                for &(to, cost) in &admitted[i..] {
                    total += cost;
                    prop_assert!(total <= r.burst + (to - from) / interval);
                }
            }
        }
    }
}
