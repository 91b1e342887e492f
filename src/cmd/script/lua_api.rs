//! What a script can call: `redis.call` and `redis.pcall` (C functions, so a command from a
//! script costs about what it costs Redis), the state they reach while a script runs, its
//! instruction budget, and the errors libraries raise as Redis raises them.

use super::super::across::{ESCALATE, NEEDS_NODE, Stores, is_escalate};
use super::super::keyed::{ExecStats, KeyCmd, Reply, encode};
use super::super::server::ServerCmd;
use super::super::table::{Flags, lookup};
use super::super::{NodeCmd, Parsed};
use super::Eval;
use super::convert::{push_resp, write_g};
use crate::protocol::{ReplyWriter, Request};
use crate::rules::RuleSet;
use bytes::Bytes;
use mlua::Lua;
use std::cell::{Cell, RefCell};

/// Lua instructions one script may run before it is stopped: about half a second of a busy
/// loop on a current core, far beyond any rate-limit script (which runs a few hundred).
pub(super) const MAX_INSTRUCTIONS: u64 = 200_000_000;
/// What one command a script calls takes from its budget, in instructions: a command costs
/// far more than a Lua instruction, and a loop of them must not run for minutes. A script
/// may still run 200,000 commands.
const COMMAND_COST: u64 = 1_000;

/// What `redis.call` and `redis.pcall` need while a script runs. They are C functions (a
/// command from a script then costs about what it costs Redis), so this is kept by the thread
/// rather than by them.
pub(super) struct CallState {
    /// Instructions left to the script running now.
    pub(super) budget: Cell<u64>,
    /// Set once the running script has been stopped: nothing in it may catch that.
    pub(super) stopped: Cell<bool>,
    /// Set when the script was stopped because it reached keys of a shard not held, before
    /// writing anything: it is run again with every shard held.
    pub(super) escalate: Cell<bool>,
    /// What the commands work on.
    pub(super) running: Cell<Option<Running>>,
    /// The reply, or the error's text, that a call is handing to Lua. It lives here rather
    /// than on the call's own frame because a Lua error while it is pushed (out of memory)
    /// leaves that frame by longjmp, past any destructor.
    pub(super) out: std::cell::UnsafeCell<Vec<u8>>,
    /// The error reply `redis.call` raised last: a script failing with it answers with it.
    pub(super) raised: RefCell<Option<String>>,
    /// The running script chose RESP3 (`redis.setresp(3)`) for the replies of its calls.
    pub(super) resp3: Cell<bool>,
}

thread_local! {
    pub(super) static CALLS: CallState = const {
        CallState {
            budget: Cell::new(0),
            stopped: Cell::new(false),
            escalate: Cell::new(false),
            running: Cell::new(None),
            out: std::cell::UnsafeCell::new(Vec::new()),
            raised: RefCell::new(None),
            resp3: Cell::new(false),
        }
    };
}

/// What `redis.call` and `redis.pcall` reach while a script runs: set by `eval` for that run
/// only (see `RunningGuard`). They are created once per interpreter, not once per script.
#[derive(Clone, Copy)]
pub(super) struct Running {
    /// The stores the script reaches (lifetime erased: valid while the script runs).
    pub(super) stores: *mut Stores<'static>,
    pub(super) stats: *mut ExecStats,
    pub(super) eval: *const Eval,
    pub(super) now: u64,
    /// Write commands are refused: EVAL_RO, or a script whose shebang says `no-writes`.
    pub(super) read_only: bool,
}

/// Clears `CallState::running` when the script's run ends, however it ends.
pub(super) struct RunningGuard;

impl Drop for RunningGuard {
    fn drop(&mut self) {
        CALLS.with(|c| c.running.set(None));
    }
}

/// A library's error raised from Rust (cjson's), which a script sees as Redis raises it: a
/// plain string, with the caller's position as `luaL_error` writes it.
#[derive(Debug, Clone)]
pub(super) struct Raised(pub(super) String);

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

    pub(super) fn find(err: &mlua::Error) -> Option<&Raised> {
        match err {
            mlua::Error::CallbackError { cause, .. } => Raised::find(cause),
            mlua::Error::ExternalError(e) => e.downcast_ref::<Raised>(),
            _ => None,
        }
    }
}

pub(super) fn spend(c: &CallState, cost: u64) -> bool {
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

pub(super) fn stop_message() -> String {
    format!("Script stopped: it ran past {MAX_INSTRUCTIONS} instructions")
}

/// What the Rust part of a call left in `CallState::out`.
#[derive(Clone, Copy)]
enum Outcome {
    /// A reply, in the protocol the script chose (`redis.setresp`).
    Reply,
    /// An error reply's text.
    Error,
    /// The script's budget ran out: the text says so.
    Stop,
}

/// `redis.call`: raises an error reply, as its plain text.
pub(super) unsafe extern "C-unwind" fn redis_call(state: *mut mlua::lua_State) -> std::ffi::c_int {
    // SAFETY: Lua calls this as a C function, with its live state.
    unsafe { raw_call(state, true) }
}

/// `redis.pcall`: hands an error reply back as an error table.
pub(super) unsafe extern "C-unwind" fn redis_pcall(state: *mut mlua::lua_State) -> std::ffi::c_int {
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
            (_, Err(why)) => Reply::err(why.message()),
            // SAFETY: `running` holds these pointers only while `eval` runs a script (a
            // `RunningGuard` clears them), and `eval` holds the exclusive borrows they come
            // from without using them meanwhile. The interpreter is this thread's alone, and a
            // script cannot run another one (EVAL from a script is refused), so these are the
            // only references while they live.
            (Some(r), Ok(req)) => unsafe {
                call_command(
                    &mut *r.stores,
                    &mut *r.stats,
                    &*r.eval,
                    req,
                    r.now,
                    r.read_only,
                )
            },
        };
        if is_escalate(&reply) {
            c.stopped.set(true);
            c.escalate.set(true);
            out.extend_from_slice(ESCALATE.as_bytes());
            return Outcome::Stop;
        }
        match reply {
            Reply::Error(msg) => {
                out.extend_from_slice(msg.as_bytes());
                *c.raised.borrow_mut() = Some(msg.into_owned());
                Outcome::Error
            }
            r => {
                encode(&mut ReplyWriter::new(out, c.resp3.get()), &r);
                Outcome::Reply
            }
        }
    })
}

