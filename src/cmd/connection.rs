//! Connection commands: PING, ECHO, HELLO, AUTH, SELECT, CLIENT, QUIT, RESET. Their entries,
//! how their arguments parse into a `ConnectionCmd`, and how they run on the connection's
//! own state.

use super::node::{Failure, msg as fail, note_subcommand, write_help};
use super::table::{COMMANDS as ALL_COMMANDS, SUBCOMMANDS};
use super::table::{CommandSpec, Parser, command, subcommand};
use super::{Finish, NodeCmd, Trailing, msg};
use crate::protocol::ReplyWriter;
use crate::protocol::{ArgError, Args};
use crate::server::conn::Conn;
use crate::server::{ClientInfo, REDIS_COMPAT_VERSION};
use crate::sync::lock;
use bytes::Bytes;
use std::sync::atomic::Ordering;

/// A connection command, parsed.
pub enum ConnectionCmd {
    /// PING [message]
    Ping(Option<Bytes>),
    /// ECHO message
    Echo(Bytes),
    Hello(Hello),
    /// AUTH [user] password
    Auth {
        user: Option<Bytes>,
        pass: Bytes,
    },
    /// SELECT 0: the only database there is.
    Select,
    /// CLIENT subcommand ...: `sub` is what CLIENT LIST shows as its `cmd=` (see
    /// `table::subcommand`); `cmd` is the subcommand, or why it is refused.
    Client {
        sub: usize,
        cmd: Result<ClientCmd, ArgError>,
    },
    /// QUIT (any arguments are ignored, as Redis ignores them).
    Quit,
    Reset,
}

/// HELLO [protover [AUTH user pass] [SETNAME name]]. The AUTH options are tried in order
/// when it runs; `refused`, an option that did not parse, is answered after them, where
/// Redis meets it.
pub struct Hello {
    pub proto: Option<i64>,
    pub auth: Vec<(Bytes, Bytes)>,
    pub setname: Option<String>,
    pub refused: Option<ArgError>,
}

/// A CLIENT subcommand, parsed.
pub enum ClientCmd {
    Id,
    SetName(String),
    GetName,
    SetInfo {
        attr: LibAttr,
        value: String,
    },
    Info,
    List(ClientList),
    Kill(ClientKill),
    /// NO-EVICT / NO-TOUCH ON|OFF: accepted, nothing to change.
    Accepted,
    Help,
}

/// The attribute CLIENT SETINFO sets.
pub enum LibAttr {
    Name,
    Ver,
}

/// Which clients CLIENT LIST shows.
pub enum ClientList {
    All,
    /// A client type none of bucketd's clients has.
    None,
    /// These ids, in the order asked.
    Ids(Vec<i64>),
}

/// CLIENT KILL, old form (`addr`: answers OK or an error, may kill the caller) or new form
/// (filters: answers how many were killed, skips the caller unless SKIPME no).
pub struct ClientKill {
    pub old_form: bool,
    pub id: Option<u64>,
    pub addr: Option<Bytes>,
    pub laddr: Option<Bytes>,
    pub skipme: bool,
    /// False when TYPE names a type no client has.
    pub type_ok: bool,
}

