//! Quiet groups: an idle Raft group stops heartbeating, and one node-level ping per peer pair
//! keeps its leader's lease and its failover going instead.
//!
//! Every group heartbeats on its own while it is awake (every 100 ms to each follower), and
//! each replica's Raft ticker wakes fifty times a second; with hundreds of groups an idle
//! cluster spends most of a core on that. A group that has been idle for a while is quieted,
//! as CockroachDB quiesces ranges: its leader turns heartbeats and its ticker off, and its
//! followers turn their election timers (and tickers) off. What remains is the node-level
//! ping that `transport` sends each peer every heartbeat interval, which lists the groups the
//! sender leads quietly.
//!
//! # The protocol
//!
//! - Quieting (leader `L`, once per interval): `L` quiets group `g` when nothing was written
//!   to `g` for `after`, every follower has matched `L`'s last log index, that index is
//!   committed, and a majority acknowledged a heartbeat within the lease (so `L`'s term is
//!   current). From then on `L`'s pings to `g`'s replicas list `(g, term)`.
//! - Promising (follower `F`): a ping from `L` listing `(g, term)`, where `F` follows `L` in
//!   `term`, is a request to stay quiet. `F` turns its election timer off for `g` and
//!   answers that it promises. A promise made on receipt at time `R` binds `F` until
//!   `R + promise`: `F` refuses every vote request for `g` (other than a leadership transfer,
//!   which `L` itself starts) and starts no election for `g`. `L` renews the promise with every
//!   ping, so a live quiet leader keeps it bound; once renewals stop (`L` died, was cut off,
//!   or woke the group and stopped listing it) the promise runs out and `F` turns elections
//!   back on.
//! - Lease: `L` serves a quiet group while a majority of its replicas, `L` counted, promised
//!   in answer to a ping sent at `T` with `T + lease` still ahead. `L` counts itself: it
//!   refuses vote requests for a group it leads quietly or holds a quiet lease on.
//! - Waking: a write wakes the group (heartbeats back on, no longer listed); so does a
//!   follower answering a ping without promising (it restarted, or saw a newer term), so
//!   that heartbeats find out. A follower wakes on any append or vote it accepts for the group.
//!   A leadership transfer wakes the leader and drops its quiet lease first
//!   (`before_transfer`).
//!
//! # Why the lease is safe
//!
//! Say a majority `M` of `g`'s replicas promised `L` in answer to pings sent at or after `T`.
//! Another node can only become leader with the votes of a majority, which shares a member
//! `F` with `M`. `F` received its ping at `R >= T` and grants no vote for another candidate
//! before `R + promise`, and it starts no election of its own before then either: its timer is
//! off, and if an append from `L` turned it back on, that append renewed Raft's own election
//! timeout, which runs at least `election_timeout_min` from a moment after `R`. So no other
//! leader exists before `T + min(promise, election_timeout_min)`, and `lease` is shorter than
//! that by a heartbeat interval (the margin for clocks that drift apart while a lease runs).
//! A promise lives in memory, so a node that restarts refuses votes for `promise` after it
//! comes up: it may have made promises it no longer remembers.
//!
//! # Failover
//!
//! When a quiet leader dies its pings stop; each follower's promise runs out `promise` after
//! the last ping it received, and it turns elections back on. Raft's own election timeout ran
//! out long before (nothing renewed it while the group was quiet), so the next tick, at most
//! 20 ms later, starts an election: no forced election is needed. A forced one
//! (`trigger().elect`) would also ignore a live leader's appends, so it is not used. To
//! keep the followers from splitting the vote, they turn elections on one after the other, in
//! placement order, a heartbeat interval apart, and the first only an interval after its
//! promise ran out, by which time every other replica's promise has run out too (a leader
//! pings all its peers at the same moment, so their promises differ by little more than the
//! network delay; the interval covers a ping that was late). A vote refused under a promise
//! would cost the candidate a whole election timeout, so this wait is worth its length. With
//! the default timings (promise 300 ms) a quiet group's leader is replaced about half a second
//! after it died, a little sooner than an awake group's.

