//! Runs the commands the node answers itself (connection state, server information,
//! operations over every shard), once `cmd` has parsed them into a `NodeCmd`.

use super::{Conn, REDIS_COMPAT_VERSION, info, lock};
use crate::cmd::NodeCmd;
use crate::cmd::cluster::{ClusterCmd, ClusterSub};
use crate::cmd::connection::{ClientCmd, ClientKill, ClientList, ConnectionCmd, Hello, LibAttr};
use crate::cmd::keyed::{KeyCmd, Reply};
use crate::cmd::rules::RuleCmd;
use crate::cmd::scan::ScanCmd;
use crate::cmd::server::{CommandCmd, CommandSub, ConfigCmd, ListFilter, ServerCmd};
use crate::cmd::table::{self, COMMANDS, CommandSpec, SUBCOMMANDS};
use crate::protocol::{ArgError, ReplyWriter};
use crate::shard::{ShardGone, ShardMsg};
use crate::store::SCAN_POSITION_BITS;
use std::sync::atomic::Ordering;

const NO_CLUSTER: &str = "ERR This instance has cluster support disabled";

/// Runs a parsed node command, or answers why its arguments were refused.
pub(super) async fn run(
    c: &mut Conn,
    spec: &'static CommandSpec,
    cmd: Result<NodeCmd, ArgError>,
    buf: &mut Vec<u8>,
) -> Result<(), ShardGone> {
    let res = match cmd {
        Ok(cmd) => dispatch(c, spec, cmd, buf).await,
        Err(e) => Err(Failure::Arg(e)),
    };
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
    cmd: NodeCmd,
    buf: &mut Vec<u8>,
) -> Result<(), Failure> {
    match cmd {
        NodeCmd::Connection(cmd) => connection(c, cmd, buf)?,
        NodeCmd::Server(cmd) => server(c, cmd, buf).await?,
        NodeCmd::Scan(cmd) => scan(c, cmd, buf).await?,
        NodeCmd::Rule(cmd) => rule(c, cmd, buf)?,
        NodeCmd::Cluster(cmd) => cluster(c, cmd, buf)?,
        NodeCmd::Transaction => {
            return Err(msg(format!(
                "ERR command '{}' is not available here",
                spec.name
            )));
        }
    }
    Ok(())
}

/// Records the subcommand a container command ran, for CLIENT LIST's `cmd=`.
fn note_subcommand(c: &Conn, sub: usize) {
    c.info.last_sub.store(sub, Ordering::Relaxed);
}

