//! Commands the node answers itself: connection state, server information, and operations
//! over every shard.

use super::{Conn, REDIS_COMPAT_VERSION, info, lock};
use crate::cmd::keyed::{KeyCmd, Reply};
use crate::cmd::resolve_spec;
use crate::cmd::table::{self, COMMANDS, CommandSpec};
use crate::protocol::{ArgError, Args, ReplyWriter};
use crate::shard::{ShardGone, ShardMsg};
use crate::slot::key_slot;
use crate::store::SCAN_POSITION_BITS;
use std::sync::atomic::Ordering;

const NO_CLUSTER: &str = "ERR This instance has cluster support disabled";

pub(super) async fn run(
    c: &mut Conn,
    spec: &'static CommandSpec,
    mut a: Args,
    buf: &mut Vec<u8>,
) -> Result<(), ShardGone> {
    let res = dispatch(c, spec, &mut a, buf).await;
    match res {
        Ok(()) => Ok(()),
        Err(Failure::Arg(e)) => {
            ReplyWriter::new(buf, c.resp3).error(&e.to_string());
            Ok(())
        }
        Err(Failure::Gone(g)) => Err(g),
    }
}

enum Failure {
    Arg(ArgError),
    Gone(ShardGone),
}

impl From<ArgError> for Failure {
    fn from(e: ArgError) -> Self {
        Failure::Arg(e)
    }
}

impl From<ShardGone> for Failure {
    fn from(e: ShardGone) -> Self {
        Failure::Gone(e)
    }
}

fn msg(m: impl Into<String>) -> Failure {
    Failure::Arg(ArgError::Msg(m.into()))
}

async fn dispatch(
    c: &mut Conn,
    spec: &'static CommandSpec,
    a: &mut Args,
    buf: &mut Vec<u8>,
) -> Result<(), Failure> {
    match spec.name {
        "ping" => {
            let arg = a.next_opt();
            a.finish().map_err(|_| a.arity_error())?;
            let mut w = ReplyWriter::new(buf, c.resp3);
            match arg {
                Some(m) => w.bulk(&m),
                None => w.simple("PONG"),
            }
        }
        "echo" => {
            let m = a.next_bytes()?;
            ReplyWriter::new(buf, c.resp3).bulk(&m);
        }
        "hello" => hello(c, a, buf)?,
        "auth" => {
            let (user, pass) = match a.remaining() {
                1 => (None, a.next_bytes()?),
                2 => (Some(a.next_bytes()?), a.next_bytes()?),
                _ => return Err(ArgError::Syntax.into()),
            };
            authenticate(c, user.as_deref(), &pass)?;
            ReplyWriter::new(buf, c.resp3).ok();
        }
        "select" => {
            let db = a.next_i64()?;
            if db != 0 {
                return Err(msg("ERR DB index is out of range"));
            }
            ReplyWriter::new(buf, c.resp3).ok();
        }
        "quit" => {
            ReplyWriter::new(buf, c.resp3).ok();
            c.quit = true;
        }
        "reset" => {
            set_resp3(c, false);
            c.authed = !c.node.live.needs_auth();
            {
                let mut m = lock(&c.info.meta);
                m.name.clear();
            }
            ReplyWriter::new(buf, c.resp3).simple("RESET");
        }
        "client" => client(c, a, buf)?,
        "command" => command(c, a, buf)?,
        "info" => {
            let sections: Vec<String> = a
                .rest()
                .iter()
                .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase())
                .collect();
            let text = info::render(&c.node, &sections);
            ReplyWriter::new(buf, c.resp3).verbatim(&text);
        }
        "config" => config(c, a, buf).await?,
        "scan" => scan(c, a, buf).await?,
        "dbsize" => {
            let total: i64 = c
                .all_shards(|| KeyCmd::DbSize)
                .await?
                .iter()
                .filter_map(Reply::as_int)
                .sum();
            ReplyWriter::new(buf, c.resp3).int(total);
        }
        "flushall" | "flushdb" => {
            if let Some(mode) = a.next_opt() {
                let m = mode.to_ascii_uppercase();
                if m != b"ASYNC" && m != b"SYNC" {
                    return Err(ArgError::Syntax.into());
                }
            }
            a.finish()?;
            if c.node.cluster().is_some() {
                // Keys are replicated state: clearing this node's copies behind Raft's back
                // would make the replicas disagree.
                return Err(msg(
                    "ERR FLUSHALL is not supported in cluster mode; remove keys with DEL or BK.RESET",
                ));
            }
            c.all_shards(|| KeyCmd::FlushAll).await?;
            ReplyWriter::new(buf, c.resp3).ok();
        }
        "time" => {
            let now = c.node.clock.now_ns();
            let mut w = ReplyWriter::new(buf, c.resp3);
            w.array(2);
            w.bulk((now / 1_000_000_000).to_string().as_bytes());
            w.bulk(((now % 1_000_000_000) / 1000).to_string().as_bytes());
        }
        "keys" => {
            let pattern = a.next_bytes()?;
            let replies = c.all_shards(|| KeyCmd::Keys(pattern.clone())).await?;
            let mut all = Vec::new();
            for r in replies {
                if let Reply::Array(items) = r {
                    all.extend(items);
                }
            }
            super::encode(&mut ReplyWriter::new(buf, c.resp3), &Reply::Array(all));
        }
        "bk.rule" => rule(c, a, buf)?,
        "cluster" => {
            let sub = a.next_keyword()?;
            note_subcommand(c, "cluster", &sub);
            match sub.as_str() {
                "KEYSLOT" => {
                    let key = a.next_bytes()?;
                    a.finish()?;
                    ReplyWriter::new(buf, c.resp3).int(i64::from(key_slot(&key)));
                }
                _ => match c.node.cluster() {
                    Some(cl) => {
                        let cl = cl.clone();
                        super::cluster_cmds::run(
                            &cl,
                            &sub,
                            a,
                            &mut ReplyWriter::new(buf, c.resp3),
                        )?;
                    }
                    None => return Err(msg(NO_CLUSTER)),
                },
            }
        }
        "readonly" | "readwrite" | "asking" => {
            if c.node.cluster().is_none() {
                return Err(msg(NO_CLUSTER));
            }
            ReplyWriter::new(buf, c.resp3).ok();
        }
        other => return Err(msg(format!("ERR command '{other}' is not available here"))),
    }
    Ok(())
}

