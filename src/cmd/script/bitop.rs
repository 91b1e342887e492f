//! `bit` for scripts, as Redis bundles it (LuaBitOp 1.0): 32-bit operations on Lua numbers.
//!
//! A number becomes 32 bits as LuaBitOp makes it: 2^52 + 2^51 is added to the double and the
//! low 32 bits of the sum are taken, which rounds a fraction to the nearest integer (ties to
//! even) and wraps anything outside 32 bits. Results are signed 32-bit numbers. Shift counts
//! use their low five bits. An argument that is not a number (or a string reading as one) is
//! refused, unless it converts to 0 bits, as LuaBitOp's own check lets such a value through
//! only when it is a number.

use super::lib_args::{to_number, type_error};
use mlua::{Lua, Table, Value, Variadic};

/// One argument as 32 bits.
fn bits(lua: &Lua, args: &[Value], n: usize, function: &str) -> mlua::Result<u32> {
    let x = to_number(lua, args.get(n - 1)).unwrap_or(0.0);
    let b = to_bits(x);
    if b == 0 && to_number(lua, args.get(n - 1)).is_none() {
        return Err(type_error(lua, args, n, function, "number"));
    }
    Ok(b)
}

/// A double as LuaBitOp's 32 bits.
fn to_bits(x: f64) -> u32 {
    (x + 6_755_399_441_055_744.0).to_bits() as u32
}

/// A result, as the signed number a script sees.
fn ret(b: u32) -> f64 {
    f64::from(b as i32)
}

type Unary = fn(u32) -> u32;
type Shift = fn(u32, u32) -> u32;

/// Builds the `bit` table.
pub(super) fn module(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    let unary: [(&'static str, Unary); 3] = [
        ("tobit", |b| b),
        ("bnot", |b| !b),
        ("bswap", u32::swap_bytes),
    ];
    for (name, op) in unary {
        t.set(
            name,
            lua.create_function(move |lua, args: Variadic<Value>| {
                Ok(ret(op(bits(lua, &args, 1, name)?)))
            })?,
        )?;
    }
    let folds: [(&'static str, Shift); 3] = [
        ("band", |a, b| a & b),
        ("bor", |a, b| a | b),
        ("bxor", |a, b| a ^ b),
    ];
    for (name, op) in folds {
        t.set(
            name,
            lua.create_function(move |lua, args: Variadic<Value>| {
                let mut acc = bits(lua, &args, 1, name)?;
                // LuaBitOp reads the arguments from the last one down.
                for n in (2..=args.len()).rev() {
                    acc = op(acc, bits(lua, &args, n, name)?);
                }
                Ok(ret(acc))
            })?,
        )?;
    }
    let shifts: [(&'static str, Shift); 5] = [
        ("lshift", |b, n| b << n),
        ("rshift", |b, n| b >> n),
        ("arshift", |b, n| ((b as i32) >> n) as u32),
        ("rol", u32::rotate_left),
        ("ror", u32::rotate_right),
    ];
    for (name, op) in shifts {
        t.set(
            name,
            lua.create_function(move |lua, args: Variadic<Value>| {
                let b = bits(lua, &args, 1, name)?;
                let n = bits(lua, &args, 2, name)? & 31;
                Ok(ret(op(b, n)))
            })?,
        )?;
    }
    t.set(
        "tohex",
        lua.create_function(|lua, args: Variadic<Value>| {
            let b = bits(lua, &args, 1, "tohex")?;
            let n = if args.len() < 2 {
                8
            } else {
                bits(lua, &args, 2, "tohex")? as i32
            };
            lua.create_string(tohex(b, n))
        })?,
    )?;
    Ok(t)
}

/// `bit.tohex`: the low `|n|` hex digits of `b` (at most 8), upper case when `n` is negative.
fn tohex(mut b: u32, n: i32) -> Vec<u8> {
    let n = n.max(i32::MIN + 1);
    let digits: &[u8; 16] = if n < 0 {
        b"0123456789ABCDEF"
    } else {
        b"0123456789abcdef"
    };
    let n = n.unsigned_abs().min(8) as usize;
    let mut out = vec![b'0'; n];
    for slot in out.iter_mut().rev() {
        *slot = digits[(b & 15) as usize];
        b >>= 4;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{ret, to_bits, tohex};

    #[test]
    fn numbers_become_32_bits_as_luabitop_makes_them() {
        for (x, want) in [
            (0.0, 0.0),
            (1.0, 1.0),
            (-1.0, -1.0),
            (2147483647.0, 2147483647.0),
            (2147483648.0, -2147483648.0),
            (4294967295.0, -1.0),
            (4294967296.0, 0.0),
            (4294967297.0, 1.0),
            (-4294967297.0, -1.0),
            (0.5, 0.0),
            (1.5, 2.0),
            (2.5, 2.0),
            (-1.5, -2.0),
        ] {
            assert_eq!(ret(to_bits(x)), want, "{x}");
        }
    }

    #[test]
    fn tohex_writes_as_luabitop_writes() {
        assert_eq!(tohex(to_bits(1.0), 8), b"00000001");
        assert_eq!(tohex(to_bits(-1.0), 8), b"ffffffff");
        assert_eq!(tohex(to_bits(-1.0), -8), b"FFFFFFFF");
        assert_eq!(tohex(0x1234_abcd, 4), b"abcd");
        assert_eq!(tohex(0x1234_abcd, -3), b"BCD");
        assert_eq!(tohex(0x1234_abcd, 20), b"1234abcd");
        assert_eq!(tohex(0x1234_abcd, 0), b"");
        assert_eq!(tohex(0x1234_abcd, i32::MIN), b"1234ABCD");
    }
}
