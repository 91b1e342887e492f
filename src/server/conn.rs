//! One client connection: reads requests, runs them on the shards that own their keys, and
//! writes the replies back in request order.
//!
//! The connection task is the coordinator for its client. Each round it parses what the
//! socket delivered (up to `MAX_BATCH` requests), runs the commands its own shard owns inline,
//! sends every other shard one batch with its share (`round`), and writes the replies in
//! order. Commands that change how later replies are encoded (HELLO), that gate later commands
//! (AUTH), or that span shards act as barriers: the round so far is flushed first.
//!
//! What one client can make the node hold is bounded in bytes:
//! - a request may not pass `client-query-buffer-limit` (bulk arguments included), and before
//!   AUTH only handshake-sized requests are accepted;
//! - replies are produced and written in pieces of about `REPLY_BUDGET` bytes, and nothing more
//!   is read until the socket has taken them, so a client that does not read its replies
//!   stalls only itself;
//! - a transaction's queued commands count against the same request cap;
//! - all connections' buffers together stay under `maxmemory-clients`: the connection whose
//!   growth passes it is closed.

use super::commands;
use super::named::{self, Decided, Named, named_rules};
use super::round::{KEEP_REQS, REPLY_BUDGET, Round};
use super::scatter;
use super::session::Session;
use super::stream::ClientStream;
use super::txn::{CROSSSLOT, ExecItem, Txn, common_slot};
use super::{ClientInfo, Node};
use super::{cross, eval_gate};
use crate::cmd::ConnectionCmd;
use crate::cmd::TxnCmd;
use crate::cmd::{self, CommandSpec, MultiCmd, NodeCmd, ParseError, Parsed};
use crate::cmd::{CheckKind, KeyCmd, MISSING_REPLY, Reply, encode};
use crate::protocol::{ArgError, ReplyWriter, Request, RequestParser};
use crate::rules::RuleSet;
use crate::shard::{CoreRef, ShardGone};
use crate::shutdown::Shutdown;
use crate::slot::key_slot;
use bytes::BytesMut;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Most requests handled per round before replies are written (the rest wait in the buffer).
const MAX_BATCH: usize = 1024;
/// What a read asks the socket for.
const READ_CHUNK: usize = 16 * 1024;
/// Buffers larger than this are given back once they are mostly empty.
const SHRINK_ABOVE: usize = 4 * READ_CHUNK;
/// Past this, a connection's buffers are worth returning to the operating system when it
/// closes.
const TRIM_AFTER: usize = 1024 * 1024;
/// A connection holding less than this is never closed for the node-wide buffer cap: the cap
/// is aimed at the clients that hold a lot.
const EVICT_FLOOR: usize = 256 * 1024;

const WATCH_UNSUPPORTED: &str = "ERR WATCH is not supported: a MULTI/EXEC on one slot already runs atomically on the shard that owns it";

/// Why a connection stops serving.
pub(super) enum Stop {
    /// A shard is gone: the node is shutting down.
    Gone,
    Io(std::io::Error),
}

impl From<ShardGone> for Stop {
    fn from(_: ShardGone) -> Self {
        Stop::Gone
    }
}

impl From<std::io::Error> for Stop {
    fn from(e: std::io::Error) -> Self {
        Stop::Io(e)
    }
}

/// What the client's next read ended on.
enum Wake {
    Read,
    Closed,
}

/// One client connection.
pub(crate) struct Conn {
    /// What node commands see of the connection.
    ses: Session,
    round: Round,
    stream: ClientStream,
    rbuf: BytesMut,
    out: Vec<u8>,
    parser: RequestParser,
    txn: Option<Txn>,
    /// The requests of the round being run, kept between rounds for their allocation.
    reqs: Vec<Request>,
    /// This connection's share of `Node::client_buffer_bytes`.
    accounted: usize,
    /// The most its buffers held at once.
    peak: usize,
}