fn set_resp3(c: &mut Conn, v: bool) {
    c.resp3 = v;
    lock(&c.info.meta).resp = if v { 3 } else { 2 };
}

/// AUTH and HELLO's AUTH. Without a password the node acts as Redis 7's `nopass` default
/// user: any password is accepted for `default`, other users do not exist, and the
/// one-argument form keeps Redis's complaint that no password is configured.
fn authenticate(c: &mut Conn, user: Option<&[u8]>, pass: &[u8]) -> Result<(), Failure> {
    const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";
    let user_ok = user.is_none_or(|u| u == b"default");
    let Some(expected) = c.node.live.requirepass() else {
        if user.is_none() {
            return Err(msg(
                "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
            ));
        }
        if !user_ok {
            return Err(msg(WRONGPASS));
        }
        c.authed = true;
        return Ok(());
    };
    // Compare in constant time so the reply time does not leak how much of the password matched.
    let pass_ok = expected.len() == pass.len()
        && expected
            .as_bytes()
            .iter()
            .zip(pass)
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0;
    if user_ok && pass_ok {
        c.authed = true;
        Ok(())
    } else {
        Err(msg(WRONGPASS))
    }
}

fn hello(c: &mut Conn, a: &mut Args, buf: &mut Vec<u8>) -> Result<(), Failure> {
    let mut proto = None;
    if a.remaining() > 0 {
        let v = a
            .next_i64()
            .map_err(|_| msg("ERR Protocol version is not an integer or out of range"))?;
        if v != 2 && v != 3 {
            return Err(msg("NOPROTO unsupported protocol version"));
        }
        proto = Some(v);
    }
    let mut setname = None;
    while a.remaining() > 0 {
        match a.next_keyword()?.as_str() {
            "AUTH" => {
                let user = a.next_bytes().map_err(|_| ArgError::Syntax)?;
                let pass = a.next_bytes().map_err(|_| ArgError::Syntax)?;
                authenticate(c, Some(&user), &pass)?;
            }
            "SETNAME" => {
                let n = a.next_string().map_err(|_| ArgError::Syntax)?;
                check_name(&n)?;
                setname = Some(n);
            }
            _ => return Err(ArgError::Syntax.into()),
        }
    }
    if !c.authed {
        return Err(msg(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
        ));
    }
    if let Some(p) = proto {
        set_resp3(c, p == 3);
    }
    if let Some(n) = setname {
        lock(&c.info.meta).name = n;
    }
    let mut w = ReplyWriter::new(buf, c.resp3);
    w.map(7);
    w.kv_str("server", "bucketd");
    w.kv_str("version", REDIS_COMPAT_VERSION);
    w.kv_int("proto", if c.resp3 { 3 } else { 2 });
    w.kv_int("id", i64::try_from(c.info.id).unwrap_or(i64::MAX));
    w.kv_str(
        "mode",
        if c.node.cluster().is_some() {
            "cluster"
        } else {
            "standalone"
        },
    );
    w.kv_str("role", "master");
    w.bulk(b"modules");
    w.array(0);
    Ok(())
}

