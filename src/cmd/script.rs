//! Lua scripting as Redis has it: EVAL, EVALSHA, EVAL_RO, EVALSHA_RO and SCRIPT, so the
//! token-bucket scripts gateways already run work unchanged.
//!
//! A script runs on the shard that owns its keys, to completion, with nothing interleaved: the
//! shard runs it as one command. Each shard thread keeps one Lua 5.1 interpreter and the
//! scripts it has compiled. In a cluster the script's text and arguments go into the log, and
//! every replica runs it at the entry's time, so they all compute the same state:
//!
//! - `TIME` inside a script is the command's time (the entry's timestamp in a cluster);
//! - nothing that reads a random source, the clock, the file system, the network or the
//!   process is there to be called (`math.random`, `os`, `io`, `require`, `loadfile`...);
//! - a runaway script is stopped after a number of Lua instructions (the same count on every
//!   replica), not after a time that would differ between them.
//!
//! A script may only touch the keys it declares (`KEYS`), and only the commands that work on
//! keys (and `TIME`) can be called from it.

use super::keyed::{ExecStats, KeyCmd, Reply, encode, execute};
use super::table::{CommandSpec, Flags, Parser, command, lookup};
use super::{Finish, NodeCmd, ParseError, Parsed, Trailing, msg};
use crate::protocol::{ArgError, Args, ReplyWriter, Request};
use crate::rules::RuleSet;
use crate::store::Store;
use ahash::AHashMap;
use bytes::Bytes;
use mlua::{Lua, LuaOptions, StdLib, Value};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Mutex;

/// Lua instructions one script may run before it is stopped: about half a second of a busy
/// loop on a current core, far beyond any rate-limit script (which runs a few hundred).
pub(crate) const MAX_INSTRUCTIONS: u64 = 200_000_000;
/// How often, in instructions, the budget is checked.
const HOOK_EVERY: u32 = 10_000;
/// What one command a script calls takes from its budget, in instructions: a command costs
/// far more than a Lua instruction, and a loop of them must not run for minutes. A script
/// may still run 200,000 commands.
const COMMAND_COST: u64 = 1_000;
/// Memory one shard's interpreter may hold, for every script it runs and has compiled.
const LUA_MEMORY: usize = 64 * 1024 * 1024;
/// Compiled scripts one shard keeps; past it the cache starts over.
const MAX_COMPILED: usize = 10_000;
/// Largest script accepted, in bytes.
pub(crate) const MAX_SCRIPT_BYTES: usize = 1024 * 1024;
/// Scripts a node keeps for EVALSHA, at most, and their bytes: past either, the oldest half
/// is forgotten (a client that meets NOSCRIPT sends EVAL again).
const MAX_SCRIPTS: usize = 10_000;
const MAX_SCRIPTS_BYTES: usize = 64 * 1024 * 1024;

pub(super) const COMMANDS: &[CommandSpec] = &[
    command! {
        name: "eval",
        arity: -3,
        flags: ["noscript", "stale", "skip_monitor", "no_mandatory_keys", "movablekeys"],
        keys: (0, 0, 0),
        acl: ["@slow", "@scripting"],
        group: "scripting",
        summary: "Runs a Lua script: EVAL script numkeys key... arg...",
        parse: Parser::Key(parse_eval),
    },
    command! {
        name: "evalsha",
        arity: -3,
        flags: ["noscript", "stale", "skip_monitor", "no_mandatory_keys", "movablekeys"],
        keys: (0, 0, 0),
        acl: ["@slow", "@scripting"],
        group: "scripting",
        summary: "Runs a script loaded before, by its SHA1: EVALSHA sha1 numkeys key... arg...",
        parse: Parser::Key(parse_evalsha),
    },
    command! {
        name: "eval_ro",
        arity: -3,
        flags: ["readonly", "noscript", "stale", "skip_monitor", "no_mandatory_keys", "movablekeys"],
        keys: (0, 0, 0),
        acl: ["@slow", "@scripting"],
        group: "scripting",
        summary: "Runs a read-only Lua script: EVAL_RO script numkeys key... arg...",
        parse: Parser::Key(parse_eval_ro),
    },
    command! {
        name: "evalsha_ro",
        arity: -3,
        flags: ["readonly", "noscript", "stale", "skip_monitor", "no_mandatory_keys", "movablekeys"],
        keys: (0, 0, 0),
        acl: ["@slow", "@scripting"],
        group: "scripting",
        summary: "Runs a read-only script loaded before: EVALSHA_RO sha1 numkeys key... arg...",
        parse: Parser::Key(parse_evalsha_ro),
    },
    command! {
        name: "script",
        arity: -2,
        flags: ["noscript"],
        keys: (0, 0, 0),
        acl: ["@slow", "@scripting"],
        group: "scripting",
        summary: "The script cache: SCRIPT LOAD|EXISTS|FLUSH.",
        parse: Parser::Node(parse_script),
    },
];