use crate::cluster::executor::GroupRaft;
use crate::cluster::typ::{GroupId, NodeId, TypeConfig};
use crate::sync::lock;
use arc_swap::ArcSwap;
use openraft::Instant as _;
use openraft::ServerState;
use openraft::raft::{AppendEntriesResponse, VoteRequest};
use openraft::type_config::async_runtime::WatchReceiver;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The groups the sender leads quietly and shares with the receiver, each with the sender's
/// term, in ascending group order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Ping {
    pub from: NodeId,
    pub quiet: Vec<(GroupId, u64)>,
    /// The groups the sender leads and serves, with their terms: how a node learns the
    /// leaders of the groups it holds no replica of.
    pub leads: Vec<(GroupId, u64)>,
}

/// The answer to a `Ping`: which of its groups the answerer promised to stay quiet for, in
/// ascending order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PingAck {
    pub promised: Vec<GroupId>,
}

/// Why this node refused a vote (or pre-vote) request: the candidate counts no vote here and
/// tries again later. It travels back to the candidate in a `PeerError`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum VoteRefusal {
    /// This node restarted less than a promise's length ago, and may have made promises it no
    /// longer remembers.
    JustRestarted,
    /// This node leads the group quietly.
    LedQuietly(GroupId),
    /// This node promised `leader` to stay quiet for the group.
    Promised { leader: NodeId, group: GroupId },
}

impl std::fmt::Display for VoteRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VoteRefusal::JustRestarted => {
                f.write_str("just restarted: not voting until promises made before have run out")
            }
            VoteRefusal::LedQuietly(g) => write!(f, "group {g} is led here quietly"),
            VoteRefusal::Promised { leader, group } => {
                write!(f, "promised node {leader} to stay quiet for group {group}")
            }
        }
    }
}

/// Timings of quiet groups, derived from the Raft timings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QuietTimings {
    /// How long a group must be idle before its leader quiets it; `None`: never.
    pub after: Option<Duration>,
    /// How often pings go out (the heartbeat interval).
    pub interval: Duration,
    /// How long a follower's promise binds it after it received the ping.
    pub promise: Duration,
    /// How long a majority's promises let a quiet leader serve, from when the ping was sent.
    pub lease: Duration,
}

impl QuietTimings {
    /// The promise lasts the shortest election timeout, the lease a heartbeat interval less
    /// (see the module comment). With a lease no longer than the interval a quiet leader would
    /// lose its lease between pings, so then groups are never quieted.
    pub(crate) fn new(
        after: Option<Duration>,
        heartbeat_ms: u64,
        election_min_ms: u64,
    ) -> QuietTimings {
        let interval = Duration::from_millis(heartbeat_ms.max(1));
        let promise = Duration::from_millis(election_min_ms);
        let lease = promise.saturating_sub(interval);
        let after = if lease > interval { after } else { None };
        QuietTimings {
            after,
            interval,
            promise,
            lease,
        }
    }
}

/// What quiet groups need to know of this node's replicas.
pub(crate) trait GroupView {
    /// `g`'s replica on this node, if it holds one.
    fn raft(&self, g: GroupId) -> Option<Arc<GroupRaft>>;
    /// Whether a majority acknowledged this node's heartbeats for `g` within the lease.
    fn heartbeat_lease(&self, g: GroupId) -> bool;
}

/// What this module last switched a group's Raft to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Heartbeats, elections and ticks on, as Raft runs by default.
    Awake,
    /// Led here quietly at this term: heartbeats and ticks off.
    QuietLeader(u64),
    /// Following a quiet leader: elections and ticks off.
    Silenced,
}

/// A follower's promise to stay quiet for `leader` in `term`, made at `at`.
#[derive(Debug, Clone, Copy)]
struct Promise {
    leader: NodeId,
    at: Instant,
}

#[derive(Debug)]
struct GroupState {
    mode: Mode,
    /// Leader side: the term of the quiet spell whose promises count towards the lease; kept
    /// after a write wakes the group (the promises still bind), dropped when the leadership
    /// ends or is handed over.
    lease_term: Option<u64>,
    /// Leader side: per follower, when the latest ping was sent whose answer promised.
    acks: Vec<(NodeId, Instant)>,
    /// Leader side: the last log index seen, to notice writes that came another way.
    seen_index: Option<u64>,
    /// Follower side: the latest promise made for the group.
    promise: Option<Promise>,
}