fn check_name(n: &str) -> Result<(), Failure> {
    if n.bytes().any(|b| !(b'!'..=b'~').contains(&b)) {
        return Err(msg(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        ));
    }
    Ok(())
}

impl super::ClientInfo {
    /// Asks the connection to close (CLIENT KILL, the idle timeout). It closes as soon as its
    /// loop sees `killed` resolve; until then it is already left out of CLIENT LIST and KILL.
    pub fn kill(&self) {
        self.kill_requested.store(true, Ordering::Release);
        self.kill_signal.notify_waiters();
    }

    pub fn is_killed(&self) -> bool {
        self.kill_requested.load(Ordering::Acquire)
    }

    /// Resolves once the client has been killed; cancel-safe, so it can sit in a `select!`
    /// that is re-entered on every read.
    pub async fn killed(&self) {
        loop {
            let notified = self.kill_signal.notified();
            tokio::pin!(notified);
            // Registered before the flag is checked, so a kill in between is not missed.
            notified.as_mut().enable();
            if self.is_killed() {
                return;
            }
            notified.await;
        }
    }
}

/// Subcommands of container commands that CLIENT LIST shows as `cmd=container|sub`.
const SUBCOMMANDS: &[&str] = &[
    "client|id",
    "client|setname",
    "client|getname",
    "client|setinfo",
    "client|info",
    "client|list",
    "client|kill",
    "client|no-evict",
    "client|no-touch",
    "client|help",
    "config|get",
    "config|set",
    "config|resetstat",
    "config|help",
    "command|count",
    "command|list",
    "command|info",
    "command|docs",
    "command|getkeys",
    "command|help",
    "cluster|info",
    "cluster|nodes",
    "cluster|slots",
    "cluster|shards",
    "cluster|myid",
    "cluster|keyslot",
];

/// Records the subcommand a container command ran, for CLIENT LIST's `cmd=`.
fn note_subcommand(c: &Conn, container: &str, sub: &str) {
    let idx = SUBCOMMANDS.iter().position(|full| {
        full.split_once('|')
            .is_some_and(|(cont, s)| cont == container && s.eq_ignore_ascii_case(sub))
    });
    c.info
        .last_sub
        .store(idx.map_or(0, |i| i + 1), Ordering::Relaxed);
}

/// The `cmd=` of a client other than the caller: its last command, with the subcommand when
/// the last container command it ran is that command.
fn last_command(info: &super::ClientInfo) -> &'static str {
    let Some(spec) = info
        .last_cmd
        .load(Ordering::Relaxed)
        .checked_sub(1)
        .and_then(|i| COMMANDS.get(i))
    else {
        return "NULL";
    };
    let sub = info
        .last_sub
        .load(Ordering::Relaxed)
        .checked_sub(1)
        .and_then(|i| SUBCOMMANDS.get(i))
        .filter(|full| {
            full.split_once('|')
                .is_some_and(|(cont, _)| cont == spec.name)
        });
    sub.copied().unwrap_or(spec.name)
}

/// One line of CLIENT LIST / CLIENT INFO, with Redis 7.0's fields in its order (plus `watch`,
/// `lib-name` and `lib-ver` of later versions). `cmd` is the caller's own current command.
fn client_line(c: &Conn, info: &super::ClientInfo, cmd: Option<&str>) -> String {
    let m = lock(&info.meta).clone();
    let now = c.node.uptime_ms();
    let idle = now.saturating_sub(info.last_active_ms.load(Ordering::Relaxed)) / 1000;
    let qbuf = info.qbuf.load(Ordering::Relaxed);
    let omem = info.omem.load(Ordering::Relaxed);
    format!(
        "id={} addr={} laddr={} fd=-1 name={} age={} idle={} flags=N db=0 sub=0 psub=0 ssub=0 multi=-1 qbuf={qbuf} qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem={omem} tot-mem={} events=r cmd={} user=default redir=-1 resp={} lib-name={} lib-ver={}\n",
        info.id,
        info.addr,
        info.laddr,
        m.name,
        info.created.elapsed().as_secs(),
        idle,
        qbuf + omem,
        cmd.unwrap_or_else(|| last_command(info)),
        m.resp,
        m.lib_name,
        m.lib_ver
    )
}

/// Client types of CLIENT LIST / CLIENT KILL TYPE; every bucketd client is `normal`.
fn client_type_matches(t: &[u8]) -> Result<bool, Failure> {
    let t = String::from_utf8_lossy(t);
    match t.to_ascii_lowercase().as_str() {
        "normal" => Ok(true),
        "master" | "replica" | "slave" | "pubsub" => Ok(false),
        _ => Err(msg(format!("ERR Unknown client type '{t}'"))),
    }
}

