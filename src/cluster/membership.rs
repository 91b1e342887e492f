//! Changing the cluster while it serves: nodes join and leave, and group replicas move to
//! where the metadata says they belong.
//!
//! Three loops run on every node:
//! - `follow`: acts on each new metadata state. It knows every member's address, opens the
//!   replicas this node should hold (empty; the group's leader fills them), stops the ones a
//!   move took away, hands the rules to the node, and keeps `cluster.conf` in the data folder
//!   up to date, so a node that joined restarts without `--join`.
//! - `drive`, for each group this node leads: moves one replica at a time to where it
//!   belongs, as TiKV's placement driver does: add the new node as a learner, wait until it
//!   caught up, swap it in for the replica that leaves (joint consensus), then report the
//!   group's new voters to the metadata. A leader that is itself leaving hands its leadership
//!   to a replica that stays first, so clients only ever see `-MOVED`.
//! - `drive`, on the metadata group's leader: writes the first metadata of a new cluster,
//!   makes joining nodes voters of the metadata group (and then full members), and takes a
//!   drained node out once no group has a replica on it.

use crate::cluster::balance::caught_up;
use crate::cluster::errors::TryAgain;
use crate::cluster::errors::{MemberChangeError, ProposeError, TransferError};
use crate::cluster::executor::GroupRaft;
use crate::cluster::groups::Groups;
use crate::cluster::join::{CLUSTER_FILE, write_cluster_file};
use crate::cluster::meta::{MemberState, MetaOp, MetaState};
use crate::cluster::replicas::ReplicaSet;
use crate::cluster::typ::{GroupId, NodeId};
use crate::cluster::writes::Writes;
use crate::cmd::Reply;
use crate::shutdown::Shutdown;
use openraft::ChangeMembers;
use openraft::impls::BasicNode;
use openraft::type_config::async_runtime::WatchReceiver;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How often the loops look again when nothing woke them.
const LOOK_EVERY: Duration = Duration::from_millis(200);
/// Most replica moves one node runs at a time (as the leader of the groups that move).
pub(crate) const MOVES_AT_ONCE: usize = 2;
/// How long a new replica may take to catch up before its move is tried again.
const CATCH_UP: Duration = Duration::from_secs(120);
/// How long a removed node that is up stays in the metadata group, so that it hears that it
/// was removed (heartbeats carry the commit every 100 ms).
const REMOVED_HEARS: Duration = Duration::from_secs(2);

/// Moves this node's part of the cluster to where the metadata says it belongs.
pub(crate) struct Membership {
    groups: Arc<Groups>,
    writes: Arc<Writes>,
    replicas: Arc<ReplicaSet>,
    /// The groups whose replicas this node moves now (as their leader).
    moving: std::sync::Mutex<std::collections::HashSet<GroupId>>,
    /// Where `cluster.conf` is kept.
    data_dir: PathBuf,
    /// This node joined a running cluster (it was not created with it).
    joined: bool,
}

async fn follow(weak: Weak<Membership>, mut shutdown: Shutdown) {
    let Some(mut rx) = weak.upgrade().map(|c| c.groups.meta.watch()) else {
        return;
    };
    let mut seen_version = None;
    let mut tick = super::ticker(Duration::from_millis(500));
    loop {
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            _ = tick.tick() => {}
            _ = shutdown.recv() => return,
        }
        let Some(c) = weak.upgrade() else { return };
        let m = c.groups.metadata();
        if !m.is_bootstrapped() {
            continue;
        }
        // A removed node stays a peer while the metadata group still lists it: its leader
        // keeps it a moment so that it hears that it was removed.
        let meta_members = c
            .groups
            .raft(c.groups.meta_group())
            .map(|r| {
                let (v, l, _) = membership_of(&r);
                v.into_iter().chain(l).collect::<Vec<_>>()
            })
            .unwrap_or_default();
        for member in m.members.values() {
            let id = member.node.id;
            if member.state != MemberState::Removed {
                c.groups.net.add_peer(id, &member.node.peer_addr());
            } else if !meta_members.contains(&id) {
                c.groups.net.remove_peer(id);
            }
        }
        if seen_version != Some(m.version) {
            seen_version = Some(m.version);
            let nodes = m.current().map(|n| &n.node);
            if let Err(e) = write_cluster_file(
                &c.data_dir,
                c.groups.me,
                m.groups,
                m.replicas as usize,
                nodes,
            ) {
                tracing::warn!("could not write {CLUSTER_FILE}: {e}");
            }
        }
        if m.state_of(c.groups.me) == Some(MemberState::Removed) {
            c.groups.mark_removed();
            // Every replica, the metadata group's too: a removed node takes part in nothing.
            for g in 0..=c.groups.meta_group() {
                c.replicas.drop_replica(g).await;
            }
            return;
        }
        let placement = m.placement();
        for g in 0..c.groups.spec.groups {
            let listed = m
                .voters
                .get(g as usize)
                .is_some_and(|v| v.contains(&c.groups.me));
            let wanted = listed
                || placement
                    .get(g as usize)
                    .is_some_and(|v| v.contains(&c.groups.me));
            let held = c.groups.raft(g).is_some();
            if wanted && !held {
                if let Err(e) = c.replicas.open_replica(g).await {
                    tracing::warn!(group = g, "could not open a replica: {e}");
                }
            } else if !wanted && held && c.groups.leader(g) != Some(c.groups.me) {
                // The group's leader reported voters without this node once the change that
                // took it out committed; a learner left over from a move given up is not
                // listed either.
                c.replicas.drop_replica(g).await;
            }
        }
    }
}