/// A script to run, as it travels to a shard and into a cluster's log: its text, so every
/// replica can run it whether or not it was loaded there.
///
/// On-disk format: part of `KeyCmd::Eval` (golden bytes in tests/encoding.rs); fields are
/// append-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Eval {
    /// The SHA1 of `body`, in lower-case hex.
    pub sha: Bytes,
    /// The script's text; empty until the connection finds it for an EVALSHA.
    pub body: Bytes,
    pub keys: Vec<Bytes>,
    pub args: Vec<Bytes>,
    /// EVAL_RO and EVALSHA_RO: the script may not write.
    pub read_only: bool,
}

fn parse_eval(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    parse_script_call(a, false, false)
}

fn parse_evalsha(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    parse_script_call(a, true, false)
}

fn parse_eval_ro(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    parse_script_call(a, false, true)
}

fn parse_evalsha_ro(a: &mut Args, _: &RuleSet) -> Result<Parsed, ParseError> {
    parse_script_call(a, true, true)
}

fn parse_script_call(a: &mut Args, by_sha: bool, read_only: bool) -> Result<Parsed, ParseError> {
    let first = a.next_bytes()?;
    let n = a
        .next_i64()
        .map_err(|_| ArgError::Msg("ERR value is not an integer or out of range".into()))?;
    if n < 0 {
        return Err(ArgError::Msg("ERR Number of keys can't be negative".into()).into());
    }
    let n = usize::try_from(n).unwrap_or(usize::MAX);
    if n > a.remaining() {
        return Err(ArgError::Msg(
            "ERR Number of keys can't be greater than number of args".into(),
        )
        .into());
    }
    let keys: Vec<Bytes> = (0..n).map(|_| a.next_bytes()).collect::<Result<_, _>>()?;
    let args = a.rest();
    let (sha, body) = if by_sha {
        (Bytes::from(first.to_ascii_lowercase()), Bytes::new())
    } else {
        if first.len() > MAX_SCRIPT_BYTES {
            return Err(ArgError::Msg(format!(
                "ERR scripts are limited to {MAX_SCRIPT_BYTES} bytes"
            ))
            .into());
        }
        (sha1_hex(&first), first)
    };
    // A script with no keys runs on any shard; with keys, on the one that owns the first
    // (`KeyCmd::route_key`).
    Ok(Parsed::Keyed(KeyCmd::Eval(Box::new(Eval {
        sha,
        body,
        keys,
        args,
        read_only,
    }))))
}

/// SCRIPT LOAD|EXISTS|FLUSH, parsed.
pub enum ScriptCmd {
    Load(Bytes),
    Exists(Vec<Bytes>),
    Flush,
}

