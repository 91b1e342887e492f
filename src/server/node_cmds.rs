//! Commands the node answers itself: connection state, server information, and operations
//! over every shard.

use super::{Conn, REDIS_COMPAT_VERSION, info, lock};
use crate::cmd::keyed::{KeyCmd, Reply};
use crate::cmd::resolve_spec;
use crate::cmd::table::{self, COMMANDS, CommandSpec};
use crate::protocol::{ArgError, Args, ReplyWriter};
use crate::shard::ShardGone;
use crate::slot::key_slot;
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
            c.authed = c.node.settings.requirepass.is_none();
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
        "config" => config(c, a, buf)?,
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

fn authenticate(c: &mut Conn, user: Option<&[u8]>, pass: &[u8]) -> Result<(), Failure> {
    let Some(expected) = &c.node.settings.requirepass else {
        return Err(msg(
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        ));
    };
    let user_ok = user.is_none_or(|u| u == b"default");
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
        Err(msg(
            "WRONGPASS invalid username-password pair or user is disabled.",
        ))
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

fn client_line(c: &Conn, info: &super::ClientInfo) -> String {
    let m = lock(&info.meta).clone();
    let now = c.node.uptime_ms();
    let idle = now.saturating_sub(info.last_active_ms.load(Ordering::Relaxed)) / 1000;
    format!(
        "id={} addr={} laddr={} fd=-1 name={} age={} idle={} flags=N db=0 sub=0 psub=0 ssub=0 multi=-1 watch=0 qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd=client|list user=default redir=-1 resp={} lib-name={} lib-ver={}\n",
        info.id,
        info.addr,
        info.laddr,
        m.name,
        info.created.elapsed().as_secs(),
        idle,
        m.resp,
        m.lib_name,
        m.lib_ver
    )
}

fn client(c: &mut Conn, a: &mut Args, buf: &mut Vec<u8>) -> Result<(), Failure> {
    let given = a.next_string()?;
    let sub = given.to_ascii_uppercase();
    let wrong = |sub: &str| {
        msg(format!(
            "ERR wrong number of arguments for 'client|{}' command",
            sub.to_ascii_lowercase()
        ))
    };
    match sub.as_str() {
        "ID" => {
            a.finish()?;
            ReplyWriter::new(buf, c.resp3).int(i64::try_from(c.info.id).unwrap_or(i64::MAX));
        }
        "SETNAME" => {
            let n = a.next_string().map_err(|_| wrong("SETNAME"))?;
            a.finish().map_err(|_| wrong("SETNAME"))?;
            check_name(&n)?;
            lock(&c.info.meta).name = n;
            ReplyWriter::new(buf, c.resp3).ok();
        }
        "GETNAME" => {
            let n = lock(&c.info.meta).name.clone();
            let mut w = ReplyWriter::new(buf, c.resp3);
            if n.is_empty() {
                w.null()
            } else {
                w.bulk(n.as_bytes())
            }
        }
        "SETINFO" => {
            let attr = a.next_keyword().map_err(|_| wrong("SETINFO"))?;
            let v = a.next_string().map_err(|_| wrong("SETINFO"))?;
            a.finish().map_err(|_| wrong("SETINFO"))?;
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
            let line = client_line(c, &c.info);
            ReplyWriter::new(buf, c.resp3).verbatim(&line);
        }
        "LIST" => {
            let clients: Vec<_> = lock(&c.node.clients).values().cloned().collect();
            let text: String = clients.iter().map(|i| client_line(c, i)).collect();
            ReplyWriter::new(buf, c.resp3).verbatim(&text);
        }
        "NO-EVICT" | "NO-TOUCH" => {
            let v = a.next_keyword()?;
            if v != "ON" && v != "OFF" {
                return Err(ArgError::Syntax.into());
            }
            ReplyWriter::new(buf, c.resp3).ok();
        }
        "HELP" => {
            let lines = [
                "CLIENT <subcommand>",
                "ID",
                "SETNAME <name>",
                "GETNAME",
                "SETINFO LIB-NAME|LIB-VER <value>",
                "INFO",
                "LIST",
            ];
            let mut w = ReplyWriter::new(buf, c.resp3);
            w.array(lines.len());
            for l in lines {
                w.simple(l);
            }
        }
        _ => {
            return Err(msg(format!(
                "ERR unknown subcommand '{given}'. Try CLIENT HELP."
            )));
        }
    }
    Ok(())
}

fn command(c: &mut Conn, a: &mut Args, buf: &mut Vec<u8>) -> Result<(), Failure> {
    let mut w = ReplyWriter::new(buf, c.resp3);
    if a.remaining() == 0 {
        w.array(COMMANDS.len());
        for cmd in COMMANDS {
            table::write_info(&mut w, cmd);
        }
        return Ok(());
    }
    let sub = a.next_keyword()?;
    match sub.as_str() {
        "COUNT" => w.int(COMMANDS.len() as i64),
        "LIST" => {
            w.array(COMMANDS.len());
            for cmd in COMMANDS {
                w.bulk(cmd.name.as_bytes());
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
            w.array(1);
            w.simple("COMMAND [COUNT|LIST|INFO [name ...]|DOCS [name ...]|GETKEYS cmd args...]");
        }
        other => {
            return Err(msg(format!(
                "ERR unknown subcommand '{other}'. Try COMMAND HELP."
            )));
        }
    }
    Ok(())
}

fn config(c: &mut Conn, a: &mut Args, buf: &mut Vec<u8>) -> Result<(), Failure> {
    let sub = a.next_keyword()?;
    let s = &c.node.settings;
    match sub.as_str() {
        "GET" => {
            let patterns = a.rest();
            if patterns.is_empty() {
                return Err(msg(
                    "ERR wrong number of arguments for 'config|get' command",
                ));
            }
            let params: Vec<(&str, String)> = vec![
                ("bind", s.bind.clone()),
                ("port", s.port.to_string()),
                ("maxclients", s.maxclients.to_string()),
                ("maxmemory", s.maxmemory.to_string()),
                ("maxmemory-policy", "noeviction".into()),
                ("max-keys", s.max_keys.to_string()),
                ("proto-max-bulk-len", s.proto_max_bulk_len.to_string()),
                ("databases", "1".into()),
                ("save", String::new()),
                ("appendonly", "no".into()),
                ("timeout", "0".into()),
                ("cluster-enabled", "no".into()),
                ("shards", c.node.shards.len().to_string()),
            ];
            let hits: Vec<&(&str, String)> = params
                .iter()
                .filter(|(k, _)| {
                    patterns
                        .iter()
                        .any(|p| crate::glob::matches(&p.to_ascii_lowercase(), k.as_bytes()))
                })
                .collect();
            let mut w = ReplyWriter::new(buf, c.resp3);
            w.map(hits.len());
            for (k, v) in hits {
                w.kv_str(k, v);
            }
        }
        "RESETSTAT" => ReplyWriter::new(buf, c.resp3).ok(),
        "SET" => {
            return Err(msg(
                "ERR CONFIG SET is not supported: restart with the new setting",
            ));
        }
        other => {
            return Err(msg(format!(
                "ERR unknown subcommand '{other}'. Try CONFIG HELP."
            )));
        }
    }
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
