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

/// Pushes the RESP value at `b[*at..]` as Lua sees it, as Redis 7 converts it.
///
/// RESP2: a status as `{ok=...}`, an error as `{err=...}`, an integer as a number, a bulk
/// string as a string, nil as false, an array as a table. RESP3 (after `redis.setresp(3)`):
/// null as nil, a boolean as a boolean, a map as `{map={k=v...}}`, a set as
/// `{set={member=true...}}`, a double as `{double=n}`, a big number as `{big_number="..."}`,
/// a verbatim string as `{verbatim_string={format=..., string=...}}`; attributes are skipped.
/// None (with whatever it pushed left for the caller to drop) on a malformed reply.
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
    let count = || -> Option<usize> { usize::try_from(int()?).ok() };
    // SAFETY: the caller's contract; each level uses at most five slots, checked first.
    unsafe {
        ffi::luaL_checkstack(state, 5, std::ptr::null());
        match tag {
            b'+' | b'-' => {
                ffi::lua_createtable(state, 0, 1);
                ffi::lua_pushlstring(state, line.as_ptr().cast(), line.len());
                let field = if tag == b'+' { c"ok" } else { c"err" };
                ffi::lua_setfield(state, -2, field.as_ptr());
            }
            b':' => ffi::lua_pushnumber(state, int()? as f64),
            b'$' | b'=' => {
                let n = int()?;
                if n < 0 {
                    ffi::lua_pushboolean(state, 0);
                    return Some(());
                }
                let n = usize::try_from(n).ok()?;
                let data = b.get(*at..*at + n)?;
                *at += n + 2;
                if tag == b'$' {
                    ffi::lua_pushlstring(state, data.as_ptr().cast(), data.len());
                } else {
                    let (format, text) = (data.get(..3)?, data.get(4..)?);
                    ffi::lua_createtable(state, 0, 1);
                    ffi::lua_createtable(state, 0, 2);
                    ffi::lua_pushlstring(state, text.as_ptr().cast(), text.len());
                    ffi::lua_setfield(state, -2, c"string".as_ptr());
                    ffi::lua_pushlstring(state, format.as_ptr().cast(), format.len());
                    ffi::lua_setfield(state, -2, c"format".as_ptr());
                    ffi::lua_setfield(state, -2, c"verbatim_string".as_ptr());
                }
            }
            b'_' => ffi::lua_pushnil(state),
            b'#' => ffi::lua_pushboolean(state, std::ffi::c_int::from(line == b"t")),
            b',' => {
                let n: f64 = std::str::from_utf8(line).ok()?.parse().ok()?;
                ffi::lua_createtable(state, 0, 1);
                ffi::lua_pushnumber(state, n);
                ffi::lua_setfield(state, -2, c"double".as_ptr());
            }
            b'(' => {
                ffi::lua_createtable(state, 0, 1);
                ffi::lua_pushlstring(state, line.as_ptr().cast(), line.len());
                ffi::lua_setfield(state, -2, c"big_number".as_ptr());
            }
            b'*' if int()? < 0 => ffi::lua_pushboolean(state, 0),
            _ if depth >= 64 => return None,
            b'*' => {
                let n = count()?;
                ffi::lua_createtable(state, c_int(n.min(1024)), 0);
                for i in 1..=n {
                    push_resp(state, b, at, depth + 1)?;
                    ffi::lua_rawseti(state, -2, i as ffi::lua_Integer);
                }
            }
            b'%' | b'~' => {
                let n = count()?;
                let field = if tag == b'%' { c"map" } else { c"set" };
                ffi::lua_createtable(state, 0, 1);
                ffi::lua_createtable(state, 0, c_int(n.min(1024)));
                for _ in 0..n {
                    push_resp(state, b, at, depth + 1)?;
                    if tag == b'%' {
                        push_resp(state, b, at, depth + 1)?;
                    } else {
                        ffi::lua_pushboolean(state, 1);
                    }
                    set_pair(state);
                }
                ffi::lua_setfield(state, -2, field.as_ptr());
            }
            b'|' => {
                // Attributes are read past: scripts do not see them.
                let n = count()?;
                let base = ffi::lua_gettop(state);
                for _ in 0..n {
                    push_resp(state, b, at, depth + 1)?;
                    push_resp(state, b, at, depth + 1)?;
                    ffi::lua_settop(state, base);
                }
                push_resp(state, b, at, depth + 1)?;
            }
            _ => return None,
        }
    }
    Some(())
}