fn parse_script(a: &mut Args) -> Result<NodeCmd, ArgError> {
    let sub = a.next_keyword()?;
    let cmd = match sub.as_str() {
        "LOAD" => {
            let body = a.next_bytes()?;
            a.finish_as(Trailing::SubArity("script|load"))?;
            if body.len() > MAX_SCRIPT_BYTES {
                return Err(msg(format!(
                    "ERR scripts are limited to {MAX_SCRIPT_BYTES} bytes"
                )));
            }
            ScriptCmd::Load(body)
        }
        "EXISTS" => {
            let shas = a.rest();
            if shas.is_empty() {
                return Err(ArgError::WrongArity("script|exists".into()));
            }
            ScriptCmd::Exists(shas)
        }
        "FLUSH" => {
            // ASYNC and SYNC are the same here: the cache is small.
            if a.remaining() > 0 && !(a.next_is("ASYNC") || a.next_is("SYNC")) {
                return Err(msg("ERR SCRIPT FLUSH only support SYNC|ASYNC option"));
            }
            a.finish_as(Trailing::Syntax)?;
            ScriptCmd::Flush
        }
        other => {
            return Err(msg(format!(
                "ERR unknown subcommand '{other}'. Try SCRIPT HELP."
            )));
        }
    };
    Ok(NodeCmd::Script(cmd))
}

/// The scripts a node knows, for EVALSHA: loaded with SCRIPT LOAD or run once with EVAL.
#[derive(Default)]
pub(crate) struct ScriptCache {
    inner: Mutex<CacheInner>,
}

#[derive(Default)]
struct CacheInner {
    by_sha: AHashMap<Bytes, (Bytes, u64)>,
    bytes: usize,
    next: u64,
}

impl std::fmt::Debug for ScriptCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = crate::sync::lock(&self.inner);
        f.debug_struct("ScriptCache")
            .field("scripts", &c.by_sha.len())
            .field("bytes", &c.bytes)
            .finish()
    }
}

impl ScriptCache {
    pub(crate) fn get(&self, sha: &[u8]) -> Option<Bytes> {
        crate::sync::lock(&self.inner)
            .by_sha
            .get(sha)
            .map(|(b, _)| b.clone())
    }

    pub(crate) fn insert(&self, sha: Bytes, body: Bytes) {
        let mut c = crate::sync::lock(&self.inner);
        if c.by_sha.contains_key(&sha) {
            return;
        }
        if c.by_sha.len() >= MAX_SCRIPTS || c.bytes + body.len() > MAX_SCRIPTS_BYTES {
            // Forget the older half: scripts are few, and a forgotten one costs its client
            // one EVAL.
            let mut ages: Vec<u64> = c.by_sha.values().map(|(_, age)| *age).collect();
            ages.sort_unstable();
            let cut = ages.get(ages.len() / 2).copied().unwrap_or(0);
            c.by_sha.retain(|_, (_, age)| *age >= cut);
            c.bytes = c.by_sha.values().map(|(b, _)| b.len()).sum();
        }
        c.bytes += body.len();
        c.next += 1;
        let age = c.next;
        c.by_sha.insert(sha, (body, age));
    }

    pub(crate) fn clear(&self) {
        let mut c = crate::sync::lock(&self.inner);
        c.by_sha.clear();
        c.bytes = 0;
    }
}

/// The SHA1 of a script, in lower-case hex, as Redis names scripts.
pub(crate) fn sha1_hex(body: &[u8]) -> Bytes {
    use sha1::Digest;
    let d = sha1::Sha1::digest(body);
    let mut s = String::with_capacity(40);
    for b in d {
        s.push_str(&format!("{b:02x}"));
    }
    Bytes::from(s)
}

/// One shard thread's interpreter and the scripts it has compiled.
struct Engine {
    lua: Lua,
    compiled: AHashMap<Bytes, mlua::Function>,
    /// The message handler a script runs under.
    handler: mlua::Function,
    /// The script's line where its last error was raised (found by the handler).
    error_line: Rc<Cell<Option<usize>>>,
}

/// What `redis.call` and `redis.pcall` need while a script runs. They are C functions (a
/// command from a script then costs about what it costs Redis), so this is kept by the thread
/// rather than by them.
struct CallState {
    /// Instructions left to the script running now.
    budget: Cell<u64>,
    /// Set once the running script has been stopped: nothing in it may catch that.
    stopped: Cell<bool>,
    /// What the commands work on.
    running: Cell<Option<Running>>,
    /// The reply, or the error's text, that a call is handing to Lua. It lives here rather
    /// than on the call's own frame because a Lua error while it is pushed (out of memory)
    /// leaves that frame by longjmp, past any destructor.
    out: std::cell::UnsafeCell<Vec<u8>>,
    /// The error reply `redis.call` raised last: a script failing with it answers with it.
    raised: RefCell<Option<String>>,
}

