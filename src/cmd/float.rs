//! INCRBYFLOAT's number rules, done as Redis does them on x86-64: both operands are read with
//! `strtold` into an 80-bit `long double` (64-bit mantissa), added in that precision, and the sum
//! printed with `%.17Lf`, trailing zeros removed. Rust has no such type, so this module carries a
//! small software version of it: correctly rounded parsing, one correctly rounded addition, and
//! exact printing with ties to even. That reproduces Redis's digits, its rounding noise included
//! (`1000` + `0.1` is `1000.09999999999999998` there, and here).
//!
//! Where it can still differ from Redis: a value below the smallest normal `long double`
//! (about 3.4e-4932) is kept with a full 64-bit mantissa instead of a subnormal's shorter one.
//! Such a value prints as `0` either way; only sums of two such values could differ, far below
//! anything `%.17Lf` shows.

use std::cmp::Ordering;

/// Redis refuses operands of this many bytes or more (`MAX_LONG_DOUBLE_CHARS`).
const MAX_CHARS: usize = 5 * 1024;
/// Mantissa bits of the x87 extended format.
const MANT_BITS: u32 = 64;
/// Exponent of the top mantissa bit of the largest finite value.
const MAX_EXP: i64 = 16383;
/// Below this the value rounds to zero even as a subnormal (the smallest normal's is -16382).
const ZERO_EXP: i64 = -16446;

/// A non-negative integer of any size, little-endian 32-bit limbs, no trailing zero limbs.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Big(Vec<u32>);

impl Big {
    fn from_u128(mut v: u128) -> Big {
        let mut limbs = Vec::new();
        while v > 0 {
            limbs.push(v as u32);
            v >>= 32;
        }
        Big(limbs)
    }

    fn is_zero(&self) -> bool {
        self.0.is_empty()
    }

    fn trim(&mut self) {
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
    }

    fn bit_len(&self) -> u64 {
        match self.0.last() {
            None => 0,
            Some(&top) => (self.0.len() as u64 - 1) * 32 + u64::from(32 - top.leading_zeros()),
        }
    }

    fn bit(&self, i: u64) -> bool {
        let limb = (i / 32) as usize;
        self.0.get(limb).is_some_and(|l| (l >> (i % 32)) & 1 == 1)
    }

    /// True if any bit below `i` is set.
    fn any_below(&self, i: u64) -> bool {
        let full = (i / 32) as usize;
        if self.0.iter().take(full).any(|&l| l != 0) {
            return true;
        }
        let rest = (i % 32) as u32;
        rest > 0
            && self
                .0
                .get(full)
                .is_some_and(|&l| l & ((1u32 << rest) - 1) != 0)
    }

    /// `self * m + a`.
    fn mul_add_small(&mut self, m: u32, a: u32) {
        let mut carry = u64::from(a);
        for l in &mut self.0 {
            let v = u64::from(*l) * u64::from(m) + carry;
            *l = v as u32;
            carry = v >> 32;
        }
        if carry > 0 {
            self.0.push(carry as u32);
        }
        self.trim();
    }

    fn mul_pow10(&mut self, mut k: u64) {
        while k >= 9 {
            self.mul_add_small(1_000_000_000, 0);
            k -= 9;
        }
        if k > 0 {
            self.mul_add_small(10u32.pow(k as u32), 0);
        }
    }

    fn shl(&self, bits: u64) -> Big {
        if self.is_zero() {
            return Big(Vec::new());
        }
        let limbs = (bits / 32) as usize;
        let shift = (bits % 32) as u32;
        let mut out = vec![0u32; limbs];
        out.reserve(self.0.len() + 1);
        let mut carry = 0u32;
        for &l in &self.0 {
            if shift == 0 {
                out.push(l);
            } else {
                out.push((l << shift) | carry);
                carry = l >> (32 - shift);
            }
        }
        if carry > 0 {
            out.push(carry);
        }
        let mut b = Big(out);
        b.trim();
        b
    }

