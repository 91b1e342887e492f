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

use super::msg::Answer;
use crate::cluster::{Cluster, GroupId, Origin, ProposeError};
use crate::cmd::{KeyCmd, Reply};
use ahash::AHashMap;
use std::borrow::Cow;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};
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
    /// Batches (one connection's round each) among `cmds`.
    batches: usize,
    /// Whether the gathered commands wait for more to join them.
    hold: Hold,
}

/// At most this many entries of one group proposed by one shard are on their way at a time.
/// Commands that arrive meanwhile wait for the next entry, so under load each replication
/// round (a log write, an append to each follower and its answer) carries every command that
/// arrived during the one before, instead of a turn's worth each: fewer, fuller entries, and
/// less CPU per command. The wait costs a command at most one round, and then a hold (see
/// [`Hold`]) of at most two milliseconds; a lone client (one command in flight) waits for
/// neither.
const MAX_IN_FLIGHT: usize = 1;

/// Most time a group's gathered commands are held back for more to join them (see [`Hold`]).
/// The event loop's timers tick in milliseconds, so a hold that nothing ends sooner lasts
/// one to two milliseconds.
const HOLD_AT_MOST: Duration = Duration::from_millis(1);

/// Entries of fewer batches than this never make the next one wait.
const HOLD_FROM_BATCHES: usize = 4;

/// Group commit under load: whether a group's gathered commands are proposed now or held back
/// for a moment so that more join them.
///
/// With one entry in flight per group, the commands of a busy group's connections fall into
/// cohorts: the connections answered by the entry that just committed come back during the
/// next one, and would otherwise ride in an entry of their own behind the few commands that
/// arrived meanwhile. Every entry costs a log write and a round trip to each follower,
/// whatever it carries, so two half-full entries per round cost nearly twice one full entry.
///
/// So right after one of the group's entries settled, when its recent entries carried many
/// batches (one connection's round each) and fewer than three quarters as many are gathered,
/// the next entry waits, until enough have come or for at most [`HOLD_AT_MOST`]. A hold that
/// runs out lowers the mark to what came, so a group whose load fell stops waiting at once.
/// Nothing waits when the group's last entry settled longer ago than that (its connections
/// are not on their way back), nor when its entries carry fewer than [`HOLD_FROM_BATCHES`]
/// batches: a lone connection, or a few, never wait.
#[derive(Default)]
struct Hold {
    /// The batches of the group's recent large entries: each entry lowers it by an eighth
    /// unless it carried more.
    peak: usize,
    /// When the group's last entry settled.
    settled: Option<Instant>,
    /// When the current hold began.
    since: Option<Instant>,
}

impl Hold {
    /// Whether `batches` gathered batches go now (`None`) or wait until the instant returned
    /// (or until more come).
    fn wait(&mut self, batches: usize, now: Instant) -> Option<Instant> {
        if self.peak < HOLD_FROM_BATCHES || batches >= self.peak * 3 / 4 {
            return None;
        }
        let start = match self.since {
            Some(since) => since,
            None => {
                let recent = self
                    .settled
                    .is_some_and(|t| now.saturating_duration_since(t) < HOLD_AT_MOST);
                if !recent {
                    return None;
                }
                *self.since.insert(now)
            }
        };
        let until = start + HOLD_AT_MOST;
        if now < until {
            return Some(until);
        }
        // The rest did not come: the group's rounds are smaller now.
        self.peak = batches;
        None
    }

    /// An entry of `batches` batches was proposed.
    fn proposed(&mut self, batches: usize) {
        self.since = None;
        self.peak = batches.max(self.peak - self.peak / 8);
    }

    /// One of the group's entries settled.
    fn settled(&mut self, now: Instant) {
        self.settled = Some(now);
    }

