//! One client connection: reads requests, runs them on the shards that own their keys, and
//! writes the replies back in request order.
//!
//! The connection task is the coordinator for its client. Each round it parses what the
//! socket delivered (up to `MAX_BATCH` requests), runs the commands its own shard owns inline,
//! sends every other shard one batch with its share, and writes the replies in order.
//! Commands that change how later replies are encoded (HELLO), that gate later commands
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
use super::scatter;
use super::session::Session;
use super::stream::ClientStream;
use super::{ClientInfo, Node};
use crate::cmd::connection::ConnectionCmd;
use crate::cmd::keyed::encode;
use crate::cmd::keyed::{CheckKind, KeyCmd, MISSING_REPLY, Reply, summarize};
use crate::cmd::transactions::TxnCmd;
use crate::cmd::{self, NodeCmd, ParseError, Parsed, table};
use crate::protocol::{ArgError, ReplyWriter, Request, RequestParser};
use crate::rules::RuleSet;
use crate::shard::metrics::Verdict;
use crate::shard::{Answer, CoreRef, Outcome, ShardGone};
use crate::shutdown::Shutdown;
use crate::slot::key_slot;
use bytes::{Bytes, BytesMut};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

/// Most requests handled per round before replies are written (the rest wait in the buffer).
const MAX_BATCH: usize = 1024;
/// Bytes of replies a round produces before they are written out and the shards are asked
/// for more. Also what each shard's share of a round may produce at once.
pub(super) const REPLY_BUDGET: usize = 256 * 1024;
/// A replicated batch's replies all arrive when its entries commit, so rounds with commands
/// that return stored values are cut to keep those replies under this.
const VALUE_REPLY_BUDGET: usize = 16 * 1024 * 1024;
/// The most requests whose vector a connection keeps between rounds.
const KEEP_REQS: usize = 32;
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

/// Where one request's reply comes from, in request order.
enum ReplySource {
    /// Already encoded, in `Round::local[start..end]`.
    Local(usize, usize),
    /// The next reply from this shard's batch.
    Shard(usize),
}

/// The requests of one round, split by the shard that owns their keys.
struct Round {
    queued: Vec<Vec<KeyCmd>>,
    /// The hash slot of each command in `queued` (a cluster proposes by slot's group, and
    /// answers -MOVED by slot).
    slots: Vec<Vec<u16>>,
    order: Vec<ReplySource>,
    local: Vec<u8>,
    /// Commands in this round that return a stored value.
    value_cmds: usize,
    /// Checks in this round (what the check latency histogram counts).
    checks: u64,
    /// Checks that named a rule: where their reply is and which rule (`Named::at` is the
    /// index in `order`).
    named: Vec<Named>,
}

/// A transaction being queued (between MULTI and EXEC).
#[derive(Default)]
struct Txn {
    items: Vec<TxnItem>,
    /// Wire bytes of the queued requests, held until EXEC.
    bytes: usize,
    /// A queued command was refused: EXEC aborts.
    dirty: bool,
    /// The slot every keyed command must share.
    slot: Option<u16>,
}

