//! `cjson` for scripts, as Redis bundles it (lua-cjson 2.1): `cjson.encode`, `cjson.decode`
//! and `cjson.null`, with its output and its error messages.
//!
//! - Numbers are written as C's `%.14g`; NaN and infinities are refused.
//! - A table whose keys are all positive integers is an array (holes become `null`), unless it
//!   is excessively sparse (its largest index over 10 and over twice its number of items),
//!   which is refused; any other table, the empty one included, is an object, its number keys
//!   written as strings. Keys are listed in the order `next` visits them.
//! - `/` is escaped as `\/`, control characters as `\u00XX`; other bytes go out as they are.
//! - Nesting deeper than 1000 is refused both ways (so a table that holds itself is too).
//! - Decoding follows lua-cjson's tokens: `null` becomes `cjson.null`, numbers are read as
//!   `strtod` reads them (hexadecimal too), and an error names the token it found and where.

use super::convert::format_g;
use super::lua_api::Raised;
use mlua::{LightUserData, Lua, Table, Value};

/// How deep tables may nest, encoding or decoding, as lua-cjson's default.
const MAX_DEPTH: usize = 1000;
/// The largest text `cjson.encode` builds: a table may hold one long string many times over,
/// so the output is bounded by itself, not only by the interpreter's memory.
const MAX_OUTPUT: usize = 64 * 1024 * 1024;

/// `cjson.null`: a light userdata holding NULL, as lua-cjson has it.
fn null() -> Value {
    Value::LightUserData(LightUserData(std::ptr::null_mut()))
}

/// Builds the `cjson` table.
pub(super) fn module(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.set(
        "encode",
        lua.create_function(|lua, v: Value| {
            let mut out = Vec::new();
            match encode(&mut out, &v, 0) {
                Ok(()) => lua.create_string(&out),
                Err(why) => Err(Raised::library(lua, &why.to_string())),
            }
        })?,
    )?;
    t.set(
        "decode",
        lua.create_function(|lua, s: mlua::LuaString| {
            let bytes = s.as_bytes();
            let mut d = Decoder {
                lua,
                text: &bytes,
                pos: 0,
                depth: 0,
            };
            match d.document()? {
                Ok(v) => Ok(v),
                Err(why) => Err(Raised::library(lua, &why)),
            }
        })?,
    )?;
    t.set("null", null())?;
    t.set("_NAME", "cjson")?;
    t.set("_VERSION", "2.1.0")?;
    Ok(t)
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Nil => "nil",
        Value::Boolean(_) => "boolean",
        Value::LightUserData(_) | Value::UserData(_) => "userdata",
        Value::Integer(_) | Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Table(_) => "table",
        Value::Function(_) => "function",
        Value::Thread(_) => "thread",
        _ => "userdata",
    }
}

/// Why a value cannot be encoded; a script sees the text, as lua-cjson words it.
#[derive(Debug)]
enum EncodeError {
    TooLong,
    Unsupported(&'static str),
    NotFinite,
    Sparse,
    Nesting(usize),
    BadKey(&'static str),
    /// Reading the table failed in Lua.
    Lua(mlua::Error),
}

impl From<mlua::Error> for EncodeError {
    fn from(e: mlua::Error) -> Self {
        EncodeError::Lua(e)
    }
}

impl std::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EncodeError::TooLong => write!(
                f,
                "Cannot serialise: the text would be over {} MiB",
                MAX_OUTPUT >> 20
            ),
            EncodeError::Unsupported(t) => write!(f, "Cannot serialise {t}: type not supported"),
            EncodeError::NotFinite => {
                f.write_str("Cannot serialise number: must not be NaN or Inf")
            }
            EncodeError::Sparse => f.write_str("Cannot serialise table: excessively sparse array"),
            EncodeError::Nesting(depth) => {
                write!(f, "Cannot serialise, excessive nesting ({depth})")
            }
            EncodeError::BadKey(t) => write!(
                f,
                "Cannot serialise {t}: table key must be a number or string"
            ),
            EncodeError::Lua(e) => write!(f, "{e}"),
        }
    }
}

