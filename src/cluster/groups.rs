//! What this node knows of every group, shared by the parts of the cluster: its replica of
//! the group (if any), the group's voters and leader as far as this node can tell, and
//! whether this node may serve the group now (its leader lease, or a quiet group's).

use crate::cluster::errors::TransferError;
use crate::cluster::executor::GroupRaft;
use crate::cluster::meta::{MetaState, MetaStore};
use crate::cluster::quiet::{GroupView, Quiet};
use crate::cluster::spec::{ClusterSpec, NodeSpec};
use crate::cluster::transport::Network;
use crate::cluster::typ::{GroupId, NodeId};
use arc_swap::{ArcSwap, ArcSwapOption};
use openraft::type_config::async_runtime::WatchReceiver;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How long a proposal waits for a group without a serving leader to get one: longer than
/// an election takes, so a move or a failover on the majority's side costs a pause, not an
/// error.
const LEADER_SETTLE: Duration = Duration::from_millis(700);

/// Who leads a group as far as this node's own replica of it can tell: Raft names the
/// leader of the last vote the replica saw. A replica taken out of the group keeps that vote
/// (it hears no newer one), its own too if it led: then the replica says nothing (0), and the
/// pings of the group's leader say who it is. A member naming itself leads, or is a candidate
/// about to: it serves only with a lease, and until then requests wait for the election
/// rather than follow an older leader's claim (which would send them back here).
pub(crate) fn local_leader(
    me: NodeId,
    named: Option<NodeId>,
    state: openraft::ServerState,
    member: bool,
) -> NodeId {
    match named {
        Some(l) if l == me && (member || state == openraft::ServerState::Leader) => me,
        Some(l) if l != me && member => l,
        _ => 0,
    }
}

/// Whether a peer's claim to lead a group in `term` replaces what this node knows of the
/// group's leader (`known`: node, term, when heard in ms): a newer term does, so does the
/// known leader renewing its claim, and so does any claim once the known one has not been
/// renewed for `fresh` ms (its leader stopped claiming the group, so it no longer serves it).
fn takes_claim(known: (NodeId, u64, u64), from: NodeId, term: u64, now: u64, fresh: u64) -> bool {
    let (node, known_term, at) = known;
    node == 0
        || term > known_term
        || (term == known_term && node == from)
        || now.saturating_sub(at) > fresh
}

/// Per group (the metadata group last, at index `spec.groups`), this node's view of it.
pub(crate) struct Groups {
    pub(crate) me: NodeId,
    /// What the node was started with: the group count and replicas are the cluster's for
    /// its whole life; the members are only the first ones (see `nodes`).
    pub(crate) spec: ClusterSpec,
    /// This node's replica of each group.
    rafts: Vec<ArcSwapOption<GroupRaft>>,
    /// Per group, its voters as this node's replica last saw them.
    voters: Vec<ArcSwap<Vec<NodeId>>>,
    leaders: Vec<AtomicU64>,
    /// Per group, while this node leads it: when a majority last acknowledged it, in ms since
    /// `born` (0: not yet).
    quorum_acked: Vec<AtomicU64>,
    /// Per group: leader changes its replica saw.
    leader_changes: Vec<AtomicU64>,
    born: tokio::time::Instant,
    /// A leader serves only while a majority acknowledged it this recently.
    lease: Duration,
    /// A peer not heard from for this long counts as failed.
    fail_after: Duration,
    /// Per group this node holds no replica of: the leader its pings name (node, term, when
    /// heard in ms since `born`).
    remote_leaders: std::sync::Mutex<Vec<(NodeId, u64, u64)>>,
    /// Which groups are quiet, and their leases.
    quiet: Quiet,
    pub(crate) net: Network,
    /// The cluster's metadata as applied here.
    pub(crate) meta: Arc<MetaStore>,
    /// Set once the cluster removed this node: it serves nothing from then on.
    removed: AtomicBool,
    /// The event loop of the node's first shard, where the node's cluster-wide tasks run.
    handle: tokio::runtime::Handle,
    /// Per shard, its event loop: a group's Raft runs on the one of the shard that owns it.
    runtimes: Vec<tokio::runtime::Handle>,
}