fn client(c: &mut Conn, a: &mut Args, buf: &mut Vec<u8>) -> Result<(), Failure> {
    let given = a.next_string()?;
    let sub = given.to_ascii_uppercase();
    note_subcommand(c, "client", &sub);
    let wrong = |sub: &str| {
        msg(format!(
            "ERR wrong number of arguments for 'client|{}' command",
            sub.to_ascii_lowercase()
        ))
    };
    let exact = |a: &Args, n: usize| {
        if a.remaining() == n {
            Ok(())
        } else {
            Err(wrong(&sub))
        }
    };
    match sub.as_str() {
        "ID" => {
            exact(a, 0)?;
            ReplyWriter::new(buf, c.resp3).int(i64::try_from(c.info.id).unwrap_or(i64::MAX));
        }
        "SETNAME" => {
            exact(a, 1)?;
            let n = a.next_string()?;
            check_name(&n)?;
            lock(&c.info.meta).name = n;
            ReplyWriter::new(buf, c.resp3).ok();
        }
        "GETNAME" => {
            exact(a, 0)?;
            let n = lock(&c.info.meta).name.clone();
            let mut w = ReplyWriter::new(buf, c.resp3);
            if n.is_empty() {
                w.null()
            } else {
                w.bulk(n.as_bytes())
            }
        }
        "SETINFO" => {
            exact(a, 2)?;
            let attr = a.next_keyword()?;
            let v = a.next_string()?;
            if v.bytes().any(|b| !(b'!'..=b'~').contains(&b)) {
                return Err(msg(format!(
                    "ERR {attr} cannot contain spaces, newlines or special characters."
                )));
            }
            let mut m = lock(&c.info.meta);
            match attr.as_str() {
                "LIB-NAME" => m.lib_name = v,
                "LIB-VER" => m.lib_ver = v,
                _ => return Err(msg(format!("ERR Unrecognized option '{attr}'"))),
            }
            drop(m);
            ReplyWriter::new(buf, c.resp3).ok();
        }
        "INFO" => {
            exact(a, 0)?;
            let line = client_line(c, &c.info, Some("client|info"));
            ReplyWriter::new(buf, c.resp3).verbatim(&line);
        }
        "LIST" => {
            let rest = a.rest();
            let all: Vec<_> = lock(&c.node.clients)
                .values()
                .filter(|i| !i.is_killed())
                .cloned()
                .collect();
            let chosen: Vec<_> = match rest.first() {
                None => all,
                Some(k) if rest.len() == 2 && k.eq_ignore_ascii_case(b"TYPE") => {
                    if client_type_matches(&rest[1])? {
                        all
                    } else {
                        Vec::new()
                    }
                }
                Some(k) if rest.len() >= 2 && k.eq_ignore_ascii_case(b"ID") => {
                    // In the order asked, as Redis answers.
                    let mut out = Vec::new();
                    for id in &rest[1..] {
                        let id = crate::protocol::args::parse_i64(id)
                            .ok_or_else(|| msg("ERR Invalid client ID"))?;
                        out.extend(
                            all.iter()
                                .filter(|i| i64::try_from(i.id) == Ok(id))
                                .cloned(),
                        );
                    }
                    out
                }
                Some(_) => return Err(ArgError::Syntax.into()),
            };
            let text: String = chosen
                .iter()
                .map(|i| {
                    let own = (i.id == c.info.id).then_some("client|list");
                    client_line(c, i, own)
                })
                .collect();
            ReplyWriter::new(buf, c.resp3).verbatim(&text);
        }
        "KILL" => client_kill(c, a, buf)?,
        "NO-EVICT" | "NO-TOUCH" => {
            exact(a, 1)?;
            let v = a.next_keyword()?;
            if v != "ON" && v != "OFF" {
                return Err(ArgError::Syntax.into());
            }
            ReplyWriter::new(buf, c.resp3).ok();
        }
        "HELP" => {
            exact(a, 0)?;
            let lines = [
                "CLIENT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "GETNAME",
                "    Return the name of the current connection.",
                "ID",
                "    Return the ID of the current connection.",
                "INFO",
                "    Return information about the current client connection.",
                "KILL <ip:port>",
                "    Kill connection made from <ip:port>.",
                "KILL <option> <value> [<option> <value> [...]]",
                "    Kill connections. Options are:",
                "    * ADDR (<ip:port>|<unixsocket>:0)",
                "      Kill connections made from the specified address",
                "    * LADDR (<ip:port>|<unixsocket>:0)",
                "      Kill connections made to specified local address",
                "    * TYPE (NORMAL|MASTER|REPLICA|PUBSUB)",
                "      Kill connections by type.",
                "    * USER <username>",
                "      Kill connections authenticated by <username>.",
                "    * SKIPME (YES|NO)",
                "      Skip killing current connection (default: yes).",
                "    * ID <client-id>",
                "      Kill connections by client id.",
                "LIST [options ...]",
                "    Return information about client connections. Options:",
                "    * TYPE (NORMAL|MASTER|REPLICA|PUBSUB)",
                "      Return clients of specified type.",
                "    * ID <client-id> [<client-id> ...]",
                "      Return clients of the given ids.",
                "SETNAME <name>",
                "    Assign the name <name> to the current connection.",
                "SETINFO <LIB-NAME|LIB-VER> <value>",
                "    Set client meta attributes: the library's name or version.",
                "NO-EVICT (ON|OFF)",
                "    Protect current client connection from eviction (accepted; bucketd never evicts clients).",
                "NO-TOUCH (ON|OFF)",
                "    Do not touch keys' access times (accepted; bucketd keeps none).",
                "HELP",
                "    Prints this help.",
            ];
            write_help(&mut ReplyWriter::new(buf, c.resp3), &lines);
        }
        _ => {
            return Err(msg(format!(
                "ERR unknown subcommand '{given}'. Try CLIENT HELP."
            )));
        }
    }
    Ok(())
}

