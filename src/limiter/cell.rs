//! redis-cell's `CL.THROTTLE key max_burst count period [quantity]`: its argument rules, its GCRA
//! step in nanoseconds, and the five-integer reply `[limited, limit, remaining, retry_after,
//! reset_after]`, reproduced down to its arithmetic.
//!
//! redis-cell (0.5, built in release mode as it is shipped) accepts every integer and computes
//! with wrapping 64-bit arithmetic, a floating-point emission interval, and the `time` crate's
//! signed durations. Its users see those results, odd ones included, so this kernel repeats them
//! exactly rather than refusing what redis-cell answers:
//!
//! - emission interval `T = trunc(f64(period * 1e9) / f64(count))` ns, saturating; `T == 0`
//!   (a zero count or period, or more than one request per nanosecond) is redis-cell's
//!   "Zero rates are not supported";
//! - limit `L = max_burst + 1`, tolerance `tau = T * L`, increment `I = T * quantity`, all
//!   wrapping i64: a negative `max_burst` is a limit of `max_burst + 1` (0 for -1), negative
//!   counts, periods and quantities give negative intervals and increments;
//! - `remaining = trunc(f64(us(tau - ttl)) / f64(us(T)))` when `tau - ttl > -T`, else 0, with
//!   whole microseconds (`us`) truncated toward zero, so an interval under 1 us divides by zero
//!   (an infinite quotient saturates to `i64::MAX`, NaN is 0);
//! - seconds in the reply are the duration truncated toward zero, plus one when its fraction
//!   holds at least one whole millisecond (a fraction under 1 ms is dropped);
//! - the key is written on every allowed request with a TTL of `ttl` whole milliseconds: a TTL
//!   of exactly -1 ms stores the key without expiry, one below that is redis-cell's
//!   "Error while setting key expire" *after* the key was written (without expiry), and a tat
//!   past 2^64 ns or before 1970 is stored wrapped modulo 2^64, as redis-cell does.
//!
//! Where bucketd differs, and why:
//! - redis-cell crashes Redis on an argument that is not UTF-8 and on a key holding anything
//!   but a decimal u64; bucketd answers the parse error and `WRONGTYPE` instead (see
//!   `cmd::keyed`).
//! - Redis expires the key on its own millisecond clock; bucketd expires it at the tat itself
//!   (to the nanosecond), so the key may disappear up to 1 ms earlier or later than in Redis.
//!   A TTL within the current millisecond (0 ms) is a key Redis drops before the next
//!   millisecond; bucketd drops it at once.
//! - An expiry past 2554 (the end of bucketd's u64 nanosecond clock) is clamped to that end.
//!
//! `CellArgs` travels inside `KeyCmd` in the Raft log: its fields and their order are an on-disk
//! format.

use serde::{Deserialize, Serialize};
use std::fmt;

const NS_PER_S: i128 = 1_000_000_000;
const NS_PER_MS: i128 = 1_000_000;
const NS_PER_US: i128 = 1_000;

/// The numeric arguments of CL.THROTTLE, as parsed from the wire (quantity defaults to 1 there).
///
/// On-disk format: bincode-encoded into the Raft log (golden bytes in tests/encoding.rs).
/// Fields never move or change type; changes are append-only (a new variant of the enum that
/// carries it) or take a new format version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CellArgs {
    pub max_burst: i64,
    pub count: i64,
    pub period_s: i64,
    pub quantity: i64,
}

/// redis-cell's refusals. `Display` gives the whole error line redis-cell sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CellError {
    /// Not 4 or 5 arguments after the command name.
    Usage,
    /// An argument that Rust's `i64` parser refuses (the argument as redis-cell echoes it).
    NotInteger(String),
    /// The emission interval is 0 ns.
    ZeroRate,
    /// The TTL to set was below -1 ms (a negative increment); the key was written regardless.
    SetExpire,
}

impl fmt::Display for CellError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Cell error: Store error: ")?;
        match self {
            CellError::Usage => f.write_str(
                "Usage: cl.throttle <key> <max_burst> <count per period> <period> [<quantity>]",
            ),
            CellError::NotInteger(arg) => write!(f, "Couldn't parse as integer: {arg}"),
            CellError::ZeroRate => f.write_str("Zero rates are not supported"),
            CellError::SetExpire => f.write_str("Error while setting key expire"),
        }
    }
}

