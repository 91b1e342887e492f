//! Connection commands: PING, ECHO, HELLO, AUTH, SELECT, CLIENT, QUIT, RESET. Their entries
//! and how their arguments parse into a `ConnectionCmd`; the server runs them on the
//! connection's own state.

use super::table::{CommandSpec, Parser, command, subcommand};
use super::{Finish, NodeCmd, Trailing, msg};
use crate::protocol::{ArgError, Args};
use bytes::Bytes;

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
                            crate::protocol::parse_i64(id)
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
                let v = crate::protocol::parse_i64(val)
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