    fn add(&self, other: &Big) -> Big {
        let n = self.0.len().max(other.0.len());
        let mut out = Vec::with_capacity(n + 1);
        let mut carry = 0u64;
        for i in 0..n {
            let v = u64::from(self.0.get(i).copied().unwrap_or(0))
                + u64::from(other.0.get(i).copied().unwrap_or(0))
                + carry;
            out.push(v as u32);
            carry = v >> 32;
        }
        if carry > 0 {
            out.push(carry as u32);
        }
        let mut b = Big(out);
        b.trim();
        b
    }

    /// `self - other`; `self >= other` is required (callers compare first).
    fn sub(&self, other: &Big) -> Big {
        let mut out = Vec::with_capacity(self.0.len());
        let mut borrow = 0i64;
        for i in 0..self.0.len() {
            let mut v =
                i64::from(self.0[i]) - i64::from(other.0.get(i).copied().unwrap_or(0)) - borrow;
            borrow = 0;
            if v < 0 {
                v += 1 << 32;
                borrow = 1;
            }
            out.push(v as u32);
        }
        let mut b = Big(out);
        b.trim();
        b
    }

    fn cmp(&self, other: &Big) -> Ordering {
        self.0
            .len()
            .cmp(&other.0.len())
            .then_with(|| self.0.iter().rev().cmp(other.0.iter().rev()))
    }

    /// Divides by `d` in place, returning the remainder.
    fn div_small(&mut self, d: u32) -> u32 {
        let mut rem = 0u64;
        for l in self.0.iter_mut().rev() {
            let cur = (rem << 32) | u64::from(*l);
            *l = (cur / u64::from(d)) as u32;
            rem = cur % u64::from(d);
        }
        self.trim();
        rem as u32
    }

    fn to_decimal(&self) -> String {
        if self.is_zero() {
            return "0".to_string();
        }
        let mut n = self.clone();
        let mut chunks = Vec::new();
        while !n.is_zero() {
            chunks.push(n.div_small(1_000_000_000));
        }
        let mut s = String::new();
        for (i, c) in chunks.iter().rev().enumerate() {
            if i == 0 {
                s.push_str(&c.to_string());
            } else {
                s.push_str(&format!("{c:09}"));
            }
        }
        s
    }
}

/// A finite `long double`: `(-1)^neg * mant * 2^exp`, `mant` normalised to its top bit, or 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LongDouble {
    neg: bool,
    mant: u64,
    exp: i64,
}

/// What `strtold` produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Parsed {
    Finite(LongDouble),
    Infinite,
}

impl LongDouble {
    pub(crate) fn from_i64(v: i64) -> LongDouble {
        round(
            v < 0,
            &Big::from_u128(u128::from(v.unsigned_abs())),
            0,
            false,
        )
        .unwrap_or(LongDouble::ZERO)
    }

    const ZERO: LongDouble = LongDouble {
        neg: false,
        mant: 0,
        exp: 0,
    };

    /// Exponent of the top mantissa bit.
    fn top_exp(&self) -> i64 {
        self.exp + i64::from(MANT_BITS) - 1
    }
}

/// Rounds `(-1)^neg * m * 2^exp` (with `sticky`: some nonzero bits below `m`) to 64 bits, ties
/// to even. None when the result overflows the format.
fn round(neg: bool, m: &Big, exp: i64, sticky: bool) -> Option<LongDouble> {
    let len = m.bit_len();
    if len == 0 {
        return Some(LongDouble {
            neg,
            ..LongDouble::ZERO
        });
    }
    let (mant, exp) = if len <= u64::from(MANT_BITS) {
        let mut v = 0u64;
        for (i, &l) in m.0.iter().enumerate() {
            v |= u64::from(l) << (32 * i);
        }
        (
            v << (u64::from(MANT_BITS) - len),
            exp - (u64::from(MANT_BITS) - len) as i64,
        )
    } else {
        let drop = len - u64::from(MANT_BITS);
        let mut v = 0u64;
        for i in 0..u64::from(MANT_BITS) {
            if m.bit(drop + i) {
                v |= 1 << i;
            }
        }
        let half = m.bit(drop - 1);
        let rest = sticky || m.any_below(drop - 1);
        let mut exp = exp + drop as i64;
        if half && (rest || v & 1 == 1) {
            match v.checked_add(1) {
                Some(up) => v = up,
                None => {
                    v = 1 << 63;
                    exp += 1;
                }
            }
        }
        (v, exp)
    };
    let ld = LongDouble { neg, mant, exp };
    (ld.top_exp() <= MAX_EXP).then_some(ld)
}