thread_local! {
    static CALLS: CallState = const {
        CallState {
            budget: Cell::new(0),
            stopped: Cell::new(false),
            running: Cell::new(None),
            out: std::cell::UnsafeCell::new(Vec::new()),
            raised: RefCell::new(None),
        }
    };
}

/// What `redis.call` and `redis.pcall` reach while a script runs: set by `eval` for that run
/// only (see `RunningGuard`). They are created once per interpreter, not once per script.
#[derive(Clone, Copy)]
struct Running {
    store: *mut Store,
    stats: *mut ExecStats,
    eval: *const Eval,
    now: u64,
}

/// Clears `CallState::running` when the script's run ends, however it ends.
struct RunningGuard;

impl Drop for RunningGuard {
    fn drop(&mut self) {
        CALLS.with(|c| c.running.set(None));
    }
}

/// A library's error raised from Rust (cjson's), which a script sees as Redis raises it: a
/// plain string, with the caller's position as `luaL_error` writes it.
#[derive(Debug, Clone)]
pub(super) struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

impl Raised {
    /// A library's error raised from Rust: prefixed with the caller's position when a script
    /// called it (not when `pcall` did), as `luaL_error` does.
    pub(super) fn library(lua: &Lua, why: &str) -> mlua::Error {
        let text = match user_script_line(lua, 1) {
            Some(l) => format!("user_script:{l}: {why}"),
            None => why.to_string(),
        };
        mlua::Error::external(Raised(text))
    }

    fn find(err: &mlua::Error) -> Option<&Raised> {
        match err {
            mlua::Error::CallbackError { cause, .. } => Raised::find(cause),
            mlua::Error::ExternalError(e) => e.downcast_ref::<Raised>(),
            _ => None,
        }
    }
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
pcall = function(...)
  return checked(raw_pcall(...))
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
for _, name in ipairs({"redis", "cjson", "string", "math", "table"}) do
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
fn spend(c: &CallState, cost: u64) -> bool {
    match c.budget.get().checked_sub(cost) {
        Some(n) => {
            c.budget.set(n);
            true
        }
        None => {
            c.stopped.set(true);
            false
        }
    }
}

fn stop_message() -> String {
    format!("Script stopped: it ran past {MAX_INSTRUCTIONS} instructions")
}

/// What the Rust part of a call left in `CallState::out`.
#[derive(Clone, Copy)]
enum Outcome {
    /// A reply, in RESP2.
    Reply,
    /// An error reply's text.
    Error,
    /// The script's budget ran out: the text says so.
    Stop,
}

/// `redis.call`: raises an error reply, as its plain text.
unsafe extern "C-unwind" fn redis_call(state: *mut mlua::lua_State) -> std::ffi::c_int {
    // SAFETY: Lua calls this as a C function, with its live state.
    unsafe { raw_call(state, true) }
}

/// `redis.pcall`: hands an error reply back as an error table.
unsafe extern "C-unwind" fn redis_pcall(state: *mut mlua::lua_State) -> std::ffi::c_int {
    // SAFETY: Lua calls this as a C function, with its live state.
    unsafe { raw_call(state, false) }
}

/// One command from a script. Everything Rust owns is dropped before the first Lua call that
/// may raise (pushing the reply can run out of memory, and raising is a longjmp), so this
/// frame holds nothing to destroy when it is left that way.
///
/// # Safety
/// `state` must be the live state of a C function call.
unsafe fn raw_call(state: *mut mlua::lua_State, raise: bool) -> std::ffi::c_int {
    use mlua::ffi;
    let outcome = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the caller's contract.
        unsafe { call_from_lua(state) }
    })) {
        Ok(o) => o,
        Err(_) => {
            CALLS.with(|c| {
                // SAFETY: `out` is touched only by the call running now, on this thread.
                let out = unsafe { &mut *c.out.get() };
                out.clear();
                out.extend_from_slice(b"ERR internal error in a command called from a script");
            });
            Outcome::Error
        }
    };
    let out: *const Vec<u8> = CALLS.with(|c| c.out.get().cast_const());
    // SAFETY: `out` is left alone until the next call, and no Lua code can run while the
    // reply is pushed (scripts cannot make finalizers: `newproxy` is removed), so no call can
    // come in meanwhile.
    let out: &[u8] = unsafe { &*out };
    // SAFETY: the caller's contract; room is checked before each push.
    unsafe {
        match outcome {
            Outcome::Reply => {
                let base = ffi::lua_gettop(state);
                let mut at = 0;
                if push_resp(state, out, &mut at, 0).is_none() {
                    ffi::lua_settop(state, base);
                    ffi::lua_pushboolean(state, 0);
                }
                1
            }
            Outcome::Error if !raise => {
                ffi::luaL_checkstack(state, 2, std::ptr::null());
                ffi::lua_createtable(state, 0, 1);
                ffi::lua_pushlstring(state, out.as_ptr().cast(), out.len());
                ffi::lua_setfield(state, -2, c"err".as_ptr());
                1
            }
            Outcome::Error | Outcome::Stop => {
                ffi::luaL_checkstack(state, 1, std::ptr::null());
                ffi::lua_pushlstring(state, out.as_ptr().cast(), out.len());
                ffi::lua_error(state)
            }
        }
    }
}

