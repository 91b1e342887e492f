//! A node's part of the cluster: the Raft groups it holds a replica of, who leads each group,
//! and proposing clients' commands to a group. `Cluster` is the face the rest of the node
//! sees; the work is done by its parts, which share `Groups` (what this node knows of every
//! group):
//!
//! - `writes`: proposing or forwarding a shard's gathered batch, and waiting for its fate;
//! - `replicas`: opening and closing this node's replicas, following their leadership;
//! - `membership`: nodes joining and leaving, replicas moving where the metadata says;
//! - `balance`: evening out the leaderships;
//! - `peer`: answering peers' requests, and this node's pings;
//! - `bootstrap`: bringing all of it up.
//!
//! Each group's Raft runs on the event loop of the shard that owns the group's keys (group g
//! on shard g % shards): that shard gathers the group's proposals, its Raft core appends and
//! replicates them, and committed entries are applied on it (`ShardExecutor`), all without
//! waking another thread. The shard's loop yields between client rounds, so heartbeats and
//! elections keep their pace while it serves clients. The log's disk writes run on the log's
//! own writer thread.

use crate::clock::Clock;
use crate::cluster::balance::Balancer;
use crate::cluster::bootstrap::{self, Host};
pub(crate) use crate::cluster::errors::{MemberChangeError, ProposeError, TransferError};
use crate::cluster::executor::{GroupExecutor, GroupRaft};
pub(crate) use crate::cluster::groups::GroupMetrics;
use crate::cluster::groups::Groups;
use crate::cluster::membership::Membership;
use crate::cluster::meta::{MetaOp, MetaState, RulesHook};
use crate::cluster::replicas::ReplicaSet;
pub use crate::cluster::settings::ClusterSettings;
use crate::cluster::spec::{ClusterSpec, NodeSpec};
use crate::cluster::transport::{Faults, Network, Rpc, RpcOk, ScriptsChange};
use crate::cluster::typ::{GroupId, NodeId, Origin};
use crate::cluster::writes::Writes;
use crate::cmd::{KeyCmd, Reply};
use crate::error::StartError;
use crate::shutdown::Shutdown;
use std::sync::Arc;
use std::time::Duration;

/// How long a member may take to make a script cache change another member shares.
const SCRIPTS_WAIT: Duration = Duration::from_secs(1);

pub struct Cluster {
    pub me: NodeId,
    /// What the node was started with: the group count and replicas are the cluster's for
    /// its whole life; the members are only the first ones (see `nodes`).
    pub spec: ClusterSpec,
    groups: Arc<Groups>,
    writes: Arc<Writes>,
    replicas: Arc<ReplicaSet>,
    membership: Arc<Membership>,
    balancer: Arc<Balancer>,
}

impl Cluster {
    /// Opens (or creates) this node's replicas and joins the cluster. A group's replicas
    /// initialise it the first time; a restart finds the group in its log and does not.
    ///
    /// `shards[s]` applies the entries of the groups `g` with `g % shards.len() == s`, on the
    /// event loop `runtimes[s]`.
    pub async fn start<S: GroupExecutor + Clone>(
        settings: ClusterSettings,
        shards: &[S],
        runtimes: &[tokio::runtime::Handle],
        clock: Arc<dyn Clock>,
        rules: Option<RulesHook>,
        shutdown: Shutdown,
    ) -> Result<Arc<Cluster>, StartError> {
        let host = Host {
            shards,
            runtimes,
            clock,
            rules,
        };
        let (parts, listener) = bootstrap::build(&settings, host, &shutdown).await?;
        let held = bootstrap::open_replicas(&parts, &settings).await?;
        if !settings.joined {
            bootstrap::initialize_groups(&parts.groups, &settings).await;
        }
        bootstrap::spawn_tasks(&parts, listener, settings.scripts.clone(), shutdown);
        tracing::info!(
            node = settings.node_id,
            groups = held.len(),
            joined = settings.joined,
            "joined the cluster"
        );
        Ok(Arc::new(Cluster {
            me: settings.node_id,
            spec: settings.spec.clone(),
            groups: parts.groups,
            writes: parts.writes,
            replicas: parts.replicas,
            membership: parts.membership,
            balancer: parts.balancer,
        }))
    }