fn encode(out: &mut Vec<u8>, v: &Value, depth: usize) -> Result<(), EncodeError> {
    if out.len() > MAX_OUTPUT {
        return Err(EncodeError::TooLong);
    }
    match v {
        Value::Nil => out.extend_from_slice(b"null"),
        Value::LightUserData(p) if p.0.is_null() => out.extend_from_slice(b"null"),
        Value::Boolean(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Integer(i) => number(out, *i as f64)?,
        Value::Number(n) => number(out, *n)?,
        Value::String(s) => string(out, &s.as_bytes()),
        Value::Table(t) => table(out, t, depth + 1)?,
        other => return Err(EncodeError::Unsupported(type_name(other))),
    }
    Ok(())
}

fn number(out: &mut Vec<u8>, n: f64) -> Result<(), EncodeError> {
    if !n.is_finite() {
        return Err(EncodeError::NotFinite);
    }
    out.extend_from_slice(format_g(n, 14).as_bytes());
    Ok(())
}

fn string(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    for &c in s {
        match c {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'/' => out.extend_from_slice(b"\\/"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\r' => out.extend_from_slice(b"\\r"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            0..=0x1f | 0x7f => {
                out.extend_from_slice(format!("\\u{c:04x}").as_bytes());
            }
            _ => out.push(c),
        }
    }
    out.push(b'"');
}

/// A table's length as an array, or None if it is an object (lua-cjson's rule).
fn array_length(t: &Table) -> Result<Option<usize>, EncodeError> {
    let (mut max, mut items) = (0usize, 0usize);
    for pair in t.clone().pairs::<Value, Value>() {
        let (k, _) = pair?;
        let index = match k {
            Value::Integer(i) if i >= 1 => usize::try_from(i).ok(),
            Value::Number(n) if n >= 1.0 && n.floor() == n && n < 9.0e15 => Some(n as usize),
            _ => None,
        };
        let Some(index) = index else {
            return Ok(None);
        };
        max = max.max(index);
        items += 1;
    }
    if max > 10 && max > items.saturating_mul(2) {
        return Err(EncodeError::Sparse);
    }
    Ok((max > 0).then_some(max))
}

fn table(out: &mut Vec<u8>, t: &Table, depth: usize) -> Result<(), EncodeError> {
    if depth > MAX_DEPTH {
        return Err(EncodeError::Nesting(depth));
    }
    if let Some(len) = array_length(t)? {
        out.push(b'[');
        for i in 1..=len {
            if i > 1 {
                out.push(b',');
            }
            let v: Value = t.raw_get(i)?;
            encode(out, &v, depth)?;
        }
        out.push(b']');
        return Ok(());
    }
    out.push(b'{');
    let mut first = true;
    for pair in t.clone().pairs::<Value, Value>() {
        let (k, v) = pair?;
        if !first {
            out.push(b',');
        }
        first = false;
        match &k {
            Value::String(s) => string(out, &s.as_bytes()),
            Value::Integer(i) => {
                out.push(b'"');
                number(out, *i as f64)?;
                out.push(b'"');
            }
            Value::Number(n) => {
                out.push(b'"');
                number(out, *n)?;
                out.push(b'"');
            }
            other => return Err(EncodeError::BadKey(type_name(other))),
        }
        out.push(b':');
        encode(out, &v, depth)?;
    }
    out.push(b'}');
    Ok(())
}

/// lua-cjson's tokens; an error token carries its own message.
#[derive(Debug)]
enum Token {
    ObjBegin,
    ObjEnd,
    ArrBegin,
    ArrEnd,
    Str(Vec<u8>),
    Number(f64),
    Boolean(bool),
    Null,
    Colon,
    Comma,
    End,
    Error(&'static str),
}

impl Token {
    fn name(&self) -> &'static str {
        match self {
            Token::ObjBegin => "T_OBJ_BEGIN",
            Token::ObjEnd => "T_OBJ_END",
            Token::ArrBegin => "T_ARR_BEGIN",
            Token::ArrEnd => "T_ARR_END",
            Token::Str(_) => "T_STRING",
            Token::Number(_) => "T_NUMBER",
            Token::Boolean(_) => "T_BOOLEAN",
            Token::Null => "T_NULL",
            Token::Colon => "T_COLON",
            Token::Comma => "T_COMMA",
            Token::End => "T_END",
            Token::Error(why) => why,
        }
    }
}

/// Why decoding stopped: the text, or the interpreter (out of memory).
enum Fail {
    Parse(String),
    Lua(mlua::Error),
}

impl From<mlua::Error> for Fail {
    fn from(e: mlua::Error) -> Fail {
        Fail::Lua(e)
    }
}

struct Decoder<'a> {
    lua: &'a Lua,
    text: &'a [u8],
    pos: usize,
    depth: usize,
}