enum TxnItem {
    /// A key command, and the rules it named (for shadow mode and the metrics by rule).
    Key(KeyCmd, Option<Vec<Named>>),
    Node(&'static table::CommandSpec, Result<NodeCmd, ArgError>),
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
            round: Round {
                queued: (0..n).map(|_| Vec::new()).collect(),
                slots: (0..n).map(|_| Vec::new()).collect(),
                order: Vec::new(),
                local: Vec::new(),
                value_cmds: 0,
                checks: 0,
                named: Vec::new(),
            },
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
        // One wait for the node's shutdown or this client's kill, made once: a fresh one per
        // read registered and dropped two waiters every round.
        let info = self.ses.info.clone();
        let stop = async move {
            tokio::select! {
                _ = shutdown.recv() => {}
                _ = info.killed() => {}
            }
        };
        tokio::pin!(stop);
        loop {
            // Like Redis's, `qbuf` counts the requests being run as well as what waits.
            self.ses
                .info
                .qbuf
                .store(self.rbuf.len() as u64, Ordering::Relaxed);
            let limits = self.ses.node.request_limits();
            // Until the client has authenticated, one request at a time: AUTH changes which
            // limits the next request is parsed with.
            let max_batch = if self.ses.authed { MAX_BATCH } else { 1 };
            let mut reqs = std::mem::take(&mut self.reqs);
            let mut proto_err = None;
            while reqs.len() < max_batch {
                match self.parser.parse(&mut self.rbuf, &limits, self.ses.authed) {
                    Ok(Some(r)) if r.is_empty() => {}
                    Ok(Some(r)) => reqs.push(r),
                    Ok(None) => break,
                    Err(e) => {
                        proto_err = Some(e);
                        break;
                    }
                }
            }
            let more_buffered = reqs.len() == max_batch;
            // A round is timed from its requests being read to its replies being written.
            let started = (!reqs.is_empty()).then(std::time::Instant::now);
            if !reqs.is_empty() {
                self.ses
                    .info
                    .last_active_ms
                    .store(self.ses.node.uptime_ms(), Ordering::Relaxed);
                // Counted per shard: one node-wide counter would bounce between cores.
                self.ses.node.shards[self.ses.my_shard]
                    .stats
                    .requests
                    .fetch_add(reqs.len() as u64, Ordering::Relaxed);
                let res = self.run_round(&mut reqs).await;
                reqs.clear();
                // A small round's vector is kept; a long pipeline's is not held while idle.
                if reqs.capacity() <= KEEP_REQS {
                    self.reqs = reqs;
                }
                match res {
                    Ok(()) => {}
                    Err(Stop::Gone) => {
                        ReplyWriter::new(&mut self.out, self.ses.resp3)
                            .error("ERR server is shutting down");
                        self.ses.quit = true;
                    }
                    Err(Stop::Io(e)) => return Err(e),
                }
            }
            self.ses
                .info
                .qbuf
                .store(self.rbuf.len() as u64, Ordering::Relaxed);
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
                // poll found readable runs its round first, and then they all write. Writes
                // spread out between other clients' rounds each found their reader asleep
                // and paid to wake it (a quarter of the CPU of one-at-a-time script calls);
                // written back to back, most find it already awake.
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
            if self.ses.quit {
                let _ = self.stream.shutdown().await;
                return Ok(());
            }
            if more_buffered {
                // Let the shard's other connections have a turn before the next round.
                tokio::task::yield_now().await;
                continue;
            }
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
            // An idle client is counted with the buffers it keeps while it waits.
            self.account();
            tokio::select! {
                n = self.stream.read_buf(&mut self.rbuf) => {
                    if n? == 0 {
                        return Ok(());
                    }
                }
                _ = &mut stop => return Ok(()),
            }
            if self.over_client_cap() {
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
                return Ok(());
            }
        }
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
            let idx = table::index_of(last.name()).map_or(0, |i| i + 1);
            self.ses.info.last_cmd.store(idx, Ordering::Relaxed);
        }
        for req in reqs.drain(..) {
            if self.ses.quit {
                break;
            }
            let is_exec = req.name().eq_ignore_ascii_case(b"exec");
            if !self.ses.authed && !table::lookup(req.name()).is_some_and(|c| c.is_no_auth()) {
                self.refuse(is_exec, "NOAUTH Authentication required.");
                continue;
            }
            if let Some(user) = &self.ses.readonly_user
                && let Some(what) = cmd::acl::readonly_refusal(&req)
            {
                let why =
                    format!("NOPERM User {user} has no permissions to run the '{what}' command");
                self.refuse(is_exec, &why);
                continue;
            }
            let wire_len = req.wire_len();
            let named = named_rules(&req);
            let mut parsed = cmd::parse(req, &rules);
            if let Ok(Parsed::Keyed(KeyCmd::Eval(e))) = &mut parsed
                && let Err(why) = self.prepare_eval(e)
            {
                parsed = Err(ParseError::Arg(ArgError::Msg(why)));
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
                Ok(Parsed::Keyed(cmd)) => {
                    self.tag_named(named);
                    let slot = self.slot_of(cmd.route_key());
                    if self.queue(slot, cmd) {
                        self.flush().await?;
                    }
                }
                Ok(Parsed::Multi(m)) => {
                    let slot = key_slot(&m.keys()[0]);
                    let first = self.ses.node.slot_owner(slot);
                    if m.keys().iter().all(|k| key_slot(k) == slot) {
                        self.tag_named(named);
                        self.push_slot(slot, m.into_key_cmd()).await?;
                    } else if self.ses.node.cluster().is_some() {
                        // As in Redis Cluster: the keys of one command share a slot.
                        self.local_error(CROSSSLOT);
                    } else if m.keys().iter().all(|k| self.ses.node.shard_of(k) == first) {
                        self.tag_named(named);
                        self.push_slot(slot, m.into_key_cmd()).await?;
                    } else {
                        self.flush().await?;
                        self.round.checks += u64::from(m.is_check());
                        let mut reply = scatter::cross_shard(&self.ses, m).await?;
                        if let Some(names) = named {
                            let decided: Vec<(Bytes, Verdict)> = names
                                .into_iter()
                                .filter_map(|n| {
                                    let v = settle_named(&mut reply, &n, &rules)?;
                                    Some((n.name, v))
                                })
                                .collect();
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
                    }
                }
                Ok(Parsed::Node(_, Ok(NodeCmd::Transaction(t)))) => match t {
                    TxnCmd::Multi => {
                        self.txn = Some(Txn::default());
                        self.local_reply(|w| w.ok());
                    }
                    TxnCmd::Exec => self.local_error("ERR EXEC without MULTI"),
                    TxnCmd::Discard => self.local_error("ERR DISCARD without MULTI"),
                    // Nothing is ever watched, so there is nothing to forget.
                    TxnCmd::Unwatch => self.local_reply(|w| w.ok()),
                    TxnCmd::Watch => self.local_error(WATCH_UNSUPPORTED),
                },
                Ok(Parsed::Node(spec, args)) => self.node_cmd(spec, args).await?,
            }
        }
        self.flush().await
    }