impl std::error::Error for CellError {}

/// What `str::parse::<i64>` accepts, read from the bytes as they are (no UTF-8 check first:
/// a byte that is not an ASCII digit fails either way): an optional `+` or `-`, then at least
/// one digit, leading zeros allowed, the value within `i64`.
pub(crate) fn parse_i64_signed(arg: &[u8]) -> Option<i64> {
    let (neg, digits) = match arg {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, arg),
    };
    if digits.is_empty() {
        return None;
    }
    let mut v: i64 = 0;
    for &c in digits {
        let d = i64::from(c.wrapping_sub(b'0'));
        if !(0..10).contains(&d) {
            return None;
        }
        // Accumulated on the negative side, which holds i64::MIN.
        v = v.checked_mul(10)?.checked_sub(d)?;
    }
    if neg { Some(v) } else { v.checked_neg() }
}

/// Parses one numeric argument as redis-cell does (Rust's `i64` parser: an optional `+` or `-`,
/// then ASCII digits, leading zeros allowed).
pub fn parse_arg(arg: &[u8]) -> Result<i64, CellError> {
    parse_i64_signed(arg).ok_or_else(|| {
        // The module hands its message to Redis as a C string (cut at the first NUL), and
        // Redis trims line breaks at its end.
        let text = String::from_utf8_lossy(arg);
        let text = text.split('\0').next().unwrap_or("");
        CellError::NotInteger(text.trim_end_matches(['\r', '\n']).to_string())
    })
}

/// The emission interval in ns, computed as redis-cell does: through `f64`, truncated and
/// saturated to `i64`. 0 means redis-cell refuses the rate.
pub fn emission_interval(count: i64, period_s: i64) -> i64 {
    if count == 0 || period_s == 0 {
        return 0;
    }
    // Converting the product as an i64 rounds exactly as converting it as an i128 does, and
    // avoids the slow 128-bit conversion whenever the product fits.
    let period_ns = match period_s.checked_mul(NS_PER_S as i64) {
        Some(ns) => ns as f64,
        None => (i128::from(period_s) * NS_PER_S) as f64,
    };
    (period_ns / count as f64) as i64
}

/// Checks what redis-cell checks before it touches the key.
pub fn validate(args: &CellArgs) -> Result<(), CellError> {
    if emission_interval(args.count, args.period_s) == 0 {
        return Err(CellError::ZeroRate);
    }
    Ok(())
}

/// What the command leaves in the keyspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellWrite {
    /// Leave the key as it is (limited requests write nothing).
    Keep,
    /// Drop the key: redis-cell stored a tat that is already past, expiring within the current
    /// millisecond, which reads exactly as a missing key.
    Remove,
    /// Store `tat`, expiring at `expires_at` (ns since the epoch; 0 = never).
    Store { tat: u64, expires_at: u64 },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CellOutcome {
    /// `[limited (0/1), limit, remaining, retry_after_s (-1 if none), reset_after_s]`, or the
    /// error redis-cell answers.
    pub reply: Result<[i64; 5], CellError>,
    /// Applied whatever `reply` is: redis-cell writes the key before it fails to set a TTL.
    pub write: CellWrite,
}

/// A duration in seconds as redis-cell replies it: `as_seconds_f64() as i64`, plus one when the
/// sub-second part holds a positive whole millisecond.
fn reply_seconds(ns: i128) -> i64 {
    // The same steps in 64 bits when the duration fits (it always does for times inside the
    // clock's range): identical results, without 128-bit division.
    if let Ok(ns) = i64::try_from(ns) {
        let secs = ns / NS_PER_S as i64;
        let nanos = ns % NS_PER_S as i64;
        let mut out = (secs as f64 + nanos as f64 / NS_PER_S as f64) as i64;
        if nanos / NS_PER_MS as i64 > 0 {
            out = out.wrapping_add(1);
        }
        return out;
    }
    let secs = ns / NS_PER_S;
    let nanos = ns % NS_PER_S;
    let mut out = (secs as f64 + nanos as f64 / NS_PER_S as f64) as i64;
    if nanos / NS_PER_MS > 0 {
        out = out.wrapping_add(1);
    }
    out
}

