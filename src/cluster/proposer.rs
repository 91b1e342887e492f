//! A shard's part in the replicated write path: it gathers, during one turn of its event
//! loop, every connection's commands for each Raft group it owns, proposes each group's
//! share as one log entry, and when the entry commits and is applied on this shard it
//! answers the connections itself.
//!
//! A connection never knows whether its commands are applied at once (a standalone node) or
//! proposed and applied on commit (a cluster): it hands the shard a batch either way and
//! gets one reply per command back, in order.
//!
//! Each gathered entry carries an `Origin` (this run of this shard, and a sequence number).
//! When the shard applies a committed entry whose origin it is still waiting on, it fills in
//! the waiting batches' replies; every other entry (a follower's, one from an earlier run,
//! or one whose wait already timed out) is applied without anyone to answer.

use crate::cluster::node::{Cluster, ProposeError};
use crate::cluster::typ::{GroupId, Origin};
use crate::cmd::keyed::{KeyCmd, Reply};
use crate::shard::Answer;
use ahash::AHashMap;
use std::borrow::Cow;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use tokio::sync::{Notify, oneshot};

/// One connection's batch while its replies come in, group by group.
struct Collect {
    replies: Vec<Reply>,
    /// Groups whose entries have yet to answer.
    outstanding: usize,
    /// Why a group refused its share, if one did (the first reason).
    refused: Option<String>,
    reply: Option<oneshot::Sender<Answer>>,
}

type BatchRef = Rc<RefCell<Collect>>;

/// Where one command's reply goes.
struct Dest {
    batch: BatchRef,
    index: u32,
    slot: u16,
}

/// A group's commands gathered since its last entry was proposed.
#[derive(Default)]
struct Gather {
    cmds: Vec<KeyCmd>,
    to: Vec<Dest>,
    /// The last batch that added to this gather (a batch counts each group once).
    last_batch: u64,
    /// This shard's entries of the group proposed and not yet settled.
    in_flight: usize,
    /// Commands in the group's last entry: room made for as many when the next one starts
    /// gathering, rather than growing (and copying) the vectors by doubling.
    last_len: usize,
}

/// At most this many entries of one group proposed by one shard are on their way at a time.
/// Commands that arrive meanwhile wait for the next entry, so under load each replication
/// round (a log write, an append to each follower and its answer) carries every command that
/// arrived during the one before, instead of a turn's worth each: at pipeline 1 with 50
/// clients over three nodes, 12 commands per entry instead of 6, and 5-10% less CPU per check
/// at pipeline 16. The wait costs a command at most one round; a lone client (one command in
/// flight) never waits.
const MAX_IN_FLIGHT: usize = 1;

/// The most commands an entry makes room for ahead of time (a guess from the last entry).
const MAX_RESERVE: usize = 4096;

pub struct Proposer {
    cluster: Arc<Cluster>,
    run: u64,
    next_seq: u64,
    batches: u64,
    /// By group id.
    gathering: Vec<Gather>,
    /// Groups with commands gathered and not yet proposed.
    dirty: Vec<GroupId>,
    /// Entries proposed and not yet answered, by sequence number.
    waiting: AHashMap<u64, Vec<Dest>>,
    kick: Rc<Notify>,
}

/// An entry to propose: the group, its origin, its commands.
pub(crate) type Proposed = (GroupId, Origin, Vec<KeyCmd>);

impl Proposer {
    pub fn new(cluster: Arc<Cluster>, run: u64) -> Proposer {
        let groups = cluster.spec.groups as usize;
        Proposer {
            cluster,
            run,
            next_seq: 1,
            batches: 0,
            gathering: (0..groups).map(|_| Gather::default()).collect(),
            dirty: Vec::new(),
            waiting: AHashMap::new(),
            kick: Rc::new(Notify::new()),
        }
    }

    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    /// Notified when a turn has gathered something to propose.
    pub fn kick(&self) -> Rc<Notify> {
        self.kick.clone()
    }