/// CLIENT KILL, old form (`addr`, replies OK or an error, may kill the caller) and new form
/// (filters, replies how many were killed, skips the caller unless SKIPME no), as Redis 7.0.
fn client_kill(c: &mut Conn, a: &mut Args, buf: &mut Vec<u8>) -> Result<(), Failure> {
    let rest = a.rest();
    let old_form = rest.len() == 1;
    let (mut id, mut addr, mut laddr, mut skipme) = (None, None, None, !old_form);
    let mut type_ok = true;
    if old_form {
        addr = Some(rest[0].clone());
    } else if rest.is_empty() {
        return Err(msg(
            "ERR wrong number of arguments for 'client|kill' command",
        ));
    } else {
        let mut i = 0;
        while i < rest.len() {
            let (opt, Some(val)) = (&rest[i], rest.get(i + 1)) else {
                return Err(ArgError::Syntax.into());
            };
            match opt.to_ascii_uppercase().as_slice() {
                b"ID" => {
                    let v = crate::protocol::args::parse_i64(val)
                        .filter(|&v| v >= 1)
                        .ok_or_else(|| msg("ERR client-id should be greater than 0"))?;
                    id = Some(v.unsigned_abs());
                }
                b"TYPE" => type_ok = client_type_matches(val)?,
                b"ADDR" => addr = Some(val.clone()),
                b"LADDR" => laddr = Some(val.clone()),
                b"USER" => {
                    if val.as_ref() != b"default" {
                        return Err(msg(format!(
                            "ERR No such user '{}'",
                            String::from_utf8_lossy(val)
                        )));
                    }
                }
                b"SKIPME" => match val.to_ascii_uppercase().as_slice() {
                    b"YES" => skipme = true,
                    b"NO" => skipme = false,
                    _ => return Err(ArgError::Syntax.into()),
                },
                _ => return Err(ArgError::Syntax.into()),
            }
            i += 2;
        }
    }
    let mut killed = 0i64;
    let mut close_self = false;
    if type_ok {
        let clients: Vec<_> = lock(&c.node.clients).values().cloned().collect();
        for info in clients {
            let is_self = info.id == c.info.id;
            let hit = !info.is_killed()
                && id.is_none_or(|id| info.id == id)
                && addr
                    .as_ref()
                    .is_none_or(|x| x.as_ref() == info.addr.to_string().as_bytes())
                && laddr
                    .as_ref()
                    .is_none_or(|x| x.as_ref() == info.laddr.to_string().as_bytes())
                && !(is_self && skipme);
            if !hit {
                continue;
            }
            if is_self {
                close_self = true;
            } else {
                info.kill();
            }
            killed += 1;
        }
    }
    let mut w = ReplyWriter::new(buf, c.resp3);
    if old_form {
        if killed == 0 {
            return Err(msg("ERR No such client"));
        }
        w.ok();
    } else {
        w.int(killed);
    }
    // The reply goes out first; nothing after it in this connection's pipeline runs.
    if close_self {
        c.quit = true;
    }
    Ok(())
}