impl GroupState {
    fn new() -> GroupState {
        GroupState {
            mode: Mode::Awake,
            lease_term: None,
            acks: Vec::new(),
            seen_index: None,
            promise: None,
        }
    }
}

/// One node's quiet-group bookkeeping, for every group it holds a replica of.
pub(crate) struct Quiet {
    me: NodeId,
    t: QuietTimings,
    born: Instant,
    /// Whether this node found groups on disk when it started: it may have promised before.
    restarted: bool,
    /// Per group, its replicas (this node among them when it holds one); they change as
    /// replicas move.
    replicas: Vec<ArcSwap<Vec<NodeId>>>,
    /// Per group: whether it is led here quietly (read on the write path without the lock).
    quiet_led: Vec<AtomicBool>,
    /// Per group: whether this node follows it silenced (read on the append path).
    silenced: Vec<AtomicBool>,
    /// Per group: until when the quiet lease holds, in ms since `born` (0: no lease).
    lease_until: Vec<AtomicU64>,
    /// Per group: the last write proposed here, in ms since `born`.
    active: Vec<AtomicU64>,
    /// How many times a group led here was woken from quiet.
    wakes: AtomicU64,
    state: Mutex<Vec<GroupState>>,
}

impl Quiet {
    pub(crate) fn new(
        me: NodeId,
        t: QuietTimings,
        replicas: Vec<Vec<NodeId>>,
        restarted: bool,
    ) -> Quiet {
        let n = replicas.len();
        Quiet {
            me,
            t,
            born: Instant::now(),
            restarted,
            replicas: replicas.into_iter().map(ArcSwap::from_pointee).collect(),
            quiet_led: (0..n).map(|_| AtomicBool::new(false)).collect(),
            silenced: (0..n).map(|_| AtomicBool::new(false)).collect(),
            lease_until: (0..n).map(|_| AtomicU64::new(0)).collect(),
            active: (0..n).map(|_| AtomicU64::new(0)).collect(),
            wakes: AtomicU64::new(0),
            state: Mutex::new((0..n).map(|_| GroupState::new()).collect()),
        }
    }

    fn replicas_of(&self, g: GroupId) -> Arc<Vec<NodeId>> {
        self.replicas
            .get(g as usize)
            .map(|r| r.load_full())
            .unwrap_or_default()
    }

    /// A group's replicas changed (a move).
    pub(crate) fn set_replicas(&self, g: GroupId, replicas: Vec<NodeId>) {
        if let Some(r) = self.replicas.get(g as usize) {
            r.store(Arc::new(replicas));
        }
    }