pub(super) const COMMANDS: &[CommandSpec] = &[
    command! {
        name: "ping",
        arity: -1,
        flags: ["fast", "stale"],
        keys: (0, 0, 0),
        acl: ["@fast", "@connection"],
        group: "connection",
        summary: "Returns the server's liveliness response.",
        parse: Parser::Node(parse_ping),
    },
    command! {
        name: "echo",
        arity: 2,
        flags: ["fast"],
        keys: (0, 0, 0),
        acl: ["@fast", "@connection"],
        group: "connection",
        summary: "Returns the given string.",
        parse: Parser::Node(parse_echo),
    },
    command! {
        name: "hello",
        arity: -1,
        flags: ["noscript", "loading", "stale", "fast", "no_auth", "allow_busy"],
        keys: (0, 0, 0),
        acl: ["@fast", "@connection"],
        group: "connection",
        summary: "Handshakes with the server: protocol version, authentication, client name.",
        barrier: true,
        parse: Parser::Node(parse_hello),
    },
    command! {
        name: "auth",
        arity: -2,
        flags: ["noscript", "loading", "stale", "fast", "no_auth", "allow_busy"],
        keys: (0, 0, 0),
        acl: ["@fast", "@connection"],
        group: "connection",
        summary: "Authenticates the connection.",
        barrier: true,
        parse: Parser::Node(parse_auth),
    },
    command! {
        name: "select",
        arity: 2,
        flags: ["loading", "stale", "fast"],
        keys: (0, 0, 0),
        acl: ["@fast", "@connection"],
        group: "connection",
        summary: "Changes the selected database (only 0 exists).",
        barrier: true,
        parse: Parser::Node(parse_select),
    },
    command! {
        name: "client",
        arity: -2,
        flags: ["noscript", "loading", "stale"],
        keys: (0, 0, 0),
        acl: ["@slow", "@connection"],
        group: "connection",
        summary: "Client connection commands: ID, SETNAME, GETNAME, SETINFO, INFO, LIST.",
        parse: Parser::Node(parse_client),
    },
    command! {
        name: "quit",
        arity: -1,
        flags: ["noscript", "loading", "stale", "fast", "no_auth", "allow_busy"],
        keys: (0, 0, 0),
        acl: ["@fast", "@connection"],
        group: "connection",
        summary: "Closes the connection.",
        barrier: true,
        parse: Parser::Node(parse_quit),
    },
    command! {
        name: "reset",
        arity: 1,
        flags: ["noscript", "loading", "stale", "fast", "no_auth", "allow_busy"],
        keys: (0, 0, 0),
        acl: ["@fast", "@connection"],
        group: "connection",
        summary: "Resets the connection to its initial state.",
        barrier: true,
        parse: Parser::Node(parse_reset),
    },
];

fn conn(cmd: ConnectionCmd) -> Result<NodeCmd, ArgError> {
    Ok(NodeCmd::Connection(cmd))
}

fn parse_ping(a: &mut Args) -> Result<NodeCmd, ArgError> {
    let arg = a.next_opt();
    a.finish_as(Trailing::Arity)?;
    conn(ConnectionCmd::Ping(arg))
}

fn parse_echo(a: &mut Args) -> Result<NodeCmd, ArgError> {
    conn(ConnectionCmd::Echo(a.next_bytes()?))
}

fn parse_hello(a: &mut Args) -> Result<NodeCmd, ArgError> {
    let mut h = Hello {
        proto: None,
        auth: Vec::new(),
        setname: None,
        refused: None,
    };
    if a.remaining() > 0 {
        let v = a
            .next_i64()
            .map_err(|_| msg("ERR Protocol version is not an integer or out of range"))?;
        if v != 2 && v != 3 {
            return Err(msg("NOPROTO unsupported protocol version"));
        }
        h.proto = Some(v);
    }
    h.refused = hello_options(a, &mut h).err();
    conn(ConnectionCmd::Hello(h))
}

/// HELLO's options, up to the first that does not parse.
fn hello_options(a: &mut Args, h: &mut Hello) -> Result<(), ArgError> {
    while a.remaining() > 0 {
        match a.next_keyword()?.as_str() {
            "AUTH" => {
                let user = a.next_bytes().map_err(|_| ArgError::Syntax)?;
                let pass = a.next_bytes().map_err(|_| ArgError::Syntax)?;
                h.auth.push((user, pass));
            }
            "SETNAME" => {
                let n = a.next_string().map_err(|_| ArgError::Syntax)?;
                check_name(&n)?;
                h.setname = Some(n);
            }
            _ => return Err(ArgError::Syntax),
        }
    }
    Ok(())
}

fn parse_auth(a: &mut Args) -> Result<NodeCmd, ArgError> {
    let (user, pass) = match a.remaining() {
        1 => (None, a.next_bytes()?),
        2 => (Some(a.next_bytes()?), a.next_bytes()?),
        _ => return Err(ArgError::Syntax),
    };
    conn(ConnectionCmd::Auth { user, pass })
}

fn parse_select(a: &mut Args) -> Result<NodeCmd, ArgError> {
    if a.next_i64()? != 0 {
        return Err(msg("ERR DB index is out of range"));
    }
    conn(ConnectionCmd::Select)
}