    fn holding(&self) -> bool {
        self.since.is_some()
    }
}

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
            if gather.cmds.is_empty() || gather.hold.holding() {
                // One wake-up is stored, however many groups ask for it before the turn.
                self.kick.notify_one();
            }
            if gather.cmds.is_empty() {
                self.dirty.push(g);
                gather.cmds.reserve(gather.last_len);
                gather.to.reserve(gather.last_len);
            }
            if gather.last_batch != batch_no {
                gather.last_batch = batch_no;
                gather.batches += 1;
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

    /// This turn's entries, one per group that has commands gathered, room for another entry
    /// in flight and no reason to hold them (see [`Hold`]); their batches now wait for the
    /// entries' fate. The other groups' commands wait for `settled`, or for more to come, or
    /// until the instant returned.
    pub fn take_turn(&mut self, now: Instant) -> (Vec<Proposed>, Option<Instant>) {
        let mut out = Vec::with_capacity(self.dirty.len());
        let mut waiting_room = Vec::new();
        let mut wake: Option<Instant> = None;
        for g in std::mem::take(&mut self.dirty) {
            let Some(gather) = self.gathering.get_mut(g as usize) else {
                continue;
            };
            if gather.in_flight >= MAX_IN_FLIGHT {
                waiting_room.push(g);
                continue;
            }
            if let Some(until) = gather.hold.wait(gather.batches, now) {
                waiting_room.push(g);
                wake = Some(wake.map_or(until, |w| w.min(until)));
                continue;
            }
            gather.hold.proposed(gather.batches);
            gather.batches = 0;
            let len = gather.cmds.len();
            gather.in_flight += 1;
            gather.last_len = len.min(MAX_RESERVE);
            let cmds = std::mem::take(&mut gather.cmds);
            let to = std::mem::take(&mut gather.to);
            let seq = self.next_seq;
            self.next_seq += 1;
            self.waiting.insert(seq, to);
            out.push((g, Origin { run: self.run, seq }, cmds));
        }
        self.dirty = waiting_room;
        (out, wake)
    }

    /// One of this shard's entries of group `g` is settled (answered or failed): if commands
    /// wait for room, the next turn proposes them.
    pub(crate) fn settled(&mut self, g: GroupId) {
        if let Some(gather) = self.gathering.get_mut(g as usize) {
            gather.in_flight = gather.in_flight.saturating_sub(1);
            gather.hold.settled(Instant::now());
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
            escalate: false,
            replies: std::mem::take(&mut b.replies),
            rest: Vec::new(),
            refused: b.refused.take(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// A group whose entries carried `batches` batches each, the last one settled at `at`.
    fn busy(batches: usize, at: Instant) -> Hold {
        let mut h = Hold::default();
        for _ in 0..4 {
            h.proposed(batches);
        }
        h.settled(at);
        h
    }

    #[test]
    fn a_lone_connection_or_a_few_never_wait() {
        let t0 = Instant::now();
        for few in 1..HOLD_FROM_BATCHES {
            let mut h = busy(few, t0);
            assert_eq!(h.wait(1, t0), None, "{few} connections");
            assert!(!h.holding());
        }
    }

    #[test]
    fn a_busy_group_waits_until_most_of_its_connections_are_back() {
        let t0 = Instant::now();
        let mut h = busy(16, t0);
        let until = t0 + us(10) + HOLD_AT_MOST;
        assert_eq!(h.wait(3, t0 + us(10)), Some(until));
        assert!(h.holding());
        // More came; the hold still ends when it began plus the most it may last.
        assert_eq!(h.wait(11, t0 + us(300)), Some(until));
        assert_eq!(h.wait(12, t0 + us(400)), None);
        h.proposed(12);
        assert!(!h.holding());
    }

    #[test]
    fn a_hold_lasts_at_most_its_bound_and_then_lowers_the_mark() {
        let t0 = Instant::now();
        let mut h = busy(16, t0);
        let until = h.wait(2, t0).expect("held");
        assert_eq!(until, t0 + HOLD_AT_MOST);
        assert_eq!(h.wait(2, until), None);
        h.proposed(2);
        // The group's load fell: its next entries go at once.
        h.settled(until + us(100));
        assert_eq!(h.wait(1, until + us(100)), None);
    }

    #[test]
    fn nothing_waits_when_the_last_entry_settled_long_ago() {
        let t0 = Instant::now();
        let mut h = busy(16, t0);
        assert_eq!(h.wait(1, t0 + HOLD_AT_MOST), None);
        assert_eq!(h.wait(1, t0 + Duration::from_secs(5)), None);
        let mut never = Hold::default();
        never.proposed(16);
        assert_eq!(never.wait(1, t0), None, "no entry settled yet");
    }

    #[test]
    fn the_mark_follows_smaller_entries_down_by_an_eighth_each() {
        let t0 = Instant::now();
        let mut h = busy(16, t0);
        h.proposed(8);
        assert_eq!(h.peak, 14);
        h.proposed(8);
        assert_eq!(h.peak, 13);
        h.proposed(20);
        assert_eq!(h.peak, 20);
    }
}
