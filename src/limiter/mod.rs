//! Rate-limit rules, per-key state, and the pure `check`/`refund` entry points that dispatch to each algorithm.
//!
//! Nothing here reads a clock or mutates shared data: the caller passes `now` (nanoseconds since the
//! UNIX epoch) and the stored state, and gets back a decision plus the state to store. That lets a
//! caller evaluate several limits and commit only when all of them pass.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

pub mod cell;
pub mod gcra;
pub mod window;

// What the rest of the crate uses of this folder.
// What the node's commands use of redis-cell's algorithm.
#[cfg(feature = "server")]
pub(crate) use cell::{CellArgs, CellError, CellWrite, parse_i64_signed};
#[cfg(feature = "server")]
pub(crate) use cell::{
    parse_arg as parse_cell_arg, throttle as throttle_cell, validate as validate_cell,
};

const NS_PER_US: u64 = 1_000;
const NS_PER_MS: u64 = 1_000_000;
const NS_PER_S: u64 = 1_000_000_000;

/// Narrows a figure the kernels computed in u128 (so that no step can overflow) back to the u64
/// they store and report, saturating: past `u64::MAX` ns is centuries away, as good as never.
#[inline]
pub(crate) fn clamp_to_u64(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// Which counting scheme a [`Rule`] uses.
///
/// On-disk format: bincode-encoded into the Raft log and snapshots (golden bytes in tests/encoding.rs).
/// Variants are append-only: add new ones at the end, never reorder or change existing ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Algorithm {
    /// Generic cell rate algorithm (a token bucket kept as one timestamp).
    #[default]
    Gcra,
    /// Sliding window counter: previous and current aligned windows, weighted.
    Sliding,
    /// Fixed window starting at the first request, like INCR + EXPIRE.
    Fixed,
    /// Fixed window aligned to multiples of the period since the epoch: every key's window
    /// turns over at the same instant (envoyproxy/ratelimit's counting).
    Aligned,
}

impl Algorithm {
    /// The lower-case name used in limit specs.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Gcra => "gcra",
            Algorithm::Sliding => "sliding",
            Algorithm::Fixed => "fixed",
            Algorithm::Aligned => "aligned",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = RuleError;

    /// Case-insensitive: `gcra`, `sliding`, `fixed` or `aligned`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            Algorithm::Gcra,
            Algorithm::Sliding,
            Algorithm::Fixed,
            Algorithm::Aligned,
        ]
        .into_iter()
        .find(|a| a.name().eq_ignore_ascii_case(s))
        .ok_or(RuleError::UnknownAlgorithm)
    }
}

/// A limit: `limit` requests per `period_ns`; for GCRA `burst` is the bucket capacity (defaults to
/// limit); ignored by windows.
///
/// Build it with [`Rule::new`] or [`parse_spec`]; the fields are public for reading. A rule built by
/// hand that breaks the checks of `new` never causes a panic, but its decisions are unspecified.
///
/// On-disk format: bincode-encoded into the Raft log (golden bytes in tests/encoding.rs).
/// Fields never move or change type; changes are append-only (a new variant of the enum that
/// carries it) or take a new format version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    pub algorithm: Algorithm,
    pub limit: u64,
    pub period_ns: u64,
    pub burst: u64,
}

impl Rule {
    /// Validates and builds a rule. For windows `burst` is ignored and stored as `limit`, so that
    /// equal limits compare equal and print the same spec.
    pub fn new(
        algorithm: Algorithm,
        limit: u64,
        period_ns: u64,
        burst: Option<u64>,
    ) -> Result<Rule, RuleError> {
        if limit == 0 {
            return Err(RuleError::ZeroLimit);
        }
        if period_ns == 0 {
            return Err(RuleError::ZeroPeriod);
        }
        let burst = match algorithm {
            Algorithm::Gcra => {
                let burst = burst.unwrap_or(limit);
                if burst == 0 {
                    return Err(RuleError::ZeroBurst);
                }
                let interval = period_ns / limit;
                if interval == 0 {
                    return Err(RuleError::RateTooHigh);
                }
                // The capacity in nanoseconds must fit the u64 timestamps it is added to.
                if interval.checked_mul(burst).is_none() {
                    return Err(RuleError::BurstTooLarge);
                }
                burst
            }
            Algorithm::Sliding | Algorithm::Fixed | Algorithm::Aligned => limit,
        };
        Ok(Rule {
            algorithm,
            limit,
            period_ns,
            burst,
        })
    }