fn parse_quit(_: &mut Args) -> Result<NodeCmd, ArgError> {
    conn(ConnectionCmd::Quit)
}

fn parse_reset(_: &mut Args) -> Result<NodeCmd, ArgError> {
    conn(ConnectionCmd::Reset)
}

/// A client name, or a library name or version: printable ASCII without spaces.
fn printable(s: &str) -> bool {
    s.bytes().all(|b| (b'!'..=b'~').contains(&b))
}

fn check_name(n: &str) -> Result<(), ArgError> {
    if !printable(n) {
        return Err(msg(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        ));
    }
    Ok(())
}

fn parse_client(a: &mut Args) -> Result<NodeCmd, ArgError> {
    let given = a.next_string()?;
    let sub = given.to_ascii_uppercase();
    conn(ConnectionCmd::Client {
        sub: subcommand("client", &sub),
        cmd: parse_client_sub(a, &given, &sub),
    })
}

fn parse_client_sub(a: &mut Args, given: &str, sub: &str) -> Result<ClientCmd, ArgError> {
    // CLIENT's subcommands have exact argument counts, checked before their arguments.
    let exact = |a: &Args, n: usize| {
        if a.remaining() == n {
            Ok(())
        } else {
            Err(ArgError::WrongArity(format!(
                "client|{}",
                sub.to_ascii_lowercase()
            )))
        }
    };
    Ok(match sub {
        "ID" => {
            exact(a, 0)?;
            ClientCmd::Id
        }
        "SETNAME" => {
            exact(a, 1)?;
            let n = a.next_string()?;
            check_name(&n)?;
            ClientCmd::SetName(n)
        }
        "GETNAME" => {
            exact(a, 0)?;
            ClientCmd::GetName
        }
        "SETINFO" => {
            exact(a, 2)?;
            let attr = a.next_keyword()?;
            let value = a.next_string()?;
            if !printable(&value) {
                return Err(msg(format!(
                    "ERR {attr} cannot contain spaces, newlines or special characters."
                )));
            }
            let attr = match attr.as_str() {
                "LIB-NAME" => LibAttr::Name,
                "LIB-VER" => LibAttr::Ver,
                _ => return Err(msg(format!("ERR Unrecognized option '{attr}'"))),
            };
            ClientCmd::SetInfo { attr, value }
        }
        "INFO" => {
            exact(a, 0)?;
            ClientCmd::Info
        }
        "LIST" => {
            let rest = a.rest();
            ClientCmd::List(match rest.first() {
                None => ClientList::All,
                Some(k) if rest.len() == 2 && k.eq_ignore_ascii_case(b"TYPE") => {
                    if client_type_matches(&rest[1])? {
                        ClientList::All
                    } else {
                        ClientList::None
                    }
                }
                Some(k) if rest.len() >= 2 && k.eq_ignore_ascii_case(b"ID") => {
                    let mut ids = Vec::with_capacity(rest.len() - 1);
                    for id in &rest[1..] {
                        ids.push(
                            crate::protocol::args::parse_i64(id)
                                .ok_or_else(|| msg("ERR Invalid client ID"))?,
                        );
                    }
                    ClientList::Ids(ids)
                }
                Some(_) => return Err(ArgError::Syntax),
            })
        }
        "KILL" => ClientCmd::Kill(parse_client_kill(a)?),
        "NO-EVICT" | "NO-TOUCH" => {
            exact(a, 1)?;
            let v = a.next_keyword()?;
            if v != "ON" && v != "OFF" {
                return Err(ArgError::Syntax);
            }
            ClientCmd::Accepted
        }
        "HELP" => {
            exact(a, 0)?;
            ClientCmd::Help
        }
        _ => {
            return Err(msg(format!(
                "ERR unknown subcommand '{given}'. Try CLIENT HELP."
            )));
        }
    })
}