impl Decoder<'_> {
    /// The byte at `i`; the text ends at its first NUL, as the C string lua-cjson reads.
    fn at(&self, i: usize) -> u8 {
        self.text.get(i).copied().unwrap_or(0)
    }

    /// The document's value, or why the text is not one.
    fn document(&mut self) -> mlua::Result<Result<Value, String>> {
        let parsed = (|| {
            let (tok, at) = self.token();
            let v = self.value(tok, at)?;
            let (tok, at) = self.token();
            if !matches!(tok, Token::End) {
                return Err(expected("the end", &tok, at));
            }
            Ok(v)
        })();
        match parsed {
            Ok(v) => Ok(Ok(v)),
            Err(Fail::Parse(why)) => Ok(Err(why)),
            Err(Fail::Lua(e)) => Err(e),
        }
    }

    /// The next token and where it starts (0-based).
    fn token(&mut self) -> (Token, usize) {
        while matches!(self.at(self.pos), b' ' | b'\t' | b'\n' | b'\r') {
            self.pos += 1;
        }
        let start = self.pos;
        let c = self.at(start);
        let single = match c {
            0 => return (Token::End, start),
            b'{' => Some(Token::ObjBegin),
            b'}' => Some(Token::ObjEnd),
            b'[' => Some(Token::ArrBegin),
            b']' => Some(Token::ArrEnd),
            b':' => Some(Token::Colon),
            b',' => Some(Token::Comma),
            _ => None,
        };
        if let Some(t) = single {
            self.pos += 1;
            return (t, start);
        }
        if c == b'"' {
            return self.string_token(start);
        }
        if c == b'-' || c == b'+' || c.is_ascii_digit() {
            return match self.number_token(start) {
                Some(n) => (Token::Number(n), start),
                None => (Token::Error("invalid number"), start),
            };
        }
        let rest = &self.text[start.min(self.text.len())..];
        for (word, tok) in [
            (&b"true"[..], Token::Boolean(true)),
            (b"false", Token::Boolean(false)),
            (b"null", Token::Null),
        ] {
            if rest.starts_with(word) {
                self.pos += word.len();
                return (tok, start);
            }
        }
        (Token::Error("invalid token"), start)
    }

    fn string_token(&mut self, start: usize) -> (Token, usize) {
        let mut s = Vec::new();
        self.pos = start + 1;
        loop {
            let c = self.at(self.pos);
            match c {
                0 => return (Token::Error("unexpected end of string"), self.pos),
                b'"' => {
                    self.pos += 1;
                    return (Token::Str(s), start);
                }
                b'\\' => {
                    let esc = self.pos;
                    let e = self.at(esc + 1);
                    let plain = match e {
                        b'"' => Some(b'"'),
                        b'\\' => Some(b'\\'),
                        b'/' => Some(b'/'),
                        b'b' => Some(0x08),
                        b'f' => Some(0x0c),
                        b'n' => Some(b'\n'),
                        b'r' => Some(b'\r'),
                        b't' => Some(b'\t'),
                        _ => None,
                    };
                    if let Some(p) = plain {
                        s.push(p);
                        self.pos += 2;
                    } else if e == b'u' {
                        match self.unicode_escape(esc) {
                            Some((ch, len)) => {
                                let mut buf = [0u8; 4];
                                s.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                                self.pos = esc + len;
                            }
                            None => return (Token::Error("invalid unicode escape code"), esc),
                        }
                    } else {
                        return (Token::Error("invalid escape code"), esc);
                    }
                }
                _ => {
                    s.push(c);
                    self.pos += 1;
                }
            }
        }
    }

    fn hex4(&self, at: usize) -> Option<u32> {
        let mut v = 0u32;
        for i in 0..4 {
            let d = char::from(self.at(at + i)).to_digit(16)?;
            v = v * 16 + d;
        }
        Some(v)
    }

    /// `\uXXXX` at `esc` (a surrogate pair as one character): the character and the bytes read.
    fn unicode_escape(&self, esc: usize) -> Option<(char, usize)> {
        let hi = self.hex4(esc + 2)?;
        if (0xdc00..0xe000).contains(&hi) {
            return None;
        }
        if (0xd800..0xdc00).contains(&hi) {
            if self.at(esc + 6) != b'\\' || self.at(esc + 7) != b'u' {
                return None;
            }
            let lo = self.hex4(esc + 8)?;
            if !(0xdc00..0xe000).contains(&lo) {
                return None;
            }
            let cp = 0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00);
            return char::from_u32(cp).map(|c| (c, 12));
        }
        char::from_u32(hi).map(|c| (c, 6))
    }

    /// A number as `strtod` reads it from `start`: decimal, or hexadecimal after `0x`.
    fn number_token(&mut self, start: usize) -> Option<f64> {
        let mut i = start;
        let negative = match self.at(i) {
            b'-' => {
                i += 1;
                true
            }
            b'+' => {
                i += 1;
                false
            }
            _ => false,
        };
        if self.at(i) == b'0'
            && matches!(self.at(i + 1), b'x' | b'X')
            && self.at(i + 2).is_ascii_hexdigit()
        {
            i += 2;
            let mut v = 0f64;
            while let Some(d) = char::from(self.at(i)).to_digit(16) {
                v = v * 16.0 + f64::from(d);
                i += 1;
            }
            self.pos = i;
            return Some(if negative { -v } else { v });
        }
        let digits_from = i;
        while self.at(i).is_ascii_digit() {
            i += 1;
        }
        let mut digits = i - digits_from;
        if self.at(i) == b'.' {
            i += 1;
            let f = i;
            while self.at(i).is_ascii_digit() {
                i += 1;
            }
            digits += i - f;
        }
        if digits == 0 {
            return None;
        }
        if matches!(self.at(i), b'e' | b'E') {
            let mut j = i + 1;
            if matches!(self.at(j), b'+' | b'-') {
                j += 1;
            }
            if self.at(j).is_ascii_digit() {
                while self.at(j).is_ascii_digit() {
                    j += 1;
                }
                i = j;
            }
        }
        let text = std::str::from_utf8(&self.text[digits_from..i]).ok()?;
        let text = if text.starts_with('.') {
            format!("0{text}")
        } else {
            text.to_string()
        };
        let v: f64 = text.trim_end_matches('.').parse().ok()?;
        self.pos = i;
        Some(if negative { -v } else { v })
    }

    fn value(&mut self, tok: Token, at: usize) -> Result<Value, Fail> {
        match tok {
            Token::ObjBegin => self.object(at),
            Token::ArrBegin => self.array(at),
            Token::Str(s) => Ok(Value::String(self.lua.create_string(&s)?)),
            Token::Number(n) => Ok(Value::Number(n)),
            Token::Boolean(b) => Ok(Value::Boolean(b)),
            Token::Null => Ok(null()),
            other => Err(expected("value", &other, at)),
        }
    }

    fn descend(&mut self, at: usize) -> Result<(), Fail> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Fail::Parse(format!(
                "Found too many nested data structures ({}) at character {}",
                self.depth,
                at + 1
            )));
        }
        Ok(())
    }

    fn object(&mut self, at: usize) -> Result<Value, Fail> {
        self.descend(at)?;
        let t = self.lua.create_table()?;
        let (mut tok, mut at) = self.token();
        if matches!(tok, Token::ObjEnd) {
            self.depth -= 1;
            return Ok(Value::Table(t));
        }
        loop {
            let Token::Str(key) = tok else {
                return Err(expected("object key string", &tok, at));
            };
            let (colon, cat) = self.token();
            if !matches!(colon, Token::Colon) {
                return Err(expected("colon", &colon, cat));
            }
            let (vt, vat) = self.token();
            let v = self.value(vt, vat)?;
            t.raw_set(self.lua.create_string(&key)?, v)?;
            let (next, nat) = self.token();
            match next {
                Token::ObjEnd => break,
                Token::Comma => {}
                other => return Err(expected("comma or object end", &other, nat)),
            }
            (tok, at) = self.token();
        }
        self.depth -= 1;
        Ok(Value::Table(t))
    }

    fn array(&mut self, at: usize) -> Result<Value, Fail> {
        self.descend(at)?;
        let t = self.lua.create_table()?;
        let (mut tok, mut at) = self.token();
        if matches!(tok, Token::ArrEnd) {
            self.depth -= 1;
            return Ok(Value::Table(t));
        }
        for i in 1usize.. {
            let v = self.value(tok, at)?;
            t.raw_set(i, v)?;
            let (next, nat) = self.token();
            match next {
                Token::ArrEnd => break,
                Token::Comma => {}
                other => return Err(expected("comma or array end", &other, nat)),
            }
            (tok, at) = self.token();
        }
        self.depth -= 1;
        Ok(Value::Table(t))
    }
}

fn expected(what: &str, found: &Token, at: usize) -> Fail {
    Fail::Parse(format!(
        "Expected {what} but found {} at character {}",
        found.name(),
        at + 1
    ))
}
