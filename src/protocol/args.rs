//! A cursor over a request's arguments, used by every command parser.

use crate::protocol::request::Request;
use bytes::Bytes;
use std::fmt;

/// Why a command's arguments were rejected; the text becomes the `-ERR` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgError {
    /// Too few or too many arguments for the named command.
    WrongArity(String),
    NotInteger,
    Syntax,
    /// Any other message, sent as given (it starts with its error code).
    Msg(String),
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgError::WrongArity(cmd) => {
                write!(f, "ERR wrong number of arguments for '{cmd}' command")
            }
            ArgError::NotInteger => f.write_str("ERR value is not an integer or out of range"),
            ArgError::Syntax => f.write_str("ERR syntax error"),
            ArgError::Msg(m) => f.write_str(m),
        }
    }
}

/// A cursor over a request's arguments after the command name. `name` is the lowercased
/// command name, for errors.
pub struct Args {
    name: &'static str,
    req: Request,
    pos: usize,
}

/// Parses a signed 64-bit integer exactly as Redis does: no spaces, no '+', no leading zeros
/// beyond a lone "0".
pub(crate) fn parse_i64(b: &[u8]) -> Option<i64> {
    if b.len() > 20 || b.starts_with(b"+") || b.starts_with(b"-0") {
        return None;
    }
    if b.len() > 1 && b[0] == b'0' {
        return None;
    }
    crate::limiter::parse_i64_signed(b)
}

impl Args {
    pub fn new(name: &'static str, req: Request) -> Args {
        Args { name, req, pos: 1 }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn remaining(&self) -> usize {
        self.req.len().saturating_sub(self.pos)
    }

    pub fn arity_error(&self) -> ArgError {
        ArgError::WrongArity(self.name.to_string())
    }

    /// The next argument, borrowed from the request: for arguments only read while parsing
    /// (numbers, keywords), which need no counted slice of the frame.
    pub fn next_slice(&mut self) -> Result<&[u8], ArgError> {
        let i = self.pos;
        if i >= self.req.len() {
            return Err(self.arity_error());
        }
        self.pos += 1;
        self.req
            .get(i)
            .ok_or_else(|| ArgError::WrongArity(self.name.to_string()))
    }

    /// The next argument as a slice that can be kept (keys, values).
    pub fn next_bytes(&mut self) -> Result<Bytes, ArgError> {
        let b = self.req.bytes(self.pos).ok_or_else(|| self.arity_error())?;
        self.pos += 1;
        Ok(b)
    }

    pub fn next_opt(&mut self) -> Option<Bytes> {
        let b = self.req.bytes(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    /// The next argument as UTF-8 text.
    pub fn next_string(&mut self) -> Result<String, ArgError> {
        let b = self.next_slice()?;
        std::str::from_utf8(b)
            .map(str::to_string)
            .map_err(|_| ArgError::Syntax)
    }

    /// The next argument uppercased, for matching keywords.
    pub fn next_keyword(&mut self) -> Result<String, ArgError> {
        Ok(self.next_string()?.to_ascii_uppercase())
    }

    /// True (and consumed) if the next argument is `kw`, in any case; no allocation.
    pub fn next_is(&mut self, kw: &str) -> bool {
        let hit = self
            .req
            .get(self.pos)
            .is_some_and(|b| b.eq_ignore_ascii_case(kw.as_bytes()));
        if hit {
            self.pos += 1;
        }
        hit
    }

    pub fn next_i64(&mut self) -> Result<i64, ArgError> {
        let b = self.next_slice()?;
        parse_i64(b).ok_or(ArgError::NotInteger)
    }

    /// A non-negative integer.
    pub fn next_u64(&mut self) -> Result<u64, ArgError> {
        let v = self.next_i64()?;
        u64::try_from(v).map_err(|_| ArgError::NotInteger)
    }

    /// Everything left, in order.
    pub fn rest(&mut self) -> Vec<Bytes> {
        let out = (self.pos..self.req.len())
            .filter_map(|i| self.req.bytes(i))
            .collect();
        self.pos = self.req.len();
        out
    }

    /// Errors if arguments remain: trailing arguments are a mistake, not something to ignore.
    pub fn finish(&self) -> Result<(), ArgError> {
        if self.remaining() == 0 {
            Ok(())
        } else {
            Err(ArgError::Syntax)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Redis's integer rules are Rust's parser with `+`, leading zeros and `-0` refused.
    #[test]
    fn integers_parse_by_redis_rules() {
        let redis = |b: &[u8]| -> Option<i64> {
            let s = std::str::from_utf8(b).ok()?;
            if b.is_empty() || b.len() > 20 || s.starts_with('+') || s.starts_with("-0") {
                return None;
            }
            if s.len() > 1 && s.starts_with('0') {
                return None;
            }
            s.parse::<i64>().ok()
        };
        let cases: &[&[u8]] = &[
            b"0",
            b"7",
            b"+7",
            b"-7",
            b"007",
            b"-0",
            b"-",
            b"",
            b" 1",
            b"1 ",
            b"\xff1",
            b"9223372036854775807",
            b"9223372036854775808",
            b"-9223372036854775808",
            b"-9223372036854775809",
            b"00",
            b"10",
        ];
        for &c in cases {
            assert_eq!(parse_i64(c), redis(c), "{:?}", String::from_utf8_lossy(c));
        }
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_i64(b"+7"), None);
        assert_eq!(crate::limiter::parse_i64_signed(b"+7"), Some(7));
    }

    #[test]
    fn integers_like_redis() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"9223372036854775808"), None);
        assert_eq!(parse_i64(b"01"), None);
        assert_eq!(parse_i64(b"+1"), None);
        assert_eq!(parse_i64(b" 1"), None);
        assert_eq!(parse_i64(b"1.5"), None);
        assert_eq!(parse_i64(b""), None);
        assert_eq!(parse_i64(b"-0"), None);
    }
}
