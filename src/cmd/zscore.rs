//! Sorted-set scores and ranges as Redis 7.0 reads and writes them: a score argument read as
//! `string2d` does, a range bound as `zslParseRange` does (`strtod`, leniently), a lex bound
//! as `zslParseLexRangeItem`, and a score printed as `%.17g`; then what they select in a set
//! (the ranks a range and its LIMIT cover) and ZADD's rules for each pair.
//!
//! The range and option types travel inside `ZOp` in the Raft log: they are an on-disk format.

use super::keyed::{OOM, Reply};
use crate::store::{PackLimits, ZSet};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

const NAN_SCORE: &str = "ERR resulting score is not a number (NaN)";

/// A score argument (ZADD, ZINCRBY), as Redis's `string2d`: the whole argument, no leading
/// space, not NaN, and no overflow or underflow to zero. Hexadecimal floats, which `strtod`
/// also reads, are refused.
pub(super) fn parse_score(s: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(s).ok()?;
    if text.starts_with(|c: char| c.is_ascii_whitespace() || c == '\x0b') {
        return None;
    }
    let v: f64 = text.parse().ok()?;
    if v.is_nan() || (v.is_infinite() && !names_infinity(text)) || underflows(text, v) {
        return None;
    }
    Some(v)
}

/// A range bound's number, as `strtod` reads it where Redis checks only that nothing follows:
/// leading space is skipped, an empty argument is 0, overflow is infinity, underflow 0.
fn parse_lenient(s: &[u8]) -> Option<f64> {
    // Redis checks for a NUL where parsing stopped, so bytes after one are not read.
    let s = s.split(|&b| b == 0).next().unwrap_or_default();
    if s.is_empty() {
        return Some(0.0);
    }
    let text = std::str::from_utf8(s).ok()?;
    let text = text.trim_start_matches(|c: char| c.is_ascii_whitespace() || c == '\x0b');
    let v: f64 = text.parse().ok()?;
    (!v.is_nan()).then_some(v)
}

fn names_infinity(text: &str) -> bool {
    text.to_ascii_lowercase().contains("inf")
}

/// True when a number written with a nonzero digit came out as zero.
fn underflows(text: &str, v: f64) -> bool {
    let mantissa = text.split(['e', 'E']).next().unwrap_or_default();
    v == 0.0 && mantissa.bytes().any(|b| (b'1'..=b'9').contains(&b))
}

/// A score as Redis 7.0 prints one (`%.17g`; `inf` and `-inf` for the infinities).
/// A score as a reply: a RESP3 double, a bulk string in RESP2, printed as Redis prints one.
pub(crate) fn score_double(v: f64) -> Reply {
    Reply::Double(bytes::Bytes::from(format_score(v)))
}

pub(crate) fn format_score(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    // Seventeen significant digits, correctly rounded, then laid out as %g lays them out.
    let sci = format!("{:.16e}", v.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if v < 0.0 { "-" } else { "" };
    if !(-4..17).contains(&exp) {
        let d = digits.trim_end_matches('0');
        let (first, rest) = d.split_at(1.min(d.len()));
        let dot = if rest.is_empty() { "" } else { "." };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{dot}{rest}e{esign}{:02}", exp.unsigned_abs());
    }
    let text = if exp >= 0 {
        let (int, frac) = digits.split_at((exp as usize + 1).min(digits.len()));
        let frac = frac.trim_end_matches('0');
        if frac.is_empty() {
            int.to_string()
        } else {
            format!("{int}.{frac}")
        }
    } else {
        let zeros = "0".repeat(exp.unsigned_abs() as usize - 1);
        format!("0.{zeros}{}", digits.trim_end_matches('0'))
    };
    format!("{sign}{text}")
}

/// A score range (ZCOUNT, ZRANGEBYSCORE...): bounds as `f64::to_bits`, each inclusive unless
/// marked exclusive (`(`).
///
/// On-disk format: bincode-encoded into the Raft log inside `ZOp`. Fields are never reordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScoreRange {
    pub min: u64,
    pub min_ex: bool,
    pub max: u64,
    pub max_ex: bool,
}