    /// Takes one connection's batch (`slots[i]` is the hash slot of `cmds[i]`); `reply` gets
    /// every command's reply once all its groups have answered.
    pub fn gather(&mut self, cmds: Vec<KeyCmd>, slots: &[u16], reply: oneshot::Sender<Answer>) {
        if cmds.is_empty() {
            let _ = reply.send(Answer::default());
            return;
        }
        self.batches += 1;
        let batch_no = self.batches;
        let batch = Rc::new(RefCell::new(Collect {
            replies: Vec::new(),
            outstanding: 0,
            refused: None,
            reply: Some(reply),
        }));
        let mut outstanding = 0;
        let n = cmds.len();
        for (i, cmd) in cmds.into_iter().enumerate() {
            let slot = slots.get(i).copied().unwrap_or(0);
            let g = self.cluster.group_of_slot(slot);
            let Some(gather) = self.gathering.get_mut(g as usize) else {
                continue;
            };
            if gather.cmds.is_empty() {
                // One wake-up is stored, however many groups ask for it before the turn.
                self.kick.notify_one();
                self.dirty.push(g);
                gather.cmds.reserve(gather.last_len);
                gather.to.reserve(gather.last_len);
            }
            if gather.last_batch != batch_no {
                gather.last_batch = batch_no;
                outstanding += 1;
            }
            gather.cmds.push(cmd);
            gather.to.push(Dest {
                batch: batch.clone(),
                index: u32::try_from(i).unwrap_or(u32::MAX),
                slot,
            });
        }
        let mut b = batch.borrow_mut();
        b.replies = (0..n).map(|_| Reply::Nil).collect();
        b.outstanding = outstanding;
    }

    /// This turn's entries, one per group that has commands gathered and room for another
    /// entry in flight; their batches now wait for the entries' fate. The other groups' commands
    /// wait for `settled`.
    pub fn take_turn(&mut self) -> Vec<Proposed> {
        let mut out = Vec::with_capacity(self.dirty.len());
        let mut waiting_room = Vec::new();
        for g in std::mem::take(&mut self.dirty) {
            let Some(gather) = self.gathering.get_mut(g as usize) else {
                continue;
            };
            if gather.in_flight >= MAX_IN_FLIGHT {
                waiting_room.push(g);
                continue;
            }
            gather.in_flight += 1;
            gather.last_len = gather.cmds.len().min(MAX_RESERVE);
            let cmds = std::mem::take(&mut gather.cmds);
            let to = std::mem::take(&mut gather.to);
            let seq = self.next_seq;
            self.next_seq += 1;
            self.waiting.insert(seq, to);
            out.push((g, Origin { run: self.run, seq }, cmds));
        }
        self.dirty = waiting_room;
        out
    }

    /// One of this shard's entries of group `g` is settled (answered or failed): if commands
    /// wait for room, the next turn proposes them.
    fn settled(&mut self, g: GroupId) {
        if let Some(gather) = self.gathering.get_mut(g as usize) {
            gather.in_flight = gather.in_flight.saturating_sub(1);
            if !gather.cmds.is_empty() {
                self.kick.notify_one();
            }
        }
    }

    /// Whether an entry of this origin was proposed here (since this node last started).
    pub fn proposed(&self, origin: Option<Origin>) -> bool {
        origin.is_some_and(|o| o.run == self.run)
    }

    /// A committed entry was applied here with these replies. Answers its batches when it is
    /// an entry of this run still waited on, and gives the replies back otherwise.
    pub fn applied(&mut self, origin: Option<Origin>, replies: Vec<Reply>) -> Option<Vec<Reply>> {
        let Some(o) = origin.filter(|_| self.proposed(origin)) else {
            return Some(replies);
        };
        if let Some(to) = self.waiting.remove(&o.seq) {
            deliver(to, replies.into_iter(), None);
        }
        None
    }

    /// The entry's replies came from the leader it was forwarded to.
    pub fn answered(&mut self, seq: u64, replies: Vec<Reply>) {
        if let Some(to) = self.waiting.remove(&seq) {
            deliver(to, replies.into_iter(), None);
        }
    }

