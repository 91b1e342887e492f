//! The Lua engine: each shard thread's interpreter, the scripts it has compiled, and the run
//! of one script against the shard's store, with its error reply in Redis 7's words.

use super::super::across::{ESCALATE, Stores};
use super::super::keyed::{ExecStats, Reply};
use super::Eval;
use super::convert::{c_int, format_g, lua_to_reply};
use super::lua_api::{
    CALLS, MAX_INSTRUCTIONS, Raised, Running, RunningGuard, redis_call, redis_pcall, script_line,
    spend, stop_message,
};
use super::redis_lib;
use crate::store::Store;
use ahash::AHashMap;
use bytes::Bytes;
use mlua::{Lua, LuaOptions, StdLib, Value};
use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// How often, in instructions, the budget is checked.
const HOOK_EVERY: u32 = 10_000;
/// Memory one shard's interpreter may hold, for every script it runs and has compiled.
const LUA_MEMORY: usize = 64 * 1024 * 1024;
/// Compiled scripts one shard keeps; past it the cache starts over.
const MAX_COMPILED: usize = 10_000;

/// Why a script did not compile or run; a client gets the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ScriptError {
    /// This thread's interpreter could not be made (with why, when known).
    EngineDown(Option<String>),
    /// An EVALSHA whose script this shard has not compiled and was not given.
    NoScript,
    /// Lua's complaint about the script's text.
    Compile(String),
    /// A script that ran and failed: its error reply, as Redis words it.
    Failed(String),
}

impl std::fmt::Display for ScriptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScriptError::EngineDown(Some(why)) => {
                write!(f, "ERR the script engine did not start: {why}")
            }
            ScriptError::EngineDown(None) => f.write_str("ERR the script engine did not start"),
            ScriptError::NoScript => f.write_str("NOSCRIPT No matching script. Please use EVAL."),
            ScriptError::Compile(why) => {
                write!(f, "ERR Error compiling script (new function): {why}")
            }
            ScriptError::Failed(reply) => f.write_str(reply),
        }
    }
}

impl std::error::Error for ScriptError {}

/// One shard thread's interpreter and the scripts it has compiled.
struct Engine {
    lua: Lua,
    compiled: AHashMap<Bytes, mlua::Function>,
    /// The message handler a script runs under.
    handler: mlua::Function,
    /// The script's line where its last error was raised (found by the handler).
    error_line: Rc<Cell<Option<usize>>>,
}

thread_local! {
    static ENGINE: RefCell<Option<Engine>> = const { RefCell::new(None) };
}

/// What a script sees besides its own globals, built once per interpreter. It is called with
/// a table only it keeps, holding `stopped` and `plain`.
///
/// - `pcall` and `xpcall` do not catch a script being stopped, and what they catch from
///   `redis.call` or `cjson` is the plain string Redis raises;
/// - the libraries and the globals are read-only.
const PRELUDE: &str = r#"
local hidden = ...
local error, type, rawget, rawset, setmetatable = error, type, rawget, rawset, setmetatable
local raw_pcall, raw_xpcall = pcall, xpcall
local stopped, plain = hidden.stopped, hidden.plain

local function checked(ok, ...)
  if ok then return ok, ... end
  if stopped() then error((...), 0) end
  return ok, plain((...))
end
-- Redis's pcall hands a caught error table (`{err=...}`) back as its message.
local function caught(ok, ...)
  if ok then return ok, ... end
  if stopped() then error((...), 0) end
  local e = plain((...))
  if type(e) == "table" then
    local m = rawget(e, "err")
    local t = type(m)
    if t == "string" or t == "number" then return ok, m end
  end
  return ok, e
end
pcall = function(...)
  return caught(raw_pcall(...))
end
xpcall = function(f, handler)
  return checked(raw_xpcall(f, function(e)
    if stopped() then return e end
    return handler(plain(e))
  end))
end

math.random = nil
math.randomseed = nil
newproxy = nil
loadfile = nil
dofile = nil
print = nil

local function readonly()
  error("Attempt to modify a readonly table", 2)
