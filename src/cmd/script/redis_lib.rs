//! The `redis` table a script sees, besides `redis.call` and `redis.pcall`: Redis 7's helpers
//! (`error_reply`, `status_reply`, `sha1hex`, `log`, `setresp`, `set_repl`,
//! `replicate_commands`, `breakpoint`, `debug`) and constants (`LOG_*`, `REPL_*`,
//! `REDIS_VERSION`, `REDIS_VERSION_NUM`).
//!
//! The helpers that check their arguments are written in Lua (`PRELUDE`), because Redis
//! raises their errors as error tables (`{err="ERR ..."}`), which `pcall` hands to the script
//! as tables; they call the Rust functions of `hidden` once the arguments are good.
//!
//! Nothing here makes a run differ between replicas: `set_repl` changes nothing (the whole
//! script is replicated, not the commands it calls), `log` only writes the node's log, and
//! `breakpoint` and `debug` do nothing, as they do in Redis outside its debugger.

use super::lua_api::CALLS;
use super::sha1_hex;
use mlua::{Lua, Table, Value};

/// The Redis version scripts see in `redis.REDIS_VERSION`, and the one INFO reports.
pub(crate) const REDIS_VERSION: &str = "7.2.0";

/// The longest message `redis.log` writes; the rest is cut, so a script cannot flood the log
/// with one call.
const MAX_LOG_MESSAGE: usize = 4096;

/// `REDIS_VERSION` as Redis numbers it: `0x00MMmmpp` (major, minor, patch).
pub(super) fn version_num(version: &str) -> u32 {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let mut next = || parts.next().unwrap_or(0).min(0xff);
    let (major, minor, patch) = (next(), next(), next());
    (major << 16) | (minor << 8) | patch
}

/// Builds the `redis` table (without `call` and `pcall`, which the engine adds).
pub(super) fn redis_table(lua: &Lua) -> mlua::Result<Table> {
    let redis = lua.create_table()?;
    redis.set(
        "error_reply",
        lua.create_function(|lua, e: mlua::LuaString| {
            let t = lua.create_table()?;
            t.set("err", e)?;
            Ok(t)
        })?,
    )?;
    redis.set(
        "status_reply",
        lua.create_function(|lua, s: mlua::LuaString| {
            let t = lua.create_table()?;
            t.set("ok", s)?;
            Ok(t)
        })?,
    )?;
    redis.set(
        "sha1hex",
        lua.create_function(|_, s: mlua::LuaString| {
            Ok(String::from_utf8_lossy(&sha1_hex(&s.as_bytes())).into_owned())
        })?,
    )?;
    redis.set(
        "replicate_commands",
        lua.create_function(|_, _: mlua::MultiValue| Ok(true))?,
    )?;
    redis.set(
        "breakpoint",
        lua.create_function(|_, _: mlua::MultiValue| Ok(false))?,
    )?;
    redis.set(
        "debug",
        lua.create_function(|_, _: mlua::MultiValue| Ok(()))?,
    )?;
    for (name, value) in [
        ("LOG_DEBUG", 0),
        ("LOG_VERBOSE", 1),
        ("LOG_NOTICE", 2),
        ("LOG_WARNING", 3),
        ("REPL_NONE", 0),
        ("REPL_AOF", 1),
        ("REPL_SLAVE", 2),
        ("REPL_REPLICA", 2),
        ("REPL_ALL", 3),
    ] {
        redis.set(name, value)?;
    }
    redis.set("REDIS_VERSION", REDIS_VERSION)?;
    redis.set("REDIS_VERSION_NUM", version_num(REDIS_VERSION))?;
    Ok(redis)
}

/// Adds to `hidden` (the table only the prelude sees) what the Lua helpers call once their
/// arguments are checked.
pub(super) fn add_hidden(lua: &Lua, hidden: &Table) -> mlua::Result<()> {
    hidden.set(
        "setresp",
        lua.create_function(|_, resp: i64| {
            CALLS.with(|c| c.resp3.set(resp == 3));
            Ok(())
        })?,
    )?;
    hidden.set(
        "log",
        lua.create_function(|_, (level, words): (i64, mlua::Variadic<Value>)| {
            log(level, &words);
            Ok(())
        })?,
    )?;
    Ok(())
}

