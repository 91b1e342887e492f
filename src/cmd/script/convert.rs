//! Values between Lua, RESP and replies: numbers as C's `%.17g` writes them (what Redis hands
//! commands), a RESP2 reply pushed as Lua sees it, and a script's return value as a reply.

use super::super::keyed::Reply;
use bytes::Bytes;
use mlua::Value;

pub(super) fn c_int(n: usize) -> std::ffi::c_int {
    std::ffi::c_int::try_from(n).unwrap_or(std::ffi::c_int::MAX)
}

/// A number as C's `%.<precision>g` writes it (precision from 1 to 17).
pub(crate) fn format_g(n: f64, precision: usize) -> String {
    let mut out = Vec::with_capacity(24);
    write_g(&mut out, n, precision);
    String::from_utf8_lossy(&out).into_owned()
}

/// Appends `n` as C's `%.<precision>g` (precision from 1 to 17): the C library's own
/// formatting, the one Redis uses.
pub(super) fn write_g(out: &mut Vec<u8>, n: f64, precision: usize) {
    // A whole number that `%.<precision>g` writes in full is its integer digits: most numbers
    // scripts pass (timestamps, counts, milliseconds) take this way.
    if n.fract() == 0.0 && n.abs() < 10f64.powi(precision.clamp(1, 15) as i32) && n != 0.0 {
        use std::io::Write;
        let _ = write!(out, "{}", n as i64);
        return;
    }
    let precision = std::ffi::c_int::try_from(precision.clamp(1, 17)).unwrap_or(17);
    let mut buf = [0u8; 40];
    // SAFETY: the format string is NUL-terminated and takes exactly an int and a double, as
    // passed; snprintf writes at most `buf.len()` bytes, its NUL included. `%.17g` of any
    // double is at most 24 characters.
    let len = unsafe {
        libc::snprintf(
            buf.as_mut_ptr().cast(),
            buf.len(),
            c"%.*g".as_ptr(),
            precision,
            n,
        )
    };
    if let Ok(len) = usize::try_from(len) {
        out.extend_from_slice(&buf[..len.min(buf.len() - 1)]);
    }
}

/// Pushes the RESP2 value at `b[*at..]` as Lua sees it: a status as `{ok=...}`, an error as
/// `{err=...}`, an integer as a number, a bulk string as a string, nil as false, an array as
/// a table. None (with whatever it pushed left for the caller to drop) on a malformed reply.
///
/// # Safety
/// `state` must be a live Lua state, in a protected call.
pub(super) unsafe fn push_resp(
    state: *mut mlua::lua_State,
    b: &[u8],
    at: &mut usize,
    depth: usize,
) -> Option<()> {
    use mlua::ffi;
    let tag = *b.get(*at)?;
    let start = *at + 1;
    let end = start + b.get(start..)?.windows(2).position(|w| w == b"\r\n")?;
    let line = &b[start..end];
    *at = end + 2;
    let int = || -> Option<i64> { std::str::from_utf8(line).ok()?.parse().ok() };
    // SAFETY: the caller's contract; each level uses at most three slots, checked first.
    unsafe {
        ffi::luaL_checkstack(state, 3, std::ptr::null());
        match tag {
            b'+' | b'-' => {
                ffi::lua_createtable(state, 0, 1);
                ffi::lua_pushlstring(state, line.as_ptr().cast(), line.len());
                let field = if tag == b'+' { c"ok" } else { c"err" };
                ffi::lua_setfield(state, -2, field.as_ptr());
            }
            b':' => ffi::lua_pushnumber(state, int()? as f64),
            b'$' => {
                let n = int()?;
                if n < 0 {
                    ffi::lua_pushboolean(state, 0);
                } else {
                    let n = usize::try_from(n).ok()?;
                    let data = b.get(*at..*at + n)?;
                    *at += n + 2;
                    ffi::lua_pushlstring(state, data.as_ptr().cast(), data.len());
                }
            }
            b'*' => {
                let n = int()?;
                if n < 0 {
                    ffi::lua_pushboolean(state, 0);
                } else if depth >= 64 {
                    return None;
                } else {
                    ffi::lua_createtable(state, c_int(usize::try_from(n).ok()?), 0);
                    for i in 1..=n {
                        push_resp(state, b, at, depth + 1)?;
                        ffi::lua_rawseti(state, -2, i as ffi::lua_Integer);
                    }
                }
            }
            _ => return None,
        }
    }
    Some(())
}

/// A script's return value as a reply: Redis's conversion rules (numbers truncated to
/// integers, `false` and nil as nil, a table as an array up to its first nil, `{err=...}` and
/// `{ok=...}` as error and status replies).
pub(super) fn lua_to_reply(v: &Value, depth: usize) -> Reply {
    match v {
        Value::Nil | Value::Boolean(false) => Reply::Nil,
        Value::Boolean(true) => Reply::Int(1),
        Value::Integer(i) => Reply::Int(*i),
        Value::Number(n) => Reply::Int(*n as i64),
        Value::String(s) => Reply::Bulk(Bytes::copy_from_slice(&s.as_bytes())),
        Value::Table(t) if depth < 64 => {
            if let Ok(Value::String(e)) = t.raw_get::<Value>("err") {
                return Reply::Error(String::from_utf8_lossy(&e.as_bytes()).into_owned().into());
            }
            if let Ok(Value::String(s)) = t.raw_get::<Value>("ok") {
                return Reply::Simple(String::from_utf8_lossy(&s.as_bytes()).into_owned().into());
            }
            let mut items = Vec::new();
            for i in 1.. {
                match t.raw_get::<Value>(i) {
                    Ok(Value::Nil) | Err(_) => break,
                    Ok(v) => items.push(lua_to_reply(&v, depth + 1)),
                }
            }
            Reply::Array(items)
        }
        _ => Reply::Nil,
    }
}

#[cfg(test)]
mod tests {
    use super::format_g;

    #[test]
    fn numbers_go_to_commands_as_redis_formats_them() {
        for (n, text) in [
            (10.0 / 3.0, "3.3333333333333335"),
            (0.1, "0.10000000000000001"),
            (1e20, "1e+20"),
            (9007199254740992.0, "9007199254740992"),
            (99.5, "99.5"),
            (-0.0, "-0"),
            (f64::INFINITY, "inf"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (1.5e-5, "1.5e-05"),
            (0.00012, "0.00012"),
            (42.0, "42"),
            (-7.25, "-7.25"),
        ] {
            assert_eq!(format_g(n, 17), text, "{n}");
        }
        for (n, text) in [
            (1e20, "1e+20"),
            (123456789012345.0, "1.2345678901234e+14"),
            (0.1, "0.1"),
        ] {
            assert_eq!(format_g(n, 14), text, "{n}");
        }
    }
}