end
for _, name in ipairs({"redis", "cjson", "bit", "struct", "cmsgpack", "string", "math", "table"}) do
  local real = rawget(_G, name)
  rawset(_G, name, setmetatable({}, { __index = real, __newindex = readonly, __metatable = false }))
end
setmetatable(_G, {
  __newindex = readonly,
  __index = function(_, name)
    error("Script attempted to access nonexistent global variable '" .. tostring(name) .. "'", 2)
  end,
})
"#;

/// Takes `cost` instructions from the running script's budget; false when it has run out, and
/// the script is stopped (for good: `stopped` keeps `pcall` from catching it).
impl Engine {
    fn new() -> mlua::Result<Engine> {
        let lua = Lua::new_with(
            StdLib::TABLE | StdLib::STRING | StdLib::MATH,
            LuaOptions::default(),
        )?;
        lua.set_memory_limit(LUA_MEMORY)?;
        let redis = redis_lib::redis_table(&lua)?;
        // SAFETY: both are C functions that keep to the Lua C API's rules (see `raw_call`).
        unsafe {
            redis.set("call", lua.create_c_function(redis_call)?)?;
            redis.set("pcall", lua.create_c_function(redis_pcall)?)?;
        }
        lua.globals().set("redis", redis.clone())?;
        lua.globals().set("cjson", super::cjson::module(&lua)?)?;
        lua.globals().set("bit", super::bitop::module(&lua)?)?;
        lua.globals()
            .set("struct", super::structlib::module(&lua)?)?;
        lua.globals()
            .set("cmsgpack", super::msgpack::module(&lua)?)?;
        let hidden = lua.create_table()?;
        redis_lib::add_hidden(&lua, &hidden)?;
        lua.load(redis_lib::PRELUDE)
            .set_name("=prelude")
            .call::<()>((redis.clone(), hidden.clone()))?;
        hidden.set(
            "stopped",
            lua.create_function(|_, ()| Ok(CALLS.with(|c| c.stopped.get())))?,
        )?;
        hidden.set(
            "plain",
            lua.create_function(|lua, e: Value| {
                Ok(match &e {
                    Value::Error(err) => match Raised::find(err) {
                        Some(r) => Value::String(lua.create_string(r.to_string())?),
                        None => e,
                    },
                    _ => e,
                })
            })?,
        )?;

        lua.load(PRELUDE)
            .set_name("=prelude")
            .call::<()>(hidden.clone())?;
        let error_line = Rc::new(Cell::new(None));
        let line = error_line.clone();
        let handler = lua.create_function(move |lua, e: Value| {
            line.set(script_line(lua));
            Ok(e)
        })?;
        lua.set_hook(
            mlua::HookTriggers::new().every_nth_instruction(HOOK_EVERY),
            |_, _| {
                if CALLS.with(|c| spend(c, u64::from(HOOK_EVERY))) {
                    Ok(mlua::VmState::Continue)
                } else {
                    Err(mlua::Error::RuntimeError(stop_message()))
                }
            },
        )?;
        Ok(Engine {
            lua,
            compiled: AHashMap::new(),
            handler,
            error_line,
        })
    }

    fn function(&mut self, sha: &Bytes, body: &[u8]) -> Result<mlua::Function, ScriptError> {
        if let Some(f) = self.compiled.get(sha) {
            return Ok(f.clone());
        }
        if body.is_empty() {
            return Err(ScriptError::NoScript);
        }
        let f = compile(&self.lua, body)?;
        if self.compiled.len() >= MAX_COMPILED {
            self.compiled.clear();
        }
        self.compiled.insert(sha.clone(), f.clone());
        Ok(f)
    }
}

/// Compiles a script, without its shebang line (its line feed is kept, so lines keep their
/// numbers).
fn compile(lua: &Lua, body: &[u8]) -> Result<mlua::Function, ScriptError> {
    let (_, shebang_len) =
        super::shebang::read(body).map_err(|e| ScriptError::Failed(e.to_string()))?;
    lua.load(&body[shebang_len..])
        .set_name("@user_script")
        .into_function()
        .map_err(|e| ScriptError::Compile(lua_message(&e)))
}