fn command(c: &mut Conn, a: &mut Args, buf: &mut Vec<u8>) -> Result<(), Failure> {
    if a.remaining() == 0 {
        let mut w = ReplyWriter::new(buf, c.resp3);
        w.array(COMMANDS.len());
        for cmd in COMMANDS {
            table::write_info(&mut w, cmd);
        }
        return Ok(());
    }
    let sub = a.next_keyword()?;
    note_subcommand(c, "command", &sub);
    let mut w = ReplyWriter::new(buf, c.resp3);
    match sub.as_str() {
        "COUNT" => {
            if a.remaining() > 0 {
                return Err(msg(
                    "ERR wrong number of arguments for 'command|count' command",
                ));
            }
            w.int(COMMANDS.len() as i64)
        }
        "LIST" => {
            let rest = a.rest();
            let filter = match rest.as_slice() {
                [] => None,
                [by, kind, arg] if by.eq_ignore_ascii_case(b"FILTERBY") => {
                    match kind.to_ascii_uppercase().as_slice() {
                        b"MODULE" | b"ACLCAT" | b"PATTERN" => {
                            Some((kind.to_ascii_uppercase(), arg.clone()))
                        }
                        _ => return Err(ArgError::Syntax.into()),
                    }
                }
                _ => return Err(ArgError::Syntax.into()),
            };
            let listed: Vec<&CommandSpec> = COMMANDS
                .iter()
                .filter(|cmd| match &filter {
                    None => true,
                    // bucketd loads no modules.
                    Some((kind, _)) if kind.as_slice() == b"MODULE" => false,
                    Some((kind, cat)) if kind.as_slice() == b"ACLCAT" => cmd.acl.iter().any(|c| {
                        c.strip_prefix('@')
                            .is_some_and(|c| c.as_bytes().eq_ignore_ascii_case(cat))
                    }),
                    Some((_, pattern)) => crate::glob::matches_nocase(pattern, cmd.name.as_bytes()),
                })
                .collect();
            // Subcommands are listed as `container|sub`, as Redis lists them; they have no
            // ACL categories or module of their own here.
            let subs: Vec<&str> = SUBCOMMANDS
                .iter()
                .copied()
                .filter(|full| match &filter {
                    None => true,
                    Some((kind, pattern)) if kind.as_slice() == b"PATTERN" => {
                        crate::glob::matches_nocase(pattern, full.as_bytes())
                    }
                    Some(_) => false,
                })
                .collect();
            w.array(listed.len() + subs.len());
            for cmd in listed {
                w.bulk(cmd.name.as_bytes());
            }
            for full in subs {
                w.bulk(full.as_bytes());
            }
        }
        "INFO" => {
            let names = a.rest();
            if names.is_empty() {
                w.array(COMMANDS.len());
                for cmd in COMMANDS {
                    table::write_info(&mut w, cmd);
                }
            } else {
                w.array(names.len());
                for n in names {
                    match table::lookup(&n) {
                        Some(cmd) => table::write_info(&mut w, cmd),
                        None => w.null_array(),
                    }
                }
            }
        }
        "DOCS" => {
            let names = a.rest();
            let found: Vec<&CommandSpec> = if names.is_empty() {
                COMMANDS.iter().collect()
            } else {
                names.iter().filter_map(|n| table::lookup(n)).collect()
            };
            w.map(found.len());
            for cmd in found {
                table::write_docs(&mut w, cmd);
            }
        }
        "GETKEYS" => {
            let args = a.rest();
            let Some(cmd) = args.first().and_then(|n| table::lookup(n)) else {
                return Err(msg("ERR Invalid command specified"));
            };
            if !table::arity_ok(cmd, args.len()) {
                return Err(msg("ERR Invalid number of arguments specified for command"));
            }
            if cmd.name == "bk.checkall" {
                // Its keys are counted by its numkeys argument, like EVAL's.
                let n = args
                    .get(1)
                    .and_then(|b| crate::protocol::args::parse_i64(b))
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|&n| n >= 1 && 2 + n <= args.len())
                    .ok_or_else(|| msg("ERR Invalid arguments specified for command"))?;
                w.array(n);
                for k in &args[2..2 + n] {
                    w.bulk(k);
                }
                return Ok(());
            }
            if cmd.first_key <= 0 {
                return Err(msg("ERR The command has no key arguments"));
            }
            let first = cmd.first_key as usize;
            let last = if cmd.last_key < 0 {
                (args.len() as i64 + cmd.last_key) as usize
            } else {
                cmd.last_key as usize
            };
            let keys: Vec<_> = (first..=last.min(args.len() - 1))
                .step_by(cmd.step.max(1) as usize)
                .map(|i| args[i].clone())
                .collect();
            w.array(keys.len());
            for k in keys {
                w.bulk(&k);
            }
        }
        "HELP" => {
            let lines = [
                "COMMAND <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "(no subcommand)",
                "    Return details about all commands.",
                "COUNT",
                "    Return the total number of commands in this server.",
                "LIST",
                "    Return a list of all commands in this server.",
                "INFO [<command-name> ...]",
                "    Return details about multiple commands.",
                "    If no command names are given, documentation details for all",
                "    commands are returned.",
                "DOCS [<command-name> ...]",
                "    Return documentation details about multiple commands.",
                "    If no command names are given, documentation details for all",
                "    commands are returned.",
                "GETKEYS <full-command>",
                "    Return the keys from a full command.",
                "LIST [FILTERBY (MODULE <module-name>|ACLCAT <category>|PATTERN <pattern>)]",
                "    Return a list of all commands in this server, filtered by module, ACL",
                "    category or a glob-style pattern.",
                "HELP",
                "    Print this help.",
            ];
            write_help(&mut w, &lines);
        }
        other => {
            return Err(msg(format!(
                "ERR unknown subcommand '{other}'. Try COMMAND HELP."
            )));
        }
    }
    Ok(())
}