async fn drive(weak: Weak<Membership>, mut shutdown: Shutdown) {
    let mut tick = super::ticker(LOOK_EVERY);
    // When this node (as the metadata group's leader) first saw each removed member.
    let mut removed_at: BTreeMap<NodeId, tokio::time::Instant> = BTreeMap::new();
    while super::next_tick(&mut tick, &mut shutdown).await {
        let Some(c) = weak.upgrade() else { return };
        if c.groups.is_removed() {
            continue;
        }
        let m = c.groups.metadata();
        if c.groups.leads(c.groups.meta_group()) {
            if !m.is_bootstrapped() {
                if !c.joined {
                    let op = MetaOp::Bootstrap {
                        nodes: c.groups.spec.nodes.clone(),
                        groups: c.groups.spec.groups,
                        replicas: c.groups.spec.replicas as u32,
                    };
                    if let Err(e) = c.propose_meta(op).await {
                        tracing::debug!("bootstrap: {e}");
                    }
                }
                continue;
            }
            if let Err(e) = steer_members(&c, &m, &mut removed_at).await {
                tracing::debug!("membership: {e}");
            }
        }
        if !m.is_bootstrapped() {
            continue;
        }
        let placement = m.placement();
        for g in 0..c.groups.spec.groups {
            if c.groups.leads(g) {
                let desired = placement.get(g as usize).cloned().unwrap_or_default();
                converge(&c, &m, g, desired).await;
            }
        }
    }
}

/// Why one step of a membership change did not happen; the loops log it and try again at
/// their next look.
#[derive(Debug)]
enum StepError {
    /// This node holds no replica of the group (any more).
    NoReplica,
    /// This node holds no replica of the metadata group.
    NoMetaReplica,
    /// The group's Raft refused the change, in openraft's words.
    Raft(String),
    /// The change could not be reported to the metadata group.
    Meta(ProposeError),
    /// The leadership could not be handed over first.
    Transfer(TransferError),
    /// The node a replica moves to is not in the metadata.
    UnknownNode(NodeId),
    /// The new replica did not catch up within `CATCH_UP`.
    CatchUp(NodeId),
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepError::NoReplica => f.write_str("no replica here"),
            StepError::NoMetaReplica => f.write_str("no metadata replica"),
            StepError::Raft(e) => f.write_str(e),
            StepError::Meta(e) => e.fmt(f),
            StepError::Transfer(e) => e.fmt(f),
            StepError::UnknownNode(n) => write!(f, "node {n} is unknown"),
            StepError::CatchUp(n) => write!(f, "node {n} did not catch up in time"),
        }
    }
}

/// openraft's error, in its words.
fn raft_error(e: impl std::fmt::Display) -> StepError {
    StepError::Raft(e.to_string())
}