impl Conn {
    pub(super) fn new(
        node: Arc<Node>,
        core: CoreRef,
        info: Arc<ClientInfo>,
        stream: ClientStream,
    ) -> Conn {
        let n = node.shards.len();
        Conn {
            ses: Session::new(node, core, info),
            round: Round::new(n),
            stream,
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            out: Vec::with_capacity(READ_CHUNK),
            parser: RequestParser::default(),
            txn: None,
            reqs: Vec::new(),
            accounted: 0,
            peak: 0,
        }
    }

    /// Serves the client until it leaves, the node shuts down, or a limit closes it; then
    /// gives back what its buffers held.
    pub(super) async fn serve(&mut self, shutdown: Shutdown) -> std::io::Result<()> {
        let res = self.serve_loop(shutdown).await;
        self.release_buffers();
        if self.peak > TRIM_AFTER {
            // A large client's buffers went back to the allocator, which keeps them; hand
            // them to the operating system so RSS falls once such clients have left.
            self.ses.node.release_free_memory();
        }
        res
    }

    async fn serve_loop(&mut self, mut shutdown: Shutdown) -> std::io::Result<()> {
        // One wait for the node's shutdown or this client's kill, for the connection's life:
        // a fresh one per read would register and drop two waiters every round.
        let info = self.ses.info.clone();
        let stop = async move {
            tokio::select! {
                _ = shutdown.recv() => {}
                _ = info.killed() => {}
            }
        };
        tokio::pin!(stop);
        loop {
            let more_buffered = self.serve_buffered().await?;
            if self.ses.quit {
                let _ = self.stream.shutdown().await;
                return Ok(());
            }
            if more_buffered {
                // Let the shard's other connections have a turn before the next round.
                tokio::task::yield_now().await;
                continue;
            }
            self.tidy_read_buffer();
            // An idle client is counted with the buffers it keeps while it waits.
            self.account();
            let wake = tokio::select! {
                n = self.stream.read_buf(&mut self.rbuf) => {
                    if n? == 0 { Wake::Closed } else { Wake::Read }
                }
                _ = &mut stop => Wake::Closed,
            };
            if matches!(wake, Wake::Closed) {
                return Ok(());
            }
            if self.over_client_cap() {
                self.evict().await;
                return Ok(());
            }
        }
    }

    /// Runs one round of what the buffer holds and writes its replies; true when more
    /// requests are already buffered.
    async fn serve_buffered(&mut self) -> std::io::Result<bool> {
        // Like Redis's, `qbuf` counts the requests being run as well as what waits.
        self.note_qbuf();
        // Until the client has authenticated, one request at a time: AUTH changes which
        // limits the next request is parsed with.
        let max_batch = if self.ses.authed { MAX_BATCH } else { 1 };
        let mut reqs = std::mem::take(&mut self.reqs);
        let proto_err = self.parse_requests(&mut reqs, max_batch);
        let more_buffered = reqs.len() == max_batch;
        // A round is timed from its requests being read to its replies being written.
        let started = (!reqs.is_empty()).then(std::time::Instant::now);
        if !reqs.is_empty() {
            self.run_requests(&mut reqs).await?;
        }
        // A small round's vector is kept; a long pipeline's is not held while idle.
        if reqs.capacity() <= KEEP_REQS {
            self.reqs = reqs;
        }
        self.note_qbuf();
        if let Some(e) = &proto_err {
            self.ses
                .node
                .stats
                .protocol_errors
                .fetch_add(1, Ordering::Relaxed);
            ReplyWriter::new(&mut self.out, self.ses.resp3).error(&format!("ERR {e}"));
            self.ses.quit = true;
        }
        if !self.out.is_empty() {
            // The replies wait for the rest of the loop's turn: every connection the last
            // poll found readable runs its round first, and then they all write. Written back
            // to back, the writes mostly find their reader already awake, rather than each
            // paying to wake it.
            crate::shard::end_of_turn().await;
        }
        self.write_out().await?;
        if let Some(started) = started
            && self.round.checks > 0
        {
            let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.ses.node.shards[self.ses.my_shard]
                .stats
                .metrics
                .check_latency
                .observe(ns, self.round.checks);
            self.round.checks = 0;
        }
        Ok(more_buffered)
    }