/// One group's replica on this node, for the metrics.
#[derive(Debug, Clone)]
pub struct GroupMetrics {
    pub group: GroupId,
    /// The metadata group (the others hold keys).
    pub meta: bool,
    pub leader: bool,
    pub term: u64,
    pub committed: u64,
    pub applied: u64,
    pub leader_changes: u64,
    pub proposals: u64,
}

/// What `Groups` starts from.
pub(crate) struct GroupsInit {
    pub me: NodeId,
    pub spec: ClusterSpec,
    /// Per group, its voters before the replica says.
    pub voters: Vec<Vec<NodeId>>,
    pub election_timeout_ms: (u64, u64),
    pub quiet: Quiet,
    pub net: Network,
    pub meta: Arc<MetaStore>,
    pub handle: tokio::runtime::Handle,
    pub runtimes: Vec<tokio::runtime::Handle>,
}

impl Groups {
    pub(crate) fn new(init: GroupsInit) -> Groups {
        let all = init.spec.groups as usize + 1;
        let counters = || (0..all).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        Groups {
            me: init.me,
            spec: init.spec,
            rafts: (0..all).map(|_| ArcSwapOption::empty()).collect(),
            voters: init.voters.into_iter().map(ArcSwap::from_pointee).collect(),
            leaders: counters(),
            quorum_acked: counters(),
            leader_changes: counters(),
            born: tokio::time::Instant::now(),
            lease: Duration::from_millis(init.election_timeout_ms.0),
            fail_after: Duration::from_millis(init.election_timeout_ms.1),
            remote_leaders: std::sync::Mutex::new(vec![(0, 0, 0); all]),
            quiet: init.quiet,
            net: init.net,
            meta: init.meta,
            removed: AtomicBool::new(false),
            handle: init.handle,
            runtimes: init.runtimes,
        }
    }

    /// When this node's view began (the origin of the ms it counts in).
    pub(crate) fn born(&self) -> tokio::time::Instant {
        self.born
    }

    /// Makes `raft` (or none) this node's replica of `g`.
    pub(crate) fn set_raft(&self, g: GroupId, raft: Option<Arc<GroupRaft>>) {
        if let Some(slot) = self.rafts.get(g as usize) {
            slot.store(raft);
        }
    }

    /// Takes this node's replica of `g` out, if it holds one.
    pub(crate) fn take_raft(&self, g: GroupId) -> Option<Arc<GroupRaft>> {
        self.rafts.get(g as usize).and_then(|s| s.swap(None))
    }

    /// Every replica this node holds.
    pub(crate) fn all_rafts(&self) -> Vec<Arc<GroupRaft>> {
        self.rafts.iter().filter_map(|r| r.load_full()).collect()
    }