/// The Rust part of a call: reads the arguments off the stack (which raises nothing), runs
/// the command and leaves its reply in `CallState::out`.
///
/// # Safety
/// `state` must be the live state of a C function call.
unsafe fn call_from_lua(state: *mut mlua::lua_State) -> Outcome {
    CALLS.with(|c| {
        // SAFETY: `out` is touched only by the call running now, on this thread.
        let out = unsafe { &mut *c.out.get() };
        out.clear();
        if !spend(c, COMMAND_COST) {
            out.extend_from_slice(stop_message().as_bytes());
            return Outcome::Stop;
        }
        let reply = match (c.running.get(), unsafe { request_from_stack(state) }) {
            (None, _) => Reply::err("ERR redis.call works only while a script runs"),
            (_, Err(why)) => Reply::Error(why.into()),
            // SAFETY: `running` holds these pointers only while `eval` runs a script (a
            // `RunningGuard` clears them), and `eval` holds the exclusive borrows they come
            // from without using them meanwhile. The interpreter is this thread's alone, and a
            // script cannot run another one (EVAL from a script is refused), so these are the
            // only references while they live.
            (Some(r), Ok(req)) => unsafe {
                call_command(&mut *r.store, &mut *r.stats, &*r.eval, req, r.now)
            },
        };
        match reply {
            Reply::Error(msg) => {
                out.extend_from_slice(msg.as_bytes());
                *c.raised.borrow_mut() = Some(msg.into_owned());
                Outcome::Error
            }
            r => {
                encode(&mut ReplyWriter::new(out, false), &r);
                Outcome::Reply
            }
        }
    })
}

/// `redis.call`'s arguments as a command: strings as they are, numbers as Redis formats them
/// (`%.17g`), all in one frame. Reads the stack only: nothing here can raise.
///
/// # Safety
/// `state` must be the live state of a C function call.
unsafe fn request_from_stack(state: *mut mlua::lua_State) -> Result<Request, String> {
    use mlua::ffi;
    // SAFETY: the caller's contract; every index is within the call's arguments.
    unsafe {
        let n = ffi::lua_gettop(state);
        if n <= 0 {
            return Err(
                "ERR Please specify at least one argument for this redis lib call".to_string(),
            );
        }
        let mut frame = Vec::with_capacity(64);
        let mut spans = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
        for i in 1..=n {
            let start = frame.len();
            match ffi::lua_type(state, i) {
                ffi::LUA_TSTRING => {
                    let mut len = 0usize;
                    let p = ffi::lua_tolstring(state, i, &mut len);
                    if !p.is_null() {
                        frame.extend_from_slice(std::slice::from_raw_parts(p.cast::<u8>(), len));
                    }
                }
                ffi::LUA_TNUMBER => write_g(&mut frame, ffi::lua_tonumber(state, i), 17),
                _ => {
                    return Err(
                        "ERR Lua redis lib command arguments must be strings or integers"
                            .to_string(),
                    );
                }
            }
            spans.push((start, frame.len()));
        }
        Ok(Request::from_frame(frame, &spans))
    }
}