async fn config(c: &mut Conn, a: &mut Args, buf: &mut Vec<u8>) -> Result<(), Failure> {
    let sub = a.next_keyword()?;
    note_subcommand(c, "config", &sub);
    match sub.as_str() {
        "GET" => {
            let patterns = a.rest();
            if patterns.is_empty() {
                return Err(msg(
                    "ERR wrong number of arguments for 'config|get' command",
                ));
            }
            let hits = super::live::config_get(&c.node, &patterns);
            let mut w = ReplyWriter::new(buf, c.resp3);
            w.map(hits.len());
            for (k, v) in hits {
                w.kv_str(&k, &v);
            }
        }
        "SET" => {
            let rest = a.rest();
            if rest.len() < 2 {
                return Err(msg(
                    "ERR wrong number of arguments for 'config|set' command",
                ));
            }
            if !rest.len().is_multiple_of(2) {
                return Err(ArgError::Syntax.into());
            }
            let pairs: Vec<_> = rest
                .chunks_exact(2)
                .map(|p| (p[0].clone(), p[1].clone()))
                .collect();
            let applied = super::live::config_set(&c.node, &pairs).map_err(msg)?;
            if applied.caps_switched {
                sync_caps(c).await?;
            }
            ReplyWriter::new(buf, c.resp3).ok();
        }
        "RESETSTAT" => {
            if a.remaining() > 0 {
                return Err(msg(
                    "ERR wrong number of arguments for 'config|resetstat' command",
                ));
            }
            for s in &c.node.shards {
                s.stats.errors.reset();
            }
            let st = &c.node.stats;
            st.connections_received.store(0, Ordering::Relaxed);
            st.rejected_connections.store(0, Ordering::Relaxed);
            st.protocol_errors.store(0, Ordering::Relaxed);
            ReplyWriter::new(buf, c.resp3).ok();
        }
        "HELP" => {
            let lines = [
                "CONFIG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "GET <pattern>",
                "    Return parameters matching the glob-like <pattern> and their values.",
                "SET <directive> <value>",
                "    Set the configuration <directive> to <value>.",
                "RESETSTAT",
                "    Reset statistics reported by the INFO command.",
                "HELP",
                "    Prints this help.",
            ];
            write_help(&mut ReplyWriter::new(buf, c.resp3), &lines);
        }
        other => {
            return Err(msg(format!(
                "ERR unknown subcommand '{other}'. Try CONFIG HELP."
            )));
        }
    }
    Ok(())
}

/// Has every shard start or stop counting its keys in the caps now, and waits for all of
/// them, so a cap switched on is in force everywhere once CONFIG SET has answered.
async fn sync_caps(c: &mut Conn) -> Result<(), Failure> {
    let mut waits = Vec::new();
    for s in &c.node.shards {
        if s.id == c.my_shard {
            c.core.borrow_mut().store.sync_caps();
        } else {
            let (tx, rx) = tokio::sync::oneshot::channel();
            s.send(ShardMsg::SyncCaps { reply: tx }).await?;
            waits.push(rx);
        }
    }
    for rx in waits {
        rx.await.map_err(|_| ShardGone)?;
    }
    Ok(())
}

/// Bits of a SCAN cursor above the store's scan position: they name the shard.
const CURSOR_SHARD_SHIFT: u32 = SCAN_POSITION_BITS;