    /// The metadata group's id: one past the last data group.
    pub fn meta_group(&self) -> GroupId {
        self.groups.meta_group()
    }

    /// The members of the cluster now (removed ones left out): from the metadata once the
    /// cluster is formed, the start-up description before.
    pub fn nodes(&self) -> Vec<NodeSpec> {
        self.groups.nodes()
    }

    /// A member's addresses.
    pub fn node(&self, id: NodeId) -> Option<NodeSpec> {
        self.groups.node(id)
    }

    /// The metadata as applied here.
    pub fn metadata(&self) -> Arc<MetaState> {
        self.groups.metadata()
    }

    /// Group `g`'s voters: as this node's replica sees them, or as the metadata says for a
    /// group this node holds no replica of.
    pub fn voters(&self, g: GroupId) -> Vec<NodeId> {
        self.groups.voters(g)
    }

    /// Whether the cluster removed this node.
    pub fn is_removed(&self) -> bool {
        self.groups.is_removed()
    }

    pub fn group_of_slot(&self, slot: u16) -> GroupId {
        self.groups.group_of_slot(slot)
    }

    /// The group's leader as last seen, if any (see `Groups::leader`).
    pub fn leader(&self, g: GroupId) -> Option<NodeId> {
        self.groups.leader(g)
    }

    /// Whether this node leads `g` and may serve it (see `Groups::leads`).
    pub fn leads(&self, g: GroupId) -> bool {
        self.groups.leads(g)
    }

    /// The leader of `g` as far as this node can tell it is serving: itself only within its
    /// lease, another node only while that node is heard from.
    pub fn serving_leader(&self, g: GroupId) -> Option<NodeId> {
        self.groups.serving_leader(g)
    }

    /// Waits a little for `g` to have a serving leader (see `Groups::settled_leader`).
    pub(crate) async fn settled_leader(&self, g: GroupId) -> Option<NodeId> {
        self.groups.settled_leader(g).await
    }

    /// Whether node `id` is this node, or was heard from recently.
    pub fn is_up(&self, id: NodeId) -> bool {
        self.groups.is_up(id)
    }

    /// Turns the evening out of leaderships on or off (for maintenance, or while moving
    /// leaderships by hand).
    pub fn set_balancing(&self, on: bool) {
        self.balancer.set(on);
    }

    /// Makes a client's change to the script cache on every other member that is up, and
    /// waits (at most `SCRIPTS_WAIT` each, all at once) until they made it: a client that
    /// loaded a script through this node then finds it on whichever node leads its keys. A
    /// member that is down or does not answer in time misses it, and its clients get
    /// `NOSCRIPT` and load the script again, as after a Redis failover.
    pub(crate) async fn share_scripts(&self, change: ScriptsChange) {
        let mut calls = tokio::task::JoinSet::new();
        for n in self.groups.nodes() {
            if n.id == self.me || !self.groups.is_up(n.id) {
                continue;
            }
            let net = self.groups.net.clone();
            let rpc = Rpc::Scripts(change.clone());
            calls.spawn(async move { (n.id, net.call(n.id, 0, rpc, SCRIPTS_WAIT).await) });
        }
        while let Some(done) = calls.join_next().await {
            match done {
                Ok((_, Ok(RpcOk::Scripts))) => {}
                Ok((peer, Ok(_))) => tracing::warn!(peer, "unexpected answer to a script change"),
                Ok((peer, Err(e))) => tracing::warn!(peer, "script change not shared: {e}"),
                Err(e) => tracing::warn!("script change not shared: {e}"),
            }
        }
    }

    /// What the Raft log's entries held in memory weigh over all groups (their records' size
    /// on disk), and the bound on it (`ClusterSettings::log_memory`).
    pub fn log_memory(&self) -> (u64, u64) {
        self.replicas.log_memory()
    }

    /// (log entries, commands in them) that this node's shards gathered and proposed: how
    /// well the shards batch.
    pub fn proposals(&self) -> (u64, u64) {
        self.writes.proposals()
    }

    /// Per group this node holds a replica of, what the metrics show of it.
    pub fn group_metrics(&self) -> Vec<GroupMetrics> {
        self.groups.group_metrics(|g| self.writes.proposals_of(g))
    }