    /// GCRA emission interval: the nanoseconds it takes to earn back one unit. Never 0, even for a
    /// hand-built rule, so callers can divide by it.
    pub fn emission_interval(&self) -> u64 {
        self.period_ns.checked_div(self.limit).unwrap_or(0).max(1)
    }
}

impl fmt::Display for Rule {
    /// Canonical spec, e.g. `gcra:100/60000ms:100` or `fixed:10/1000ms`; `parse_spec` reads it back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}/", self.algorithm, self.limit)?;
        // Milliseconds keep the usual specs readable; anything finer falls back to exact nanoseconds.
        if self.period_ns.is_multiple_of(NS_PER_MS) {
            write!(f, "{}ms", self.period_ns / NS_PER_MS)?;
        } else {
            write!(f, "{}ns", self.period_ns)?;
        }
        if self.algorithm == Algorithm::Gcra {
            write!(f, ":{}", self.burst)?;
        }
        Ok(())
    }
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_spec(s)
    }
}

/// Why a rule or a limit spec was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleError {
    ZeroLimit,
    ZeroPeriod,
    ZeroBurst,
    /// GCRA would need an emission interval below one nanosecond.
    RateTooHigh,
    /// GCRA capacity in nanoseconds (interval * burst) does not fit in 64 bits.
    BurstTooLarge,
    /// A burst was given for a window algorithm.
    BurstNotAllowed,
    UnknownAlgorithm,
    /// Not of the form `[ALGO:]LIMIT/PERIOD[:BURST]`.
    Syntax,
    /// A number is empty or has something other than decimal digits.
    BadNumber,
    UnknownUnit,
    /// A number or the period in nanoseconds does not fit in 64 bits.
    TooLarge,
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            RuleError::ZeroLimit => "limit must be at least 1",
            RuleError::ZeroPeriod => "period must be at least 1ns",
            RuleError::ZeroBurst => "burst must be at least 1",
            RuleError::RateTooHigh => "rate too high: period / limit must be at least 1ns",
            RuleError::BurstTooLarge => "burst too large for this rate",
            RuleError::BurstNotAllowed => "burst is only allowed for gcra",
            RuleError::UnknownAlgorithm => {
                "unknown algorithm (expected gcra, sliding, fixed or aligned)"
            }
            RuleError::Syntax => "expected [ALGO:]LIMIT/PERIOD[:BURST]",
            RuleError::BadNumber => "expected a positive decimal integer",
            RuleError::UnknownUnit => "unknown period unit (expected ns, us, ms, s, m, h or d)",
            RuleError::TooLarge => "number too large",
        };
        f.write_str(text)
    }
}

impl std::error::Error for RuleError {}

/// Parses `[ALGO:]LIMIT/PERIOD[:BURST]`, e.g. `100/1m`, `sliding:5000/1h`, `gcra:10/1s:50`.
///
/// ALGO is case-insensitive and defaults to gcra. PERIOD is an integer with an optional unit
/// `ns|us|ms|s|m|h|d` (lower case; none means seconds). BURST is only accepted for gcra. Surrounding
/// whitespace is ignored; none is allowed inside.
pub fn parse_spec(s: &str) -> Result<Rule, RuleError> {
    let (head, tail) = s.trim().split_once('/').ok_or(RuleError::Syntax)?;
    let (algorithm, limit_text) = match head.split_once(':') {
        Some((algo, limit)) => (algo.parse()?, limit),
        None => (Algorithm::Gcra, head),
    };
    let (period_text, burst_text) = match tail.split_once(':') {
        Some((period, burst)) => (period, Some(burst)),
        None => (tail, None),
    };
    let limit = parse_number(limit_text)?;
    let period_ns = parse_period(period_text)?;
    let burst = burst_text.map(parse_number).transpose()?;
    if burst.is_some() && algorithm != Algorithm::Gcra {
        return Err(RuleError::BurstNotAllowed);
    }
    Rule::new(algorithm, limit, period_ns, burst)
}