/// On the metadata group's leader: lets one joining node in, or one drained node out.
async fn steer_members(
    c: &Arc<Membership>,
    m: &MetaState,
    removed_at: &mut BTreeMap<NodeId, tokio::time::Instant>,
) -> Result<(), StepError> {
    let g = c.groups.meta_group();
    let raft = c.groups.raft(g).ok_or(StepError::NoMetaReplica)?;
    let (voters, learners, joint) = membership_of(&raft);
    if joint {
        c.groups.wake_for_write(g, &raft).await;
        return finish_joint(&raft).await;
    }
    for member in m.members.values() {
        let id = member.node.id;
        match member.state {
            MemberState::Joining => {
                if !learners.contains(&id) && !voters.contains(&id) {
                    c.groups.wake_for_write(g, &raft).await;
                    let node = BasicNode::new(member.node.peer_addr());
                    // Not waited for: a node that never comes must not hold up the others.
                    if let Err(e) = raft.add_learner(id, node, false).await {
                        tracing::info!(node = id, "could not add a joining node: {e}");
                    }
                    continue;
                }
                // Made a voter (and given replicas) only once it caught up on the metadata, so
                // that a node that joined and died holds up nothing.
                if !voters.contains(&id) {
                    if !caught_up(&raft, id) {
                        continue;
                    }
                    c.groups.wake_for_write(g, &raft).await;
                    raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
                        .await
                        .map_err(raft_error)?;
                }
                c.propose_meta(MetaOp::Activate(id))
                    .await
                    .map_err(StepError::Meta)?;
                tracing::info!(node = id, "a node joined the cluster");
                return Ok(());
            }
            MemberState::Draining if m.replicas_on(id) == 0 => {
                if id == c.groups.me {
                    // Someone else lets this node out.
                    if let Some(&to) = voters.iter().find(|&&v| v != id && c.groups.is_up(v)) {
                        c.groups
                            .transfer_leader(g, to)
                            .await
                            .map_err(StepError::Transfer)?;
                    }
                    return Ok(());
                }
                // Said first, while the node still follows the metadata, so that it learns it
                // is out.
                c.propose_meta(MetaOp::Remove(id))
                    .await
                    .map_err(StepError::Meta)?;
                tracing::info!(node = id, "a node left the cluster");
                return Ok(());
            }
            MemberState::Removed if voters.contains(&id) || learners.contains(&id) => {
                // A removed node that is up learns it is out from the metadata, which it
                // follows only while it is a member: give it a moment to hear the commit.
                let seen = *removed_at
                    .entry(id)
                    .or_insert_with(tokio::time::Instant::now);
                if c.groups.is_up(id) && seen.elapsed() < REMOVED_HEARS {
                    continue;
                }
                c.groups.wake_for_write(g, &raft).await;
                raft.change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
                    .await
                    .map_err(raft_error)?;
                if learners.contains(&id) {
                    raft.change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
                        .await
                        .map_err(raft_error)?;
                }
                return Ok(());
            }
            _ => {}
        }
    }
    Ok(())
}

/// A membership change whose leader changed between its two steps leaves the group in a
/// joint configuration: the new leader finishes it, with the configuration it was going to.
async fn finish_joint(raft: &GroupRaft) -> Result<(), StepError> {
    let last: Option<BTreeSet<NodeId>> = {
        let m = raft.metrics();
        let m = m.borrow_watched();
        m.membership_config
            .membership()
            .get_joint_config()
            .last()
            .cloned()
    };
    let Some(last) = last else { return Ok(()) };
    raft.change_membership(ChangeMembers::ReplaceAllVoters(last), false)
        .await
        .map(|_| ())
        .map_err(raft_error)
}

/// (voters, learners, whether a joint configuration is in force) of a replica's membership.
fn membership_of(raft: &GroupRaft) -> (Vec<NodeId>, Vec<NodeId>, bool) {
    let m = raft.metrics();
    let m = m.borrow_watched();
    let mem = m.membership_config.membership();
    (
        mem.voter_ids().collect(),
        mem.learner_ids().collect(),
        mem.get_joint_config().len() > 1,
    )
}