/// A SCAN cursor as Redis 7.0 reads one (`strtoul`): an optional sign (a minus wraps), then
/// decimal digits; an empty string is 0; spaces, other characters and overflow are refused.
fn parse_cursor(b: &[u8]) -> Option<u64> {
    let (neg, digits) = match b.first() {
        None => return Some(0),
        Some(b'-') => (true, &b[1..]),
        Some(b'+') => (false, &b[1..]),
        Some(_) => (false, b),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let v = digits.iter().try_fold(0u64, |acc, d| {
        acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })?;
    Some(if neg { v.wrapping_neg() } else { v })
}

/// SCAN cursor [MATCH pattern] [COUNT n] [TYPE type]. The cursor holds the shard in its top
/// bits and the shard store's scan position below, so scanning walks the shards in order and
/// each shard's keys in the order of their hash; see `Store::scan` for the guarantee.
async fn scan(c: &mut Conn, a: &mut Args, buf: &mut Vec<u8>) -> Result<(), Failure> {
    let cursor = parse_cursor(&a.next_bytes()?).ok_or_else(|| msg("ERR invalid cursor"))?;
    let mut count: u64 = 10;
    let (mut pattern, mut type_name) = (None, None);
    while a.remaining() > 0 {
        if a.remaining() < 2 {
            return Err(ArgError::Syntax.into());
        }
        let opt = a.next_keyword()?;
        match opt.as_str() {
            "COUNT" => {
                let n = a.next_i64()?;
                count = u64::try_from(n)
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or(ArgError::Syntax)?;
            }
            "MATCH" => {
                let p = a.next_bytes()?;
                // "*" matches everything: skip the matching.
                pattern = (p.as_ref() != b"*").then_some(p);
            }
            "TYPE" => type_name = Some(a.next_bytes()?),
            _ => return Err(ArgError::Syntax.into()),
        }
    }
    let n = c.node.shards.len();
    let mut shard = usize::try_from(cursor >> CURSOR_SHARD_SHIFT).unwrap_or(usize::MAX);
    let mut from = cursor & ((1u64 << CURSOR_SHARD_SHIFT) - 1);
    let mut examined = 0u64;
    let mut keys = Vec::new();
    while shard < n && examined < count {
        let cmd = KeyCmd::Scan {
            from,
            count: count - examined,
            pattern: pattern.clone(),
            type_name: type_name.clone(),
        };
        let reply = c.dispatch(shard, vec![cmd]).await?.replies().await?;
        let Some(Reply::Array(mut parts)) = reply.into_iter().next() else {
            return Err(msg("ERR internal error: missing reply"));
        };
        let (Some(Reply::Array(found)), Some(Reply::Int(seen)), Some(Reply::Int(next))) =
            (parts.pop(), parts.pop(), parts.pop())
        else {
            return Err(msg("ERR internal error: malformed scan reply"));
        };
        examined += seen.unsigned_abs();
        keys.extend(found);
        match u64::try_from(next) {
            Ok(pos) => from = pos,
            Err(_) => {
                shard += 1;
                from = 0;
            }
        }
    }
    let next = if shard >= n {
        0
    } else {
        ((shard as u64) << CURSOR_SHARD_SHIFT) | from
    };
    let mut w = ReplyWriter::new(buf, c.resp3);
    w.array(2);
    w.bulk(next.to_string().as_bytes());
    super::encode(&mut w, &Reply::Array(keys));
    Ok(())
}

fn rule(c: &mut Conn, a: &mut Args, buf: &mut Vec<u8>) -> Result<(), Failure> {
    let sub = a.next_keyword()?;
    let rules = &c.node.rules;
    let mut w = ReplyWriter::new(buf, c.resp3);
    match sub.as_str() {
        "SET" => {
            let name = a.next_string()?;
            let spec = a.next_bytes()?;
            a.finish()?;
            if !spec.contains(&b'/') {
                return Err(msg("ERR a rule needs an inline spec such as 100/1m"));
            }
            let r = resolve_spec(&spec, &crate::rules::RuleSet::default())?;
            rules.set(&name, r).map_err(|e| msg(format!("ERR {e}")))?;
            w.ok();
        }
        "GET" => {
            let name = a.next_string()?;
            a.finish()?;
            match rules.load().get(&name) {
                Some(r) => w.bulk(r.to_string().as_bytes()),
                None => w.null(),
            }
        }
        "DEL" => {
            let name = a.next_string()?;
            a.finish()?;
            w.int(i64::from(rules.remove(&name)));
        }
        "LIST" => {
            a.finish()?;
            let set = rules.load();
            let sorted = set.sorted();
            w.map(sorted.len());
            for (name, r) in sorted {
                w.kv_str(name, &r.to_string());
            }
        }
        "RELOAD" => {
            a.finish()?;
            let n = rules
                .reload()
                .map_err(|e| msg(format!("ERR rules not reloaded, previous rules kept: {e}")))?;
            w.int(n as i64);
        }
        other => {
            return Err(msg(format!(
                "ERR unknown subcommand '{other}' for BK.RULE: use SET, GET, DEL, LIST or RELOAD"
            )));
        }
    }
    Ok(())
}

/// A HELP reply: one status line each, as Redis sends them.
fn write_help(w: &mut ReplyWriter, lines: &[&str]) {
    w.array(lines.len());
    for l in lines {
        w.simple(l);
    }
}