/// Client types of CLIENT LIST / CLIENT KILL TYPE; every bucketd client is `normal`.
fn client_type_matches(t: &[u8]) -> Result<bool, ArgError> {
    let t = String::from_utf8_lossy(t);
    match t.to_ascii_lowercase().as_str() {
        "normal" => Ok(true),
        "master" | "replica" | "slave" | "pubsub" => Ok(false),
        _ => Err(msg(format!("ERR Unknown client type '{t}'"))),
    }
}

/// CLIENT KILL's arguments, as Redis 7.0 reads them.
fn parse_client_kill(a: &mut Args) -> Result<ClientKill, ArgError> {
    let rest = a.rest();
    let old_form = rest.len() == 1;
    let mut k = ClientKill {
        old_form,
        id: None,
        addr: None,
        laddr: None,
        skipme: !old_form,
        type_ok: true,
    };
    if old_form {
        k.addr = Some(rest[0].clone());
        return Ok(k);
    }
    if rest.is_empty() {
        return Err(ArgError::WrongArity("client|kill".into()));
    }
    for pair in rest.chunks(2) {
        let [opt, val] = pair else {
            return Err(ArgError::Syntax);
        };
        match opt.to_ascii_uppercase().as_slice() {
            b"ID" => {
                let v = crate::protocol::args::parse_i64(val)
                    .filter(|&v| v >= 1)
                    .ok_or_else(|| msg("ERR client-id should be greater than 0"))?;
                k.id = Some(v.unsigned_abs());
            }
            b"TYPE" => k.type_ok = client_type_matches(val)?,
            b"ADDR" => k.addr = Some(val.clone()),
            b"LADDR" => k.laddr = Some(val.clone()),
            b"USER" => {
                if val.as_ref() != b"default" {
                    return Err(msg(format!(
                        "ERR No such user '{}'",
                        String::from_utf8_lossy(val)
                    )));
                }
            }
            b"SKIPME" => match val.to_ascii_uppercase().as_slice() {
                b"YES" => k.skipme = true,
                b"NO" => k.skipme = false,
                _ => return Err(ArgError::Syntax),
            },
            _ => return Err(ArgError::Syntax),
        }
    }
    Ok(k)
}

/// Runs a connection command on the connection that sent it.
pub(crate) fn run(c: &mut Conn, cmd: ConnectionCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    match cmd {
        ConnectionCmd::Ping(arg) => {
            let mut w = ReplyWriter::new(buf, c.resp3());
            match arg {
                Some(m) => w.bulk(&m),
                None => w.simple("PONG"),
            }
        }
        ConnectionCmd::Echo(m) => ReplyWriter::new(buf, c.resp3()).bulk(&m),
        ConnectionCmd::Hello(h) => hello(c, h, buf)?,
        ConnectionCmd::Auth { user, pass } => {
            authenticate(c, user.as_deref(), &pass)?;
            ReplyWriter::new(buf, c.resp3()).ok();
        }
        ConnectionCmd::Select => ReplyWriter::new(buf, c.resp3()).ok(),
        ConnectionCmd::Quit => {
            ReplyWriter::new(buf, c.resp3()).ok();
            c.close_after_reply();
        }
        ConnectionCmd::Reset => {
            c.set_resp3(false);
            c.set_authed(!c.node().live.needs_auth());
            c.set_user("default", false);
            {
                let mut m = lock(&c.info().meta);
                m.name.clear();
            }
            ReplyWriter::new(buf, c.resp3()).simple("RESET");
        }
        ConnectionCmd::Client { sub, cmd } => {
            note_subcommand(c, sub);
            client(c, cmd?, buf)?;
        }
    }
    Ok(())
}