    /// The entry could not be committed: each of its commands gets the error a Redis Cluster
    /// client acts on.
    pub fn failed(&mut self, seq: u64, e: &ProposeError) {
        if let Some(to) = self.waiting.remove(&seq) {
            let errors: Vec<Reply> = to
                .iter()
                .map(|d| Reply::Error(Cow::Owned(self.cluster.error_reply(d.slot, e))))
                .collect();
            let why = errors.first().and_then(|r| match r {
                Reply::Error(m) => Some(m.to_string()),
                _ => None,
            });
            deliver(to, errors.into_iter(), why);
        }
    }

    /// Whether the entry is still waited on (it was neither applied here nor failed).
    pub fn is_waiting(&self, seq: u64) -> bool {
        self.waiting.contains_key(&seq)
    }
}

/// Puts an entry's replies where they belong, and answers every batch that has all of its
/// replies now. A batch's commands for one group are contiguous in the entry.
fn deliver(to: Vec<Dest>, mut replies: impl Iterator<Item = Reply>, refused: Option<String>) {
    let mut prev: Option<BatchRef> = None;
    for d in to {
        let reply = replies
            .next()
            .unwrap_or_else(|| Reply::Error(Cow::Borrowed("ERR internal error: missing reply")));
        {
            let mut b = d.batch.borrow_mut();
            if let Some(slot) = b.replies.get_mut(d.index as usize) {
                *slot = reply;
            }
        }
        if !prev.as_ref().is_some_and(|p| Rc::ptr_eq(p, &d.batch)) {
            if let Some(p) = prev.take() {
                finish_one(&p, refused.as_deref());
            }
            prev = Some(d.batch);
        }
    }
    if let Some(p) = prev {
        finish_one(&p, refused.as_deref());
    }
}

/// One of the batch's groups has answered; the last one sends the batch its replies.
fn finish_one(batch: &BatchRef, refused: Option<&str>) {
    let mut b = batch.borrow_mut();
    if b.refused.is_none() {
        b.refused = refused.map(str::to_string);
    }
    b.outstanding = b.outstanding.saturating_sub(1);
    if b.outstanding == 0
        && let Some(tx) = b.reply.take()
    {
        let _ = tx.send(Answer {
            replies: std::mem::take(&mut b.replies),
            rest: Vec::new(),
            refused: b.refused.take(),
        });
    }
}

/// Runs on the shard's event loop: after each turn that gathered something, proposes every
/// group's entry of that turn.
pub(crate) async fn propose_turns(core: crate::shard::CoreRef, kick: Rc<Notify>) {
    loop {
        kick.notified().await;
        // Let every connection task that is ready run first, so what they hand the shard
        // this turn rides in the same entries.
        tokio::task::yield_now().await;
        let (cluster, work) = {
            let mut c = core.borrow_mut();
            let Some(p) = c.proposer.as_mut() else { return };
            (p.cluster().clone(), p.take_turn())
        };
        for (g, origin, cmds) in work {
            tokio::task::spawn_local(submit(core.clone(), cluster.clone(), g, origin, cmds));
        }
    }
}

/// Replicates one entry and settles its batches' fate: answered by the apply on this shard,
/// by the leader it was forwarded to, or failed.
async fn submit(
    core: crate::shard::CoreRef,
    cluster: Arc<Cluster>,
    g: GroupId,
    origin: Origin,
    cmds: Vec<KeyCmd>,
) {
    let result = cluster.replicate(g, origin, cmds).await;
    let mut c = core.borrow_mut();
    let Some(p) = c.proposer.as_mut() else { return };
    p.settled(g);
    match result {
        // Committed, and applied here before the commit was reported: already answered.
        Ok(None) => {
            if p.is_waiting(origin.seq) {
                p.failed(
                    origin.seq,
                    &ProposeError::TryAgain("the write committed without its replies".into()),
                );
            }
        }
        Ok(Some(replies)) => p.answered(origin.seq, replies),
        Err(e) => p.failed(origin.seq, &e),
    }
}
