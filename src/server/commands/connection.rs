//! Connection commands, run on the connection's own state: PING, ECHO, HELLO, AUTH, SELECT,
//! CLIENT, QUIT, RESET.

use super::{Failure, fail, write_help};
use crate::cmd::{COMMANDS as ALL_COMMANDS, SUBCOMMANDS};
use crate::cmd::{ClientCmd, ClientKill, ClientList, ConnectionCmd, Hello, LibAttr};
use crate::protocol::ReplyWriter;
use crate::server::acl;
use crate::server::session::Session;
use crate::server::{ClientInfo, REDIS_COMPAT_VERSION};
use crate::sync::lock;
use std::sync::atomic::Ordering;

/// Runs a connection command on the connection that sent it.
pub(super) fn run(s: &mut Session, cmd: ConnectionCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    match cmd {
        ConnectionCmd::Ping(arg) => {
            let mut w = ReplyWriter::new(buf, s.resp3());
            match arg {
                Some(m) => w.bulk(&m),
                None => w.simple("PONG"),
            }
        }
        ConnectionCmd::Echo(m) => ReplyWriter::new(buf, s.resp3()).bulk(&m),
        ConnectionCmd::Hello(h) => hello(s, h, buf)?,
        ConnectionCmd::Auth { user, pass } => {
            authenticate(s, user.as_deref(), &pass)?;
            ReplyWriter::new(buf, s.resp3()).ok();
        }
        ConnectionCmd::Select => ReplyWriter::new(buf, s.resp3()).ok(),
        ConnectionCmd::Quit => {
            ReplyWriter::new(buf, s.resp3()).ok();
            s.close_after_reply();
        }
        ConnectionCmd::Reset => {
            s.set_resp3(false);
            s.set_authed(!s.node().live.needs_auth());
            s.set_user("default", false);
            {
                let mut m = lock(&s.info().meta);
                m.name.clear();
            }
            ReplyWriter::new(buf, s.resp3()).simple("RESET");
        }
        ConnectionCmd::Client { sub, cmd } => {
            s.note_subcommand(sub);
            client(s, cmd?, buf)?;
        }
    }
    Ok(())
}

/// AUTH and HELLO's AUTH. Without a password the node acts as Redis 7's `nopass` default
/// user: any password is accepted for `default`, other users do not exist, and the
/// one-argument form keeps Redis's complaint that no password is configured.
fn authenticate(s: &mut Session, user: Option<&[u8]>, pass: &[u8]) -> Result<(), Failure> {
    const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";
    let user_ok = user.is_none_or(|u| u == b"default");
    if let Some(name) = user.filter(|_| !user_ok) {
        // A named user from the config file.
        let found = acl::find_user(&s.node().settings.users, name, pass)
            .map(|u| (u.name.clone(), u.readonly));
        return match found {
            Some((name, readonly)) => {
                s.set_authed(true);
                s.set_user(&name, readonly);
                Ok(())
            }
            None => Err(fail(WRONGPASS)),
        };
    }
    let Some(expected) = s.node().live.requirepass() else {
        if !s.node().settings.users.is_empty() {
            // Named users are configured and the default user has no password: it is off.
            return Err(fail(WRONGPASS));
        }
        if user.is_none() {
            return Err(fail(
                "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
            ));
        }
        if !user_ok {
            return Err(fail(WRONGPASS));
        }
        s.set_authed(true);
        return Ok(());
    };
    // Compare in constant time so the reply time does not leak how much of the password matched.
    let pass_ok = acl::same_bytes(expected.as_bytes(), pass);
    if user_ok && pass_ok {
        s.set_authed(true);
        s.set_user("default", false);
        Ok(())
    } else {
        Err(fail(WRONGPASS))
    }
}

