//! `cmsgpack` for scripts, as Redis bundles it (lua-cmsgpack 0.4): `cmsgpack.pack`,
//! `cmsgpack.unpack`, `cmsgpack.unpack_one` and `cmsgpack.unpack_limit`, with the same bytes.
//!
//! - A number that is a whole 64-bit integer is packed as the smallest integer form; any
//!   other as a float when a float holds it exactly, else as a double.
//! - A table whose keys are exactly 1..n is an array, any other a map (its pairs in the order
//!   `next` visits them). Tables nested 16 deep are packed as nil, so a table holding itself
//!   packs too.
//! - Strings use the str 8/16/32 forms; nil, functions and other values pack as nil.
//! - Unpacking reads the forms above (bin and ext forms are "Bad data format in input.");
//!   every number comes back as a Lua number. `unpack_one` and `unpack_limit` return the
//!   offset to go on from first (-1 once the input is used up), then the values.

use super::lib_args::{arg_error, check_bytes, check_integer, opt_integer};
use super::lua_api::Raised;
use mlua::{Lua, Table, Value, Variadic};

/// Tables nested deeper than this pack as nil.
const MAX_NESTING: usize = 16;
/// How deep unpacking nests before it gives up (the C library runs out of Lua stack).
const MAX_DECODE_DEPTH: usize = 1000;
/// Values one unpack returns at most (Lua's stack bound).
const MAX_RESULTS: usize = 7_990;

/// Builds the `cmsgpack` table.
pub(super) fn module(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.set(
        "pack",
        lua.create_function(|lua, args: Variadic<Value>| {
            if args.is_empty() {
                return Err(arg_error(lua, 0, "pack", "MessagePack pack needs input."));
            }
            let mut out = Vec::new();
            for v in args.iter() {
                encode(&mut out, v, 0)?;
            }
            lua.create_string(&out)
        })?,
    )?;
    t.set(
        "unpack",
        lua.create_function(|lua, args: Variadic<Value>| unpack(lua, &args, "unpack", 0, 0))?,
    )?;
    t.set(
        "unpack_one",
        lua.create_function(|lua, args: Variadic<Value>| {
            let offset = opt_integer(lua, &args, 2, "unpack_one", 0)?;
            unpack(lua, &args, "unpack_one", 1, offset)
        })?,
    )?;
    t.set(
        "unpack_limit",
        lua.create_function(|lua, args: Variadic<Value>| {
            let limit = check_integer(lua, &args, 2, "unpack_limit")?;
            let offset = opt_integer(lua, &args, 3, "unpack_limit", 0)?;
            unpack(lua, &args, "unpack_limit", limit, offset)
        })?,
    )?;
    t.set("_NAME", "cmsgpack")?;
    t.set("_VERSION", "lua-cmsgpack 0.4.0")?;
    t.set("_COPYRIGHT", "Copyright (C) 2012, Salvatore Sanfilippo")?;
    t.set("_DESCRIPTION", "MessagePack C implementation for Lua")?;
    Ok(t)
}