fn bound(s: &[u8]) -> Option<(u64, bool)> {
    match s.strip_prefix(b"(") {
        Some(rest) => parse_lenient(rest).map(|v| (v.to_bits(), true)),
        None => parse_lenient(s).map(|v| (v.to_bits(), false)),
    }
}

impl ScoreRange {
    /// Reads `min` and `max` as `zslParseRange` does; None is "min or max is not a float".
    pub(super) fn parse(min: &[u8], max: &[u8]) -> Option<ScoreRange> {
        let (min, min_ex) = bound(min)?;
        let (max, max_ex) = bound(max)?;
        Some(ScoreRange {
            min,
            min_ex,
            max,
            max_ex,
        })
    }

    fn min(&self) -> f64 {
        f64::from_bits(self.min)
    }

    fn max(&self) -> f64 {
        f64::from_bits(self.max)
    }

    /// False when no score can be in the range.
    pub(super) fn is_possible(&self) -> bool {
        let (min, max) = (self.min(), self.max());
        !(min > max || (min == max && (self.min_ex || self.max_ex)))
    }

    /// The score is not below the range.
    pub(super) fn above_min(&self, s: f64) -> bool {
        if self.min_ex {
            s > self.min()
        } else {
            s >= self.min()
        }
    }

    /// The score is not above the range.
    pub(super) fn below_max(&self, s: f64) -> bool {
        if self.max_ex {
            s < self.max()
        } else {
            s <= self.max()
        }
    }
}

/// One end of a lex range: `-`, `+`, `[member` (inclusive) or `(member` (exclusive).
///
/// On-disk format: bincode-encoded into the Raft log inside `ZOp`. Variants are append-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LexBound {
    Lowest,
    Highest,
    Incl(Bytes),
    Excl(Bytes),
}

impl LexBound {
    fn parse(s: &[u8]) -> Option<LexBound> {
        match s.split_first()? {
            (b'-', []) => Some(LexBound::Lowest),
            (b'+', []) => Some(LexBound::Highest),
            (b'[', rest) => Some(LexBound::Incl(Bytes::copy_from_slice(rest))),
            (b'(', rest) => Some(LexBound::Excl(Bytes::copy_from_slice(rest))),
            _ => None,
        }
    }

    fn exclusive(&self) -> bool {
        !matches!(self, LexBound::Incl(_))
    }
}

/// A lex range (ZRANGEBYLEX, ZLEXCOUNT...).
///
/// On-disk format: bincode-encoded into the Raft log inside `ZOp`. Fields are never reordered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LexRange {
    pub min: LexBound,
    pub max: LexBound,
}

impl LexRange {
    /// None is "min or max not valid string range item".
    pub(super) fn parse(min: &[u8], max: &[u8]) -> Option<LexRange> {
        Some(LexRange {
            min: LexBound::parse(min)?,
            max: LexBound::parse(max)?,
        })
    }

    /// False when no member can be in the range, as Redis's `sdscmplex` decides it.
    pub(super) fn is_possible(&self) -> bool {
        use std::cmp::Ordering::*;
        let cmp = match (&self.min, &self.max) {
            (LexBound::Lowest, LexBound::Lowest) | (LexBound::Highest, LexBound::Highest) => Equal,
            (LexBound::Lowest, _) | (_, LexBound::Highest) => Less,
            (LexBound::Highest, _) | (_, LexBound::Lowest) => Greater,
            (LexBound::Incl(a) | LexBound::Excl(a), LexBound::Incl(b) | LexBound::Excl(b)) => {
                a.cmp(b)
            }
        };
        !(cmp == Greater || (cmp == Equal && (self.min.exclusive() || self.max.exclusive())))
    }