/// On the leader of `g`: reports the group's voters if the metadata has them wrong, and
/// starts moving a replica if one is not where it belongs.
async fn converge(c: &Arc<Membership>, m: &MetaState, g: GroupId, mut desired: Vec<NodeId>) {
    let Some(raft) = c.groups.raft(g) else { return };
    let (mut voters, learners, joint) = membership_of(&raft);
    if joint {
        if c.start_move(g) {
            let c2 = c.clone();
            c.groups.runtime_of(g).spawn(async move {
                c2.groups.wake_for_write(g, &raft).await;
                if let Err(e) = finish_joint(&raft).await {
                    tracing::info!(group = g, "a membership change is not finished yet: {e}");
                }
                c2.end_move(g);
            });
        }
        return;
    }
    if voters.is_empty() {
        return;
    }
    voters.sort_unstable();
    let mut reported = m.voters.get(g as usize).cloned().unwrap_or_default();
    reported.sort_unstable();
    if reported != voters {
        let _ = c
            .propose_meta(MetaOp::Voters {
                group: g,
                voters: voters.clone(),
            })
            .await;
        return;
    }
    desired.sort_unstable();
    if desired.is_empty() {
        return;
    }
    if desired == voters {
        let strays: BTreeSet<NodeId> = learners
            .into_iter()
            .filter(|l| !desired.contains(l))
            .collect();
        if !strays.is_empty() {
            c.groups.wake_for_write(g, &raft).await;
            let _ = raft
                .change_membership(ChangeMembers::RemoveNodes(strays), false)
                .await;
        }
        return;
    }
    if !c.start_move(g) {
        return;
    }
    let c2 = c.clone();
    c.groups.runtime_of(g).spawn(async move {
        match move_one(&c2, g, &voters, &desired).await {
            Ok(()) => {}
            Err(e) => tracing::info!(group = g, "replica move not done yet: {e}"),
        }
        c2.end_move(g);
    });
}

/// One step towards `desired`: one replica in, one out.
async fn move_one(
    c: &Arc<Membership>,
    g: GroupId,
    voters: &[NodeId],
    desired: &[NodeId],
) -> Result<(), StepError> {
    let raft = c.groups.raft(g).ok_or(StepError::NoReplica)?;
    let incoming: Vec<NodeId> = desired
        .iter()
        .copied()
        .filter(|n| !voters.contains(n))
        .collect();
    let outgoing: Vec<NodeId> = voters
        .iter()
        .copied()
        .filter(|n| !desired.contains(n))
        .collect();
    // Hand the leadership to a replica that stays; it goes on with the move.
    if outgoing.contains(&c.groups.me)
        && let Some(&to) = voters
            .iter()
            .find(|&&v| v != c.groups.me && desired.contains(&v) && c.groups.is_up(v))
    {
        c.groups
            .transfer_leader(g, to)
            .await
            .map_err(StepError::Transfer)?;
        return Ok(());
    }
    c.groups.wake_for_write(g, &raft).await;
    let mut next: BTreeSet<NodeId> = voters.iter().copied().collect();
    if let Some(&n) = incoming.first() {
        let node = c.groups.node(n).ok_or(StepError::UnknownNode(n))?;
        tokio::time::timeout(
            CATCH_UP,
            raft.add_learner(n, BasicNode::new(node.peer_addr()), true),
        )
        .await
        .map_err(|_| StepError::CatchUp(n))?
        .map_err(raft_error)?;
        next.insert(n);
    }
    // The leader leaves last. With replicas that stay but none in reach it takes itself out,
    // and they elect a leader among themselves: a leader that cannot hear them is better gone
    // than kept. A group with no replica that stays (a group of one) first gains the incoming
    // replica as a voter beside its leader, which hands over to it at the next look: taking
    // the only voter out would leave the group leaderless until an election timeout.
    let others_stay = voters
        .iter()
        .any(|&v| v != c.groups.me && desired.contains(&v));
    if let Some(&out) = outgoing
        .iter()
        .find(|&&o| o != c.groups.me)
        .or(outgoing.first().filter(|_| others_stay))
    {
        next.remove(&out);
    }
    if next.iter().copied().collect::<Vec<_>>() == voters {
        return Ok(());
    }
    raft.change_membership(ChangeMembers::ReplaceAllVoters(next.clone()), false)
        .await
        .map_err(raft_error)?;
    tracing::info!(group = g, voters = ?next, "moved a replica");
    c.propose_meta(MetaOp::Voters {
        group: g,
        voters: next.into_iter().collect(),
    })
    .await
    .map_err(StepError::Meta)?;
    Ok(())
}

impl Membership {
    pub(crate) fn new(
        replicas: Arc<ReplicaSet>,
        writes: Arc<Writes>,
        data_dir: PathBuf,
        joined: bool,
    ) -> Membership {
        Membership {
            groups: writes.groups().clone(),
            writes,
            replicas,
            moving: std::sync::Mutex::new(std::collections::HashSet::new()),
            data_dir,
            joined,
        }
    }