/// Sets key (at -2) to value (at -1) in the table below them, and pops both; a pair whose key
/// no table can hold (nil, NaN) is dropped instead of raising.
///
/// # Safety
/// `state` must be a live Lua state with a table under two values.
unsafe fn set_pair(state: *mut mlua::lua_State) {
    use mlua::ffi;
    // SAFETY: the caller's contract.
    unsafe {
        let key_ok = match ffi::lua_type(state, -2) {
            ffi::LUA_TNIL => false,
            ffi::LUA_TNUMBER => !ffi::lua_tonumber(state, -2).is_nan(),
            _ => true,
        };
        if key_ok {
            ffi::lua_rawset(state, -3);
        } else {
            ffi::lua_settop(state, -3);
        }
    }
}

/// A script's return value as a reply, by Redis 7's rules: numbers truncated to integers, nil
/// as nil, a table as an array up to its first nil, and the tables that stand for other
/// replies (`{err=...}`, `{ok=...}`, `{double=...}`, `{big_number=...}`,
/// `{verbatim_string=...}`, `{map=...}`, `{set=...}`, looked for in that order). Booleans
/// follow the protocol the script chose with `redis.setresp`: in RESP2 true is 1 and false
/// nil, in RESP3 they are booleans.
pub(super) fn lua_to_reply(v: &Value, depth: usize, resp3: bool) -> Reply {
    match v {
        Value::Nil => Reply::Nil,
        Value::Boolean(b) if resp3 => Reply::Bool(*b),
        Value::Boolean(false) => Reply::Nil,
        Value::Boolean(true) => Reply::Int(1),
        Value::Integer(i) => Reply::Int(*i),
        Value::Number(n) => Reply::Int(*n as i64),
        Value::String(s) => Reply::Bulk(Bytes::copy_from_slice(&s.as_bytes())),
        Value::Table(t) if depth < 64 => table_to_reply(t, depth, resp3),
        _ => Reply::Nil,
    }
}

fn table_to_reply(t: &mlua::Table, depth: usize, resp3: bool) -> Reply {
    let field = |name: &str| t.raw_get::<Value>(name).unwrap_or(Value::Nil);
    let text = |s: &mlua::LuaString| String::from_utf8_lossy(&s.as_bytes()).into_owned();
    if let Value::String(e) = field("err") {
        return Reply::Error(text(&e).into());
    }
    if let Value::String(s) = field("ok") {
        return Reply::Simple(text(&s).into());
    }
    match field("double") {
        Value::Number(n) => return Reply::Double(double_text(n)),
        Value::Integer(n) => return Reply::Double(double_text(n as f64)),
        _ => {}
    }
    if let Value::String(s) = field("big_number") {
        // A big number is one line: line breaks become spaces, as Redis does.
        let digits: Vec<u8> = s
            .as_bytes()
            .iter()
            .map(|&c| if c == b'\r' || c == b'\n' { b' ' } else { c })
            .collect();
        return Reply::BigNumber(Bytes::from(digits));
    }
    if let Value::Table(v) = field("verbatim_string")
        && let (Ok(Value::String(format)), Ok(Value::String(text))) =
            (v.raw_get::<Value>("format"), v.raw_get::<Value>("string"))
    {
        // The format is three bytes, padded with spaces when shorter.
        let mut f = [b' '; 3];
        for (slot, &c) in f.iter_mut().zip(format.as_bytes().iter()) {
            *slot = c;
        }
        return Reply::Verbatim(f, Bytes::copy_from_slice(&text.as_bytes()));
    }
    if let Value::Table(m) = field("map") {
        let pairs = m
            .pairs::<Value, Value>()
            .filter_map(Result::ok)
            .map(|(k, v)| {
                (
                    lua_to_reply(&k, depth + 1, resp3),
                    lua_to_reply(&v, depth + 1, resp3),
                )
            })
            .collect();
        return Reply::Map(pairs);
    }
    if let Value::Table(m) = field("set") {
        let items = m
            .pairs::<Value, Value>()
            .filter_map(Result::ok)
            .map(|(k, _)| lua_to_reply(&k, depth + 1, resp3))
            .collect();
        return Reply::Set(items);
    }
    let mut items = Vec::new();
    for i in 1.. {
        match t.raw_get::<Value>(i) {
            Ok(Value::Nil) | Err(_) => break,
            Ok(v) => items.push(lua_to_reply(&v, depth + 1, resp3)),
        }
    }
    Reply::Array(items)
}

/// A double as Redis writes it in a reply: `%.17g`, and infinities as `inf` and `-inf`.
fn double_text(n: f64) -> Bytes {
    if n.is_infinite() {
        return Bytes::from_static(if n > 0.0 { b"inf" } else { b"-inf" });
    }
    let mut out = Vec::with_capacity(24);
    write_g(&mut out, n, 17);
    Bytes::from(out)
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