    pub(super) fn above_min(&self, m: &[u8]) -> bool {
        match &self.min {
            LexBound::Lowest => true,
            LexBound::Highest => false,
            LexBound::Incl(b) => m >= &b[..],
            LexBound::Excl(b) => m > &b[..],
        }
    }

    pub(super) fn below_max(&self, m: &[u8]) -> bool {
        match &self.max {
            LexBound::Lowest => false,
            LexBound::Highest => true,
            LexBound::Incl(b) => m <= &b[..],
            LexBound::Excl(b) => m < &b[..],
        }
    }
}

/// ZADD's options.
///
/// On-disk format: bincode-encoded into the Raft log inside `ZOp`. Fields are never reordered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddFlags {
    pub nx: bool,
    pub xx: bool,
    pub gt: bool,
    pub lt: bool,
    pub ch: bool,
    pub incr: bool,
}

/// What a ZRANGE-family command selects.
///
/// On-disk format: bincode-encoded into the Raft log inside `ZOp`. Variants are append-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RangeBy {
    /// Ranks, negative ones from the end.
    Rank {
        start: i64,
        stop: i64,
    },
    Score(ScoreRange),
    Lex(LexRange),
}

/// ZADD's work on one set, as Redis's `zsetAdd` for each pair in turn.
pub(super) fn add(z: &mut ZSet, f: AddFlags, pairs: &[(u64, Bytes)], limits: PackLimits) -> Reply {
    let (mut added, mut updated, mut processed) = (0, 0, 0);
    let mut last = 0.0;
    for (bits, member) in pairs {
        let mut score = f64::from_bits(*bits);
        match z.score(member) {
            Some(cur) => {
                if f.nx {
                    continue;
                }
                if f.incr {
                    score += cur;
                    if score.is_nan() {
                        return Reply::err(NAN_SCORE);
                    }
                }
                if (f.lt && score >= cur) || (f.gt && score <= cur) {
                    continue;
                }
                if score != cur {
                    z.set_within(member, score, limits);
                    updated += 1;
                }
            }
            None if f.xx => continue,
            None => {
                if !z.set_within(member, score, limits).1 {
                    return Reply::err(OOM);
                }
                added += 1;
            }
        }
        processed += 1;
        last = score;
    }
    match (f.incr, processed) {
        (true, 0) => Reply::Nil,
        (true, _) => score_double(last),
        (false, _) if f.ch => count(added + updated),
        (false, _) => count(added),
    }
}

pub(super) fn count(n: usize) -> Reply {
    Reply::Int(i64::try_from(n).unwrap_or(i64::MAX))
}

/// The ranks, lowest first, of the entries in a score range.
pub(super) fn score_window(z: &ZSet, r: &ScoreRange) -> (usize, usize) {
    if !r.is_possible() {
        return (0, 0);
    }
    let lo = z.partition_point(|(_, s)| !r.above_min(s));
    let hi = z.partition_point(|(_, s)| r.below_max(s));
    (lo, hi.max(lo))
}

/// The ranks, lowest first, of the entries in a lex range. Members are in lex order only
/// where their scores are equal; elsewhere Redis leaves the answer unspecified, but refuses
/// as it does when the last member is below the range or the first above it.
pub(super) fn lex_window(z: &ZSet, r: &LexRange) -> (usize, usize) {
    let mut ends = (false, false);
    z.each(0, 1, |(m, _)| ends.0 = r.below_max(m));
    z.each(z.len().saturating_sub(1), z.len(), |(m, _)| {
        ends.1 = r.above_min(m)
    });
    if !r.is_possible() || ends != (true, true) {
        return (0, 0);
    }
    let lo = z.partition_point(|(m, _)| !r.above_min(m));
    let hi = z.partition_point(|(m, _)| r.below_max(m));
    (lo, hi.max(lo))
}