    /// Starts following the metadata (see the module comment).
    pub(crate) fn spawn(self: &Arc<Self>, shutdown: Shutdown) {
        let h = self.groups.event_loop();
        h.spawn(follow(Arc::downgrade(self), shutdown.clone()));
        h.spawn(drive(Arc::downgrade(self), shutdown));
    }

    /// Runs a change through the metadata group: on this node if it leads the group,
    /// otherwise on its leader. The reply is the change's.
    pub(crate) async fn propose_meta(&self, op: MetaOp) -> Result<Reply, ProposeError> {
        let cmd = op
            .to_cmd()
            .map_err(|e| ProposeError::TryAgain(TryAgain::Encode(e.to_string())))?;
        let g = self.groups.meta_group();
        // Longer than a client's write waits: an operator's change should ride out the
        // election that follows the loss of the metadata group's leader.
        // A leader that has just stopped can still look up here for a moment: a change whose
        // connection to it would not open was never sent, and is sent again.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        loop {
            if let Some(leader) = self.groups.settled_leader(g).await {
                match self
                    .writes
                    .send_to_leader(g, leader, None, vec![cmd.clone()])
                    .await
                {
                    Ok(replies) => {
                        return replies
                            .unwrap_or_default()
                            .pop()
                            .ok_or(ProposeError::TryAgain(TryAgain::NoReply));
                    }
                    // Never sent: it goes to the leader the group settles on next.
                    Err(ProposeError::TryAgain(TryAgain::NotSent(_)))
                        if tokio::time::Instant::now() < deadline => {}
                    Err(e) => return Err(e),
                }
            } else if tokio::time::Instant::now() >= deadline {
                return Err(ProposeError::ClusterDown);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A node asks to join (`BK.CLUSTER JOIN`): its peer port must answer from here, then it
    /// gets a fresh id.
    pub(crate) async fn admit(
        &self,
        host: &str,
        port: u16,
        peer_port: u16,
    ) -> Result<NodeId, MemberChangeError> {
        let addr = format!("{host}:{peer_port}");
        match tokio::time::timeout(
            Duration::from_secs(2),
            tokio::net::TcpStream::connect(&addr),
        )
        .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(MemberChangeError::PeerUnreachable {
                    addr,
                    error: Some(e),
                });
            }
            Err(_) => return Err(MemberChangeError::PeerUnreachable { addr, error: None }),
        }
        // A cluster just created writes its first metadata a moment after it elects.
        if !self
            .await_meta(|m| m.is_bootstrapped(), Duration::from_secs(10))
            .await
        {
            return Err(MemberChangeError::NotFormed);
        }
        let op = MetaOp::Join {
            host: host.to_string(),
            port,
            peer_port,
        };
        match self.propose_meta(op).await {
            Ok(Reply::Int(id)) => u64::try_from(id).map_err(|_| MemberChangeError::BadId),
            Ok(Reply::Error(e)) => Err(MemberChangeError::Refused(e.into_owned())),
            Ok(_) => Err(MemberChangeError::UnexpectedReply),
            Err(e) => Err(MemberChangeError::NotApplied(
                self.writes.error_reply(0, &e),
            )),
        }
    }

    /// Waits (at most `limit`) until this node's copy of the metadata satisfies `done`.
    pub(crate) async fn await_meta(
        &self,
        done: impl Fn(&MetaState) -> bool,
        limit: Duration,
    ) -> bool {
        let mut rx = self.groups.meta.watch();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if done(&self.groups.metadata()) {
                return true;
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return done(&self.groups.metadata());
            }
        }
    }

    /// `BK.CLUSTER REMOVE`: starts draining node `id`.
    pub(crate) async fn remove_node(&self, id: NodeId) -> Result<(), MemberChangeError> {
        match self.propose_meta(MetaOp::Drain(id)).await {
            Ok(Reply::Error(e)) => Err(MemberChangeError::Refused(e.into_owned())),
            Ok(_) => Ok(()),
            Err(e) => Err(MemberChangeError::NotApplied(
                self.writes.error_reply(0, &e),
            )),
        }
    }

    /// Starts a move of `g`'s replicas unless one runs already or this node runs its most.
    fn start_move(&self, g: GroupId) -> bool {
        let mut moving = crate::sync::lock(&self.moving);
        if moving.contains(&g) || moving.len() >= MOVES_AT_ONCE {
            return false;
        }
        moving.insert(g);
        true
    }

    fn end_move(&self, g: GroupId) {
        let mut moving = crate::sync::lock(&self.moving);
        moving.remove(&g);
    }
}