/// Writes a script's `redis.log` line to the node's log: its words (strings and numbers;
/// other values are skipped) joined by spaces, as Redis glues them.
fn log(level: i64, words: &[Value]) {
    let enabled = match level {
        0 | 1 => tracing::enabled!(target: "script", tracing::Level::DEBUG),
        2 => tracing::enabled!(target: "script", tracing::Level::INFO),
        _ => tracing::enabled!(target: "script", tracing::Level::WARN),
    };
    if !enabled {
        return;
    }
    let mut line = Vec::new();
    for (i, w) in words.iter().enumerate() {
        let text = match w {
            Value::String(s) => s.as_bytes().to_vec(),
            Value::Integer(n) => n.to_string().into_bytes(),
            Value::Number(n) => super::convert::format_g(*n, 14).into_bytes(),
            _ => continue,
        };
        if i != 0 {
            line.push(b' ');
        }
        line.extend_from_slice(&text);
        if line.len() >= MAX_LOG_MESSAGE {
            line.truncate(MAX_LOG_MESSAGE);
            break;
        }
    }
    let line = String::from_utf8_lossy(&line);
    match level {
        0 | 1 => tracing::debug!(target: "script", "{line}"),
        2 => tracing::info!(target: "script", "{line}"),
        _ => tracing::warn!(target: "script", "{line}"),
    }
}

/// The Lua half of the helpers that check their arguments, run once per interpreter with the
/// `redis` table and `hidden`, before either is made read-only. Their checks and error texts
/// are Redis 7's: a number is read as `lua_tonumber` reads it (anything else is 0) and cut to
/// an integer as C's `(int)` cuts it.
pub(super) const PRELUDE: &str = r##"
local redis, hidden = ...
local error, select, tonumber, type = error, select, tonumber, type
local floor, ceil = math.floor, math.ceil
local set_resp, write_log = hidden.setresp, hidden.log

local function c_int(v)
  local n = tonumber(v) or 0
  -- What x86 gives for a double no int holds (NaN too): INT_MIN.
  if n ~= n or n >= 2147483648 or n <= -2147483649 then return -2147483648 end
  if n >= 0 then return floor(n) end
  return ceil(n)
end

redis.set_repl = function(...)
  if select("#", ...) ~= 1 then
    error({ err = "ERR redis.set_repl() requires two arguments." })
  end
  local flags = c_int((...))
  if flags < 0 or flags > 3 then
    error({ err = "ERR Invalid replication flags. Use REPL_AOF, REPL_REPLICA, REPL_ALL or REPL_NONE." })
  end
end

redis.setresp = function(...)
  if select("#", ...) ~= 1 then
    error({ err = "ERR redis.setresp() requires one argument." })
  end
  local resp = c_int((...))
  if resp ~= 2 and resp ~= 3 then
    error({ err = "ERR RESP version must be 2 or 3." })
  end
  set_resp(resp)
end

redis.log = function(...)
  local argc = select("#", ...)
  if argc < 2 then
    error({ err = "ERR redis.log() requires two arguments or more." })
  end
  if tonumber((...)) == nil then
    error({ err = "ERR First argument must be a number (log level)." })
  end
  local level = c_int((...))
  if level < 0 or level > 3 then
    error({ err = "ERR Invalid debug level." })
  end
  write_log(level, select(2, ...))
end
"##;

#[cfg(test)]
mod tests {
    use super::version_num;

    #[test]
    fn versions_are_numbered_as_redis_numbers_them() {
        assert_eq!(version_num("7.0.15"), 0x0007_000f);
        assert_eq!(version_num("7.2.0"), 0x0007_0200);
        assert_eq!(version_num("6.2"), 0x0006_0200);
    }
}