/// The ranks `lo..hi`, lowest first, a range command selects, LIMIT applied from the end it
/// starts at (the highest rank when `rev`).
pub(super) fn select(z: &ZSet, by: &RangeBy, rev: bool, offset: i64, limit: i64) -> (usize, usize) {
    let len = z.len();
    let (lo, hi) = match by {
        RangeBy::Rank { start, stop } => {
            let n = i64::try_from(len).unwrap_or(i64::MAX);
            let start = if *start < 0 { n + start } else { *start }.max(0);
            let stop = if *stop < 0 { n + stop } else { *stop };
            if start > stop || start >= n {
                return (0, 0);
            }
            let stop = stop.min(n - 1);
            // Counted from the highest when reversed.
            let (start, stop) = (start as usize, stop as usize);
            return if rev {
                (len - 1 - stop, len - start)
            } else {
                (start, stop + 1)
            };
        }
        RangeBy::Score(r) => score_window(z, r),
        RangeBy::Lex(r) => lex_window(z, r),
    };
    // A negative offset skips everything; a negative count takes everything.
    let Ok(offset) = usize::try_from(offset) else {
        return (0, 0);
    };
    let take = usize::try_from(limit).unwrap_or(usize::MAX);
    let avail = (hi - lo).saturating_sub(offset);
    let n = avail.min(take);
    if rev {
        (hi - offset.min(hi - lo) - n, hi - offset.min(hi - lo))
    } else {
        (lo + offset.min(hi - lo), lo + offset.min(hi - lo) + n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_print_as_percent_17g() {
        for (v, s) in [
            (0.1, "0.10000000000000001"),
            (1.0, "1"),
            (-2.5, "-2.5"),
            (1e17, "1e+17"),
            (1.5e16, "15000000000000000"),
            (1e-5, "1.0000000000000001e-05"),
            (0.0001, "0.0001"),
            (123456789.123, "123456789.123"),
            (1700000000123.0, "1700000000123"),
            (-0.0, "-0"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (f64::MAX, "1.7976931348623157e+308"),
            (5e-324, "4.9406564584124654e-324"),
        ] {
            assert_eq!(format_score(v), s, "{v:e}");
        }
    }

    #[test]
    fn score_arguments_read_as_string2d() {
        for (s, v) in [
            ("1", Some(1.0)),
            ("+inf", Some(f64::INFINITY)),
            ("-Infinity", Some(f64::NEG_INFINITY)),
            (".5", Some(0.5)),
            ("1.", Some(1.0)),
            ("1e400", None),
            ("1e-400", None),
            ("0e-400", Some(0.0)),
            ("nan", None),
            (" 1", None),
            ("1 ", None),
            ("", None),
            ("abc", None),
        ] {
            assert_eq!(parse_score(s.as_bytes()), v, "{s:?}");
        }
    }

    #[test]
    fn range_bounds_read_as_zslparserange() {
        let r = ScoreRange::parse(b"(1", b" 5").unwrap();
        assert!(r.min_ex && !r.max_ex);
        assert_eq!((f64::from_bits(r.min), f64::from_bits(r.max)), (1.0, 5.0));
        assert!(ScoreRange::parse(b"", b"(").is_some());
        assert!(ScoreRange::parse(b"  ", b"1").is_none());
        assert!(ScoreRange::parse(b"1x", b"1").is_none());
        assert!(ScoreRange::parse(b"nan", b"1").is_none());
        assert!(ScoreRange::parse(b"1e400", b"1").is_some());
        assert!(LexRange::parse(b"-", b"+").is_some());
        assert!(LexRange::parse(b"a", b"+").is_none());
        assert!(LexRange::parse(b"-x", b"+").is_none());
        assert!(!LexRange::parse(b"+", b"-").unwrap().is_possible());
        assert!(!LexRange::parse(b"(a", b"[a").unwrap().is_possible());
        assert!(LexRange::parse(b"[a", b"[a").unwrap().is_possible());
    }
}