/// Reads a number as Redis's `string2ld` does: `strtold` syntax (decimal, hexadecimal with a
/// binary exponent, `inf`/`infinity`), the whole string, no leading space; NaN, a result that
/// overflows, and one that underflows to zero are refused.
pub(crate) fn parse(s: &[u8]) -> Option<Parsed> {
    if s.is_empty() || s.len() >= MAX_CHARS {
        return None;
    }
    let (neg, body) = match s[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if body.eq_ignore_ascii_case(b"inf") || body.eq_ignore_ascii_case(b"infinity") {
        return Some(Parsed::Infinite);
    }
    let v = if body.len() > 2 && body[0] == b'0' && (body[1] | 0x20) == b'x' {
        parse_hex(neg, &body[2..])?
    } else {
        parse_decimal(neg, body)?
    };
    if v.mant != 0 && v.top_exp() < ZERO_EXP {
        return None;
    }
    Some(Parsed::Finite(v))
}

/// Digits with an optional point; returns (digits, count after the point) or None if there
/// is no digit at all.
fn mantissa_digits(body: &[u8], is_digit: fn(u8) -> bool) -> Option<(&[u8], &[u8], &[u8])> {
    let int_end = body
        .iter()
        .position(|&b| !is_digit(b))
        .unwrap_or(body.len());
    let (int, rest) = body.split_at(int_end);
    let (frac, rest) = match rest.first() {
        Some(b'.') => {
            let r = &rest[1..];
            let end = r.iter().position(|&b| !is_digit(b)).unwrap_or(r.len());
            r.split_at(end)
        }
        _ => (&rest[..0], rest),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    Some((int, frac, rest))
}

/// An exponent: optional sign then at least one decimal digit, saturated far beyond any
/// exponent that could matter.
fn exponent(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut v: i64 = 0;
    for &d in digits {
        v = (v * 10 + i64::from(d - b'0')).min(1 << 40);
    }
    Some(if neg { -v } else { v })
}

fn parse_decimal(neg: bool, body: &[u8]) -> Option<LongDouble> {
    let (int, frac, rest) = mantissa_digits(body, |b| b.is_ascii_digit())?;
    let exp10 = match rest.first() {
        None => 0,
        Some(b'e' | b'E') => exponent(&rest[1..])?,
        Some(_) => return None,
    };
    let mut digits: Vec<u8> = int.iter().chain(frac).copied().collect();
    let lead = digits.iter().take_while(|&&d| d == b'0').count();
    digits.drain(..lead);
    let mut exp10 = exp10 - frac.len() as i64;
    while digits.last() == Some(&b'0') {
        digits.pop();
        exp10 += 1;
    }
    if digits.is_empty() {
        return Some(LongDouble {
            neg,
            ..LongDouble::ZERO
        });
    }
    // Decimal magnitude is between 10^(len + exp10 - 1) and 10^(len + exp10): settle what is
    // certainly out of range before building big numbers.
    let magnitude = digits.len() as i64 + exp10;
    if magnitude > 4934 {
        return None;
    }
    if magnitude < -4952 {
        return None;
    }
    let mut d = Big(Vec::new());
    for chunk in digits.chunks(9) {
        let mut v = 0u32;
        for &c in chunk {
            v = v * 10 + u32::from(c - b'0');
        }
        d.mul_add_small(10u32.pow(chunk.len() as u32), v);
    }
    if exp10 >= 0 {
        d.mul_pow10(exp10 as u64);
        return round(neg, &d, 0, false);
    }
    let mut p = Big::from_u128(1);
    p.mul_pow10(exp10.unsigned_abs());
    // Scale so the quotient has 66 or 67 bits: 64 kept, a rounding bit, and one to spare.
    let shift = 66 + p.bit_len() as i64 - d.bit_len() as i64;
    let (mut n, q) = if shift >= 0 {
        (d.shl(shift as u64), p)
    } else {
        (d, p.shl(shift.unsigned_abs()))
    };
    let mut quotient = Big(Vec::new());
    let span = n.bit_len().saturating_sub(q.bit_len());
    for i in (0..=span).rev() {
        let part = q.shl(i);
        if n.cmp(&part) != Ordering::Less {
            n = n.sub(&part);
            quotient = quotient.add(&Big::from_u128(1).shl(i));
        }
    }
    round(neg, &quotient, -shift, !n.is_zero())
}

fn parse_hex(neg: bool, body: &[u8]) -> Option<LongDouble> {
    let (int, frac, rest) = mantissa_digits(body, |b| b.is_ascii_hexdigit())?;
    let exp2 = match rest.first() {
        None => 0,
        Some(b'p' | b'P') => exponent(&rest[1..])?,
        Some(_) => return None,
    };
    let mut m = Big(Vec::new());
    for &h in int.iter().chain(frac) {
        let v = (h as char).to_digit(16).unwrap_or(0);
        m.mul_add_small(16, v);
    }
    round(neg, &m, exp2 - 4 * frac.len() as i64, false)
}

/// `a + b`, correctly rounded; None when the sum overflows.
pub(crate) fn add(a: LongDouble, b: LongDouble) -> Option<LongDouble> {
    if a.mant == 0 {
        return Some(if b.mant == 0 {
            LongDouble {
                neg: a.neg && b.neg,
                ..LongDouble::ZERO
            }
        } else {
            b
        });
    }
    if b.mant == 0 {
        return Some(a);
    }
    let (hi, lo) = if a.exp >= b.exp { (a, b) } else { (b, a) };
    let gap = (hi.exp - lo.exp) as u64;
    if gap > 2 * u64::from(MANT_BITS) + 2 {
        // The smaller one lies below half a unit of the larger one's last place.
        return Some(hi);
    }
    let x = Big::from_u128(u128::from(hi.mant)).shl(gap);
    let y = Big::from_u128(u128::from(lo.mant));
    if hi.neg == lo.neg {
        return round(hi.neg, &x.add(&y), lo.exp, false);
    }
    match x.cmp(&y) {
        Ordering::Equal => Some(LongDouble::ZERO),
        Ordering::Greater => round(hi.neg, &x.sub(&y), lo.exp, false),
        Ordering::Less => round(lo.neg, &y.sub(&x), lo.exp, false),
    }
}

/// Formats as Redis's human-friendly `ld2string`: `%.17Lf`, trailing zeros (and a bare point)
/// removed, `-0` written as `0`. Never exponent notation.
pub(crate) fn format(v: LongDouble) -> String {
    const SCALE: u128 = 100_000_000_000_000_000; // 10^17
    let (int, frac) = if v.mant == 0 {
        (Big(Vec::new()), 0u128)
    } else if v.exp >= 0 {
        (Big::from_u128(u128::from(v.mant)).shl(v.exp as u64), 0)
    } else {
        let e = v.exp.unsigned_abs();
        let int = if e >= 64 { 0 } else { v.mant >> e };
        let f = if e >= 64 {
            v.mant
        } else {
            v.mant & ((1u64 << e) - 1)
        };
        // f < 2^64 and 10^17 < 2^57: the product fits in 128 bits.
        let scaled = u128::from(f) * SCALE;
        let (mut q, up) = if e >= 128 {
            // Below 2^-64: rounds to zero at 17 decimals.
            (0, false)
        } else {
            let q = scaled >> e;
            let rem = scaled & ((1u128 << e) - 1);
            let half = 1u128 << (e - 1);
            (q, rem > half || (rem == half && q & 1 == 1))
        };
        let mut int = u128::from(int);
        if up {
            q += 1;
            if q == SCALE {
                q = 0;
                int += 1;
            }
        }
        (Big::from_u128(int), q)
    };
    let mut s = String::new();
    if v.neg {
        s.push('-');
    }
    s.push_str(&int.to_decimal());
    let digits = format!("{frac:017}");
    let digits = digits.trim_end_matches('0');
    if !digits.is_empty() {
        s.push('.');
        s.push_str(digits);
    }
    if s == "-0" {
        s = "0".to_string();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(a: &str, b: &str) -> Option<String> {
        let (Some(Parsed::Finite(x)), Some(Parsed::Finite(y))) =
            (parse(a.as_bytes()), parse(b.as_bytes()))
        else {
            return None;
        };
        add(x, y).map(format)
    }

    /// Each pair and its sum as Redis 7.0 (x86-64, glibc) answers INCRBYFLOAT.
    #[test]
    fn sums_match_redis() {
        let cases = [
            ("10.5", "0.1", "10.6"),
            ("10.6", "-5", "5.6"),
            ("5.0e3", "2.0e2", "5200"),
            ("0", "3.0e3", "3000"),
            ("0.1", "0.2", "0.3"),
            ("1000", "0.1", "1000.09999999999999998"),
            ("1000.09999999999999998", "0.1", "1000.19999999999999996"),
            ("123456.789", "0.001", "123456.78999999999999915"),
            (
                "123456.78999999999999915",
                "1e-20",
                "123456.78999999999999915",
            ),
            ("0", "1e-20", "0"),
            ("0", "-0.0", "0"),
            ("0", "1.5e-7", "0.00000015"),
            ("99999999999999999", "1", "100000000000000000"),
            ("3.14159265358979323846", "0", "3.14159265358979324"),
            ("0.000003814697265625", "0", "0.00000381469726562"),
            ("0.000011444091796875", "0", "0.00001144409179688"),
            ("0x1.8p1", "0", "3"),
            ("1", "0x10", "17"),
            ("1.", ".5", "1.5"),
            ("1.5", "+.5e+1", "6.5"),
            ("18446744073709551615", "1", "18446744073709551616"),
            ("9223372036854775807", "0", "9223372036854775807"),
            ("-1e-20", "0", "0"),
            ("0e99999", "0", "0"),
            ("1e-4940", "0", "0"),
        ];
        for (a, b, want) in cases {
            assert_eq!(sum(a, b).as_deref(), Some(want), "{a} + {b}");
        }
        assert!(
            sum("0", "1e400")
                .unwrap()
                .starts_with("1000000000000000000028188068394758651")
        );
        let big = sum("0", "1e4932").unwrap();
        assert_eq!(big.len(), 4933);
        assert!(big.starts_with("100000000000000000000601894938796389132"));
        assert_eq!(sum("1e4932", "1e4932"), None, "overflow");
        assert_eq!(sum("1.18e4932", "1.18e4932"), None, "overflow");
    }

    #[test]
    fn refuses_what_strtold_and_redis_refuse() {
        for bad in [
            "", " 1", "1 ", "nan", "NaN", "1e", "1e+", "0x", ".", "e5", "abc", "1e5000", "-1e5000",
            "1e-5000", "1_000", "0x1p", "--1", "+-1", "infinit",
        ] {
            assert_eq!(parse(bad.as_bytes()), None, "{bad:?}");
        }
        for inf in ["inf", "-INF", "Infinity", "+infinity"] {
            assert_eq!(parse(inf.as_bytes()), Some(Parsed::Infinite), "{inf}");
        }
        assert_eq!(parse(&vec![b'1'; MAX_CHARS]), None);
        assert!(
            parse(&vec![b'1'; MAX_CHARS - 1]).is_none(),
            "above the format's range"
        );
        let long = format!("0.{}", "1".repeat(MAX_CHARS - 3));
        assert!(matches!(parse(long.as_bytes()), Some(Parsed::Finite(_))));
    }

    #[test]
    fn integers_convert_exactly() {
        for v in [0, 1, -1, i64::MAX, i64::MIN, 1 << 62] {
            assert_eq!(format(LongDouble::from_i64(v)), v.to_string());
        }
    }
}