    /// What `g`'s replica on this node last said of its leadership: the leader it names (0:
    /// none) and, while that is this node, when a majority last acknowledged it (ms since
    /// `born`, 0: not yet).
    pub(crate) fn observe_leader(&self, g: GroupId, leader: NodeId, acked_at: u64) {
        let i = g as usize;
        if let Some(a) = self.quorum_acked.get(i) {
            a.store(acked_at, Ordering::Relaxed);
        }
        if let Some(l) = self.leaders.get(i) {
            let before = l.swap(leader, Ordering::Relaxed);
            if leader != 0
                && leader != before
                && let Some(n) = self.leader_changes.get(i)
            {
                n.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// `g`'s replica here says nothing of its leadership any more (it stopped).
    pub(crate) fn forget_leader(&self, g: GroupId) {
        let i = g as usize;
        if let Some(l) = self.leaders.get(i) {
            l.store(0, Ordering::Relaxed);
        }
        if let Some(a) = self.quorum_acked.get(i) {
            a.store(0, Ordering::Relaxed);
        }
    }

    /// `g`'s voters as its replica here last saw them.
    pub(crate) fn stored_voters(&self, g: GroupId) -> Arc<Vec<NodeId>> {
        self.voters
            .get(g as usize)
            .map(|v| v.load_full())
            .unwrap_or_default()
    }

    /// `g`'s replica here saw its voters change.
    pub(crate) fn set_voters(&self, g: GroupId, voters: Vec<NodeId>) {
        self.quiet.set_replicas(g, voters.clone());
        if let Some(v) = self.voters.get(g as usize) {
            v.store(Arc::new(voters));
        }
    }

    /// The event loop a group's Raft runs on: the one of the shard that owns its keys (the
    /// metadata group's on the first shard's).
    pub(crate) fn runtime_of(&self, g: GroupId) -> tokio::runtime::Handle {
        if g >= self.spec.groups {
            return self.handle.clone();
        }
        let s = g as usize % self.runtimes.len().max(1);
        self.runtimes
            .get(s)
            .cloned()
            .unwrap_or_else(|| self.handle.clone())
    }

    /// The event loop where the node's cluster-wide tasks run.
    pub(crate) fn event_loop(&self) -> tokio::runtime::Handle {
        self.handle.clone()
    }

    /// The metadata group's id: one past the last data group.
    pub(crate) fn meta_group(&self) -> GroupId {
        self.spec.groups
    }

    /// The members of the cluster now (removed ones left out): from the metadata once the
    /// cluster is formed, the start-up description before.
    pub(crate) fn nodes(&self) -> Vec<NodeSpec> {
        let meta = self.meta.get();
        if meta.is_bootstrapped() {
            meta.current().map(|m| m.node.clone()).collect()
        } else {
            self.spec.nodes.clone()
        }
    }

    /// A member's addresses.
    pub(crate) fn node(&self, id: NodeId) -> Option<NodeSpec> {
        let meta = self.meta.get();
        match meta.members.get(&id) {
            Some(m) => Some(m.node.clone()),
            None => self.spec.node(id).cloned(),
        }
    }

    /// The metadata as applied here.
    pub(crate) fn metadata(&self) -> Arc<MetaState> {
        self.meta.get()
    }

    /// Group `g`'s voters: as this node's replica sees them, or as the metadata says for a
    /// group this node holds no replica of.
    pub(crate) fn voters(&self, g: GroupId) -> Vec<NodeId> {
        if self.raft(g).is_some()
            && let Some(v) = self.voters.get(g as usize)
        {
            let v = v.load();
            if !v.is_empty() {
                return Vec::clone(&v);
            }
        }
        let meta = self.meta.get();
        match meta.voters.get(g as usize) {
            Some(v) if !v.is_empty() => v.clone(),
            _ => self.spec.placement(g),
        }
    }

    /// Whether the cluster removed this node.
    pub(crate) fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Relaxed)
    }

    pub(crate) fn mark_removed(&self) {
        if !self.removed.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                node = self.me,
                "this node was removed from the cluster; it serves nothing any more"
            );
        }
    }

    pub(crate) fn group_of_slot(&self, slot: u16) -> GroupId {
        self.spec.group_of_slot(slot)
    }

    /// The group's leader as last seen, if any: as this node's replica sees it, or, for a
    /// group without a replica here or whose replica knows of no leader, as the leader's pings
    /// said lately. A replica that knows of none is often one being filled (a learner a move
    /// is bringing up, which hears from the leader only once it is caught up) or one the group
    /// no longer counts: the group has its leader meanwhile, and this node must not call the
    /// slots unserved (`CLUSTER INFO` would say `fail`, and clients would get `-CLUSTERDOWN`).
    pub(crate) fn leader(&self, g: GroupId) -> Option<NodeId> {
        match self
            .leaders
            .get(g as usize)
            .map(|l| l.load(Ordering::Relaxed))
        {
            Some(0) | None => {}
            Some(id) => return Some(id),
        }
        let (node, _, at) = crate::sync::lock(&self.remote_leaders)
            .get(g as usize)
            .copied()
            .unwrap_or_default();
        (node != 0 && self.ms_since_born().saturating_sub(at) <= self.fail_after_ms())
            .then_some(node)
    }

    /// How long a peer's claim to lead a group stands without being renewed, in ms.
    fn fail_after_ms(&self) -> u64 {
        u64::try_from(self.fail_after.as_millis()).unwrap_or(u64::MAX)
    }

    fn ms_since_born(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// The groups this node leads and serves now, with their terms (for its pings).
    /// The term is read with the state, from one look at the metrics: a leader that has just
    /// granted a successor's vote already has the successor's term, and a claim in that term
    /// would hide the successor's own from every node that holds no replica of the group.
    pub(crate) fn led_groups(&self) -> Vec<(GroupId, u64)> {
        (0..self.spec.groups)
            .filter(|&g| self.leads(g))
            .filter_map(|g| {
                let r = self.raft(g)?;
                let m = r.metrics();
                let m = m.borrow_watched();
                (m.state == openraft::ServerState::Leader).then_some((g, m.current_term))
            })
            .collect()
    }

    /// A peer's ping said which groups it leads.
    pub(crate) fn note_leads(&self, from: NodeId, leads: &[(GroupId, u64)]) {
        let (now, fresh) = (self.ms_since_born(), self.fail_after_ms());
        let mut remote = crate::sync::lock(&self.remote_leaders);
        for &(g, term) in leads {
            if let Some(e) = remote.get_mut(g as usize)
                && takes_claim(*e, from, term, now, fresh)
            {
                *e = (from, term, now);
            }
        }
    }

    /// Whether this node leads `g` and may serve it: a majority acknowledged it within the
    /// lease (a heartbeat, or for a quiet group a ping, see `quiet`). A leader cut off from
    /// its majority stops serving (and claiming the group) once the lease runs out, which is
    /// before the others can have elected a new leader. The only voter of a group is its own
    /// majority: no other node can be elected while it is.
    pub(crate) fn leads(&self, g: GroupId) -> bool {
        self.leader(g) == Some(self.me)
            && (self.heartbeat_lease(g) || self.quiet.lease_holds(g) || self.sole_voter(g))
    }

    /// Whether this node is the one voter of its replica of `g`.
    fn sole_voter(&self, g: GroupId) -> bool {
        self.voters
            .get(g as usize)
            .is_some_and(|v| v.load().as_slice() == [self.me])
    }

    /// Whether a majority acknowledged this node's heartbeats (or appends) for `g` within the
    /// lease; `leads` says whether it leads `g` at all.
    pub(crate) fn heartbeat_lease(&self, g: GroupId) -> bool {
        let at = self
            .quorum_acked
            .get(g as usize)
            .map_or(0, |a| a.load(Ordering::Relaxed));
        if at == 0 {
            return false;
        }
        let now = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        now.saturating_sub(at) <= u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX)
    }

    /// The leader of `g` as far as this node can tell it is serving: itself only within its
    /// lease, another node only while that node is heard from.
    pub(crate) fn serving_leader(&self, g: GroupId) -> Option<NodeId> {
        match self.leader(g) {
            Some(l) if l == self.me => self.leads(g).then_some(l),
            Some(l) => self.is_up(l).then_some(l),
            None => None,
        }
    }

    /// Whether a majority of `g`'s replicas (this node counted) were heard from recently.
    pub(crate) fn majority_up(&self, g: GroupId) -> bool {
        let replicas = self.voters(g);
        let up = replicas.iter().filter(|&&id| self.is_up(id)).count();
        up * 2 > replicas.len()
    }

    /// Whether node `id` is this node, or was heard from recently.
    pub(crate) fn is_up(&self, id: NodeId) -> bool {
        self.net.reachable(id, self.fail_after)
    }

    /// Waits a little for `g` to have a serving leader, so that a leadership moving between
    /// nodes (a planned transfer takes a round trip and an election) costs a client a short
    /// pause and a -MOVED, not an error.
    /// A node that cannot reach a majority of the group's replicas answers at once: no
    /// election it could wait for would make it the leader's neighbour.
    pub(crate) async fn settled_leader(&self, g: GroupId) -> Option<NodeId> {
        let deadline = tokio::time::Instant::now() + LEADER_SETTLE;
        loop {
            if let Some(l) = self.serving_leader(g) {
                return Some(l);
            }
            if tokio::time::Instant::now() >= deadline || !self.majority_up(g) {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// `g`'s replica on this node. Hand its leadership over with `transfer_leader`, not
    /// through the Raft handle, so that a quiet group is woken first.
    pub(crate) fn raft(&self, g: GroupId) -> Option<Arc<GroupRaft>> {
        self.rafts.get(g as usize).and_then(|r| r.load_full())
    }

    pub(crate) fn quiet(&self) -> &Quiet {
        &self.quiet
    }

    /// Hands the leadership of `g`, which this node leads, to replica `to`; a quiet group is
    /// woken and stops serving on its followers' promises first.
    pub(crate) async fn transfer_leader(
        &self,
        g: GroupId,
        to: NodeId,
    ) -> Result<(), TransferError> {
        let raft = self.raft(g).ok_or(TransferError::NoReplica(g))?;
        self.quiet.before_transfer(g, &raft);
        raft.trigger()
            .transfer_leader(to)
            .await
            .map_err(TransferError::Raft)
    }

    /// A write to `g` is about to be proposed here (see `Quiet::on_write`).
    pub(crate) async fn wake_for_write(&self, g: GroupId, raft: &GroupRaft) {
        let heartbeat_lease = self.heartbeat_lease(g);
        self.quiet.on_write(heartbeat_lease, g, raft).await;
    }

    /// Per group this node holds a replica of, what the metrics show of it; `proposals(g)`:
    /// the entries proposed through this node.
    pub(crate) fn group_metrics(&self, proposals: impl Fn(GroupId) -> u64) -> Vec<GroupMetrics> {
        let mut out = Vec::new();
        for (i, slot) in self.rafts.iter().enumerate() {
            let Some(raft) = slot.load_full() else {
                continue;
            };
            let g = i as GroupId;
            let m = raft.metrics();
            let m = m.borrow_watched();
            let committed = m.local_committed.as_ref().map_or(0, |l| l.index);
            let applied = m.last_applied.as_ref().map_or(0, |l| l.index);
            out.push(GroupMetrics {
                group: g,
                meta: i == self.spec.groups as usize,
                leader: m.state == openraft::ServerState::Leader,
                term: m.current_term,
                committed,
                applied,
                leader_changes: self.leader_changes[i].load(Ordering::Relaxed),
                proposals: proposals(g),
            });
        }
        out
    }
}

impl GroupView for Groups {
    fn raft(&self, g: GroupId) -> Option<Arc<GroupRaft>> {
        Groups::raft(self, g)
    }

    fn heartbeat_lease(&self, g: GroupId) -> bool {
        Groups::heartbeat_lease(self, g)
    }
}

/// Runs `Quiet::look` every heartbeat interval until the node stops.
pub(crate) async fn run_quiet(
    groups: std::sync::Weak<Groups>,
    every: Duration,
    mut shutdown: crate::shutdown::Shutdown,
) {
    let mut tick = super::ticker(every);
    while super::next_tick(&mut tick, &mut shutdown).await {
        let Some(g) = groups.upgrade() else { return };
        g.quiet.look(&*g);
    }
}

#[cfg(test)]
mod tests {
    use super::{local_leader, takes_claim};
    use openraft::ServerState;

    #[test]
    fn a_replica_taken_out_of_its_group_names_no_leader() {
        // Leading: itself.
        assert_eq!(local_leader(1, Some(1), ServerState::Leader, true), 1);
        // Leading the change that takes it out, until that commits: itself.
        assert_eq!(local_leader(1, Some(1), ServerState::Leader, false), 1);
        // Taken out of the group while it led: Raft still names it (its own vote), but it
        // is a learner of nothing now.
        assert_eq!(local_leader(1, Some(1), ServerState::Learner, false), 0);
        // A candidate for its own election: itself (it serves once it leads, with a lease).
        assert_eq!(local_leader(1, Some(1), ServerState::Candidate, true), 1);
        // Following: the leader Raft names.
        assert_eq!(local_leader(1, Some(2), ServerState::Follower, true), 2);
        // A learner being filled hears from the leader.
        assert_eq!(local_leader(4, Some(2), ServerState::Learner, true), 2);
        // A replica taken out of the group hears no newer leader: it names none.
        assert_eq!(local_leader(3, Some(2), ServerState::Learner, false), 0);
        assert_eq!(local_leader(1, None, ServerState::Candidate, true), 0);
    }

    #[test]
    fn a_leadership_claim_replaces_an_older_or_lapsed_one() {
        let fresh = 1000;
        // Nothing known yet.
        assert!(takes_claim((0, 0, 0), 2, 3, 10, fresh));
        // A newer term.
        assert!(takes_claim((1, 5, 100), 2, 6, 200, fresh));
        // The known leader renewing.
        assert!(takes_claim((1, 5, 100), 1, 5, 200, fresh));
        // An older term, or another node in the same term, while the known claim is fresh.
        assert!(!takes_claim((1, 5, 100), 2, 4, 200, fresh));
        assert!(!takes_claim((1, 5, 100), 2, 5, 200, fresh));
        // The known claim lapsed: its node stopped claiming the group.
        assert!(takes_claim((1, 5, 100), 2, 5, 100 + fresh + 1, fresh));
        assert!(takes_claim((1, 5, 100), 2, 4, 100 + fresh + 1, fresh));
    }
}