    pub fn faults(&self) -> &Arc<Faults> {
        self.groups.net.faults()
    }

    pub fn network(&self) -> &Network {
        &self.groups.net
    }

    /// `g`'s replica on this node. Hand its leadership over with `transfer_leader`, not
    /// through the Raft handle, so that a quiet group is woken first.
    pub fn raft(&self, g: GroupId) -> Option<Arc<GroupRaft>> {
        self.groups.raft(g)
    }

    /// How many groups this node leads quietly (idle, not heartbeating) now.
    pub fn quiet_groups(&self) -> usize {
        self.groups.quiet().quiet_led()
    }

    /// Whether this node leads `g` quietly now.
    pub fn is_quiet(&self, g: GroupId) -> bool {
        self.groups.quiet().is_quiet_led(g)
    }

    /// How many times a group led here was woken from quiet (by a write, a leadership
    /// transfer, or a follower that did not promise).
    pub fn quiet_wakes(&self) -> u64 {
        self.groups.quiet().wakes()
    }

    /// How many groups this node follows with its election timer off (their leader is quiet).
    pub fn silenced_groups(&self) -> usize {
        self.groups.quiet().silenced()
    }

    /// Hands the leadership of `g`, which this node leads, to replica `to`; a quiet group is
    /// woken and stops serving on its followers' promises first.
    pub async fn transfer_leader(&self, g: GroupId, to: NodeId) -> Result<(), TransferError> {
        self.groups.transfer_leader(g, to).await
    }

    /// Commits an empty entry to `g`, which this node leads: its stamp moves the group's time
    /// on, and with it the expiry of the group's keys on every replica.
    pub async fn move_time_on(&self, g: GroupId) -> Result<(), ProposeError> {
        self.writes.propose_local(g, Vec::new()).await.map(|_| ())
    }

    /// Runs a shard's gathered batch through group `g` (see `Writes::replicate`).
    pub async fn replicate(
        &self,
        g: GroupId,
        origin: Origin,
        cmds: Vec<KeyCmd>,
    ) -> Result<Option<Vec<Reply>>, ProposeError> {
        self.writes.replicate(g, origin, cmds).await
    }

    /// Runs `cmds` through group `g` on `target`, its leader as far as this node knows (see
    /// `Writes::send_to_leader`).
    pub(crate) async fn send_to_leader(
        &self,
        g: GroupId,
        target: NodeId,
        origin: Option<Origin>,
        cmds: Vec<KeyCmd>,
    ) -> Result<Option<Vec<Reply>>, ProposeError> {
        self.writes.send_to_leader(g, target, origin, cmds).await
    }

    /// The error reply a Redis Cluster client acts on, for a command on `slot` that group
    /// could not take.
    pub fn error_reply(&self, slot: u16, e: &ProposeError) -> String {
        self.writes.error_reply(slot, e)
    }

    /// Runs a change through the metadata group: on this node if it leads the group,
    /// otherwise on its leader. The reply is the change's.
    pub async fn propose_meta(&self, op: MetaOp) -> Result<Reply, ProposeError> {
        self.membership.propose_meta(op).await
    }

    /// A node asks to join (`BK.CLUSTER JOIN`): its peer port must answer from here, then it
    /// gets a fresh id.
    pub async fn admit(
        &self,
        host: &str,
        port: u16,
        peer_port: u16,
    ) -> Result<NodeId, MemberChangeError> {
        self.membership.admit(host, port, peer_port).await
    }

    /// Waits (at most `limit`) until this node's copy of the metadata satisfies `done`.
    pub async fn await_meta(&self, done: impl Fn(&MetaState) -> bool, limit: Duration) -> bool {
        self.membership.await_meta(done, limit).await
    }

    /// `BK.CLUSTER REMOVE`: starts draining node `id`.
    pub async fn remove_node(&self, id: NodeId) -> Result<(), MemberChangeError> {
        self.membership.remove_node(id).await
    }

    /// Stops every group. Their tasks run on the shards' event loops, which end after this.
    pub async fn shutdown(&self) {
        let rafts = self.groups.all_rafts();
        let done = self.groups.event_loop().spawn(async move {
            for r in rafts {
                let _ = r.shutdown().await;
            }
        });
        let _ = done.await;
    }
}