fn connection(c: &mut Conn, cmd: ConnectionCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    match cmd {
        ConnectionCmd::Ping(arg) => {
            let mut w = ReplyWriter::new(buf, c.resp3);
            match arg {
                Some(m) => w.bulk(&m),
                None => w.simple("PONG"),
            }
        }
        ConnectionCmd::Echo(m) => ReplyWriter::new(buf, c.resp3).bulk(&m),
        ConnectionCmd::Hello(h) => hello(c, h, buf)?,
        ConnectionCmd::Auth { user, pass } => {
            authenticate(c, user.as_deref(), &pass)?;
            ReplyWriter::new(buf, c.resp3).ok();
        }
        ConnectionCmd::Select => ReplyWriter::new(buf, c.resp3).ok(),
        ConnectionCmd::Quit => {
            ReplyWriter::new(buf, c.resp3).ok();
            c.quit = true;
        }
        ConnectionCmd::Reset => {
            set_resp3(c, false);
            c.authed = !c.node.live.needs_auth();
            {
                let mut m = lock(&c.info.meta);
                m.name.clear();
            }
            ReplyWriter::new(buf, c.resp3).simple("RESET");
        }
        ConnectionCmd::Client { sub, cmd } => {
            note_subcommand(c, sub);
            client(c, cmd?, buf)?;
        }
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

fn hello(c: &mut Conn, h: Hello, buf: &mut Vec<u8>) -> Result<(), Failure> {
    for (user, pass) in &h.auth {
        authenticate(c, Some(user), pass)?;
    }
    if let Some(e) = h.refused {
        return Err(e.into());
    }
    if !c.authed {
        return Err(msg(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
        ));
    }
    if let Some(p) = h.proto {
        set_resp3(c, p == 3);
    }
    if let Some(n) = h.setname {
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

fn client(c: &mut Conn, cmd: ClientCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    match cmd {
        ClientCmd::Id => {
            ReplyWriter::new(buf, c.resp3).int(i64::try_from(c.info.id).unwrap_or(i64::MAX));
        }
        ClientCmd::SetName(n) => {
            lock(&c.info.meta).name = n;
            ReplyWriter::new(buf, c.resp3).ok();
        }
        ClientCmd::GetName => {
            let n = lock(&c.info.meta).name.clone();
            let mut w = ReplyWriter::new(buf, c.resp3);
            if n.is_empty() {
                w.null()
            } else {
                w.bulk(n.as_bytes())
            }
        }
        ClientCmd::SetInfo { attr, value } => {
            let mut m = lock(&c.info.meta);
            match attr {
                LibAttr::Name => m.lib_name = value,
                LibAttr::Ver => m.lib_ver = value,
            }
            drop(m);
            ReplyWriter::new(buf, c.resp3).ok();
        }
        ClientCmd::Info => {
            let line = client_line(c, &c.info, Some("client|info"));
            ReplyWriter::new(buf, c.resp3).verbatim(&line);
        }
        ClientCmd::List(which) => {
            let all: Vec<_> = lock(&c.node.clients)
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
                    let own = (i.id == c.info.id).then_some("client|list");
                    client_line(c, i, own)
                })
                .collect();
            ReplyWriter::new(buf, c.resp3).verbatim(&text);
        }
        ClientCmd::Kill(k) => client_kill(c, k, buf)?,
        ClientCmd::Accepted => ReplyWriter::new(buf, c.resp3).ok(),
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
            write_help(&mut ReplyWriter::new(buf, c.resp3), &lines);
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

async fn server(c: &mut Conn, cmd: ServerCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    match cmd {
        ServerCmd::Command(cmd) => command(c, cmd, buf)?,
        ServerCmd::Info(sections) => {
            let text = info::render(&c.node, &sections);
            ReplyWriter::new(buf, c.resp3).verbatim(&text);
        }
        ServerCmd::Config { sub, cmd } => {
            note_subcommand(c, sub);
            config(c, cmd?, buf).await?;
        }
        ServerCmd::DbSize => {
            let total: i64 = c
                .all_shards(|| KeyCmd::DbSize)
                .await?
                .iter()
                .filter_map(Reply::as_int)
                .sum();
            ReplyWriter::new(buf, c.resp3).int(total);
        }
        ServerCmd::Flush => {
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
        ServerCmd::Time => {
            let now = c.node.clock.now_ns();
            let mut w = ReplyWriter::new(buf, c.resp3);
            w.array(2);
            w.bulk((now / 1_000_000_000).to_string().as_bytes());
            w.bulk(((now % 1_000_000_000) / 1000).to_string().as_bytes());
        }
        ServerCmd::Keys(pattern) => {
            let replies = c.all_shards(|| KeyCmd::Keys(pattern.clone())).await?;
            let mut all = Vec::new();
            for r in replies {
                if let Reply::Array(items) = r {
                    all.extend(items);
                }
            }
            super::encode(&mut ReplyWriter::new(buf, c.resp3), &Reply::Array(all));
        }
    }
    Ok(())
}

fn command(c: &mut Conn, cmd: CommandCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    let cmd = match cmd {
        CommandCmd::All => {
            let mut w = ReplyWriter::new(buf, c.resp3);
            w.array(COMMANDS.len());
            for cmd in COMMANDS {
                table::write_info(&mut w, cmd);
            }
            return Ok(());
        }
        CommandCmd::Sub { sub, cmd } => {
            note_subcommand(c, sub);
            cmd?
        }
    };
    let mut w = ReplyWriter::new(buf, c.resp3);
    match cmd {
        CommandSub::Count => w.int(COMMANDS.len() as i64),
        CommandSub::List(filter) => {
            let listed: Vec<&CommandSpec> = COMMANDS
                .iter()
                .filter(|cmd| match &filter {
                    None => true,
                    // bucketd loads no modules.
                    Some(ListFilter::Module) => false,
                    Some(ListFilter::AclCat(cat)) => cmd.acl.iter().any(|c| {
                        c.strip_prefix('@')
                            .is_some_and(|c| c.as_bytes().eq_ignore_ascii_case(cat))
                    }),
                    Some(ListFilter::Pattern(pattern)) => {
                        crate::glob::matches_nocase(pattern, cmd.name.as_bytes())
                    }
                })
                .collect();
            // Subcommands are listed as `container|sub`, as Redis lists them; they have no
            // ACL categories or module of their own here.
            let subs: Vec<&str> = SUBCOMMANDS
                .iter()
                .copied()
                .filter(|full| match &filter {
                    None => true,
                    Some(ListFilter::Pattern(pattern)) => {
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
        CommandSub::Info(names) => {
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
        CommandSub::Docs(names) => {
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
        CommandSub::GetKeys(keys) => {
            w.array(keys.len());
            for k in keys {
                w.bulk(&k);
            }
        }
        CommandSub::Help => {
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
    }
    Ok(())
}

async fn config(c: &mut Conn, cmd: ConfigCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    match cmd {
        ConfigCmd::Get(patterns) => {
            let hits = super::live::config_get(&c.node, &patterns);
            let mut w = ReplyWriter::new(buf, c.resp3);
            w.map(hits.len());
            for (k, v) in hits {
                w.kv_str(&k, &v);
            }
        }
        ConfigCmd::Set(pairs) => {
            let applied = super::live::config_set(&c.node, &pairs).map_err(msg)?;
            if applied.caps_switched {
                sync_caps(c).await?;
            }
            ReplyWriter::new(buf, c.resp3).ok();
        }
        ConfigCmd::ResetStat => {
            for s in &c.node.shards {
                s.stats.errors.reset();
            }
            let st = &c.node.stats;
            st.connections_received.store(0, Ordering::Relaxed);
            st.rejected_connections.store(0, Ordering::Relaxed);
            st.protocol_errors.store(0, Ordering::Relaxed);
            ReplyWriter::new(buf, c.resp3).ok();
        }
        ConfigCmd::Help => {
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

/// SCAN: the cursor holds the shard in its top bits and the shard store's scan position below,
/// so scanning walks the shards in order and each shard's keys in the order of their hash; see
/// `Store::scan` for the guarantee.
async fn scan(c: &mut Conn, cmd: ScanCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    let ScanCmd {
        cursor,
        count,
        pattern,
        type_name,
    } = cmd;
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

fn rule(c: &mut Conn, cmd: RuleCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    let rules = &c.node.rules;
    let mut w = ReplyWriter::new(buf, c.resp3);
    match cmd {
        RuleCmd::Set { name, rule } => {
            rules
                .set(&name, rule)
                .map_err(|e| msg(format!("ERR {e}")))?;
            w.ok();
        }
        RuleCmd::Get(name) => match rules.load().get(&name) {
            Some(r) => w.bulk(r.to_string().as_bytes()),
            None => w.null(),
        },
        RuleCmd::Del(name) => w.int(i64::from(rules.remove(&name))),
        RuleCmd::List => {
            let set = rules.load();
            let sorted = set.sorted();
            w.map(sorted.len());
            for (name, r) in sorted {
                w.kv_str(name, &r.to_string());
            }
        }
        RuleCmd::Reload => {
            let n = rules
                .reload()
                .map_err(|e| msg(format!("ERR rules not reloaded, previous rules kept: {e}")))?;
            w.int(n as i64);
        }
    }
    Ok(())
}

fn cluster(c: &mut Conn, cmd: ClusterCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    match cmd {
        ClusterCmd::Cluster { sub, cmd } => {
            note_subcommand(c, sub);
            match cmd? {
                ClusterSub::KeySlot(slot) => ReplyWriter::new(buf, c.resp3).int(i64::from(slot)),
                ClusterSub::View(view) => match c.node.cluster() {
                    Some(cl) => {
                        let cl = cl.clone();
                        super::cluster_cmds::run(&cl, &view?, &mut ReplyWriter::new(buf, c.resp3));
                    }
                    None => return Err(msg(NO_CLUSTER)),
                },
            }
        }
        ClusterCmd::Accepted => {
            if c.node.cluster().is_none() {
                return Err(msg(NO_CLUSTER));
            }
            ReplyWriter::new(buf, c.resp3).ok();
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