/// The current line of the frame at `level` of the stack, if it is the script's own.
fn user_script_line(lua: &Lua, level: usize) -> Option<usize> {
    lua.inspect_stack(level, |d| {
        d.source()
            .source
            .is_some_and(|s| s.starts_with("@user_script"))
            .then(|| d.current_line())
            .flatten()
    })
    .flatten()
}

/// The line of the script frame nearest the top of the stack, if any.
fn script_line(lua: &Lua) -> Option<usize> {
    (1..64).find_map(|level| user_script_line(lua, level))
}

impl Engine {
    fn new() -> mlua::Result<Engine> {
        let lua = Lua::new_with(
            StdLib::TABLE | StdLib::STRING | StdLib::MATH,
            LuaOptions::default(),
        )?;
        lua.set_memory_limit(LUA_MEMORY)?;
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
        // Logging goes nowhere: a script must not make the node write what it likes.
        redis.set("log", lua.create_function(|_, _: mlua::MultiValue| Ok(()))?)?;
        for (name, level) in [
            ("LOG_DEBUG", 0),
            ("LOG_VERBOSE", 1),
            ("LOG_NOTICE", 2),
            ("LOG_WARNING", 3),
        ] {
            redis.set(name, level)?;
        }
        // SAFETY: both are C functions that keep to the Lua C API's rules (see `raw_call`).
        unsafe {
            redis.set("call", lua.create_c_function(redis_call)?)?;
            redis.set("pcall", lua.create_c_function(redis_pcall)?)?;
        }
        lua.globals().set("redis", redis)?;
        lua.globals().set("cjson", super::cjson::module(&lua)?)?;
        let hidden = lua.create_table()?;
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

    fn function(&mut self, sha: &Bytes, body: &[u8]) -> Result<mlua::Function, String> {
        if let Some(f) = self.compiled.get(sha) {
            return Ok(f.clone());
        }
        if body.is_empty() {
            return Err("NOSCRIPT No matching script. Please use EVAL.".into());
        }
        let f = compile(&self.lua, body)?;
        if self.compiled.len() >= MAX_COMPILED {
            self.compiled.clear();
        }
        self.compiled.insert(sha.clone(), f.clone());
        Ok(f)
    }
}

fn compile(lua: &Lua, body: &[u8]) -> Result<mlua::Function, String> {
    lua.load(body)
        .set_name("@user_script")
        .into_function()
        .map_err(|e| {
            format!(
                "ERR Error compiling script (new function): {}",
                lua_message(&e)
            )
        })
}

/// Whether a script compiles, on this thread's interpreter (SCRIPT LOAD).
pub(crate) fn check_compiles(body: &[u8]) -> Result<(), String> {
    with_engine(|e| compile(&e.lua, body).map(|_| ()))
}

fn with_engine<T>(f: impl FnOnce(&mut Engine) -> Result<T, String>) -> Result<T, String> {
    ENGINE.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(
                Engine::new().map_err(|e| format!("ERR the script engine did not start: {e}"))?,
            );
        }
        match slot.as_mut() {
            Some(e) => f(e),
            None => Err("ERR the script engine did not start".into()),
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

/// Runs a script on this shard's store, at `now`.
pub(super) fn eval(store: &mut Store, e: &Eval, now: u64, stats: &mut ExecStats) -> Reply {
    let result = with_engine(|engine| {
        let f = engine.function(&e.sha, &e.body)?;
        engine.error_line.set(None);
        let lua = &engine.lua;
        CALLS.with(|c| {
            c.budget.set(MAX_INSTRUCTIONS);
            c.stopped.set(false);
            *c.raised.borrow_mut() = None;
            c.running.set(Some(Running {
                store,
                stats,
                eval: e,
                now,
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
        let failure = match out {
            Ok((true, v)) => return Ok(lua_to_reply(&v, 0)),
            Ok((false, v)) => {
                let raised = CALLS.with(|c| c.raised.borrow_mut().take());
                failure(&v, engine.error_line.get(), raised.as_deref(), &e.sha)
            }
            Err(err) => script_error(&err, &e.sha),
        };
        // A script stopped part-way may leave a lot behind (one that ran out of memory,
        // everything): collect it now, not when the next script needs room.
        let _ = lua.gc_collect();
        Err(failure)
    });
    match result {
        Ok(r) => r,
        Err(msg) => Reply::Error(Cow::Owned(msg)),
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

fn c_int(n: usize) -> std::ffi::c_int {
    std::ffi::c_int::try_from(n).unwrap_or(std::ffi::c_int::MAX)
}

/// A number as C's `%.<precision>g` writes it (precision from 1 to 17).
pub(super) fn format_g(n: f64, precision: usize) -> String {
    let mut out = Vec::with_capacity(24);
    write_g(&mut out, n, precision);
    String::from_utf8_lossy(&out).into_owned()
}

/// Appends `n` as C's `%.<precision>g` (precision from 1 to 17): the C library's own
/// formatting, the one Redis uses.
fn write_g(out: &mut Vec<u8>, n: f64, precision: usize) {
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

/// Runs one command for a script, on the script's own keys only.
fn call_command(
    store: &mut Store,
    stats: &mut ExecStats,
    e: &Eval,
    req: Request,
    now: u64,
) -> Reply {
    let Some(spec) = lookup(req.name()) else {
        return Reply::err("ERR Unknown Redis command called from script");
    };
    if spec.name == "time" {
        let us = now / 1_000;
        return Reply::Array(vec![
            Reply::Bulk(Bytes::from((us / 1_000_000).to_string())),
            Reply::Bulk(Bytes::from((us % 1_000_000).to_string())),
        ]);
    }
    if e.read_only && spec.props.contains(Flags::WRITE) {
        return Reply::err("ERR Write commands are not allowed from read-only scripts.");
    }
    // Commands from scripts take inline limits only (no named rules), as they parse the same on
    // every replica; an empty set built once, not a hash map seeded per call.
    static NO_RULES: std::sync::OnceLock<RuleSet> = std::sync::OnceLock::new();
    let cmd = match super::parse(req, NO_RULES.get_or_init(RuleSet::default)) {
        Err(err) => return Reply::Error(err.message().into()),
        Ok(Parsed::Keyed(cmd)) => {
            if matches!(cmd, KeyCmd::Eval(_)) {
                return Reply::err("ERR This Redis command is not allowed from script");
            }
            if !e.keys.iter().any(|k| k[..] == *cmd.route_key()) {
                return undeclared();
            }
            cmd
        }
        Ok(Parsed::Multi(m)) => {
            if !m.keys().iter().all(|k| e.keys.contains(k)) {
                return undeclared();
            }
            m.into_key_cmd()
        }
        Ok(Parsed::Node(..)) => {
            return Reply::err("ERR This Redis command is not allowed from script");
        }
    };
    if matches!(
        cmd,
        KeyCmd::DbSize | KeyCmd::FlushAll | KeyCmd::Keys(_) | KeyCmd::Scan { .. }
    ) {
        return Reply::err("ERR This Redis command is not allowed from script");
    }
    execute(store, &cmd, now, stats)
}

fn undeclared() -> Reply {
    Reply::err("ERR Script attempted to access a key that was not declared in KEYS")
}

/// Pushes the RESP2 value at `b[*at..]` as Lua sees it: a status as `{ok=...}`, an error as
/// `{err=...}`, an integer as a number, a bulk string as a string, nil as false, an array as
/// a table. None (with whatever it pushed left for the caller to drop) on a malformed reply.
///
/// # Safety
/// `state` must be a live Lua state, in a protected call.
unsafe fn push_resp(
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
fn lua_to_reply(v: &Value, depth: usize) -> Reply {
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