    /// Parses buffered requests into `reqs`, up to `max_batch`; the protocol error that
    /// stopped parsing, if one did.
    fn parse_requests(
        &mut self,
        reqs: &mut Vec<Request>,
        max_batch: usize,
    ) -> Option<crate::protocol::ProtocolError> {
        let limits = self.ses.node.request_limits();
        while reqs.len() < max_batch {
            match self.parser.parse(&mut self.rbuf, &limits, self.ses.authed) {
                Ok(Some(r)) if r.is_empty() => {}
                Ok(Some(r)) => reqs.push(r),
                Ok(None) => break,
                Err(e) => return Some(e),
            }
        }
        None
    }

    /// Runs a round of requests; a node shutting down is answered, not an error.
    async fn run_requests(&mut self, reqs: &mut Vec<Request>) -> std::io::Result<()> {
        self.ses
            .info
            .last_active_ms
            .store(self.ses.node.uptime_ms(), Ordering::Relaxed);
        // Counted per shard: one node-wide counter would bounce between cores.
        self.ses.node.shards[self.ses.my_shard]
            .stats
            .requests
            .fetch_add(reqs.len() as u64, Ordering::Relaxed);
        let res = self.run_round(reqs).await;
        reqs.clear();
        match res {
            Ok(()) => Ok(()),
            Err(Stop::Gone) => {
                // The round's commands went to a shard that stopped before it answered: they
                // may have been applied (in a cluster, their entries may still commit).
                ReplyWriter::new(&mut self.out, self.ses.resp3).error(
                    "UNKNOWN outcome unknown: the node is shutting down; the command may or may not have been applied",
                );
                self.ses.quit = true;
                Ok(())
            }
            Err(Stop::Io(e)) => Err(e),
        }
    }

    fn note_qbuf(&self) {
        self.ses
            .info
            .qbuf
            .store(self.rbuf.len() as u64, Ordering::Relaxed);
    }

    /// Makes room for the next read, and gives back a large buffer that is mostly empty.
    fn tidy_read_buffer(&mut self) {
        if self.rbuf.capacity() - self.rbuf.len() < 4096 {
            self.rbuf.reserve(READ_CHUNK);
        }
        if self.rbuf.capacity() > SHRINK_ABOVE && self.rbuf.len() < self.rbuf.capacity() / 8 {
            // Keep what is buffered (the start of a request: the parser's offsets stay
            // valid, they count from the buffer's start) in a right-sized buffer.
            let mut fresh =
                BytesMut::with_capacity((self.rbuf.len() * 2).max(READ_CHUNK) + READ_CHUNK);
            fresh.extend_from_slice(&self.rbuf);
            self.rbuf = fresh;
        }
    }