/// Strict decimal: `str::parse` would also take a leading `+`, which specs should not carry.
fn parse_number(s: &str) -> Result<u64, RuleError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(RuleError::BadNumber);
    }
    s.bytes().try_fold(0u64, |acc, b| {
        acc.checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(b - b'0')))
            .ok_or(RuleError::TooLarge)
    })
}

pub(crate) fn parse_period(s: &str) -> Result<u64, RuleError> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at_checked(split).ok_or(RuleError::Syntax)?;
    let scale = match unit {
        "" | "s" => NS_PER_S,
        "ns" => 1,
        "us" => NS_PER_US,
        "ms" => NS_PER_MS,
        "m" => 60 * NS_PER_S,
        "h" => 3_600 * NS_PER_S,
        "d" => 86_400 * NS_PER_S,
        _ => return Err(RuleError::UnknownUnit),
    };
    parse_number(digits)?
        .checked_mul(scale)
        .ok_or(RuleError::TooLarge)
}

/// Per-key state; the caller stores one of these per key.
///
/// On-disk format: bincode-encoded into snapshots (golden bytes in tests/encoding.rs).
/// Variants are append-only: add new ones at the end, never reorder or change existing ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum State {
    /// Theoretical arrival time: when the bucket would be full again (absolute ns).
    Gcra { tat: u64 },
    /// Window start (absolute ns) and units counted in it.
    Fixed { start: u64, count: u64 },
    /// Start of the current aligned window and the counts of the previous and current windows.
    Sliding { start: u64, prev: u64, cur: u64 },
    /// Start of the aligned window (a multiple of the period) and units counted in it.
    Aligned { start: u64, count: u64 },
}

impl State {
    pub fn algorithm(&self) -> Algorithm {
        match self {
            State::Gcra { .. } => Algorithm::Gcra,
            State::Fixed { .. } => Algorithm::Fixed,
            State::Sliding { .. } => Algorithm::Sliding,
            State::Aligned { .. } => Algorithm::Aligned,
        }
    }
}

/// What to tell the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// Capacity: the burst for GCRA, the limit for windows.
    pub limit: u64,
    /// Units still available right after this decision.
    pub remaining: u64,
    /// How long until the same request would be allowed, if nothing else arrives. None when
    /// allowed, or when the cost can never fit.
    pub retry_after_ns: Option<u64>,
    /// How long until the limiter is back to full capacity (0 when it already is).
    pub reset_after_ns: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub decision: Decision,
    /// State to store if the caller commits (Some only when allowed and cost>0; None = leave the
    /// stored state as it was).
    pub new_state: Option<State>,
    /// When the stored state (new_state if committed, else the old one) holds no more information
    /// and may be deleted (absolute ns). A value at or before `now` means it can go right away; with
    /// no usable old state this is `now`.
    pub expires_at: u64,
}

/// Evaluate `rule` for `cost` units at `now` against `state`. If `state` is of another algorithm
/// than the rule (rule changed), treat it as absent. cost 0 = peek: reports the current figures,
/// allowed=true, new_state None.
pub fn check(rule: &Rule, state: Option<State>, cost: u64, now: u64) -> Outcome {
    let (decision, new_state) = match (rule.algorithm, state) {
        (Algorithm::Gcra, Some(State::Gcra { tat })) => gcra::check(rule, Some(tat), cost, now),
        (Algorithm::Gcra, _) => gcra::check(rule, None, cost, now),
        (Algorithm::Fixed, Some(State::Fixed { start, count })) => {
            window::check_fixed(rule, Some((start, count)), cost, now)
        }
        (Algorithm::Fixed, _) => window::check_fixed(rule, None, cost, now),
        (Algorithm::Sliding, Some(State::Sliding { start, prev, cur })) => {
            window::check_sliding(rule, Some((start, prev, cur)), cost, now)
        }
        (Algorithm::Sliding, _) => window::check_sliding(rule, None, cost, now),
        (Algorithm::Aligned, Some(State::Aligned { start, count })) => {
            window::check_aligned(rule, Some((start, count)), cost, now)
        }
        (Algorithm::Aligned, _) => window::check_aligned(rule, None, cost, now),
    };
    let kept = new_state.or(state.filter(|s| s.algorithm() == rule.algorithm));
    Outcome {
        decision,
        new_state,
        expires_at: kept.map_or(now, |s| expires_at(rule, &s)),
    }
}