    /// Readies a script to run: finds an EVALSHA's text in the node's cache (and keeps an
    /// EVAL's, as Redis does), and checks its keys can be run on together: one slot in a
    /// cluster, one shard on a standalone node.
    fn prepare_eval(&self, e: &mut crate::cmd::script::Eval) -> Result<(), String> {
        if e.body.is_empty() {
            e.body = self
                .ses
                .node
                .scripts
                .get(&e.sha)
                .ok_or_else(|| "NOSCRIPT No matching script. Please use EVAL.".to_string())?;
        } else {
            self.ses.node.scripts.insert(e.sha.clone(), e.body.clone());
        }
        let Some(first) = e.keys.first() else {
            return Ok(());
        };
        if self.ses.node.cluster().is_some() {
            let slot = key_slot(first);
            if !e.keys.iter().all(|k| key_slot(k) == slot) {
                return Err(CROSSSLOT.to_string());
            }
        } else {
            let shard = self.ses.node.shard_of(first);
            if !e.keys.iter().all(|k| self.ses.node.shard_of(k) == shard) {
                return Err(
                    "ERR a script's keys must live on one shard: give them a common hash tag, such as {user42}"
                        .to_string(),
                );
            }
        }
        Ok(())
    }

    /// Runs a command the node answers itself, in order with the round's other replies.
    async fn node_cmd(
        &mut self,
        spec: &'static table::CommandSpec,
        args: Result<NodeCmd, ArgError>,
    ) -> Result<(), Stop> {
        if spec.is_barrier() {
            self.flush().await?;
            let mut buf = std::mem::take(&mut self.round.local);
            let res = self.node_command(spec, args, &mut buf).await;
            self.out.extend_from_slice(&buf);
            buf.clear();
            self.round.local = buf;
            res?;
        } else {
            let start = self.round.local.len();
            let mut buf = std::mem::take(&mut self.round.local);
            let res = self.node_command(spec, args, &mut buf).await;
            self.round.local = buf;
            self.round
                .order
                .push(ReplySource::Local(start, self.round.local.len()));
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

    /// Queues a command whose keys are all in `slot`, for the shard that owns it.
    async fn push_slot(&mut self, slot: u16, cmd: KeyCmd) -> Result<(), Stop> {
        if self.queue(slot, cmd) {
            self.flush().await?;
        }
        Ok(())
    }

    /// Queues a command for the shard that owns `slot`; true when the round must be run now,
    /// before more is queued (its replies of stored values would pass the budget). Not async,
    /// so the command is moved once, into the queue, not through the futures of the calls.
    fn queue(&mut self, slot: u16, cmd: KeyCmd) -> bool {
        let s = self.ses.node.slot_owner(slot);
        self.round.checks += u64::from(cmd.is_check());
        let returns_value = returns_stored_value(&cmd);
        self.round.queued[s].push(cmd);
        self.round.slots[s].push(slot);
        self.round.order.push(ReplySource::Shard(s));
        if returns_value {
            self.round.value_cmds += 1;
            let largest = self.ses.node.live.caps.largest_value();
            return self.round.value_cmds >= (VALUE_REPLY_BUDGET / largest).max(1);
        }
        false
    }

    /// Encodes a reply of the node's own into the round, in order.
    fn local_reply(&mut self, f: impl FnOnce(&mut ReplyWriter)) {
        let start = self.round.local.len();
        f(&mut ReplyWriter::new(&mut self.round.local, self.ses.resp3));
        self.round
            .order
            .push(ReplySource::Local(start, self.round.local.len()));
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
        if self.round.order.is_empty() {
            return Ok(());
        }
        self.round.value_cmds = 0;
        let n = self.round.queued.len();
        let mut replies: Vec<std::vec::IntoIter<Reply>> =
            (0..n).map(|_| Vec::new().into_iter()).collect();
        let order = std::mem::take(&mut self.round.order);
        let mut next = 0;
        // Checks by rule name: how many of `round.named` are settled, and their decisions.
        let mut named_done = 0;
        let mut decided: Vec<(Bytes, Verdict)> = Vec::new();
        let rules = (!self.round.named.is_empty()).then(|| self.ses.node.rules.load());
        // BK.CHECKALL decisions (the only command that answers `LimitAll`): [allowed, denied].
        let mut all_checks = [0u64; 2];
        loop {
            // Send the other shards their batches first, so they work while this one does.
            let mut waits: Vec<(usize, oneshot::Receiver<Answer>)> = Vec::new();
            for (s, ready) in replies.iter().enumerate() {
                if s != self.ses.my_shard && !self.round.queued[s].is_empty() && ready.len() == 0 {
                    let batch = take_sized(&mut self.round.queued[s]);
                    let slots = std::mem::take(&mut self.round.slots[s]);
                    let rx = self.ses.node.shards[s]
                        .submit_keyed(batch, slots, REPLY_BUDGET)
                        .await?;
                    waits.push((s, rx));
                }
            }
            let mine = self.ses.my_shard;
            if !self.round.queued[mine].is_empty() && replies[mine].len() == 0 {
                let batch = take_sized(&mut self.round.queued[mine]);
                let outcome = {
                    let slots = &self.round.slots[mine];
                    self.ses.core.borrow_mut().run(batch, slots, REPLY_BUDGET)
                };
                match outcome {
                    Outcome::Ready(a) => self.take_answer(mine, a, &mut replies),
                    Outcome::Later(rx) => waits.push((mine, rx)),
                }
            }
            for (s, rx) in waits {
                let a = rx.await.map_err(|_| ShardGone)?;
                self.take_answer(s, a, &mut replies);
            }
            let mut w = ReplyWriter::new(&mut self.out, self.ses.resp3);
            let named = &self.round.named;
            while next < order.len() {
                match order[next] {
                    ReplySource::Local(a, b) => w.buf.extend_from_slice(&self.round.local[a..b]),
                    ReplySource::Shard(s) => match replies[s].next() {
                        Some(mut r) => {
                            if let Reply::LimitAll(summary, _) = &r {
                                all_checks[usize::from(summary[0] == 0)] += 1;
                            }
                            while named_done < named.len() && named[named_done].at == next {
                                let n = &named[named_done];
                                if let Some(rules) = &rules
                                    && let Some(v) = settle_named(&mut r, n, rules)
                                {
                                    decided.push((n.name.clone(), v));
                                }
                                named_done += 1;
                            }
                            encode(&mut w, &r)
                        }
                        // The shard stopped at its budget: ask it for the rest.
                        None if !self.round.queued[s].is_empty() => break,
                        None => w.error(MISSING_REPLY),
                    },
                }
                next += 1;
            }
            if next == order.len() {
                break;
            }
            self.write_out().await?;
        }
        self.round.order = order;
        self.round.order.clear();
        self.round.local.clear();
        self.round.named.clear();
        if all_checks != [0, 0] {
            self.ses.node.shards[self.ses.my_shard]
                .stats
                .metrics
                .count_kind(CheckKind::CheckAll, all_checks[0], all_checks[1]);
        }
        self.count_named(&decided);
        Ok(())
    }

    /// Notes the rules a check names, for its reply: the next one queued.
    fn tag_named(&mut self, names: Option<Vec<Named>>) {
        if let Some(names) = names {
            let at = self.round.order.len();
            self.round
                .named
                .extend(names.into_iter().map(|n| Named { at, ..n }));
        }
    }

    /// Counts the decisions of checks that named a rule.
    fn count_named(&self, decided: &[(Bytes, Verdict)]) {
        if !decided.is_empty() {
            self.ses.node.shards[self.ses.my_shard]
                .stats
                .metrics
                .count_rules(decided.iter().map(|(n, v)| (n.as_ref(), *v)));
        }
    }

    /// Files a shard's answer: its replies, and what it left unrun for the next pass (with
    /// the slots of those commands, which are the last ones queued).
    fn take_answer(&mut self, s: usize, a: Answer, replies: &mut [std::vec::IntoIter<Reply>]) {
        // A batch sent to another shard took its slots along; only a standalone shard leaves
        // commands unrun, and it does not look at slots.
        let slots = &mut self.round.slots[s];
        let done = slots.len().saturating_sub(a.rest.len());
        slots.drain(..done);
        replies[s] = a.replies.into_iter();
        // Mostly nothing is left: the queue then keeps the room `take_sized` made for the next
        // round, instead of growing again from nothing.
        if !a.rest.is_empty() {
            self.round.queued[s] = a.rest;
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
        let item = match parsed {
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
                _ => TxnItem::Node(spec, args),
            },
            Ok(Parsed::Keyed(cmd)) => {
                if !same_slot(txn, key_slot(cmd.route_key())) {
                    txn.dirty = true;
                    self.local_error(CROSSSLOT);
                    return Ok(());
                }
                TxnItem::Key(cmd, named)
            }
            Ok(Parsed::Multi(m)) => {
                let slot = key_slot(&m.keys()[0]);
                if !m.keys().iter().all(|k| key_slot(k) == slot) || !same_slot(txn, slot) {
                    txn.dirty = true;
                    self.local_error(CROSSSLOT);
                    return Ok(());
                }
                TxnItem::Key(m.into_key_cmd(), named)
            }
        };
        if txn.bytes + wire_len > limit {
            txn.dirty = true;
            self.local_error("ERR transaction larger than client-query-buffer-limit");
            return Ok(());
        }
        txn.bytes += wire_len;
        txn.items.push(item);
        self.local_reply(|w| w.simple("QUEUED"));
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
        let mut keyed = Vec::new();
        let mut rest = Vec::with_capacity(txn.items.len());
        for item in txn.items {
            match item {
                TxnItem::Key(cmd, named) => {
                    keyed.push(cmd);
                    rest.push(Err(named));
                }
                TxnItem::Node(spec, args) => rest.push(Ok((spec, args))),
            }
        }
        let mut replies = if keyed.is_empty() {
            Vec::new().into_iter()
        } else {
            let slot = txn.slot.unwrap_or(0);
            let slots = vec![slot; keyed.len()];
            let answer = self
                .run_whole(self.ses.node.slot_owner(slot), keyed, slots)
                .await?;
            if let Some(why) = answer.refused {
                // The group could not take the transaction: nothing of it ran.
                ReplyWriter::new(&mut self.out, self.ses.resp3).error(&why);
                return Ok(());
            }
            answer.replies.into_iter()
        };
        let mut buf = Vec::new();
        let mut decided: Vec<(Bytes, Verdict)> = Vec::new();
        let rules = self.ses.node.rules.load();
        ReplyWriter::new(&mut buf, self.ses.resp3).array(rest.len());
        for item in rest {
            match item {
                Err(named) => match replies.next() {
                    Some(mut r) => {
                        if let Some(names) = named {
                            for n in names {
                                if let Some(v) = settle_named(&mut r, &n, &rules) {
                                    decided.push((n.name, v));
                                }
                            }
                        }
                        encode(&mut ReplyWriter::new(&mut buf, self.ses.resp3), &r)
                    }
                    None => ReplyWriter::new(&mut buf, self.ses.resp3).error(MISSING_REPLY),
                },
                Ok((spec, args)) => self.node_command(spec, args, &mut buf).await?,
            }
        }
        self.count_named(&decided);
        self.out.extend_from_slice(&buf);
        Ok(())
    }

    /// Hands shard `s` key commands to run whole, as one batch (in a cluster, one entry of
    /// their group), and waits for the answer.
    async fn run_whole(
        &self,
        s: usize,
        cmds: Vec<KeyCmd>,
        slots: Vec<u16>,
    ) -> Result<Answer, ShardGone> {
        let rx = if s == self.ses.my_shard {
            match self.ses.core.borrow_mut().run(cmds, &slots, usize::MAX) {
                Outcome::Ready(a) => return Ok(a),
                Outcome::Later(rx) => rx,
            }
        } else {
            self.ses.node.shards[s]
                .submit_keyed(cmds, slots, usize::MAX)
                .await?
        };
        rx.await.map_err(|_| ShardGone)
    }

    /// Runs a command the node answers itself, writing its reply into `buf`.
    async fn node_command(
        &mut self,
        spec: &'static table::CommandSpec,
        args: Result<NodeCmd, ArgError>,
        buf: &mut Vec<u8>,
    ) -> Result<(), ShardGone> {
        commands::run(&mut self.ses, spec, args, buf).await
    }
}

const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";
const WATCH_UNSUPPORTED: &str = "ERR WATCH is not supported: a MULTI/EXEC on one slot already runs atomically on the shard that owns it";

/// Whether a transaction's next key command may use `slot` (the first one fixes it).
/// A rule a limit command named, and where its decision is in the reply.
struct Named {
    /// The index in the round's `order` of the command's reply.
    at: usize,
    /// Which of the command's limits it is (BK.CHECKALL has several).
    pos: usize,
    name: Bytes,
    /// BK.LEASE: its reply is the units taken, which shadow mode cannot change.
    lease: bool,
}

/// Takes a round's commands for a shard, leaving room for as many (up to `KEEP_REQS`) in
/// their place: the batch goes to the shard for good, and the next round of a pipelining
/// client would otherwise grow its vector again from nothing, a reallocation and copy of
/// every command so far at each doubling.
fn take_sized(queued: &mut Vec<KeyCmd>) -> Vec<KeyCmd> {
    let room = queued.len().min(KEEP_REQS);
    std::mem::replace(queued, Vec::with_capacity(room))
}

/// The rule names a limit command gives instead of inline specs (an inline spec has a '/'),
/// for the metrics by rule and for rules in shadow mode. None for every other command,
/// cheaply: most requests are not limit commands that name a rule.
fn named_rules(req: &Request) -> Option<Vec<Named>> {
    let name = req.name();
    if name.len() < 8 || !name[..3].eq_ignore_ascii_case(b"bk.") {
        return None;
    }
    let is_name = |i: usize| req.get(i).is_some_and(|s| !s.contains(&b'/'));
    let named = |pos: usize, i: usize, lease: bool| {
        req.bytes(i).map(|name| Named {
            at: 0,
            pos,
            name,
            lease,
        })
    };
    let rest = &name[3..];
    let names: Vec<Named> =
        if rest.eq_ignore_ascii_case(b"check") || rest.eq_ignore_ascii_case(b"lease") {
            if !is_name(2) {
                return None;
            }
            named(0, 2, rest.eq_ignore_ascii_case(b"lease"))
                .into_iter()
                .collect()
        } else if rest.eq_ignore_ascii_case(b"checkall") {
            let n: usize = std::str::from_utf8(req.get(1)?).ok()?.parse().ok()?;
            if n > req.len() {
                return None;
            }
            (n + 2..2 * n + 2)
                .filter(|&i| is_name(i))
                .filter_map(|i| named(i - n - 2, i, false))
                .collect()
        } else {
            return None;
        };
    (!names.is_empty()).then_some(names)
}

/// How a check that named a rule was decided; a rule in shadow mode that refused is answered
/// as allowed here (BK.CHECKALL's shards already left it out of the set's decision). None for
/// an error reply.
fn settle_named(r: &mut Reply, n: &Named, rules: &RuleSet) -> Option<Verdict> {
    let shadow = rules.is_shadow(&n.name);
    match r {
        Reply::Limit(l) if l[0] > 0 => Some(Verdict::Within),
        Reply::Limit(_) if shadow && n.lease => Some(Verdict::Shadowed),
        Reply::Limit(l) if shadow => {
            l[0] = 1;
            l[3] = -1;
            Some(Verdict::Shadowed)
        }
        Reply::Limit(_) => Some(Verdict::Over),
        Reply::LimitAll(summary, each) => {
            let overall = summary[0] == 1;
            let e = each.get_mut(n.pos)?;
            if shadow && e[0] == 0 {
                e[0] = 1;
                e[3] = -1;
                *summary = summarize(each, overall);
                return Some(Verdict::Shadowed);
            }
            Some(if overall {
                Verdict::Within
            } else {
                Verdict::Over
            })
        }
        _ => None,
    }
}

fn same_slot(txn: &mut Txn, slot: u16) -> bool {
    *txn.slot.get_or_insert(slot) == slot
}

/// Whether a command's reply can carry a stored value (and so be as large as one).
fn returns_stored_value(cmd: &KeyCmd) -> bool {
    match cmd {
        KeyCmd::Get(_)
        | KeyCmd::Keys(_)
        | KeyCmd::Scan { .. }
        | KeyCmd::GetSet { .. }
        | KeyCmd::GetEx { .. }
        | KeyCmd::GetDel(_)
        | KeyCmd::MGet(_) => true,
        KeyCmd::Set { get, .. } => *get,
        KeyCmd::Hash { op, .. } => op.returns_values(),
        KeyCmd::IncrBy { .. }
        | KeyCmd::Expire { .. }
        | KeyCmd::Persist(_)
        | KeyCmd::Ttl { .. }
        | KeyCmd::Type(_)
        | KeyCmd::Del(_)
        | KeyCmd::Exists(_)
        | KeyCmd::Throttle { .. }
        | KeyCmd::Check { .. }
        | KeyCmd::CheckAll { .. }
        | KeyCmd::Refund { .. }
        | KeyCmd::Lease { .. }
        | KeyCmd::DbSize
        | KeyCmd::FlushAll
        | KeyCmd::ExpireChecked { .. }
        | KeyCmd::SetEx { .. }
        | KeyCmd::SetNx { .. }
        | KeyCmd::ExpireTime { .. }
        | KeyCmd::IncrByFloat { .. }
        | KeyCmd::MSet { .. }
        | KeyCmd::Meta(_)
        | KeyCmd::CheckSet { .. }
        | KeyCmd::RefundSet { .. }
        | KeyCmd::Acquire { .. }
        | KeyCmd::Release { .. }
        | KeyCmd::InFlight(_) => false,
        // A script can return what it read.
        KeyCmd::Eval(_) => true,
    }
}
