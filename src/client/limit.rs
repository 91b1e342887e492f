//! Limits written in Rust instead of spec strings, and the [`ToSpec`] trait that lets every
//! client method take either.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

/// How bucketd counts a limit: the server's own type, so the two can never disagree.
pub use crate::limiter::Algorithm;

/// An inline limit: `limit` units per `period`, rendered as bucketd's spec string
/// `[ALGO:]LIMIT/PERIOD[:BURST]`.
///
/// ```
/// use bucketd::client::Limit;
/// use std::time::Duration;
///
/// assert_eq!(Limit::per_minute(100).to_string(), "100/1m");
/// assert_eq!(Limit::per_hour(5000).sliding().to_string(), "sliding:5000/1h");
/// assert_eq!(Limit::per_second(10).burst(50).to_string(), "10/1s:50");
/// assert_eq!(Limit::new(3, Duration::from_millis(1500)).fixed().to_string(), "fixed:3/1500ms");
/// ```
///
/// Nothing is validated here: a zero limit or period is sent as written and bucketd refuses it
/// with a server error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    algorithm: Algorithm,
    limit: u64,
    period: Duration,
    burst: Option<u64>,
}

impl Limit {
    /// `limit` units per `period`, token bucket, burst equal to the limit.
    pub fn new(limit: u64, period: Duration) -> Limit {
        Limit {
            algorithm: Algorithm::Gcra,
            limit,
            period,
            burst: None,
        }
    }

    pub fn per_second(limit: u64) -> Limit {
        Limit::new(limit, Duration::from_secs(1))
    }

    pub fn per_minute(limit: u64) -> Limit {
        Limit::new(limit, Duration::from_secs(60))
    }

    pub fn per_hour(limit: u64) -> Limit {
        Limit::new(limit, Duration::from_secs(3_600))
    }

    pub fn per_day(limit: u64) -> Limit {
        Limit::new(limit, Duration::from_secs(86_400))
    }

    /// Counts with a sliding window (a burst set earlier is ignored).
    pub fn sliding(self) -> Limit {
        self.with_algorithm(Algorithm::Sliding)
    }

    /// Counts with a fixed window (a burst set earlier is ignored).
    pub fn fixed(self) -> Limit {
        self.with_algorithm(Algorithm::Fixed)
    }

    /// Counts with a token bucket (the default).
    pub fn gcra(self) -> Limit {
        self.with_algorithm(Algorithm::Gcra)
    }

    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Limit {
        self.algorithm = algorithm;
        self
    }

    /// Bucket capacity for the token bucket: up to `burst` units at once, refilled at the
    /// limit's rate. Only the token bucket has one; windows ignore it.
    pub fn burst(mut self, burst: u64) -> Limit {
        self.burst = Some(burst);
        self
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Units per period.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    /// How many units can be taken at once from a full limiter: the burst for a token
    /// bucket (the limit when unset), the limit for windows.
    pub fn capacity(&self) -> u64 {
        match (self.algorithm, self.burst) {
            (Algorithm::Gcra, Some(b)) => b,
            _ => self.limit,
        }
    }

    /// The spec string bucketd parses.
    pub fn spec(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.algorithm != Algorithm::Gcra {
            write!(f, "{}:", self.algorithm.name())?;
        }
        write!(f, "{}/", self.limit)?;
        write_period(f, self.period)?;
        if let (Algorithm::Gcra, Some(burst)) = (self.algorithm, self.burst) {
            write!(f, ":{burst}")?;
        }
        Ok(())
    }
}

/// The largest unit that expresses the period exactly.
fn write_period(f: &mut fmt::Formatter<'_>, period: Duration) -> fmt::Result {
    const UNITS: [(u128, &str); 7] = [
        (86_400_000_000_000, "d"),
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
        (1, "ns"),
    ];
    let ns = period.as_nanos();
    for (scale, unit) in UNITS {
        if ns >= scale && ns.is_multiple_of(scale) {
            return write!(f, "{}{unit}", ns / scale);
        }
    }
    // Zero: bucketd rejects it, with its own message.
    write!(f, "0s")
}

/// Anything that can be sent as a spec: a [`Limit`], an inline spec string such as `"100/1m"`,
/// or the name of a rule configured on the server.
pub trait ToSpec {
    fn to_spec(&self) -> Cow<'_, str>;
}

impl ToSpec for Limit {
    fn to_spec(&self) -> Cow<'_, str> {
        Cow::Owned(self.to_string())
    }
}

impl ToSpec for str {
    fn to_spec(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

impl ToSpec for String {
    fn to_spec(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

impl<T: ToSpec + ?Sized> ToSpec for &T {
    fn to_spec(&self) -> Cow<'_, str> {
        (**self).to_spec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::parse_spec;

    #[test]
    fn renders_what_the_server_parses() {
        let cases = [
            (Limit::per_minute(100), "100/1m"),
            (Limit::per_hour(5000).sliding(), "sliding:5000/1h"),
            (Limit::per_day(7).fixed(), "fixed:7/1d"),
            (Limit::per_second(10).burst(50), "10/1s:50"),
            (Limit::per_second(10).burst(50).sliding(), "sliding:10/1s"),
            (Limit::new(3, Duration::from_millis(1500)), "3/1500ms"),
            (Limit::new(3, Duration::from_secs(90)), "3/90s"),
            (Limit::new(1, Duration::from_micros(7)), "1/7us"),
            (Limit::new(1, Duration::from_nanos(1001)), "1/1001ns"),
        ];
        for (limit, text) in cases {
            assert_eq!(limit.to_string(), text);
            let rule = parse_spec(text).unwrap();
            assert_eq!(rule.limit, limit.limit());
            assert_eq!(u128::from(rule.period_ns), limit.period().as_nanos());
            assert_eq!(rule.burst, limit.capacity());
            assert_eq!(rule.algorithm, limit.algorithm());
        }
    }

    #[test]
    fn specs_of_every_kind() {
        fn text<S: ToSpec + ?Sized>(s: &S) -> String {
            s.to_spec().into_owned()
        }
        assert_eq!(text("api"), "api");
        assert_eq!(text(&String::from("5/1s")), "5/1s");
        assert_eq!(text(&Limit::per_second(5)), "5/1s");
        assert_eq!(text(&&Limit::per_second(5)), "5/1s");
        assert_eq!(Limit::new(1, Duration::ZERO).to_string(), "1/0s");
    }
}