    pub(crate) fn timings(&self) -> QuietTimings {
        self.t
    }

    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.born).as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    fn now_ms(&self) -> u64 {
        self.ms(Instant::now())
    }

    /// How many groups this node leads quietly now.
    pub(crate) fn quiet_led(&self) -> usize {
        self.quiet_led
            .iter()
            .filter(|q| q.load(Ordering::Relaxed))
            .count()
    }

    /// Whether this node leads `g` quietly now.
    pub(crate) fn is_quiet_led(&self, g: GroupId) -> bool {
        Self::flag(&self.quiet_led, g)
    }

    /// How many times a group led here was woken from quiet so far.
    pub(crate) fn wakes(&self) -> u64 {
        self.wakes.load(Ordering::Relaxed)
    }

    /// How many groups this node follows with its election timer off now.
    pub(crate) fn silenced(&self) -> usize {
        self.silenced
            .iter()
            .filter(|q| q.load(Ordering::Relaxed))
            .count()
    }

    /// Whether the promises of a majority still let this node serve `g` (which it must lead).
    pub(crate) fn lease_holds(&self, g: GroupId) -> bool {
        let until = self
            .lease_until
            .get(g as usize)
            .map_or(0, |u| u.load(Ordering::Relaxed));
        until != 0 && self.now_ms() < until
    }

    fn flag(v: &[AtomicBool], g: GroupId) -> bool {
        v.get(g as usize).is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// Switches `g`'s Raft to `mode` and records it.
    fn switch(&self, g: GroupId, st: &mut GroupState, raft: &GroupRaft, mode: Mode) {
        if st.mode == mode {
            return;
        }
        let rc = raft.runtime_config();
        match mode {
            Mode::Awake => {
                rc.heartbeat(true);
                rc.elect(true);
                rc.tick(true);
            }
            Mode::QuietLeader(_) => {
                rc.heartbeat(false);
                rc.tick(false);
            }
            Mode::Silenced => {
                rc.elect(false);
                rc.tick(false);
            }
        }
        if matches!(st.mode, Mode::QuietLeader(_)) {
            self.wakes.fetch_add(1, Ordering::Relaxed);
        }
        st.mode = mode;
        let i = g as usize;
        if let Some(q) = self.quiet_led.get(i) {
            q.store(matches!(mode, Mode::QuietLeader(_)), Ordering::Relaxed);
        }
        if let Some(s) = self.silenced.get(i) {
            s.store(mode == Mode::Silenced, Ordering::Relaxed);
        }
    }

    /// Forgets the quiet lease of `g` (its leadership ended or is being handed over).
    fn drop_lease(&self, g: GroupId, st: &mut GroupState) {
        st.lease_term = None;
        st.acks.clear();
        if let Some(u) = self.lease_until.get(g as usize) {
            u.store(0, Ordering::Relaxed);
        }
    }

    /// A write to `g` is about to be proposed here: the group is active, and awake from now.
    /// Raft itself takes writes only while a majority acknowledged its leader within
    /// `election_timeout_max`, which a quiet leader's heartbeats no longer renew: so a woken
    /// leader sends a heartbeat at once and waits (a round trip, at most a promise's length)
    /// for the acknowledgement before the write goes on. The quiet lease stays meanwhile: the
    /// promises behind it still bind until they run out. `heartbeat_lease`: whether a
    /// majority acknowledged this node's heartbeats for `g` within the lease.
    pub(crate) async fn on_write(&self, heartbeat_lease: bool, g: GroupId, raft: &GroupRaft) {
        if let Some(a) = self.active.get(g as usize) {
            a.store(self.now_ms(), Ordering::Relaxed);
        }
        let quiet = Self::flag(&self.quiet_led, g);
        // Quiet, or woken a moment ago and still serving on promises alone.
        let needs_ack = quiet || (self.lease_holds(g) && !heartbeat_lease);
        if !needs_ack {
            return;
        }
        if quiet {
            let mut all = lock(&self.state);
            if let Some(st) = all.get_mut(g as usize) {
                self.switch(g, st, raft, Mode::Awake);
            }
        }
        let asked = Instant::now();
        if raft.trigger().heartbeat().await.is_err() {
            return;
        }
        let mut metrics = raft.metrics();
        let acked = async {
            loop {
                let fresh = metrics
                    .borrow_watched()
                    .last_quorum_acked
                    .as_ref()
                    .is_some_and(|t| t.elapsed() <= asked.elapsed());
                if fresh || metrics.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(self.t.promise, acked).await;
    }

    /// Before this node hands `g`'s leadership over: wake it, and stop serving on promises,
    /// since the transfer's election is one the followers take part in despite them.
    pub(crate) fn before_transfer(&self, g: GroupId, raft: &GroupRaft) {
        if let Some(a) = self.active.get(g as usize) {
            a.store(self.now_ms(), Ordering::Relaxed);
        }
        let mut all = lock(&self.state);
        if let Some(st) = all.get_mut(g as usize) {
            self.drop_lease(g, st);
            self.switch(g, st, raft, Mode::Awake);
        }
    }

    /// Whether this node may answer a vote (or pre-vote) request for `g` now; `Err` says why
    /// not. A refused request fails as if this node were unreachable, so the candidate counts
    /// no vote here and tries again later.
    pub(crate) fn may_vote(
        &self,
        g: GroupId,
        req: &VoteRequest<TypeConfig>,
    ) -> Result<(), VoteRefusal> {
        // A transfer's election is started on the leader's word, which wakes first.
        if req.leadership_transfer {
            return Ok(());
        }
        if self.restarted && self.born.elapsed() < self.t.promise {
            return Err(VoteRefusal::JustRestarted);
        }
        if Self::flag(&self.quiet_led, g) || self.lease_holds(g) {
            return Err(VoteRefusal::LedQuietly(g));
        }
        let all = lock(&self.state);
        if let Some(p) = all.get(g as usize).and_then(|st| st.promise)
            && p.at.elapsed() < self.t.promise
            && req.vote.leader_id().node_id != p.leader
        {
            return Err(VoteRefusal::Promised {
                leader: p.leader,
                group: g,
            });
        }
        Ok(())
    }

    /// A vote request for `g` passed `may_vote` and is about to be handled. A transfer's vote
    /// hands the leadership over, so a leader's quiet lease ends before it can grant it.
    pub(crate) fn before_vote(&self, g: GroupId, req: &VoteRequest<TypeConfig>) {
        if req.leadership_transfer && (Self::flag(&self.quiet_led, g) || self.lease_holds(g)) {
            let mut all = lock(&self.state);
            if let Some(st) = all.get_mut(g as usize) {
                self.drop_lease(g, st);
            }
        }
    }

    /// Wakes `g` here: it heartbeats (or times out) again, and a quiet lease held on it ends.
    fn wake_up(&self, g: GroupId, raft: &GroupRaft) {
        let mut all = lock(&self.state);
        if let Some(st) = all.get_mut(g as usize) {
            if matches!(st.mode, Mode::QuietLeader(_)) {
                self.drop_lease(g, st);
            }
            self.switch(g, st, raft, Mode::Awake);
        }
    }

    /// Raft handled a vote request for `g` that passed `may_vote`: elections are back on here.
    /// Only now, not before: a granted vote renews Raft's election timeout, which on a quiet
    /// follower ran out long ago, so turning elections on first could start an election of
    /// this node's own that races the candidate's.
    pub(crate) fn after_vote(&self, g: GroupId, raft: &GroupRaft) {
        if !Self::flag(&self.quiet_led, g) && !Self::flag(&self.silenced, g) {
            return;
        }
        self.wake_up(g, raft);
    }

    /// An append for `g` was handled: the group is awake. Unless the sender turned out to be
    /// a stale leader (its term is behind ours), someone leads the group with heartbeats now:
    /// this follower's timer is on again, renewed by this very append, and a node that led the
    /// group quietly has lost it.
    pub(crate) fn after_append(
        &self,
        g: GroupId,
        raft: &GroupRaft,
        resp: Option<&AppendEntriesResponse<TypeConfig>>,
    ) {
        if !Self::flag(&self.quiet_led, g) && !Self::flag(&self.silenced, g) {
            return;
        }
        if !matches!(
            resp,
            Some(
                AppendEntriesResponse::Success
                    | AppendEntriesResponse::PartialSuccess(_)
                    | AppendEntriesResponse::Conflict
            )
        ) {
            return;
        }
        self.wake_up(g, raft);
    }

    /// A leadership transfer for `g` arrived: if this replica is its target it is about to be
    /// elected and will have to heartbeat, so its ticker goes back on. Elections stay off:
    /// Raft's timeout is long past on a quiet follower, and an election of its own would
    /// race the transfer's.
    pub(crate) fn on_transfer(&self, g: GroupId, raft: &GroupRaft) {
        if Self::flag(&self.silenced, g) {
            raft.runtime_config().tick(true);
        }
    }

    /// This node's ping to `peer`: the groups it leads quietly that `peer` holds a replica of.
    pub(crate) fn ping(&self, peer: NodeId) -> Ping {
        let all = lock(&self.state);
        let quiet = all
            .iter()
            .enumerate()
            .filter_map(|(g, st)| match st.mode {
                Mode::QuietLeader(term) if self.replicas_of(g as GroupId).contains(&peer) => {
                    Some((g as GroupId, term))
                }
                _ => None,
            })
            .collect();
        Ping {
            from: self.me,
            quiet,
            leads: Vec::new(),
        }
    }

    /// Answers a peer's ping: promises to stay quiet for each listed group this node follows
    /// the sender in, at the listed term, and silences those groups here.
    pub(crate) fn on_ping(&self, cluster: &impl GroupView, ping: &Ping) -> PingAck {
        let now = Instant::now();
        let mut promised = Vec::new();
        let mut all = lock(&self.state);
        for &(g, term) in &ping.quiet {
            let Some(raft) = cluster.raft(g) else {
                continue;
            };
            let Some(st) = all.get_mut(g as usize) else {
                continue;
            };
            let follows = {
                let m = raft.metrics();
                let m = m.borrow_watched();
                m.current_leader == Some(ping.from)
                    && m.current_term == term
                    && m.state == ServerState::Follower
            };
            if !follows || matches!(st.mode, Mode::QuietLeader(_)) {
                continue;
            }
            st.promise = Some(Promise {
                leader: ping.from,
                at: now,
            });
            self.switch(g, st, &raft, Mode::Silenced);
            promised.push(g);
        }
        PingAck { promised }
    }

    /// `peer` answered the ping sent at `sent`: its promises extend the quiet leases; a group
    /// it did not promise for is woken, so that heartbeats find out why.
    pub(crate) fn answered(
        &self,
        cluster: &impl GroupView,
        peer: NodeId,
        sent: Instant,
        ping: &Ping,
        ack: &PingAck,
    ) {
        let mut all = lock(&self.state);
        for &(g, term) in &ping.quiet {
            let Some(st) = all.get_mut(g as usize) else {
                continue;
            };
            if st.lease_term != Some(term) {
                continue;
            }
            if ack.promised.binary_search(&g).is_ok() {
                match st.acks.iter_mut().find(|(id, _)| *id == peer) {
                    Some((_, at)) => *at = (*at).max(sent),
                    None => st.acks.push((peer, sent)),
                }
                self.renew_lease(g, st);
            } else if let Some(raft) = cluster.raft(g) {
                // Counted as activity, so the group stays awake for a while instead of being
                // quieted again at the next look.
                if let Some(a) = self.active.get(g as usize) {
                    a.store(self.now_ms(), Ordering::Relaxed);
                }
                self.switch(g, st, &raft, Mode::Awake);
            }
        }
    }

    /// Sets `g`'s lease from the promises: this node plus the followers whose promise came in
    /// answer to the latest pings make a majority; the lease runs from the oldest of those
    /// pings.
    fn renew_lease(&self, g: GroupId, st: &mut GroupState) {
        let replicas = self.replicas_of(g);
        let needed = replicas.len() / 2; // a majority, this node not counted
        let mut times: Vec<Instant> = st
            .acks
            .iter()
            .filter(|(id, _)| *id != self.me && replicas.contains(id))
            .map(|&(_, at)| at)
            .collect();
        if needed == 0 || times.len() < needed {
            return;
        }
        times.sort_unstable_by(|a, b| b.cmp(a));
        let from = times[needed - 1];
        if let Some(u) = self.lease_until.get(g as usize) {
            u.fetch_max(self.ms(from + self.t.lease), Ordering::Relaxed);
        }
    }

    /// One look at every group, each heartbeat interval: quiet the idle groups this node
    /// leads, put back in step the groups whose leadership changed, and turn elections back on
    /// for followers whose promise ran out.
    pub(crate) fn look(&self, cluster: &impl GroupView) {
        let now = Instant::now();
        let now_ms = self.ms(now);
        let mut all = lock(&self.state);
        for (i, st) in all.iter_mut().enumerate() {
            let g = i as GroupId;
            let Some(raft) = cluster.raft(g) else {
                continue;
            };
            let (leading, term, last, committed, caught_up) = {
                let m = raft.metrics();
                let m = m.borrow_watched();
                let leading = m.state == ServerState::Leader && m.current_leader == Some(self.me);
                let last = m.last_log_index;
                let caught_up = m.replication.as_ref().is_some_and(|r| {
                    r.values()
                        .all(|matched| matched.as_ref().map(|l| l.index) == last)
                });
                (
                    leading,
                    m.current_term,
                    last,
                    m.cluster_committed.as_ref().map(|l| l.index),
                    caught_up,
                )
            };
            if !leading {
                if matches!(st.mode, Mode::QuietLeader(_)) || st.lease_term.is_some() {
                    self.drop_lease(g, st);
                    self.switch(g, st, &raft, Mode::Awake);
                }
                if st.mode == Mode::Silenced && self.promise_released(g, st, now) {
                    self.switch(g, st, &raft, Mode::Awake);
                }
                continue;
            }
            match st.mode {
                Mode::Silenced => self.switch(g, st, &raft, Mode::Awake),
                Mode::QuietLeader(t) if t != term => {
                    self.drop_lease(g, st);
                    self.switch(g, st, &raft, Mode::Awake);
                }
                _ => {}
            }
            if st.seen_index != last {
                st.seen_index = last;
                self.active[i].store(now_ms, Ordering::Relaxed);
            }
            let Some(after) = self.t.after else { continue };
            let idle = now_ms.saturating_sub(self.active[i].load(Ordering::Relaxed))
                >= u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
            if st.mode == Mode::Awake
                && idle
                && self.replicas_of(g).len() >= 2
                && caught_up
                && committed == last
                && cluster.heartbeat_lease(g)
            {
                if st.lease_term != Some(term) {
                    self.drop_lease(g, st);
                    st.lease_term = Some(term);
                }
                self.switch(g, st, &raft, Mode::QuietLeader(term));
            }
        }
    }

    /// Whether a silenced follower's promise ran out and its turn to campaign came: the first
    /// follower in placement order an interval after its promise ran out, the next one an
    /// interval later, and so on (see the module comment).
    fn promise_released(&self, g: GroupId, st: &GroupState, now: Instant) -> bool {
        let Some(p) = st.promise else { return true };
        let rank = self
            .replicas_of(g)
            .iter()
            .filter(|&&id| id != p.leader)
            .position(|&id| id == self.me)
            .unwrap_or(0);
        let wait = self.t.promise + self.t.interval * (rank as u32 + 1);
        now.saturating_duration_since(p.at) >= wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_is_a_heartbeat_shorter_than_the_promise() {
        let t = QuietTimings::new(Some(Duration::from_secs(2)), 100, 300);
        assert_eq!(t.promise, Duration::from_millis(300));
        assert_eq!(t.lease, Duration::from_millis(200));
        assert_eq!(t.after, Some(Duration::from_secs(2)));
    }

    #[test]
    fn too_tight_timings_never_quiet() {
        let t = QuietTimings::new(Some(Duration::from_secs(2)), 100, 150);
        assert_eq!(t.after, None);
    }

    #[test]
    fn lease_needs_a_majority_and_runs_from_the_older_ping() {
        let t = QuietTimings::new(Some(Duration::from_secs(2)), 100, 300);
        let q = Quiet::new(1, t, vec![vec![1, 2, 3, 4, 5]], false);
        let mut st = GroupState::new();
        let t0 = Instant::now();
        st.acks.push((2, t0 + Duration::from_millis(50)));
        q.renew_lease(0, &mut st);
        assert_eq!(q.lease_until[0].load(Ordering::Relaxed), 0, "two of five");
        st.acks.push((3, t0 + Duration::from_millis(10)));
        q.renew_lease(0, &mut st);
        let until = q.lease_until[0].load(Ordering::Relaxed);
        assert_eq!(until, q.ms(t0 + Duration::from_millis(210)));
        // Acks from nodes that are not replicas do not count.
        let mut other = GroupState::new();
        other.acks.push((9, t0));
        other.acks.push((8, t0));
        let q2 = Quiet::new(1, t, vec![vec![1, 2, 3]], false);
        q2.renew_lease(0, &mut other);
        assert_eq!(q2.lease_until[0].load(Ordering::Relaxed), 0);
    }
}