/// Whether a script compiles, on this thread's interpreter (SCRIPT LOAD).
pub(crate) fn check_compiles(body: &[u8]) -> Result<(), ScriptError> {
    with_engine(|e| compile(&e.lua, body).map(|_| ()))
}

fn with_engine<T>(f: impl FnOnce(&mut Engine) -> Result<T, ScriptError>) -> Result<T, ScriptError> {
    ENGINE.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(Engine::new().map_err(|e| ScriptError::EngineDown(Some(e.to_string())))?);
        }
        match slot.as_mut() {
            Some(e) => f(e),
            None => Err(ScriptError::EngineDown(None)),
        }
    })
}

/// The text of a Lua error, without mlua's own decoration.
fn lua_message(e: &mlua::Error) -> String {
    match e {
        mlua::Error::SyntaxError { message, .. } => message.clone(),
        mlua::Error::RuntimeError(m) => m.clone(),
        mlua::Error::CallbackError { cause, .. } => lua_message(cause),
        mlua::Error::MemoryError(_) => "not enough memory".into(),
        other => other.to_string(),
    }
}

/// Runs a script on a cluster group's store, at `now` (its declared keys only).
pub(crate) fn eval(store: &mut Store, e: &Eval, now: u64, stats: &mut ExecStats) -> Reply {
    eval_in(&mut Stores::one(store, true), e, now, stats)
}

/// Runs a script on the stores it may reach, at `now`. A script that reaches a shard not
/// held before it has written anything answers `ESCALATE`: run it again with every shard.
pub(crate) fn eval_in(stores: &mut Stores<'_>, e: &Eval, now: u64, stats: &mut ExecStats) -> Reply {
    // A script whose shebang does not parse never compiles: `function` refuses it below.
    let flags = e.flags().unwrap_or_default();
    if e.read_only && flags.declares_writes() {
        return Reply::err("ERR Can not execute a script with write flag using *_ro command.");
    }
    // The lifetime is erased for the call state; the pointer lives only while this runs.
    let stores: *mut Stores<'_> = stores;
    let stores = stores.cast::<Stores<'static>>();
    let result = with_engine(|engine| {
        let f = engine.function(&e.sha, &e.body)?;
        engine.error_line.set(None);
        let lua = &engine.lua;
        CALLS.with(|c| {
            c.budget.set(MAX_INSTRUCTIONS);
            c.stopped.set(false);
            c.escalate.set(false);
            c.resp3.set(false);
            *c.raised.borrow_mut() = None;
            c.running.set(Some(Running {
                stores,
                stats,
                eval: e,
                now,
                read_only: e.read_only || flags.read_only(),
            }));
        });
        let guard = RunningGuard;
        // One protected call sets KEYS and ARGV and runs the script under its message handler,
        // leaving (whether it succeeded, its result or its error).
        // SAFETY: the stack holds the handler (1) and the script (2), as passed; the closure
        // checks for room before it pushes, and leaves exactly two values. A memory error while
        // setting KEYS or ARGV is raised inside exec_raw's protection and returned as an Err.
        let out = unsafe {
            lua.exec_raw::<(bool, Value)>((engine.handler.clone(), f), |state| {
                use mlua::ffi;
                set_global_list(state, c"KEYS", &e.keys);
                set_global_list(state, c"ARGV", &e.args);
                let status = ffi::lua_pcall(state, 0, 1, 1);
                ffi::lua_pushboolean(state, std::ffi::c_int::from(status == ffi::LUA_OK));
                ffi::lua_replace(state, 1);
            })
        };
        drop(guard);
        if CALLS.with(|c| c.escalate.get()) {
            return Ok(Reply::Error(Cow::Borrowed(ESCALATE)));
        }
        let failure = match out {
            Ok((true, v)) => {
                let resp3 = CALLS.with(|c| c.resp3.get());
                return Ok(lua_to_reply(&v, 0, resp3));
            }
            Ok((false, v)) => {
                let raised = CALLS.with(|c| c.raised.borrow_mut().take());
                failure(&v, engine.error_line.get(), raised.as_deref(), &e.sha)
            }
            Err(err) => script_error(&err, &e.sha),
        };
        // A script stopped part-way may leave a lot behind (one that ran out of memory,
        // everything): collect it now, not when the next script needs room.
        let _ = lua.gc_collect();
        Err(ScriptError::Failed(failure))
    });
    match result {
        Ok(r) => r,
        Err(e) => Reply::Error(Cow::Owned(e.to_string())),
    }
}