fn hello(s: &mut Session, h: Hello, buf: &mut Vec<u8>) -> Result<(), Failure> {
    for (user, pass) in &h.auth {
        authenticate(s, Some(user), pass)?;
    }
    if let Some(e) = h.refused {
        return Err(e.into());
    }
    if !s.authed() {
        return Err(fail(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
        ));
    }
    if let Some(p) = h.proto {
        s.set_resp3(p == 3);
    }
    if let Some(n) = h.setname {
        lock(&s.info().meta).name = n;
    }
    let mut w = ReplyWriter::new(buf, s.resp3());
    w.map(7);
    w.kv_str("server", "bucketd");
    w.kv_str("version", REDIS_COMPAT_VERSION);
    w.kv_int("proto", if s.resp3() { 3 } else { 2 });
    w.kv_int("id", i64::try_from(s.info().id).unwrap_or(i64::MAX));
    w.kv_str(
        "mode",
        if s.node().cluster().is_some() {
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

/// The `cmd=` of a client other than the caller: its last command, with the subcommand when
/// the last container command it ran is that command.
fn last_command(info: &ClientInfo) -> &'static str {
    let Some(spec) = info
        .last_cmd
        .load(Ordering::Relaxed)
        .checked_sub(1)
        .and_then(|i| ALL_COMMANDS.get(i))
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
fn client_line(s: &Session, info: &ClientInfo, cmd: Option<&str>) -> String {
    let m = lock(&info.meta).clone();
    let now = s.node().uptime_ms();
    let idle = now.saturating_sub(info.last_active_ms.load(Ordering::Relaxed)) / 1000;
    let qbuf = info.qbuf.load(Ordering::Relaxed);
    let omem = info.omem.load(Ordering::Relaxed);
    format!(
        "id={} addr={} laddr={} fd=-1 name={} age={} idle={} flags=N db=0 sub=0 psub=0 ssub=0 multi=-1 qbuf={qbuf} qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem={omem} tot-mem={} events=r cmd={} user={} redir=-1 resp={} lib-name={} lib-ver={}\n",
        info.id,
        info.addr,
        info.laddr,
        m.name,
        info.created.elapsed().as_secs(),
        idle,
        qbuf + omem,
        cmd.unwrap_or_else(|| last_command(info)),
        m.user,
        m.resp,
        m.lib_name,
        m.lib_ver
    )
}

fn client(s: &mut Session, cmd: ClientCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    match cmd {
        ClientCmd::Id => {
            ReplyWriter::new(buf, s.resp3()).int(i64::try_from(s.info().id).unwrap_or(i64::MAX));
        }
        ClientCmd::SetName(n) => {
            lock(&s.info().meta).name = n;
            ReplyWriter::new(buf, s.resp3()).ok();
        }
        ClientCmd::GetName => {
            let n = lock(&s.info().meta).name.clone();
            let mut w = ReplyWriter::new(buf, s.resp3());
            if n.is_empty() {
                w.null()
            } else {
                w.bulk(n.as_bytes())
            }
        }
        ClientCmd::SetInfo { attr, value } => {
            let mut m = lock(&s.info().meta);
            match attr {
                LibAttr::Name => m.lib_name = value,
                LibAttr::Ver => m.lib_ver = value,
            }
            drop(m);
            ReplyWriter::new(buf, s.resp3()).ok();
        }
        ClientCmd::Info => {
            let line = client_line(s, s.info(), Some("client|info"));
            ReplyWriter::new(buf, s.resp3()).verbatim(&line);
        }
        ClientCmd::List(which) => {
            let all: Vec<_> = lock(&s.node().clients)
                .values()
                .filter(|i| !i.is_killed())
                .cloned()
                .collect();
            let chosen: Vec<_> = match which {
                ClientList::All => all,
                ClientList::None => Vec::new(),
                ClientList::Ids(ids) => ids
                    .iter()
                    .flat_map(|&id| all.iter().filter(move |i| i64::try_from(i.id) == Ok(id)))
                    .cloned()
                    .collect(),
            };
            let text: String = chosen
                .iter()
                .map(|i| {
                    let own = (i.id == s.info().id).then_some("client|list");
                    client_line(s, i, own)
                })
                .collect();
            ReplyWriter::new(buf, s.resp3()).verbatim(&text);
        }
        ClientCmd::Kill(k) => client_kill(s, k, buf)?,
        ClientCmd::Accepted => ReplyWriter::new(buf, s.resp3()).ok(),
        ClientCmd::Help => {
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
            write_help(&mut ReplyWriter::new(buf, s.resp3()), &lines);
        }
    }
    Ok(())
}

/// CLIENT KILL, old form (`addr`, replies OK or an error, may kill the caller) and new form
/// (filters, replies how many were killed, skips the caller unless SKIPME no), as Redis 7.0.
fn client_kill(s: &mut Session, k: ClientKill, buf: &mut Vec<u8>) -> Result<(), Failure> {
    let ClientKill {
        old_form,
        id,
        addr,
        laddr,
        skipme,
        type_ok,
    } = k;
    let mut killed = 0i64;
    let mut close_self = false;
    if type_ok {
        let clients: Vec<_> = lock(&s.node().clients).values().cloned().collect();
        for info in clients {
            let is_self = info.id == s.info().id;
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
    let mut w = ReplyWriter::new(buf, s.resp3());
    if old_form {
        if killed == 0 {
            return Err(fail("ERR No such client"));
        }
        w.ok();
    } else {
        w.int(killed);
    }
    // The reply goes out first; nothing after it in this connection's pipeline runs.
    if close_self {
        s.close_after_reply();
    }
    Ok(())
}
