//! One round of a connection's requests: the commands queued for each shard, where each
//! reply comes from in request order, and the node's own replies encoded along the way. A
//! flush sends every shard its share, then writes the replies in order as they come in.

use super::Node;
use super::named::{self, Decided, Named};
use super::session::Session;
use crate::cmd::{KeyCmd, MISSING_REPLY, Reply, encode};
use crate::protocol::ReplyWriter;
use crate::rules::RuleSet;
use crate::shard::{Answer, Outcome, ShardGone};
use tokio::sync::oneshot;

/// Bytes of replies a round produces before they are written out and the shards are asked
/// for more. Also what each shard's share of a round may produce at once.
pub(super) const REPLY_BUDGET: usize = 256 * 1024;
/// A replicated batch's replies all arrive when its entries commit, so rounds with commands
/// that return stored values are cut to keep those replies under this.
const VALUE_REPLY_BUDGET: usize = 16 * 1024 * 1024;
/// The most requests whose vector a connection keeps between rounds, and the most commands
/// whose room a shard's queue keeps.
pub(super) const KEEP_REQS: usize = 32;

/// Where one request's reply comes from, in request order.
enum ReplySource {
    /// Already encoded, in `Round::local[start..end]`.
    Local(usize, usize),
    /// The next reply from this shard's batch.
    Shard(usize),
}

/// The requests of one round, split by the shard that owns their keys.
pub(super) struct Round {
    queued: Vec<Vec<KeyCmd>>,
    /// The hash slot of each command in `queued` (a cluster proposes by slot's group, and
    /// answers -MOVED by slot).
    slots: Vec<Vec<u16>>,
    order: Vec<ReplySource>,
    local: Vec<u8>,
    /// Commands in this round that return a stored value.
    value_cmds: usize,
    /// Checks in this round (what the check latency histogram counts).
    pub(super) checks: u64,
    /// Checks that named a rule: where their reply is and which rule (`Named::at` is the
    /// index in `order`).
    named: Vec<Named>,
}

/// A flush under way: the replies in from each shard, and how far they are written.
pub(super) struct Flush {
    replies: Vec<std::vec::IntoIter<Reply>>,
    order: Vec<ReplySource>,
    next: usize,
    /// How many of `Round::named` are settled, and their decisions.
    named_done: usize,
    pub(super) decided: Decided,
    /// BK.CHECKALL decisions (the only command that answers `LimitAll`): [allowed, denied].
    pub(super) all_checks: [u64; 2],
}