/// Give back `cost` units previously taken (used to roll back a multi-limit check that failed on
/// another shard); returns the new state, never below an empty bucket. None means the state holds
/// nothing any more (full capacity) and may be deleted; a state of another algorithm also gives
/// None, since `check` would ignore it anyway.
pub fn refund(rule: &Rule, state: State, cost: u64, now: u64) -> Option<State> {
    match (rule.algorithm, state) {
        (Algorithm::Gcra, State::Gcra { tat }) => gcra::refund(rule, tat, cost, now),
        (Algorithm::Fixed, State::Fixed { start, count }) => {
            window::refund_fixed(rule, start, count, cost, now)
        }
        (Algorithm::Sliding, State::Sliding { start, prev, cur }) => {
            window::refund_sliding(rule, (start, prev, cur), cost, now)
        }
        (Algorithm::Aligned, State::Aligned { start, count }) => {
            window::refund_aligned(rule, start, count, cost, now)
        }
        _ => None,
    }
}

/// When `state` stops holding information under `rule` and may be deleted (absolute ns): a GCRA
/// bucket at its tat, a fixed window at its end, a sliding window once both counts have decayed.
/// Use it after `refund`, whose result carries no expiry. A state of another algorithm gives 0.
pub fn expires_at(rule: &Rule, state: &State) -> u64 {
    match (rule.algorithm, *state) {
        (Algorithm::Gcra, State::Gcra { tat }) => tat,
        (Algorithm::Fixed, State::Fixed { start, .. }) => window::fixed_expiry(rule, start),
        (Algorithm::Sliding, State::Sliding { start, prev, cur }) => {
            window::sliding_expiry(rule, start, prev, cur)
        }
        (Algorithm::Aligned, State::Aligned { start, .. }) => window::fixed_expiry(rule, start),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn parses_examples() {
        assert_eq!(
            parse_spec("100/1m").unwrap(),
            Rule::new(Algorithm::Gcra, 100, 60 * SEC, None).unwrap()
        );
        assert_eq!(
            parse_spec("100/60").unwrap(),
            parse_spec("gcra:100/60000ms:100").unwrap()
        );
        let r = parse_spec("sliding:5000/1h").unwrap();
        assert_eq!(
            (r.algorithm, r.limit, r.period_ns, r.burst),
            (Algorithm::Sliding, 5000, 3600 * SEC, 5000)
        );
        let r = parse_spec("fixed:10/1s").unwrap();
        assert_eq!(
            (r.algorithm, r.limit, r.period_ns),
            (Algorithm::Fixed, 10, SEC)
        );
        let r = parse_spec("gcra:10/1s:50").unwrap();
        assert_eq!((r.limit, r.period_ns, r.burst), (10, SEC, 50));
        let r = parse_spec(" GCRA:1/1d ").unwrap();
        assert_eq!(r.period_ns, 86_400 * SEC);
        assert_eq!(parse_spec("Fixed:3/250ms").unwrap().period_ns, 250_000_000);
        assert_eq!(parse_spec("3/7ns").unwrap().period_ns, 7);
        assert_eq!(parse_spec("3/7us").unwrap().period_ns, 7_000);
    }

    #[test]
    fn rejects_bad_specs() {
        let cases = [
            ("", RuleError::Syntax),
            ("100", RuleError::Syntax),
            ("100/", RuleError::BadNumber),
            ("/1s", RuleError::BadNumber),
            ("+5/1s", RuleError::BadNumber),
            ("5/-1s", RuleError::UnknownUnit),
            ("5/1.5s", RuleError::UnknownUnit),
            ("5/1 s", RuleError::UnknownUnit),
            ("5/1w", RuleError::UnknownUnit),
            ("5/1S", RuleError::UnknownUnit),
            ("leaky:5/1s", RuleError::UnknownAlgorithm),
            (":5/1s", RuleError::UnknownAlgorithm),
            ("0/1s", RuleError::ZeroLimit),
            ("5/0s", RuleError::ZeroPeriod),
            ("5/1s:0", RuleError::ZeroBurst),
            ("5/1s:", RuleError::BadNumber),
            ("5/1s:2:3", RuleError::BadNumber),
            ("5/1s/2", RuleError::UnknownUnit),
            ("fixed:5/1s:5", RuleError::BurstNotAllowed),
            ("sliding:5/1s:5", RuleError::BurstNotAllowed),
            ("2/1ns", RuleError::RateTooHigh),
            ("99999999999999999999/1s", RuleError::TooLarge),
            ("1/999999999999d", RuleError::TooLarge),
            ("1/1000s:18446744073709551615", RuleError::BurstTooLarge),
        ];
        for (spec, err) in cases {
            assert_eq!(parse_spec(spec), Err(err), "spec {spec:?}");
        }
    }

    #[test]
    fn rule_new_validates() {
        assert_eq!(
            Rule::new(Algorithm::Gcra, 0, 1, None),
            Err(RuleError::ZeroLimit)
        );
        assert_eq!(
            Rule::new(Algorithm::Fixed, 1, 0, None),
            Err(RuleError::ZeroPeriod)
        );
        assert_eq!(
            Rule::new(Algorithm::Gcra, 1, 1, Some(0)),
            Err(RuleError::ZeroBurst)
        );
        assert_eq!(
            Rule::new(Algorithm::Gcra, 11, 10, None),
            Err(RuleError::RateTooHigh)
        );
        // Windows have no emission interval, so a very high rate is fine there.
        let r = Rule::new(Algorithm::Sliding, 11, 10, Some(0)).unwrap();
        assert_eq!(r.burst, 11);
        assert_eq!(
            Rule::new(Algorithm::Gcra, 1, SEC, Some(u64::MAX / SEC + 1)),
            Err(RuleError::BurstTooLarge)
        );
        assert!(Rule::new(Algorithm::Gcra, 1, SEC, Some(u64::MAX / SEC)).is_ok());
    }

    #[test]
    fn display_is_canonical() {
        let r = parse_spec("100/1m").unwrap();
        assert_eq!(r.to_string(), "gcra:100/60000ms:100");
        assert_eq!(
            parse_spec("fixed:10/1s").unwrap().to_string(),
            "fixed:10/1000ms"
        );
        assert_eq!(
            parse_spec("sliding:3/1500us").unwrap().to_string(),
            "sliding:3/1500000ns"
        );
        assert_eq!(RuleError::ZeroLimit.to_string(), "limit must be at least 1");
    }

    #[test]
    fn state_of_another_algorithm_is_ignored() {
        let now = 1_000 * SEC;
        let gcra = parse_spec("2/1s").unwrap();
        let foreign = State::Fixed {
            start: now,
            count: 1_000,
        };
        let fresh = check(&gcra, None, 1, now);
        let out = check(&gcra, Some(foreign), 1, now);
        assert_eq!(out, fresh);
        // Peek or denial with a foreign state: nothing of value is stored, delete it now.
        let peek = check(&gcra, Some(foreign), 0, now);
        assert_eq!(peek.new_state, None);
        assert_eq!(peek.expires_at, now);
        assert_eq!(refund(&gcra, foreign, 1, now), None);
        assert_eq!(expires_at(&gcra, &foreign), 0);

        let fixed = parse_spec("fixed:2/1s").unwrap();
        let out = check(&fixed, Some(State::Gcra { tat: now * 2 }), 2, now);
        assert!(out.decision.allowed);
        assert_eq!(
            out.new_state,
            Some(State::Fixed {
                start: now,
                count: 2
            })
        );
        let sliding = parse_spec("sliding:2/1s").unwrap();
        let out = check(&sliding, Some(foreign), 2, now);
        assert!(out.decision.allowed);
    }

    #[test]
    fn expires_at_tracks_the_stored_state() {
        let now = 1_000 * SEC;
        let r = parse_spec("10/1s").unwrap();
        let first = check(&r, None, 1, now);
        assert_eq!(first.expires_at, now + SEC / 10);
        // A denial keeps the old state's expiry.
        let mut state = first.new_state;
        for _ in 0..9 {
            state = check(&r, state, 1, now).new_state;
        }
        let denied = check(&r, state, 1, now);
        assert!(!denied.decision.allowed);
        assert_eq!(denied.expires_at, now + SEC);
        assert_eq!(denied.expires_at, expires_at(&r, &state.unwrap()));
    }

    fn any_rule() -> impl Strategy<Value = Rule> {
        (
            prop_oneof![
                Just(Algorithm::Gcra),
                Just(Algorithm::Sliding),
                Just(Algorithm::Fixed)
            ],
            1u64..=1_000_000,
            prop_oneof![1u64..=10_000_000_000, 1u64..=1_000_000 * NS_PER_MS],
            proptest::option::of(1u64..=1_000_000),
        )
            .prop_filter_map("invalid rule", |(a, l, p, b)| Rule::new(a, l, p, b).ok())
    }

    proptest! {
        #[test]
        fn display_round_trips(rule in any_rule()) {
            prop_assert_eq!(parse_spec(&rule.to_string()), Ok(rule));
        }

        /// Whatever the stored state says (stored at any time, ahead of now or long past), a
        /// reply stays within what the limit itself can ask: remaining within the capacity,
        /// a wait no longer than an empty limit's.
        #[test]
        fn replies_stay_within_what_the_limit_can_ask(
            rule in any_rule(),
            algorithm in prop_oneof![
                Just(Algorithm::Gcra),
                Just(Algorithm::Sliding),
                Just(Algorithm::Fixed),
                Just(Algorithm::Aligned)
            ],
            a in any::<u64>(),
            b in any::<u64>(),
            c in any::<u64>(),
            cost in 0u64..=4,
            now in 0u64..=u64::MAX / 4,
        ) {
            let Ok(rule) = Rule::new(algorithm, rule.limit, rule.period_ns, Some(rule.burst)) else {
                return Ok(());
            };
            let state = match algorithm {
                Algorithm::Gcra => State::Gcra { tat: a },
                Algorithm::Fixed => State::Fixed { start: a, count: b },
                Algorithm::Aligned => State::Aligned { start: a, count: b },
                Algorithm::Sliding => State::Sliding { start: a, prev: b, cur: c },
            };
            let d = check(&rule, Some(state), cost, now).decision;
            let capacity = match algorithm {
                Algorithm::Gcra => rule.burst,
                _ => rule.limit,
            };
            prop_assert!(d.remaining <= capacity, "{d:?}");
            let longest = match algorithm {
                Algorithm::Gcra => rule.emission_interval().saturating_mul(rule.burst),
                Algorithm::Fixed | Algorithm::Aligned => rule.period_ns,
                Algorithm::Sliding => rule.period_ns.saturating_mul(2),
            };
            prop_assert!(d.reset_after_ns <= longest, "{d:?} longest {longest}");
            if let Some(retry) = d.retry_after_ns {
                prop_assert!(retry <= longest, "{d:?} longest {longest}");
            }
        }

        #[test]
        fn parse_never_panics(s in "[a-zA-Z0-9:/ +.-]{0,24}") {
            if let Ok(rule) = parse_spec(&s) {
                prop_assert_eq!(parse_spec(&rule.to_string()), Ok(rule));
            }
        }
    }
}