/// AUTH and HELLO's AUTH. Without a password the node acts as Redis 7's `nopass` default
/// user: any password is accepted for `default`, other users do not exist, and the
/// one-argument form keeps Redis's complaint that no password is configured.
fn authenticate(c: &mut Conn, user: Option<&[u8]>, pass: &[u8]) -> Result<(), Failure> {
    const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";
    let user_ok = user.is_none_or(|u| u == b"default");
    if let Some(name) = user.filter(|_| !user_ok) {
        // A named user from the config file.
        let found = super::acl::find_user(&c.node().settings.users, name, pass)
            .map(|u| (u.name.clone(), u.readonly));
        return match found {
            Some((name, readonly)) => {
                c.set_authed(true);
                c.set_user(&name, readonly);
                Ok(())
            }
            None => Err(fail(WRONGPASS)),
        };
    }
    let Some(expected) = c.node().live.requirepass() else {
        if !c.node().settings.users.is_empty() {
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
        c.set_authed(true);
        return Ok(());
    };
    // Compare in constant time so the reply time does not leak how much of the password matched.
    let pass_ok = super::acl::same_bytes(expected.as_bytes(), pass);
    if user_ok && pass_ok {
        c.set_authed(true);
        c.set_user("default", false);
        Ok(())
    } else {
        Err(fail(WRONGPASS))
    }
}

fn hello(c: &mut Conn, h: Hello, buf: &mut Vec<u8>) -> Result<(), Failure> {
    for (user, pass) in &h.auth {
        authenticate(c, Some(user), pass)?;
    }
    if let Some(e) = h.refused {
        return Err(e.into());
    }
    if !c.authed() {
        return Err(fail(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
        ));
    }
    if let Some(p) = h.proto {
        c.set_resp3(p == 3);
    }
    if let Some(n) = h.setname {
        lock(&c.info().meta).name = n;
    }
    let mut w = ReplyWriter::new(buf, c.resp3());
    w.map(7);
    w.kv_str("server", "bucketd");
    w.kv_str("version", REDIS_COMPAT_VERSION);
    w.kv_int("proto", if c.resp3() { 3 } else { 2 });
    w.kv_int("id", i64::try_from(c.info().id).unwrap_or(i64::MAX));
    w.kv_str(
        "mode",
        if c.node().cluster().is_some() {
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
fn client_line(c: &Conn, info: &ClientInfo, cmd: Option<&str>) -> String {
    let m = lock(&info.meta).clone();
    let now = c.node().uptime_ms();
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

fn client(c: &mut Conn, cmd: ClientCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    match cmd {
        ClientCmd::Id => {
            ReplyWriter::new(buf, c.resp3()).int(i64::try_from(c.info().id).unwrap_or(i64::MAX));
        }
        ClientCmd::SetName(n) => {
            lock(&c.info().meta).name = n;
            ReplyWriter::new(buf, c.resp3()).ok();
        }
        ClientCmd::GetName => {
            let n = lock(&c.info().meta).name.clone();
            let mut w = ReplyWriter::new(buf, c.resp3());
            if n.is_empty() {
                w.null()
            } else {
                w.bulk(n.as_bytes())
            }
        }
        ClientCmd::SetInfo { attr, value } => {
            let mut m = lock(&c.info().meta);
            match attr {
                LibAttr::Name => m.lib_name = value,
                LibAttr::Ver => m.lib_ver = value,
            }
            drop(m);
            ReplyWriter::new(buf, c.resp3()).ok();
        }
        ClientCmd::Info => {
            let line = client_line(c, c.info(), Some("client|info"));
            ReplyWriter::new(buf, c.resp3()).verbatim(&line);
        }
        ClientCmd::List(which) => {
            let all: Vec<_> = lock(&c.node().clients)
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
                    let own = (i.id == c.info().id).then_some("client|list");
                    client_line(c, i, own)
                })
                .collect();
            ReplyWriter::new(buf, c.resp3()).verbatim(&text);
        }
        ClientCmd::Kill(k) => client_kill(c, k, buf)?,
        ClientCmd::Accepted => ReplyWriter::new(buf, c.resp3()).ok(),
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
            write_help(&mut ReplyWriter::new(buf, c.resp3()), &lines);
        }
    }
    Ok(())
}

/// CLIENT KILL, old form (`addr`, replies OK or an error, may kill the caller) and new form
/// (filters, replies how many were killed, skips the caller unless SKIPME no), as Redis 7.0.
fn client_kill(c: &mut Conn, k: ClientKill, buf: &mut Vec<u8>) -> Result<(), Failure> {
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
        let clients: Vec<_> = lock(&c.node().clients).values().cloned().collect();
        for info in clients {
            let is_self = info.id == c.info().id;
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
    let mut w = ReplyWriter::new(buf, c.resp3());
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
        c.close_after_reply();
    }
    Ok(())
}