/// Why `redis.call`'s arguments make no command.
#[derive(Debug, Clone, Copy)]
enum CallArgsError {
    Missing,
    NotStringOrNumber,
}

impl CallArgsError {
    fn message(self) -> &'static str {
        match self {
            CallArgsError::Missing => {
                "ERR Please specify at least one argument for this redis lib call"
            }
            CallArgsError::NotStringOrNumber => {
                "ERR Lua redis lib command arguments must be strings or integers"
            }
        }
    }
}

/// `redis.call`'s arguments as a command: strings as they are, numbers as Redis formats them
/// (`%.17g`), all in one frame. Reads the stack only: nothing here can raise.
///
/// # Safety
/// `state` must be the live state of a C function call.
unsafe fn request_from_stack(state: *mut mlua::lua_State) -> Result<Request, CallArgsError> {
    use mlua::ffi;
    // SAFETY: the caller's contract; every index is within the call's arguments.
    unsafe {
        let n = ffi::lua_gettop(state);
        if n <= 0 {
            return Err(CallArgsError::Missing);
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
                    return Err(CallArgsError::NotStringOrNumber);
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
pub(super) fn script_line(lua: &Lua) -> Option<usize> {
    (1..64).find_map(|level| user_script_line(lua, level))
}

/// Runs one command for a script. In a cluster, on the script's own keys only; on a standalone
/// node, on any key, and KEYS and DBSIZE over the whole keyspace, as Redis allows.
fn call_command(
    stores: &mut Stores<'_>,
    stats: &mut ExecStats,
    e: &Eval,
    req: Request,
    now: u64,
    read_only: bool,
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
    if read_only && spec.props.contains(Flags::WRITE) {
        return Reply::err("ERR Write commands are not allowed from read-only scripts.");
    }
    // Commands from scripts take inline limits only (no named rules), as they parse the same on
    // every replica; an empty set built once, not a hash map seeded per call.
    static NO_RULES: std::sync::OnceLock<RuleSet> = std::sync::OnceLock::new();
    let declared_only = stores.declared_only();
    let cmd = match super::super::parse(req, NO_RULES.get_or_init(RuleSet::default)) {
        Err(err) => return Reply::Error(err.message().into()),
        Ok(Parsed::Keyed(cmd)) => {
            if matches!(cmd, KeyCmd::Eval(_)) {
                return Reply::err("ERR This Redis command is not allowed from script");
            }
            if declared_only && !e.keys.iter().any(|k| k[..] == *cmd.route_key()) {
                return undeclared();
            }
            cmd
        }
        Ok(Parsed::Multi(m)) => {
            if declared_only && !m.keys().iter().all(|k| e.keys.contains(k)) {
                return undeclared();
            }
            m.into_key_cmd()
        }
        // The keyspace as a whole, which a standalone node's script may read.
        Ok(Parsed::Node(_, Ok(NodeCmd::Server(ServerCmd::Keys(pattern))))) if !declared_only => {
            KeyCmd::Keys(pattern)
        }
        Ok(Parsed::Node(_, Ok(NodeCmd::Server(ServerCmd::DbSize)))) if !declared_only => {
            KeyCmd::DbSize
        }
        Ok(Parsed::Node(_, Ok(NodeCmd::Scan(scan)))) if !declared_only => {
            let reply = stores.scan(&scan, now, stats);
            return if is_escalate(&reply) && stores.wrote {
                Reply::err(NEEDS_NODE)
            } else {
                reply
            };
        }
        // Their arguments refused: the error the command gives a client.
        Ok(Parsed::Node(spec, Err(e)))
            if !declared_only && matches!(spec.name, "keys" | "scan" | "dbsize") =>
        {
            return Reply::Error(e.to_string().into());
        }
        Ok(Parsed::Node(..)) => {
            return Reply::err("ERR This Redis command is not allowed from script");
        }
    };
    if declared_only
        && matches!(
            cmd,
            KeyCmd::DbSize | KeyCmd::FlushAll | KeyCmd::Keys(_) | KeyCmd::Scan { .. }
        )
    {
        return Reply::err("ERR This Redis command is not allowed from script");
    }
    let reply = stores.run(&cmd, now, stats);
    if is_escalate(&reply) && stores.wrote {
        return Reply::err(NEEDS_NODE);
    }
    if spec.props.contains(Flags::WRITE) {
        stores.wrote = true;
    }
    reply
}

fn undeclared() -> Reply {
    Reply::err("ERR Script attempted to access a key that was not declared in KEYS")
}