    /// Closes this connection because all connections' buffers passed `maxmemory-clients`.
    async fn evict(&mut self) {
        self.ses
            .node
            .stats
            .evicted_clients
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            client = self.ses.info.id,
            bytes = self.accounted,
            "closing a client: connections' buffers passed maxmemory-clients"
        );
        // Give the buffers back first: the cap is node-wide, and others are waiting.
        self.release_buffers();
        let _ = self
            .stream
            .write_all(b"-ERR client buffers passed maxmemory-clients; closing\r\n")
            .await;
        let _ = self.stream.shutdown().await;
    }

    /// Drops this connection's buffers and takes them out of the node-wide count.
    fn release_buffers(&mut self) {
        self.rbuf = BytesMut::new();
        self.out = Vec::new();
        self.account();
    }

    /// Updates this connection's share of the node-wide buffer count.
    fn account(&mut self) {
        let now = self.rbuf.capacity() + self.out.capacity();
        self.peak = self.peak.max(now);
        if now != self.accounted {
            let total = &self.ses.node.client_buffer_bytes;
            if now > self.accounted {
                total.fetch_add(now - self.accounted, Ordering::Relaxed);
            } else {
                total.fetch_sub(self.accounted - now, Ordering::Relaxed);
            }
            self.accounted = now;
        }
    }

    /// Whether this connection must be closed because all connections together hold more
    /// than `maxmemory-clients` and it holds a lot of it.
    fn over_client_cap(&mut self) -> bool {
        self.account();
        let cap = self.ses.node.maxmemory_clients();
        cap > 0
            && self.accounted > EVICT_FLOOR
            && self.ses.node.client_buffer_bytes.load(Ordering::Relaxed) > cap
    }

    /// Writes every encoded reply to the socket; waits while the client is not reading.
    async fn write_out(&mut self) -> std::io::Result<()> {
        if self.out.is_empty() {
            return Ok(());
        }
        self.ses
            .info
            .omem
            .store(self.out.len() as u64, Ordering::Relaxed);
        self.account();
        self.stream.write_all(&self.out).await?;
        self.out.clear();
        self.ses.info.omem.store(0, Ordering::Relaxed);
        if self.out.capacity() > 2 * REPLY_BUDGET {
            self.out.shrink_to(READ_CHUNK);
        }
        Ok(())
    }

    /// Handles one round of requests, appending every reply to `out` in order.
    async fn run_round(&mut self, reqs: &mut Vec<Request>) -> Result<(), Stop> {
        let rules = self.ses.node.rules.load();
        if let Some(last) = reqs.last() {
            let idx = cmd::index_of(last.name()).map_or(0, |i| i + 1);
            self.ses.info.last_cmd.store(idx, Ordering::Relaxed);
        }
        for req in reqs.drain(..) {
            if self.ses.quit {
                break;
            }
            let is_exec = req.name().eq_ignore_ascii_case(b"exec");
            if let Some(why) = self.refusal(&req) {
                self.refuse(is_exec, &why);
                continue;
            }
            // As in Redis, a transaction takes no command that would grow memory at its cap.
            if self.txn.is_some()
                && self.ses.node.live.caps.memory_full()
                && cmd::lookup(req.name()).is_some_and(|c| c.refused_when_full())
            {
                self.refuse(
                    false,
                    "OOM command not allowed when used memory > 'maxmemory'.",
                );
                continue;
            }
            let wire_len = req.wire_len();
            let named = named_rules(&req);
            let mut parsed = cmd::parse(req, &rules);
            let mut across = None;
            if let Ok(Parsed::Keyed(KeyCmd::Eval(e))) = &mut parsed {
                match eval_gate::prepare(&self.ses.node, e) {
                    Err(why) => parsed = Err(ParseError::Arg(ArgError::Msg(why.message().into()))),
                    Ok(span) => across = span,
                }
            }
            if is_exec && let Err(e) = &parsed {
                self.refuse(true, &e.message());
                continue;
            }
            if self.txn.is_some() {
                self.in_transaction(parsed, wire_len, named).await?;
                continue;
            }
            match parsed {
                Err(e) => self.local_error(&e.message()),
                Ok(Parsed::Keyed(cmd)) if across.is_some() => {
                    let span = across.unwrap_or(cross::Span::Every);
                    self.run_across(span, cmd).await?;
                }
                Ok(Parsed::Keyed(cmd)) => {
                    self.round.tag_named(named);
                    let slot = self.slot_of(cmd.route_key());
                    // Queued here rather than through `push_slot`: an async call would move
                    // every command through its future.
                    if self.round.queue(&self.ses.node, slot, cmd) {
                        self.flush().await?;
                    }
                }
                Ok(Parsed::Multi(m)) => self.run_multi(m, named, &rules).await?,
                Ok(Parsed::Node(_, Ok(NodeCmd::Transaction(t)))) => self.transaction_cmd(t),
                Ok(Parsed::Node(spec, args)) => self.node_cmd(spec, args).await?,
            }
        }
        self.flush().await
    }

    /// Why a request is refused before it is parsed: the client has not authenticated, or
    /// its user may only read.
    fn refusal(&self, req: &Request) -> Option<String> {
        if !self.ses.authed && !cmd::lookup(req.name()).is_some_and(|c| c.is_no_auth()) {
            return Some("NOAUTH Authentication required.".into());
        }
        let user = self.ses.readonly_user.as_ref()?;
        let what = cmd::readonly_refusal(req)?;
        Some(format!(
            "NOPERM User {user} has no permissions to run the '{what}' command"
        ))
    }

    /// A multi-key command: queued like a one-key command when one shard owns every key,
    /// otherwise run across the shards at once.
    async fn run_multi(
        &mut self,
        m: MultiCmd,
        named: Option<Vec<Named>>,
        rules: &RuleSet,
    ) -> Result<(), Stop> {
        let slot = key_slot(&m.keys()[0]);
        let node = &self.ses.node;
        let first = node.slot_owner(slot);
        if common_slot(m.keys().iter().map(|k| &k[..])).is_some()
            || (node.cluster().is_none() && m.keys().iter().all(|k| node.shard_of(k) == first))
        {
            self.round.tag_named(named);
            return self.push_slot(slot, m.into_key_cmd()).await;
        }
        if node.cluster().is_some() {
            // As in Redis Cluster: the keys of one command share a slot.
            self.local_error(CROSSSLOT);
            return Ok(());
        }
        if !m.is_check() {
            // As on a standalone Redis: atomic and isolated, whichever shards own the keys.
            let span = cross::Span::Some(m.keys().iter().map(|k| node.shard_of(k)).collect());
            return self.run_across(span, m.into_key_cmd()).await;
        }
        self.flush().await?;
        self.round.checks += u64::from(m.is_check());
        let mut reply = scatter::cross_shard(&self.ses, m).await?;
        if let Some(names) = named {
            let mut decided = Decided::new();
            named::settle(&mut reply, &names, rules, &mut decided);
            self.count_named(&decided);
        }
        if let Reply::LimitAll(summary, _) = &reply {
            let allowed = u64::from(summary[0] != 0);
            self.ses.node.shards[self.ses.my_shard]
                .stats
                .metrics
                .count_kind(CheckKind::CheckAll, allowed, 1 - allowed);
        }
        encode(&mut ReplyWriter::new(&mut self.out, self.ses.resp3), &reply);
        Ok(())
    }

    /// MULTI, EXEC, DISCARD, WATCH, UNWATCH outside a transaction.
    fn transaction_cmd(&mut self, t: TxnCmd) {
        match t {
            TxnCmd::Multi => {
                self.txn = Some(Txn::new(self.ses.node.cluster().is_none()));
                self.local_reply(|w| w.ok());
            }
            TxnCmd::Exec => self.local_error("ERR EXEC without MULTI"),
            TxnCmd::Discard => self.local_error("ERR DISCARD without MULTI"),
            // Nothing is ever watched, so there is nothing to forget.
            TxnCmd::Unwatch => self.local_reply(|w| w.ok()),
            TxnCmd::Watch => self.local_error(WATCH_UNSUPPORTED),
        }
    }

    /// Runs one command over the keys of several shards of a standalone node, after the
    /// round so far, and writes its reply.
    async fn run_across(&mut self, span: cross::Span, cmd: KeyCmd) -> Result<(), Stop> {
        self.flush().await?;
        let reply = cross::run(&self.ses, span, vec![cmd]).await?;
        let r = reply
            .into_iter()
            .next()
            .unwrap_or(Reply::err(MISSING_REPLY));
        encode(&mut ReplyWriter::new(&mut self.out, self.ses.resp3), &r);
        Ok(())
    }

    /// Runs a command the node answers itself, in order with the round's other replies.
    async fn node_cmd(
        &mut self,
        spec: &'static CommandSpec,
        args: Result<NodeCmd, ArgError>,
    ) -> Result<(), Stop> {
        if spec.is_barrier() {
            self.flush().await?;
            let mut buf = self.round.lend_local();
            let res = self.node_command(spec, args, &mut buf).await;
            self.out.extend_from_slice(&buf);
            self.round.give_back(buf);
            res?;
        } else {
            let mut buf = self.round.lend_local();
            let start = buf.len();
            let res = self.node_command(spec, args, &mut buf).await;
            self.round.return_local(buf, start);
            res?;
        }
        Ok(())
    }

    /// The hash slot a one-key command is queued under. A standalone node with one shard
    /// routes nothing by slot (and a cluster is only ever joined by a node started as one), so
    /// it skips hashing the key.
    fn slot_of(&self, route: &[u8]) -> u16 {
        if self.ses.node.shards.len() == 1 && self.ses.node.cluster().is_none() {
            0
        } else {
            key_slot(route)
        }
    }

    /// Queues a command whose keys are all in `slot`, for the shard that owns it; runs the
    /// round when its replies of stored values would pass the budget.
    async fn push_slot(&mut self, slot: u16, cmd: KeyCmd) -> Result<(), Stop> {
        if self.round.queue(&self.ses.node, slot, cmd) {
            self.flush().await?;
        }
        Ok(())
    }

    /// Encodes a reply of the node's own into the round, in order.
    fn local_reply(&mut self, f: impl FnOnce(&mut ReplyWriter)) {
        self.round.local_reply(self.ses.resp3, f);
    }

    fn local_error(&mut self, msg: &str) {
        self.local_reply(|w| w.error(msg));
    }

    /// Answers a command refused before it ran. As in Redis, that also dooms an open
    /// transaction, and a refused EXEC discards it and says why.
    fn refuse(&mut self, is_exec: bool, msg: &str) {
        if is_exec {
            self.txn = None;
            let why = msg.strip_prefix("ERR ").unwrap_or(msg);
            self.local_error(&format!(
                "EXECABORT Transaction discarded because of: {why}"
            ));
            return;
        }
        if let Some(t) = &mut self.txn {
            t.dirty = true;
        }
        self.local_error(msg);
    }

    /// Runs every shard's share of the round and writes all replies in order. Shards run
    /// their share until its replies pass `REPLY_BUDGET`; what is ready is written to the
    /// socket, and the shards are asked for the rest, so a round of large replies never sits
    /// in memory whole. (A replicated share is answered whole once its entries commit.)
    pub(super) async fn flush(&mut self) -> Result<(), Stop> {
        if self.round.is_empty() {
            return Ok(());
        }
        let rules = self.round.has_named().then(|| self.ses.node.rules.load());
        let mut f = self.round.start_flush();
        loop {
            self.round
                .run_shares(&self.ses, &mut f, REPLY_BUDGET)
                .await?;
            let done = self.round.write_ready(
                &mut f,
                &mut self.out,
                self.ses.resp3,
                rules.as_ref().map(|r| &***r),
            );
            if done {
                break;
            }
            self.write_out().await?;
        }
        self.round.end_flush(&mut f);
        if f.all_checks != [0, 0] {
            self.ses.node.shards[self.ses.my_shard]
                .stats
                .metrics
                .count_kind(CheckKind::CheckAll, f.all_checks[0], f.all_checks[1]);
        }
        self.count_named(&f.decided);
        Ok(())
    }

    /// Counts the decisions of checks that named a rule.
    fn count_named(&self, decided: &Decided) {
        if !decided.is_empty() {
            self.ses.node.shards[self.ses.my_shard]
                .stats
                .metrics
                .count_rules(decided.iter().map(|(n, v)| (n.as_ref(), *v)));
        }
    }

    /// Handles a request that arrives between MULTI and EXEC: queues it, or ends the
    /// transaction.
    async fn in_transaction(
        &mut self,
        parsed: Result<Parsed, ParseError>,
        wire_len: usize,
        named: Option<Vec<Named>>,
    ) -> Result<(), Stop> {
        let limit = self.ses.node.request_limits().max_request_bytes;
        let Some(txn) = self.txn.as_mut() else {
            return Ok(());
        };
        let queued = match parsed {
            Err(e) => {
                txn.dirty = true;
                self.local_error(&e.message());
                return Ok(());
            }
            Ok(Parsed::Node(spec, args)) => match &args {
                Ok(NodeCmd::Transaction(TxnCmd::Exec)) => return self.exec().await,
                Ok(NodeCmd::Transaction(TxnCmd::Discard)) => {
                    self.txn = None;
                    self.local_reply(|w| w.ok());
                    return Ok(());
                }
                Ok(NodeCmd::Transaction(TxnCmd::Multi)) => {
                    self.local_error("ERR MULTI calls can not be nested");
                    return Ok(());
                }
                Ok(NodeCmd::Transaction(TxnCmd::Watch)) => {
                    self.local_error("ERR WATCH inside MULTI is not allowed");
                    return Ok(());
                }
                // These act at once, as in Redis: QUIT closes, RESET also ends the transaction.
                Ok(NodeCmd::Connection(ConnectionCmd::Quit)) => {
                    return self.node_cmd(spec, args).await;
                }
                Ok(NodeCmd::Connection(ConnectionCmd::Reset)) => {
                    self.txn = None;
                    return self.node_cmd(spec, args).await;
                }
                _ => txn.queue_node(spec, args, wire_len, limit),
            },
            Ok(Parsed::Keyed(cmd)) => txn.queue_key(cmd, named, wire_len, limit),
            Ok(Parsed::Multi(m)) => txn.queue_multi(m, named, wire_len, limit),
        };
        match queued {
            Ok(()) => self.local_reply(|w| w.simple("QUEUED")),
            Err(why) => self.local_error(why),
        }
        Ok(())
    }

    /// EXEC: runs the queued key commands as one batch on the shard (or, in a cluster, as one
    /// log entry of the group) that owns their slot, so nothing interleaves with them, then
    /// answers with every queued command's reply in order.
    async fn exec(&mut self) -> Result<(), Stop> {
        let Some(txn) = self.txn.take() else {
            return Ok(());
        };
        if txn.dirty {
            self.local_error("EXECABORT Transaction discarded because of previous errors.");
            return Ok(());
        }
        // The QUEUED replies and everything before them go first.
        self.flush().await?;
        let (slot, keyed, order) = txn.into_parts();
        let span = cross::exec_span(&self.ses.node, &keyed);
        let mut replies = if keyed.is_empty() {
            Vec::new().into_iter()
        } else if let Some(span) = span {
            cross::run(&self.ses, span, keyed).await?.into_iter()
        } else {
            let slots = vec![slot; keyed.len()];
            let owner = self.ses.node.slot_owner(slot);
            let answer = self.ses.run_whole(owner, keyed, slots).await?;
            if let Some(why) = answer.refused {
                // The group could not take the transaction: nothing of it ran.
                ReplyWriter::new(&mut self.out, self.ses.resp3).error(&why);
                return Ok(());
            }
            answer.replies.into_iter()
        };
        let mut buf = Vec::new();
        let mut decided = Decided::new();
        let rules = self.ses.node.rules.load();
        ReplyWriter::new(&mut buf, self.ses.resp3).array(order.len());
        for item in order {
            self.exec_reply(item, &mut replies, &rules, &mut decided, &mut buf)
                .await?;
        }
        self.count_named(&decided);
        self.out.extend_from_slice(&buf);
        Ok(())
    }

    /// Writes one queued command's reply to EXEC: the next of the key commands' replies, or
    /// a node command's, run now.
    async fn exec_reply(
        &mut self,
        item: ExecItem,
        replies: &mut std::vec::IntoIter<Reply>,
        rules: &RuleSet,
        decided: &mut Decided,
        buf: &mut Vec<u8>,
    ) -> Result<(), ShardGone> {
        match item {
            Ok(named) => match replies.next() {
                Some(mut r) => {
                    if let Some(names) = named {
                        named::settle(&mut r, &names, rules, decided);
                    }
                    encode(&mut ReplyWriter::new(buf, self.ses.resp3), &r);
                }
                None => ReplyWriter::new(buf, self.ses.resp3).error(MISSING_REPLY),
            },
            Err((spec, args)) => self.node_command(spec, args, buf).await?,
        }
        Ok(())
    }

    /// Runs a command the node answers itself, writing its reply into `buf`.
    async fn node_command(
        &mut self,
        spec: &'static CommandSpec,
        args: Result<NodeCmd, ArgError>,
        buf: &mut Vec<u8>,
    ) -> Result<(), ShardGone> {
        commands::run(&mut self.ses, spec, args, buf).await
    }
}
