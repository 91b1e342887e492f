//! Arguments of the libraries written in Rust (`bit`, `struct`, `cmsgpack`), read as the Lua
//! 5.1 C API reads them, with its error texts (`bad argument #1 to 'pack' (number expected,
//! got nil)`), raised as `luaL_error` raises them.

use super::lua_api::Raised;
use mlua::{Lua, Value};

/// A value's type as Lua 5.1's `luaL_typename` names it; "no value" past the last argument.
pub(super) fn type_name(v: Option<&Value>) -> &'static str {
    match v {
        None => "no value",
        Some(Value::Nil) => "nil",
        Some(Value::Boolean(_)) => "boolean",
        Some(Value::Integer(_) | Value::Number(_)) => "number",
        Some(Value::String(_)) => "string",
        Some(Value::Table(_)) => "table",
        Some(Value::Function(_)) => "function",
        Some(Value::Thread(_)) => "thread",
        Some(_) => "userdata",
    }
}

/// `luaL_argerror`: the error for argument `n` of `function`.
pub(super) fn arg_error(lua: &Lua, n: usize, function: &str, why: &str) -> mlua::Error {
    Raised::library(lua, &format!("bad argument #{n} to '{function}' ({why})"))
}

/// `luaL_typerror`: argument `n` is not of the type `expected`.
pub(super) fn type_error(
    lua: &Lua,
    args: &[Value],
    n: usize,
    function: &str,
    expected: &str,
) -> mlua::Error {
    let got = type_name(args.get(n - 1));
    arg_error(lua, n, function, &format!("{expected} expected, got {got}"))
}

/// `lua_tonumber`: a number, or a string that reads as one.
pub(super) fn to_number(lua: &Lua, v: Option<&Value>) -> Option<f64> {
    match v? {
        Value::Integer(i) => Some(*i as f64),
        Value::Number(n) => Some(*n),
        s @ Value::String(_) => lua.coerce_number(s.clone()).ok().flatten(),
        _ => None,
    }
}

/// `luaL_checknumber` on argument `n` (from 1).
pub(super) fn check_number(
    lua: &Lua,
    args: &[Value],
    n: usize,
    function: &str,
) -> mlua::Result<f64> {
    to_number(lua, args.get(n - 1)).ok_or_else(|| type_error(lua, args, n, function, "number"))
}

/// `luaL_checkinteger` on argument `n` (from 1): the number, cut toward zero.
pub(super) fn check_integer(
    lua: &Lua,
    args: &[Value],
    n: usize,
    function: &str,
) -> mlua::Result<i64> {
    check_number(lua, args, n, function).map(|x| x as i64)
}

/// `luaL_optinteger` on argument `n` (from 1): `default` when it is absent or nil.
pub(super) fn opt_integer(
    lua: &Lua,
    args: &[Value],
    n: usize,
    function: &str,
    default: i64,
) -> mlua::Result<i64> {
    match args.get(n - 1) {
        None | Some(Value::Nil) => Ok(default),
        Some(_) => check_integer(lua, args, n, function),
    }
}

/// `luaL_checklstring` on argument `n` (from 1): a string, or a number as Lua writes it.
pub(super) fn check_bytes(
    lua: &Lua,
    args: &[Value],
    n: usize,
    function: &str,
) -> mlua::Result<Vec<u8>> {
    match args.get(n - 1) {
        Some(Value::String(s)) => Ok(s.as_bytes().to_vec()),
        Some(Value::Integer(i)) => Ok(super::convert::format_g(*i as f64, 14).into_bytes()),
        Some(Value::Number(x)) => Ok(super::convert::format_g(*x, 14).into_bytes()),
        _ => Err(type_error(lua, args, n, function, "string")),
    }
}