/// Appends `v` packed.
fn encode(out: &mut Vec<u8>, v: &Value, level: usize) -> mlua::Result<()> {
    match v {
        Value::String(s) => encode_bytes(out, &s.as_bytes()),
        Value::Boolean(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        Value::Integer(i) => encode_int(out, *i),
        Value::Number(n) => encode_number(out, *n),
        Value::Table(t) if level < MAX_NESTING => encode_table(out, t, level)?,
        _ => out.push(0xc0),
    }
    Ok(())
}

fn encode_number(out: &mut Vec<u8>, n: f64) {
    // A whole number inside the 64-bit range is an integer (what C's `(int64_t)n == n` finds).
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if n.fract() == 0.0 && (-TWO_63..TWO_63).contains(&n) {
        encode_int(out, n as i64);
    } else if f64::from(n as f32) == n {
        out.push(0xca);
        out.extend_from_slice(&(n as f32).to_be_bytes());
    } else {
        out.push(0xcb);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

fn encode_int(out: &mut Vec<u8>, n: i64) {
    if n >= 0 {
        match n {
            0..=127 => out.push(n as u8),
            128..=0xff => out.extend_from_slice(&[0xcc, n as u8]),
            0x100..=0xffff => {
                out.push(0xcd);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            0x1_0000..=0xffff_ffff => {
                out.push(0xce);
                out.extend_from_slice(&(n as u32).to_be_bytes());
            }
            _ => {
                out.push(0xcf);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
    } else {
        match n {
            -32..=-1 => out.push(n as i8 as u8),
            -128..=-33 => out.extend_from_slice(&[0xd0, n as i8 as u8]),
            -32768..=-129 => {
                out.push(0xd1);
                out.extend_from_slice(&(n as i16).to_be_bytes());
            }
            -2_147_483_648..=-32769 => {
                out.push(0xd2);
                out.extend_from_slice(&(n as i32).to_be_bytes());
            }
            _ => {
                out.push(0xd3);
                out.extend_from_slice(&n.to_be_bytes());
            }
        }
    }
}

fn encode_bytes(out: &mut Vec<u8>, s: &[u8]) {
    let len = s.len();
    if len < 32 {
        out.push(0xa0 | len as u8);
    } else if len <= 0xff {
        out.extend_from_slice(&[0xd9, len as u8]);
    } else if len <= 0xffff {
        out.push(0xda);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
    out.extend_from_slice(s);
}

/// The header of an array (`base` 0x90, 0xdc) or a map (0x80, 0xde) of `n` entries.
fn encode_len(out: &mut Vec<u8>, n: usize, fix: u8, wide: u8) {
    if n <= 15 {
        out.push(fix | n as u8);
    } else if n <= 0xffff {
        out.push(wide);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(wide + 1);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

/// Whether a table's keys are exactly 1..n (each a whole number that fits a C int).
fn is_array(t: &Table) -> bool {
    let (mut count, mut max) = (0i64, 0i64);
    for pair in t.pairs::<Value, Value>() {
        let Ok((k, _)) = pair else { return false };
        let n = match k {
            Value::Integer(i) if i > 0 && i <= i64::from(i32::MAX) => i,
            Value::Number(n) if n > 0.0 && n <= f64::from(i32::MAX) && n.fract() == 0.0 => n as i64,
            _ => return false,
        };
        max = max.max(n);
        count += 1;
    }
    max == count
}

fn encode_table(out: &mut Vec<u8>, t: &Table, level: usize) -> mlua::Result<()> {
    if is_array(t) {
        let len = t.raw_len();
        encode_len(out, len, 0x90, 0xdc);
        for i in 1..=len {
            encode(out, &t.get::<Value>(i)?, level + 1)?;
        }
    } else {
        let pairs: Vec<(Value, Value)> = t.pairs::<Value, Value>().collect::<Result<_, _>>()?;
        encode_len(out, pairs.len(), 0x80, 0xde);
        for (k, v) in &pairs {
            encode(out, k, level + 1)?;
            encode(out, v, level + 1)?;
        }
    }
    Ok(())
}

/// Why unpacking stopped.
enum DecodeError {
    Eof,
    BadFormat,
    TooDeep,
    /// A map key no table can hold (nil, NaN): Lua's own error text.
    BadKey(&'static str),
    Lua(mlua::Error),
}

impl From<mlua::Error> for DecodeError {
    fn from(e: mlua::Error) -> Self {
        DecodeError::Lua(e)
    }
}

/// The input being unpacked.
struct Cursor<'a> {
    data: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn left(&self) -> usize {
        self.data.len() - self.at
    }

    fn take(&mut self, n: usize) -> Result<&[u8], DecodeError> {
        if self.left() < n {
            return Err(DecodeError::Eof);
        }
        let s = &self.data[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn uint(&mut self, n: usize) -> Result<u64, DecodeError> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    fn value(&mut self, lua: &Lua, depth: usize) -> Result<Value, DecodeError> {
        if depth > MAX_DECODE_DEPTH {
            return Err(DecodeError::TooDeep);
        }
        let tag = self.take(1)?[0];
        let num = |n: f64| Ok(Value::Number(n));
        match tag {
            0x00..=0x7f => num(f64::from(tag)),
            0xe0..=0xff => num(f64::from(tag as i8)),
            0xcc => num(self.uint(1)? as f64),
            0xcd => num(self.uint(2)? as f64),
            0xce => num(self.uint(4)? as f64),
            0xcf => num(self.uint(8)? as f64),
            0xd0 => num(f64::from(self.uint(1)? as u8 as i8)),
            0xd1 => num(f64::from(self.uint(2)? as u16 as i16)),
            0xd2 => num(f64::from(self.uint(4)? as u32 as i32)),
            0xd3 => num(self.uint(8)? as i64 as f64),
            0xc0 => Ok(Value::Nil),
            0xc2 => Ok(Value::Boolean(false)),
            0xc3 => Ok(Value::Boolean(true)),
            0xca => num(f64::from(f32::from_bits(self.uint(4)? as u32))),
            0xcb => num(f64::from_bits(self.uint(8)?)),
            0xa0..=0xbf => self.string(lua, usize::from(tag & 0x1f)),
            0xd9 => {
                let n = self.uint(1)? as usize;
                self.string(lua, n)
            }
            0xda => {
                let n = self.uint(2)? as usize;
                self.string(lua, n)
            }
            0xdb => {
                let n = self.uint(4)? as usize;
                self.string(lua, n)
            }
            0x90..=0x9f => self.array(lua, usize::from(tag & 0xf), depth),
            0xdc => {
                let n = self.uint(2)? as usize;
                self.array(lua, n, depth)
            }
            0xdd => {
                let n = self.uint(4)? as usize;
                self.array(lua, n, depth)
            }
            0x80..=0x8f => self.map(lua, usize::from(tag & 0xf), depth),
            0xde => {
                let n = self.uint(2)? as usize;
                self.map(lua, n, depth)
            }
            0xdf => {
                let n = self.uint(4)? as usize;
                self.map(lua, n, depth)
            }
            _ => Err(DecodeError::BadFormat),
        }
    }

    fn string(&mut self, lua: &Lua, n: usize) -> Result<Value, DecodeError> {
        let s = self.take(n)?;
        Ok(Value::String(lua.create_string(s)?))
    }

    fn array(&mut self, lua: &Lua, n: usize, depth: usize) -> Result<Value, DecodeError> {
        let t = lua.create_table()?;
        // Entries are read one by one: a count larger than the input stops at its end.
        for i in 1..=n {
            let v = self.value(lua, depth + 1)?;
            t.raw_set(i, v)?;
        }
        Ok(Value::Table(t))
    }

    fn map(&mut self, lua: &Lua, n: usize, depth: usize) -> Result<Value, DecodeError> {
        let t = lua.create_table()?;
        for _ in 0..n {
            let k = self.value(lua, depth + 1)?;
            let v = self.value(lua, depth + 1)?;
            match &k {
                Value::Nil => return Err(DecodeError::BadKey("table index is nil")),
                Value::Number(x) if x.is_nan() => {
                    return Err(DecodeError::BadKey("table index is NaN"));
                }
                _ => t.raw_set(k, v)?,
            }
        }
        Ok(Value::Table(t))
    }
}

/// The unpack functions: up to `limit` values from `offset` (all of them, and no offset in
/// front, when both are 0).
fn unpack(
    lua: &Lua,
    args: &[Value],
    function: &str,
    limit: i64,
    offset: i64,
) -> mlua::Result<Variadic<Value>> {
    let data = check_bytes(lua, args, 1, function)?;
    let len = data.len();
    if offset < 0 || limit < 0 {
        // The C library prints the input's length where it means the limit.
        return Err(Raised::library(
            lua,
            &format!(
                "Invalid request to unpack with offset of {} and limit of {}.",
                offset as i32, len as i32
            ),
        ));
    }
    if offset as u64 > len as u64 {
        return Err(Raised::library(
            lua,
            &format!(
                "Start offset {} greater than input length {}.",
                offset as i32, len as i32
            ),
        ));
    }
    let all = limit == 0 && offset == 0;
    let limit = if all { i64::from(i32::MAX) } else { limit };
    let mut c = Cursor {
        data: &data,
        at: offset as usize,
    };
    let mut out = Vec::new();
    let mut count = 0;
    while c.left() > 0 && count < limit {
        if out.len() >= MAX_RESULTS {
            return Err(Raised::library(
                lua,
                "stack overflow (too many return values at once; use unpack_one or \
                 unpack_limit instead.)",
            ));
        }
        match c.value(lua, 0) {
            Ok(v) => out.push(v),
            Err(DecodeError::Eof) => return Err(Raised::library(lua, "Missing bytes in input.")),
            Err(DecodeError::BadFormat) => {
                return Err(Raised::library(lua, "Bad data format in input."));
            }
            Err(DecodeError::TooDeep) => {
                return Err(Raised::library(
                    lua,
                    "stack overflow (in function mp_decode_to_lua_array)",
                ));
            }
            Err(DecodeError::BadKey(why)) => {
                return Err(mlua::Error::external(Raised(why.to_string())));
            }
            Err(DecodeError::Lua(e)) => return Err(e),
        }
        count += 1;
    }
    if !all {
        let next = if c.left() == 0 { -1 } else { c.at as i64 };
        out.insert(0, Value::Integer(next));
    }
    Ok(Variadic::from_iter(out))
}

#[cfg(test)]
mod tests {
    use super::{encode_bytes, encode_int, encode_number};

    fn int(n: i64) -> Vec<u8> {
        let mut out = Vec::new();
        encode_int(&mut out, n);
        out
    }

    #[test]
    fn integers_take_the_smallest_form() {
        assert_eq!(int(0), [0x00]);
        assert_eq!(int(127), [0x7f]);
        assert_eq!(int(128), [0xcc, 0x80]);
        assert_eq!(int(256), [0xcd, 0x01, 0x00]);
        assert_eq!(int(65536), [0xce, 0x00, 0x01, 0x00, 0x00]);
        assert_eq!(int(1 << 32), [0xcf, 0, 0, 0, 1, 0, 0, 0, 0]);
        assert_eq!(int(-1), [0xff]);
        assert_eq!(int(-32), [0xe0]);
        assert_eq!(int(-33), [0xd0, 0xdf]);
        assert_eq!(int(-129), [0xd1, 0xff, 0x7f]);
        assert_eq!(int(-32769), [0xd2, 0xff, 0xff, 0x7f, 0xff]);
        assert_eq!(int(i64::MIN)[0], 0xd3);
    }

    #[test]
    fn numbers_and_strings_pack_as_lua_cmsgpack_packs_them() {
        let mut out = Vec::new();
        encode_number(&mut out, 1.5);
        assert_eq!(out, [0xca, 0x3f, 0xc0, 0x00, 0x00]);
        out.clear();
        encode_number(&mut out, 0.1);
        assert_eq!(out[0], 0xcb);
        out.clear();
        encode_number(&mut out, 3.0);
        assert_eq!(out, [0x03]);
        out.clear();
        encode_bytes(&mut out, b"abc");
        assert_eq!(out, b"\xa3abc");
        out.clear();
        encode_bytes(&mut out, &[b'x'; 40]);
        assert_eq!(&out[..2], [0xd9, 40]);
    }
}