/// Where a failed script's error reply says it failed.
fn failed_at(sha: &Bytes, line: Option<usize>) -> String {
    let sha = String::from_utf8_lossy(sha);
    match line {
        Some(l) => format!("script: {sha}, on @user_script:{l}."),
        None => format!("script: {sha}, on @user_script."),
    }
}

/// An error's text as a failed script's reply carries it: its first line, `ERR ` once, then
/// where (the line given, or else the one Lua's `user_script:N:` prefix names).
fn error_text_reply(text: &str, line: Option<usize>, sha: &Bytes) -> String {
    let text = text.lines().next().unwrap_or("");
    let line = line.or_else(|| {
        text.strip_prefix("user_script:")
            .and_then(|t| t.split_once(':'))
            .and_then(|(n, _)| n.parse::<usize>().ok())
    });
    let text = text.strip_prefix("ERR ").unwrap_or(text);
    format!("ERR {text} {}", failed_at(sha, line))
}

/// The error reply of a script that failed with the error value `v`, raised at `line`.
fn failure(v: &Value, line: Option<usize>, raised: Option<&str>, sha: &Bytes) -> String {
    match v {
        Value::Error(err) => match Raised::find(err) {
            Some(Raised(text)) => error_text_reply(text, line, sha),
            None => script_error(err, sha),
        },
        Value::String(s) => {
            let bytes = s.as_bytes();
            let text = String::from_utf8_lossy(&bytes);
            // An error reply raised by redis.call goes back as it was.
            if raised == Some(&*text) {
                return format!("{text} {}", failed_at(sha, line));
            }
            error_text_reply(&text, line, sha)
        }
        Value::Table(t) => match t.raw_get::<Value>("err") {
            Ok(Value::String(e)) => {
                format!(
                    "{} {}",
                    String::from_utf8_lossy(&e.as_bytes()),
                    failed_at(sha, line)
                )
            }
            _ => format!(
                "ERR the script raised a table with no 'err' field {}",
                failed_at(sha, line)
            ),
        },
        Value::Number(n) => format!("ERR {} {}", format_g(*n, 14), failed_at(sha, line)),
        Value::Integer(n) => format!("ERR {n} {}", failed_at(sha, line)),
        Value::Nil => format!("ERR nil {}", failed_at(sha, line)),
        other => format!(
            "ERR the script raised a {} value {}",
            other.type_name(),
            failed_at(sha, line)
        ),
    }
}

/// The error reply of a script that failed in Rust or outside its own code, in Redis 7's words:
/// the error, then which script and line.
fn script_error(err: &mlua::Error, sha: &Bytes) -> String {
    error_text_reply(&lua_message(err), None, sha)
}

/// Sets the global `name` (raw: the globals are read-only to scripts) to a new array of
/// `items`.
///
/// # Safety
/// `state` must be a live Lua state, in a protected call (a memory error raises).
unsafe fn set_global_list(state: *mut mlua::lua_State, name: &std::ffi::CStr, items: &[Bytes]) {
    use mlua::ffi;
    // SAFETY: the caller's contract; three slots are used at most (name, table, item).
    unsafe {
        ffi::luaL_checkstack(state, 3, std::ptr::null());
        ffi::lua_pushstring(state, name.as_ptr());
        ffi::lua_createtable(state, c_int(items.len()), 0);
        for (i, item) in items.iter().enumerate() {
            ffi::lua_pushlstring(state, item.as_ptr().cast(), item.len());
            ffi::lua_rawseti(state, -2, i as ffi::lua_Integer + 1);
        }
        ffi::lua_rawset(state, ffi::LUA_GLOBALSINDEX);
    }
}