/// Applies CL.THROTTLE at `now` (ns) to the stored tat (None for a missing key).
pub fn throttle(tat: Option<u64>, args: &CellArgs, now: u64) -> CellOutcome {
    let interval = emission_interval(args.count, args.period_s);
    if interval == 0 {
        return CellOutcome {
            reply: Err(CellError::ZeroRate),
            write: CellWrite::Keep,
        };
    }
    let limit = args.max_burst.wrapping_add(1);
    // Wrapping, as redis-cell's release build multiplies.
    let tau = i128::from(interval.wrapping_mul(limit));
    let increment = i128::from(interval.wrapping_mul(args.quantity));
    let t = i128::from(interval);

    // Every quantity below stays far inside i128: times are u64 ns, durations i64 ns.
    let now_w = i128::from(now);
    // A tat further ahead than the limit's whole capacity (stored at a time far ahead of this
    // one, or wrapped by a negative quantity) reads as an empty bucket, and one behind now (a
    // key a negative quantity left without expiry) as a full one: no reply asks more than the
    // limit itself can, where redis-cell would answer a negative reset, or more remaining than
    // the limit.
    let tat_w = tat.map_or(now_w, |t| {
        let t = i128::from(t);
        if tau > 0 {
            t.clamp(now_w, now_w + tau)
        } else {
            t
        }
    });
    let new_tat = if now_w > tat_w { now_w } else { tat_w } + increment;
    let diff = now_w - (new_tat - tau);

    let (limited, ttl, retry_after, write) = if diff < 0 {
        let retry = if increment <= tau { -diff } else { -NS_PER_S };
        (1, tat_w - now_w, retry, CellWrite::Keep)
    } else {
        let ttl = new_tat - now_w;
        // The stored value is the tat's nanoseconds since the epoch modulo 2^64.
        let stored = new_tat as u64;
        let ttl_ms = ttl / NS_PER_MS;
        let write = if ttl_ms < 0 {
            CellWrite::Store {
                tat: stored,
                expires_at: 0,
            }
        } else if ttl <= 0 {
            CellWrite::Remove
        } else {
            CellWrite::Store {
                tat: stored,
                expires_at: u64::try_from(new_tat).unwrap_or(u64::MAX),
            }
        };
        if ttl_ms < -1 {
            return CellOutcome {
                reply: Err(CellError::SetExpire),
                write,
            };
        }
        (0, ttl, -NS_PER_S, write)
    };

    let next = tau - ttl;
    let remaining = if next > -t {
        // In 64 bits when both fit (the usual case): the quotients and their conversions are
        // the same, without 128-bit division.
        match (i64::try_from(next), i64::try_from(t)) {
            (Ok(next), Ok(t)) => {
                ((next / NS_PER_US as i64) as f64 / (t / NS_PER_US as i64) as f64) as i64
            }
            _ => ((next / NS_PER_US) as f64 / (t / NS_PER_US) as f64) as i64,
        }
    } else {
        0
    };
    CellOutcome {
        reply: Ok([
            limited,
            limit,
            remaining,
            reply_seconds(retry_after),
            reply_seconds(ttl),
        ]),
        write,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, Rule, State, check};
    use proptest::prelude::*;

    const SEC: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;
    const NOW: u64 = 1_700_000_000 * SEC;

    /// Arguments are read as Rust's own i64 parser reads them, byte for byte.
    #[test]
    fn arguments_parse_as_rusts_i64_parser_does() {
        let rust = |b: &[u8]| {
            std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
        };
        let cases: &[&[u8]] = &[
            b"0",
            b"7",
            b"+7",
            b"-7",
            b"007",
            b"-0",
            b"+",
            b"-",
            b"",
            b"+-1",
            b"--1",
            b" 1",
            b"1 ",
            b"1.0",
            b"1e3",
            b"9223372036854775807",
            b"9223372036854775808",
            b"-9223372036854775808",
            b"-9223372036854775809",
            b"+9223372036854775807",
            b"00000000000000000000000000042",
            b"\xff1",
            b"1\0",
            "\u{661}".as_bytes(),
        ];
        for &c in cases {
            assert_eq!(
                parse_i64_signed(c),
                rust(c),
                "{:?}",
                String::from_utf8_lossy(c)
            );
        }
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let len = (rng % 22) as usize;
            let alphabet = b"0123456789+-9 x";
            let b: Vec<u8> = (0..len)
                .map(|i| alphabet[((rng >> (i * 3 % 60)) % alphabet.len() as u64) as usize])
                .collect();
            assert_eq!(
                parse_i64_signed(&b),
                rust(&b),
                "{:?}",
                String::from_utf8_lossy(&b)
            );
        }
    }

    fn args(max_burst: i64, count: i64, period_s: i64, quantity: i64) -> CellArgs {
        CellArgs {
            max_burst,
            count,
            period_s,
            quantity,
        }
    }

    fn reply(tat: Option<u64>, a: CellArgs, now: u64) -> [i64; 5] {
        throttle(tat, &a, now).reply.unwrap()
    }

    fn stored(out: &CellOutcome) -> Option<u64> {
        match out.write {
            CellWrite::Store { tat, .. } => Some(tat),
            _ => None,
        }
    }

    #[test]
    fn known_vectors() {
        let out = throttle(None, &args(15, 30, 60, 1), NOW);
        assert_eq!(out.reply, Ok([0, 16, 15, -1, 2]));
        assert_eq!(
            out.write,
            CellWrite::Store {
                tat: NOW + 2 * SEC,
                expires_at: NOW + 2 * SEC
            }
        );

        let first = throttle(None, &args(0, 1, 2, 1), NOW);
        assert_eq!(first.reply, Ok([0, 1, 0, -1, 2]));
        let second = throttle(stored(&first), &args(0, 1, 2, 1), NOW);
        assert_eq!(second.reply, Ok([1, 1, 0, 2, 2]));
        assert_eq!(second.write, CellWrite::Keep);

        let peek = throttle(None, &args(15, 30, 60, 0), NOW);
        assert_eq!(peek.reply, Ok([0, 16, 16, -1, 0]));
        assert_eq!(peek.write, CellWrite::Remove);
    }

    /// Replies of the redis-cell 0.5 module loaded into Redis 7.0, each on a fresh key.
    #[test]
    fn odd_arguments_answer_as_redis_cell_does() {
        let cases: [(CellArgs, [i64; 5]); 8] = [
            (args(-1, 30, 60, 1), [1, 0, 0, -1, 0]),
            (args(-5, 30, 60, 1), [1, -4, 0, -1, 0]),
            (args(1, -1, 60, 1), [1, 2, 0, -1, 0]),
            (args(1, 1, -60, 1), [1, 2, 0, -1, 0]),
            (args(1, 1000, 1, -1), [0, 2, 3, -1, 0]),
            (args(i64::MAX, 1, 1, 1), [1, i64::MIN, 0, -1, 0]),
            (args(1, i64::MAX, i64::MAX, 1), [0, 2, 1, -1, 1]),
            (args(1, 1, i64::MAX, 1), [1, 2, 0, -1, 0]),
        ];
        for (a, want) in cases {
            assert_eq!(reply(None, a, NOW), want, "{a:?}");
        }
    }

    #[test]
    fn zero_rates_and_bad_integers_are_redis_cells_errors() {
        for a in [
            args(1, 0, 60, 1),
            args(1, 1, 0, 1),
            args(1, 2_000_000_000, 1, 1),
        ] {
            assert_eq!(validate(&a), Err(CellError::ZeroRate));
            assert_eq!(throttle(None, &a, NOW).reply, Err(CellError::ZeroRate));
        }
        assert_eq!(
            CellError::ZeroRate.to_string(),
            "Cell error: Store error: Zero rates are not supported"
        );
        assert_eq!(parse_arg(b"+1"), Ok(1));
        assert_eq!(parse_arg(b"007"), Ok(7));
        assert_eq!(parse_arg(b"-0"), Ok(0));
        assert_eq!(
            parse_arg(b"1.5").unwrap_err().to_string(),
            "Cell error: Store error: Couldn't parse as integer: 1.5"
        );
        assert_eq!(
            parse_arg(b" 1"),
            Err(CellError::NotInteger(" 1".to_string()))
        );
        assert_eq!(
            parse_arg(b"9223372036854775808"),
            Err(CellError::NotInteger("9223372036854775808".to_string()))
        );
        assert_eq!(parse_arg(b"x\0y"), Err(CellError::NotInteger("x".into())));
    }

    #[test]
    fn negative_quantities_write_past_tats() {
        // A 1 ms increment taken back: the key stays, without expiry, in the past.
        let out = throttle(None, &args(1, 1000, 1, -1), NOW);
        assert_eq!(out.reply, Ok([0, 2, 3, -1, 0]));
        assert_eq!(
            out.write,
            CellWrite::Store {
                tat: NOW - MS,
                expires_at: 0
            }
        );
        // A later limited request reads that past tat as a full bucket (redis-cell reads it as
        // it is: 5003 remaining, a reset of -5 s).
        let later = throttle(Some(NOW - MS), &args(1, 1000, 1, 5), NOW + 5 * SEC);
        assert_eq!(later.reply, Ok([1, 2, 2, -1, 0]));
        // Taking back more than a millisecond fails after writing the key.
        let out = throttle(None, &args(1, 1, 60, -1), NOW);
        assert_eq!(out.reply, Err(CellError::SetExpire));
        assert_eq!(
            out.write,
            CellWrite::Store {
                tat: NOW - 60 * SEC,
                expires_at: 0
            }
        );
        // Within the current millisecond: as good as missing.
        let out = throttle(None, &args(1, 2000, 1, -1), NOW);
        assert_eq!(out.write, CellWrite::Remove);
    }

    #[test]
    fn tats_wrap_modulo_two_to_the_64() {
        // An increment that takes the tat before 1970 is stored wrapped, far in the future.
        let a = args(0, 1, 9_000_000_000, -1);
        let out = throttle(None, &a, NOW);
        assert_eq!(out.reply, Err(CellError::SetExpire));
        let CellWrite::Store { tat, expires_at } = out.write else {
            panic!("the key is written: {:?}", out.write);
        };
        assert_eq!(expires_at, 0);
        let interval = emission_interval(1, 9_000_000_000);
        assert_eq!(tat, NOW.wrapping_sub(interval as u64));
        assert!(tat > NOW);
    }

    #[test]
    fn seconds_round_up_from_one_millisecond() {
        assert_eq!(reply_seconds(i128::from(SEC)), 1);
        assert_eq!(reply_seconds(i128::from(SEC + MS - 1)), 1);
        assert_eq!(reply_seconds(i128::from(SEC + MS)), 2);
        assert_eq!(reply_seconds(-i128::from(SEC)), -1);
        assert_eq!(reply_seconds(-i128::from(MS + 5)), 0);
        assert_eq!(reply_seconds(0), 0);
    }

    #[test]
    fn sixteen_quick_calls_then_limited() {
        let a = args(15, 30, 60, 1);
        let mut tat = None;
        for left in (0..16).rev() {
            let out = throttle(tat, &a, NOW);
            assert_eq!(out.reply.clone().unwrap()[..3], [0, 16, left]);
            tat = stored(&out);
        }
        assert_eq!(reply(tat, a, NOW), [1, 16, 0, 2, 32]);
        let later = throttle(tat, &a, NOW + 2 * SEC);
        assert_eq!(later.reply, Ok([0, 16, 0, -1, 32]));
        assert_eq!(reply(stored(&later), a, NOW + 2 * SEC)[0], 1);
    }

    #[test]
    fn fractions_round_up() {
        // 3 per second: an interval of 333_333_333ns reads as 1s.
        let out = throttle(None, &args(0, 3, 1, 1), NOW);
        assert_eq!(out.reply, Ok([0, 1, 0, -1, 1]));
        assert_eq!(
            reply(stored(&out), args(0, 3, 1, 1), NOW + 1),
            [1, 1, 0, 1, 1]
        );
    }

    #[test]
    fn quantity_above_limit_never_fits() {
        let out = throttle(None, &args(4, 1, 1, 6), NOW);
        assert_eq!(out.reply, Ok([1, 5, 5, -1, 0]));
        assert_eq!(out.write, CellWrite::Keep);
        // Exactly the whole capacity does fit.
        assert_eq!(reply(None, args(4, 1, 1, 5), NOW), [0, 5, 0, -1, 5]);
    }

    #[test]
    fn sub_microsecond_intervals_divide_by_zero_as_redis_cell_does() {
        // 2_000_000 per second: 500 ns, 0 whole microseconds.
        assert_eq!(
            reply(None, args(5, 2_000_000, 1, 1), NOW),
            [0, 6, i64::MAX, -1, 0]
        );
    }

    #[test]
    fn extreme_arguments_do_not_panic() {
        let values = [i64::MIN, -1, 0, 1, i64::MAX];
        for &b in &values {
            for &c in &values {
                for &p in &values {
                    for &q in &values {
                        for tat in [None, Some(0), Some(NOW), Some(u64::MAX)] {
                            for now in [0, NOW, u64::MAX] {
                                let _ = throttle(tat, &args(b, c, p, q), now);
                            }
                        }
                    }
                }
            }
        }
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

    /// redis-cell's rounding: whole seconds, plus one for a fraction of at least 1 ms.
    fn cell_seconds(ns: u64) -> i64 {
        i64::try_from(ns / SEC + u64::from(ns % SEC >= MS)).unwrap()
    }

    /// `reply_seconds` all in 128 bits, as it was first written.
    fn reply_seconds_wide(ns: i128) -> i64 {
        let secs = ns / NS_PER_S;
        let nanos = ns % NS_PER_S;
        let mut out = (secs as f64 + nanos as f64 / NS_PER_S as f64) as i64;
        if nanos / NS_PER_MS > 0 {
            out = out.wrapping_add(1);
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The 64-bit shortcuts answer exactly what the 128-bit arithmetic does.
        #[test]
        fn narrow_arithmetic_matches_wide(ns in any::<i64>(), s in any::<i64>(), c in any::<i64>()) {
            prop_assert_eq!(reply_seconds(i128::from(ns)), reply_seconds_wide(i128::from(ns)));
            let wide = if c == 0 || s == 0 {
                0
            } else {
                ((i128::from(s) * NS_PER_S) as f64 / c as f64) as i64
            };
            prop_assert_eq!(emission_interval(c, s), wide);
        }

        /// Whatever tat is stored (at any time, far ahead of now included), the reply asks no
        /// more than the limit can: remaining within max_burst + 1, retry and reset within the
        /// time the whole burst takes to drain.
        #[test]
        fn replies_stay_within_what_the_limit_can_ask(
            tat in any::<u64>(),
            b in 0i64..=1000,
            c in 1i64..=1000,
            p in 1i64..=3600,
            quantity in 0i64..=3,
            now in NOW..=NOW * 2,
        ) {
            let reply = throttle(Some(tat), &args(b, c, p, quantity), now).reply.unwrap();
            let drain_s = emission_interval(c, p) as i128 * i128::from(b + 1) / NS_PER_S + 1;
            prop_assert!((0..=b + 1).contains(&reply[2]), "{reply:?}");
            prop_assert!(i128::from(reply[3]) <= drain_s, "{reply:?} drain {drain_s}");
            prop_assert!((0..=drain_s).contains(&i128::from(reply[4])), "{reply:?} drain {drain_s}");
        }

        /// On ordinary arguments, max_burst B, count C, period P admits and refuses exactly as
        /// GCRA with limit C per P and burst B + 1, and stores the same tat.
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
                // The store drops a key at its tat.
                tat = tat.filter(|&t| t > now);
                let cell = throttle(tat, &args(b, c, p, quantity), now);
                let got = cell.reply.clone().unwrap();
                let state = tat.map(|tat| State::Gcra { tat });
                let d = check(&rule, state, u64::try_from(quantity).unwrap(), now);
                prop_assert_eq!(got[0], i64::from(!d.decision.allowed));
                prop_assert_eq!(got[1], i64::try_from(d.decision.limit).unwrap());
                prop_assert_eq!(got[3], d.decision.retry_after_ns.map_or(-1, cell_seconds));
                prop_assert_eq!(got[4], cell_seconds(d.decision.reset_after_ns));
                let gcra_tat = d.new_state.map(|s| match s {
                    State::Gcra { tat } => tat,
                    other => panic!("unexpected state {other:?}"),
                });
                match cell.write {
                    // A peek rewrites the same tat; GCRA leaves it alone.
                    CellWrite::Store { tat: t, .. } if quantity == 0 => prop_assert_eq!(tat, Some(t)),
                    CellWrite::Store { tat: t, expires_at } => {
                        prop_assert_eq!(Some(t), gcra_tat);
                        prop_assert_eq!(expires_at, t);
                        tat = Some(t);
                    }
                    CellWrite::Keep | CellWrite::Remove => prop_assert_eq!(None, gcra_tat),
                }
            }
        }
    }
}