impl Round {
    pub(super) fn new(shards: usize) -> Round {
        Round {
            queued: (0..shards).map(|_| Vec::new()).collect(),
            slots: (0..shards).map(|_| Vec::new()).collect(),
            order: Vec::new(),
            local: Vec::new(),
            value_cmds: 0,
            checks: 0,
            named: Vec::new(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Whether checks in the round named rules, to be settled as their replies come in.
    pub(super) fn has_named(&self) -> bool {
        !self.named.is_empty()
    }

    /// Queues a command for the shard that owns `slot`; true when the round must be run now,
    /// before more is queued (its replies of stored values would pass the budget). Not async,
    /// so the command is moved once, into the queue, not through the futures of the calls.
    pub(super) fn queue(&mut self, node: &Node, slot: u16, cmd: KeyCmd) -> bool {
        let s = node.slot_owner(slot);
        self.checks += u64::from(cmd.is_check());
        let returns_value = returns_stored_value(&cmd);
        self.queued[s].push(cmd);
        self.slots[s].push(slot);
        self.order.push(ReplySource::Shard(s));
        if returns_value {
            self.value_cmds += 1;
            let largest = node.live.caps.largest_value();
            return self.value_cmds >= (VALUE_REPLY_BUDGET / largest).max(1);
        }
        false
    }

    /// Encodes a reply of the node's own into the round, in order.
    pub(super) fn local_reply(&mut self, resp3: bool, f: impl FnOnce(&mut ReplyWriter)) {
        let start = self.local.len();
        f(&mut ReplyWriter::new(&mut self.local, resp3));
        self.order.push(ReplySource::Local(start, self.local.len()));
    }

    /// Lends the round's buffer of the node's own replies, to encode one more at its end.
    pub(super) fn lend_local(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.local)
    }

    /// Takes the buffer back: the reply encoded in it from `start` on is the next in order.
    pub(super) fn return_local(&mut self, buf: Vec<u8>, start: usize) {
        self.local = buf;
        self.order.push(ReplySource::Local(start, self.local.len()));
    }

    /// Takes the buffer back emptied, its reply having gone straight out (a barrier's, after
    /// the round was flushed).
    pub(super) fn give_back(&mut self, mut buf: Vec<u8>) {
        buf.clear();
        self.local = buf;
    }

    /// Notes the rules a check names, for its reply: the next one queued.
    pub(super) fn tag_named(&mut self, names: Option<Vec<Named>>) {
        if let Some(names) = names {
            let at = self.order.len();
            self.named.extend(names.into_iter().map(|n| n.at(at)));
        }
    }

    /// Starts flushing the round: nothing is in yet.
    pub(super) fn start_flush(&mut self) -> Flush {
        self.value_cmds = 0;
        Flush {
            replies: (0..self.queued.len())
                .map(|_| Vec::new().into_iter())
                .collect(),
            order: std::mem::take(&mut self.order),
            next: 0,
            named_done: 0,
            decided: Decided::new(),
            all_checks: [0, 0],
        }
    }

    /// Sends every shard whose earlier replies are all written the next part of its share,
    /// runs this connection's own shard's part inline, and waits for them all. The other
    /// shards get theirs first, so they work while this one does.
    pub(super) async fn run_shares(
        &mut self,
        ses: &Session,
        f: &mut Flush,
        budget: usize,
    ) -> Result<(), ShardGone> {
        let mut waits: Vec<(usize, oneshot::Receiver<Answer>)> = Vec::new();
        for (s, ready) in f.replies.iter().enumerate() {
            if s != ses.my_shard && !self.queued[s].is_empty() && ready.len() == 0 {
                let batch = take_sized(&mut self.queued[s]);
                let slots = std::mem::take(&mut self.slots[s]);
                let rx = ses.node.shards[s]
                    .submit_keyed(batch, slots, budget)
                    .await?;
                waits.push((s, rx));
            }
        }
        let mine = ses.my_shard;
        let mut escalated = Vec::new();
        if !self.queued[mine].is_empty() && f.replies[mine].len() == 0 {
            let batch = take_sized(&mut self.queued[mine]);
            let outcome = ses.core.borrow_mut().run(batch, &self.slots[mine], budget);
            match outcome {
                Outcome::Ready(a) => {
                    if a.escalate {
                        escalated.push(mine);
                    }
                    self.take_answer(mine, a, f);
                }
                Outcome::Later(rx) => waits.push((mine, rx)),
            }
        }
        for (s, rx) in waits {
            let a = rx.await.map_err(|_| ShardGone)?;
            if a.escalate {
                escalated.push(s);
            }
            self.take_answer(s, a, f);
        }
        for s in escalated {
            self.run_escalated(ses, s, f).await?;
        }
        Ok(())
    }

    /// Runs the script a shard stopped at, because it reached keys of other shards, again
    /// over every shard; its reply follows the shard's others, and the shard's commands after
    /// it are sent on the next pass.
    async fn run_escalated(
        &mut self,
        ses: &Session,
        s: usize,
        f: &mut Flush,
    ) -> Result<(), ShardGone> {
        if self.queued[s].is_empty() {
            return Ok(());
        }
        let script = self.queued[s].remove(0);
        if !self.slots[s].is_empty() {
            self.slots[s].remove(0);
        }
        let reply = super::cross::run(ses, super::cross::Span::Every, vec![script])
            .await?
            .pop()
            .unwrap_or(Reply::err(MISSING_REPLY));
        let mut replies: Vec<Reply> = std::mem::take(&mut f.replies[s]).collect();
        replies.push(reply);
        f.replies[s] = replies.into_iter();
        Ok(())
    }

    /// Files a shard's answer: its replies, and what it left unrun for the next pass (with
    /// the slots of those commands, which are the last ones queued).
    fn take_answer(&mut self, s: usize, a: Answer, f: &mut Flush) {
        // A batch sent to another shard took its slots along; only a standalone shard leaves
        // commands unrun, and it does not look at slots.
        let slots = &mut self.slots[s];
        let done = slots.len().saturating_sub(a.rest.len());
        slots.drain(..done);
        f.replies[s] = a.replies.into_iter();
        // Mostly nothing is left: the queue then keeps the room `take_sized` made for the next
        // round, instead of growing again from nothing.
        if !a.rest.is_empty() {
            self.queued[s] = a.rest;
        }
    }

    /// Writes into `out`, in order, every reply that is in; true once all are written, false
    /// when a shard stopped at its budget and must be asked for the rest. `rules` settles the
    /// checks that named a rule (there are none without it).
    pub(super) fn write_ready(
        &self,
        f: &mut Flush,
        out: &mut Vec<u8>,
        resp3: bool,
        rules: Option<&RuleSet>,
    ) -> bool {
        let mut w = ReplyWriter::new(out, resp3);
        while f.next < f.order.len() {
            match f.order[f.next] {
                ReplySource::Local(a, b) => w.buf.extend_from_slice(&self.local[a..b]),
                ReplySource::Shard(s) => match f.replies[s].next() {
                    Some(mut r) => {
                        if let Reply::LimitAll(summary, _) = &r {
                            f.all_checks[usize::from(summary[0] == 0)] += 1;
                        }
                        let from = f.named_done;
                        let here = self.named[from..]
                            .iter()
                            .take_while(|n| n.at == f.next)
                            .count();
                        f.named_done += here;
                        if let Some(rules) = rules {
                            let names = &self.named[from..from + here];
                            named::settle(&mut r, names, rules, &mut f.decided);
                        }
                        encode(&mut w, &r)
                    }
                    // The shard stopped at its budget: ask it for the rest.
                    None if !self.queued[s].is_empty() => return false,
                    None => w.error(MISSING_REPLY),
                },
            }
            f.next += 1;
        }
        true
    }

    /// Ends a flush: the round is empty again, its buffers kept for the next one.
    pub(super) fn end_flush(&mut self, f: &mut Flush) {
        self.order = std::mem::take(&mut f.order);
        self.order.clear();
        self.local.clear();
        self.named.clear();
    }
}

/// Takes a round's commands for a shard, leaving room for as many (up to `KEEP_REQS`) in
/// their place: the batch goes to the shard for good, and the next round of a pipelining
/// client would otherwise grow its vector again from nothing, a reallocation and copy of
/// every command so far at each doubling.
fn take_sized(queued: &mut Vec<KeyCmd>) -> Vec<KeyCmd> {
    let room = queued.len().min(KEEP_REQS);
    std::mem::replace(queued, Vec::with_capacity(room))
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
        KeyCmd::ZSet { op, .. } => op.returns_values(),
        KeyCmd::List { op, .. } => op.returns_values(),
        KeyCmd::Members { op, .. } => op.returns_values(),
        KeyCmd::Rename { .. } | KeyCmd::Copy { .. } | KeyCmd::Object { .. } => false,
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
