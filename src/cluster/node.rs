//! A node's part of the cluster: the Raft groups it holds a replica of, who leads each group,
//! and proposing clients' commands to a group.
//!
//! Each group's Raft runs on the event loop of the shard that owns the group's keys (group g
//! on shard g % shards): that shard gathers the group's proposals, its Raft core appends and
//! replicates them, and committed entries are applied on it (`ShardExecutor`), all without
//! waking another thread. The shard's loop yields between client rounds, so heartbeats and
//! elections keep their pace while it serves clients. The log's disk writes run on the log's
//! own writer thread.

use crate::clock::Clock;
use crate::cluster::errors::TryAgain;
pub(crate) use crate::cluster::errors::{ProposeError, TransferError};
use crate::cluster::executor::{GroupApplier, GroupExecutor, ShardExecutor, SharedExecutor};
use crate::cluster::group_net::GroupNet;
use crate::cluster::log_store::NodeLog;
use crate::cluster::meta::{MetaState, MetaStore, RulesHook};
use crate::cluster::quiet::{self, Quiet, QuietPinger, QuietTimings};
use crate::cluster::spec::{ClusterSpec, NodeSpec};
use crate::cluster::state_machine::GroupStateMachine;
use crate::cluster::transport::{
    self, CallError, Faults, GroupSnapshotWire, Handler, Network, PeerError, Rpc, RpcOk,
    ScriptsChange,
};
use crate::cluster::typ::{Applied, GroupId, NodeId, Origin, Proposal, TypeConfig};
use crate::cmd::keyed::{KeyCmd, Reply};
use crate::cmd::script::{MAX_SCRIPT_BYTES, ScriptCache, sha1_hex};
use crate::error::StartError;
use crate::shutdown::Shutdown;
use arc_swap::{ArcSwap, ArcSwapOption};
use openraft::Instant as _;
use openraft::error::ClientWriteError;
use openraft::impls::BasicNode;
use openraft::network::RaftNetworkFactory;
use openraft::type_config::async_runtime::WatchReceiver;
use openraft_multi::{GroupNetworkAdapter, GroupNetworkFactory};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// How long a member may take to make a script cache change another member shares.
const SCRIPTS_WAIT: Duration = Duration::from_secs(1);

/// How one node joins a cluster.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    pub node_id: NodeId,
    pub spec: ClusterSpec,
    /// The node's Raft log lives here in `raft-log/`, and each group's snapshots in a folder
    /// of its own.
    pub data_dir: PathBuf,
    /// Serve clients that are not cluster-aware: forward commands to the group's leader
    /// instead of answering `-MOVED`.
    pub forward: bool,
    /// fsync the Raft log before acknowledging (survives power loss, not only process loss).
    pub fsync: bool,
    pub heartbeat_ms: u64,
    pub election_timeout_ms: (u64, u64),
    /// How long a write may wait for its group to commit before the client gets `-TRYAGAIN`.
    pub write_timeout: Duration,
    /// Even out the leaderships over the nodes that are up (on unless something else moves
    /// leaderships deliberately).
    pub balance_leaders: bool,
    /// Quiet a group this node leads once it has had no write for this long: it stops
    /// heartbeating until the next write (see `quiet`). `None`: groups always heartbeat.
    pub quiet_after: Option<Duration>,
    /// This node joined a running cluster (its id came from the cluster): it initialises no
    /// group; the cluster adds it to the metadata group and moves replicas to it.
    pub joined: bool,
    /// Join the cluster through this member's client address: the node's id and the members
    /// are not known until it starts.
    pub join: Option<String>,
    /// How peer connections authenticate (a cluster secret, mutual TLS, or neither).
    pub security: transport::PeerSecurity,
    /// The node's script cache, which SCRIPT LOAD and SCRIPT FLUSH on any member change.
    pub(crate) scripts: Arc<ScriptCache>,
    /// What the Raft log's entries held in memory may weigh over all the node's groups (the
    /// size of their records on disk). A group past its share (this over the number of
    /// groups) snapshots and drops the entries its snapshot covers, without waiting for
    /// openraft's count of entries.
    pub log_memory: u64,
}

/// See `ClusterSettings::log_memory`. An entry in memory takes about two to three times its
/// record's size.
pub(crate) const DEFAULT_LOG_MEMORY: u64 = 256 << 20;

/// How long a group past its share of the log's memory waits for the snapshot or the purge it
/// asked for before it gives the step up (and asks again if still past its share).
const TRIM_RETRY: Duration = Duration::from_secs(5);

/// What a group does next to keep its log within its share of memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trim {
    Nothing,
    /// Take a snapshot now.
    Snapshot,
    /// The snapshot asked for is made: drop the entries up to this index, which it covers.
    Purge(u64),
}

/// Where a group is in trimming its log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trimming {
    Idle,
    /// A snapshot was asked for at `since`, when the latest one ended at `before`.
    Snapshot {
        since: tokio::time::Instant,
        before: Option<u64>,
    },
    /// Entries up to `upto` were asked to go at `since` (a leader may put it off while a
    /// replication still reads them).
    Purge {
        since: tokio::time::Instant,
        upto: u64,
    },
}

/// Who leads a group as far as this node's own replica of it can tell: Raft names the
/// leader of the last vote the replica saw. A replica taken out of the group keeps that vote
/// (it hears no newer one), its own too if it led: then the replica says nothing (0), and the
/// pings of the group's leader say who it is. A member naming itself leads, or is a candidate
/// about to: it serves only with a lease, and until then requests wait for the election
/// rather than follow an older leader's claim (which would send them back here).
fn local_leader(
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

/// One step of trimming a group's log, given the group's latest snapshot and purge and
/// whether its entries weigh more than its share: ask for a snapshot, then for a purge of what
/// it covers once it is there (openraft on its own keeps a thousand entries after each
/// snapshot, whatever their size). A step that does not happen within `TRIM_RETRY` is given
/// up, and asked for again if the log is still over its share.
fn trim_step(
    state: &mut Trimming,
    snapshot: Option<u64>,
    purged: Option<u64>,
    over: impl FnOnce() -> bool,
) -> Trim {
    // Called on every change of the group's metrics: the clock is read only mid-step.
    let now = tokio::time::Instant::now;
    match *state {
        Trimming::Snapshot { before, .. }
            if let Some(upto) = snapshot.filter(|&i| Some(i) > before) =>
        {
            *state = Trimming::Purge { since: now(), upto };
            Trim::Purge(upto)
        }
        Trimming::Purge { upto, .. } if purged >= Some(upto) => {
            *state = Trimming::Idle;
            Trim::Nothing
        }
        Trimming::Snapshot { since, .. } | Trimming::Purge { since, .. }
            if now().duration_since(since) < TRIM_RETRY =>
        {
            Trim::Nothing
        }
        _ if over() => {
            *state = Trimming::Snapshot {
                since: now(),
                before: snapshot,
            };
            Trim::Snapshot
        }
        _ => {
            *state = Trimming::Idle;
            Trim::Nothing
        }
    }
}

impl ClusterSettings {
    pub fn new(node_id: NodeId, spec: ClusterSpec, data_dir: PathBuf) -> ClusterSettings {
        ClusterSettings {
            node_id,
            spec,
            data_dir,
            forward: false,
            fsync: false,
            // A follower asks for an election 300-400 ms after its leader went quiet and gets
            // votes once the others have not heard from the leader for 400 ms (openraft's
            // lease is the longest election timeout), while a leader stops serving 300 ms
            // after it sent what a majority last acknowledged: a leader cut off from its
            // majority stops claiming its groups before another can have been elected.
            // Heartbeats every 100 ms give three chances before that; more often would double
            // what idle groups cost (every group heartbeats on its own). The longest timeout
            // stays close to the shortest: a pre-vote cannot begin before the lease runs out,
            // so every millisecond more is a millisecond of failover.
            heartbeat_ms: 100,
            election_timeout_ms: (300, 400),
            write_timeout: Duration::from_millis(500),
            balance_leaders: true,
            // Long enough that a group in use does not go quiet between two bursts, short
            // enough that an idle cluster soon costs little.
            quiet_after: Some(Duration::from_secs(2)),
            joined: false,
            join: None,
            security: transport::PeerSecurity::default(),
            scripts: Arc::default(),
            log_memory: DEFAULT_LOG_MEMORY,
        }
    }
}

pub(crate) use crate::cluster::executor::GroupRaft;

/// Builds each group's network client: every group shares the node's one `Network`.
#[derive(Clone)]
pub(crate) struct NetFactory(GroupNetworkFactory<Network, GroupId>);

impl RaftNetworkFactory<TypeConfig> for NetFactory {
    type Network = GroupNet;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Self::Network {
        GroupNet(GroupNetworkAdapter::new(
            self.0.factory.clone(),
            target,
            self.0.group_id,
        ))
    }
}

pub struct Cluster {
    pub me: NodeId,
    /// What the node was started with: the group count and replicas are the cluster's for
    /// its whole life; the members are only the first ones (see `nodes`).
    pub spec: ClusterSpec,
    /// Per group (the metadata group last, at index `spec.groups`), this node's replica.
    groups: Vec<ArcSwapOption<GroupRaft>>,
    /// Per group, its voters as this node's replica last saw them.
    voters: Vec<ArcSwap<Vec<NodeId>>>,
    leaders: Arc<Vec<AtomicU64>>,
    /// Per group, while this node leads it: when a majority last acknowledged it, in ms since
    /// `born` (0: not yet).
    quorum_acked: Arc<Vec<AtomicU64>>,
    born: tokio::time::Instant,
    /// A leader serves only while a majority acknowledged it this recently.
    lease: Duration,
    /// A peer not heard from for this long counts as failed.
    fail_after: Duration,
    /// Whether this node evens out leaderships (it hands its surplus over).
    balancing: std::sync::atomic::AtomicBool,
    net: Network,
    clock: Arc<dyn Clock>,
    forward: bool,
    write_timeout: Duration,
    /// The event loop of the node's first shard, where the peer listener and the balancer
    /// run.
    handle: tokio::runtime::Handle,
    /// Log entries the shards gathered and proposed here, and the commands they carried.
    entries_proposed: AtomicU64,
    commands_proposed: AtomicU64,
    /// Per group: entries proposed through this node, and leader changes its replica saw.
    group_proposals: Vec<AtomicU64>,
    /// Per group: the writes proposed through this node that wait for their fate, and
    /// whether its replica is being moved away (see `drop_replica`).
    write_gates: Vec<WriteGate>,
    leader_changes: Arc<Vec<AtomicU64>>,
    /// Which groups are quiet, and their leases.
    quiet: Quiet,
    /// The cluster's metadata as applied here.
    pub(crate) meta: Arc<MetaStore>,
    /// What opening a replica needs: the node's log, the Raft settings, where snapshots go,
    /// and the shards (with their event loops) that own the groups' keys.
    node_log: NodeLog,
    /// What the entries of all groups, and of one group, may weigh in memory (see
    /// `ClusterSettings::log_memory`).
    log_limit: u64,
    log_share: u64,
    raft_config: Arc<openraft::Config>,
    data_dir: PathBuf,
    shards: Vec<SharedExecutor>,
    runtimes: Vec<tokio::runtime::Handle>,
    /// Set once the cluster removed this node: it serves nothing from then on.
    removed: std::sync::atomic::AtomicBool,
    /// The groups whose replicas this node moves now (as their leader).
    pub(crate) moving: std::sync::Mutex<std::collections::HashSet<GroupId>>,
    /// Per group this node holds no replica of: the leader its pings name (node, term, when
    /// heard in ms since `born`).
    remote_leaders: std::sync::Mutex<Vec<(NodeId, u64, u64)>>,
    joined: bool,
    scripts: Arc<ScriptCache>,
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
        settings.spec.validate().map_err(StartError::Spec)?;
        let me = settings.node_id;
        let my_spec = settings
            .spec
            .node(me)
            .cloned()
            .ok_or(StartError::NotInCluster(me))?;
        let handle = runtimes.first().cloned().ok_or(StartError::NoShards)?;
        if shards.is_empty() {
            return Err(StartError::NoShards);
        }
        let faults = Arc::new(Faults::default());
        let peers: Vec<(NodeId, String)> = settings
            .spec
            .nodes
            .iter()
            .map(|n| (n.id, n.peer_addr()))
            .collect();
        let net = Network::new(
            me,
            &peers,
            faults.clone(),
            shutdown.clone(),
            settings.security.clone(),
        );
        let all = settings.spec.groups as usize + 1;
        let leaders: Arc<Vec<AtomicU64>> = Arc::new((0..all).map(|_| AtomicU64::new(0)).collect());
        let quorum_acked: Arc<Vec<AtomicU64>> =
            Arc::new((0..all).map(|_| AtomicU64::new(0)).collect());
        let born = tokio::time::Instant::now();

        let listener = {
            let addr = format!("{}:{}", bind_host(&my_spec.host), my_spec.peer_port);
            let l = match std::net::TcpListener::bind(&addr) {
                Ok(l) => l,
                Err(error) => return Err(StartError::ListenPeers { addr, error }),
            };
            l.set_nonblocking(true).map_err(StartError::Socket)?;
            l
        };

        let config = openraft::Config {
            cluster_name: "bucketd".into(),
            heartbeat_interval: settings.heartbeat_ms,
            election_timeout_min: settings.election_timeout_ms.0,
            election_timeout_max: settings.election_timeout_ms.1,
            // A replica that cannot win an election (cut off from its group, or one that comes
            // back to a group it left, with its old log) first asks whether it would win, and
            // raises its term only if a majority says so: otherwise its higher term, at its
            // first answer to the leader, would depose a leader the others still follow.
            enable_pre_vote: Some(true),
            ..Default::default()
        };
        let config = Arc::new(config.validate().map_err(StartError::RaftConfig)?);

        // A node that ran before may have made promises for quiet groups it no longer
        // remembers (see `quiet`).
        let restarted = settings.data_dir.exists();
        let data_dir = settings.data_dir.clone();
        let fsync = settings.fsync;
        let node_log = handle
            .spawn(async move {
                // One log for every group of the node, so one write (and fsync) carries them
                // all.
                NodeLog::open(Some(data_dir.join("raft-log")), fsync).map_err(StartError::Log)
            })
            .await
            .map_err(StartError::ClusterTask)??;

        let spec = settings.spec.clone();
        let meta_group = spec.groups;
        // A new cluster's first placement; a joining node learns its groups from the metadata.
        let first_voters = |g: GroupId| -> Vec<NodeId> {
            if settings.joined {
                Vec::new()
            } else if g == meta_group {
                spec.nodes.iter().map(|n| n.id).collect()
            } else {
                spec.placement(g)
            }
        };
        let quiet = Quiet::new(
            me,
            QuietTimings::new(
                settings.quiet_after,
                settings.heartbeat_ms,
                settings.election_timeout_ms.0,
            ),
            (0..=meta_group).map(first_voters).collect(),
            restarted,
        );
        let cluster = Arc::new(Cluster {
            me,
            spec: settings.spec.clone(),
            groups: (0..all).map(|_| ArcSwapOption::empty()).collect(),
            voters: (0..=meta_group)
                .map(|g| ArcSwap::from_pointee(first_voters(g)))
                .collect(),
            leaders,
            quorum_acked,
            born,
            lease: Duration::from_millis(settings.election_timeout_ms.0),
            fail_after: Duration::from_millis(settings.election_timeout_ms.1),
            balancing: std::sync::atomic::AtomicBool::new(settings.balance_leaders),
            net,
            clock,
            forward: settings.forward,
            write_timeout: settings.write_timeout,
            handle: handle.clone(),
            entries_proposed: AtomicU64::new(0),
            commands_proposed: AtomicU64::new(0),
            group_proposals: (0..all).map(|_| AtomicU64::new(0)).collect(),
            write_gates: (0..all).map(|_| WriteGate::default()).collect(),
            leader_changes: Arc::new((0..all).map(|_| AtomicU64::new(0)).collect()),
            quiet,
            meta: Arc::new(MetaStore::new(rules)),
            node_log,
            log_limit: settings.log_memory,
            log_share: settings.log_memory / (u64::from(meta_group) + 1),
            raft_config: config,
            data_dir: settings.data_dir.clone(),
            shards: shards
                .iter()
                .map(|s| Arc::new(s.clone()) as SharedExecutor)
                .collect(),
            runtimes: runtimes.to_vec(),
            removed: std::sync::atomic::AtomicBool::new(false),
            moving: std::sync::Mutex::new(std::collections::HashSet::new()),
            remote_leaders: std::sync::Mutex::new(vec![(0, 0, 0); all]),
            joined: settings.joined,
            scripts: settings.scripts.clone(),
        });

        // The metadata group first: it says which groups this node holds now (a restarted
        // node may hold others than it was created with).
        let meta_raft = cluster.open_replica(meta_group).await?;
        if restarted {
            // The metadata replays from the node's own log and snapshot.
            cluster
                .await_meta(MetaState::is_bootstrapped, Duration::from_secs(2))
                .await;
        }
        let known = cluster.meta.get();
        let placement = known.placement();
        let held: Vec<GroupId> = (0..meta_group)
            .filter(|&g| {
                if known.is_bootstrapped() {
                    known
                        .voters
                        .get(g as usize)
                        .is_some_and(|v| v.contains(&me))
                        || placement.get(g as usize).is_some_and(|v| v.contains(&me))
                } else {
                    first_voters(g).contains(&me)
                }
            })
            .collect();
        for &g in &held {
            cluster.open_replica(g).await?;
        }
        if !settings.joined {
            // Every replica proposes the same initial membership, so a group forms even if
            // some replicas start late; a restarted replica is already initialised and this
            // is refused harmlessly.
            for g in (0..meta_group).chain([meta_group]) {
                let Some(raft) = cluster.raft(g) else {
                    continue;
                };
                let placement = first_voters(g);
                if !placement.contains(&me) {
                    continue;
                }
                let members: BTreeMap<NodeId, BasicNode> = placement
                    .iter()
                    .filter_map(|id| spec.node(*id).map(|n| (*id, BasicNode::new(n.peer_addr()))))
                    .collect();
                let rt = cluster.runtime_of(g);
                let first = placement.first() == Some(&me);
                let done = rt.spawn(async move {
                    if !raft.is_initialized().await.unwrap_or(true) {
                        let _ = raft.initialize(members).await;
                        if first {
                            // The first replica campaigns first, so leaders start out spread;
                            // the balancer evens them out from there.
                            let _ = raft.trigger().elect(false).await;
                        }
                    }
                });
                let _ = done.await;
            }
        }
        drop(meta_raft);

        let handler = Arc::new(PeerHandler(Arc::downgrade(&cluster)));
        let served_net = cluster.net.clone();
        let balance_shutdown = shutdown.clone();
        handle.spawn(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => transport::serve(l, handler, served_net, shutdown).await,
                Err(e) => tracing::error!("peer listener: {e}"),
            }
        });
        let every = cluster.quiet.timings().interval;
        transport::ping_peers(
            &cluster.net,
            Arc::new(QuietPinger(Arc::downgrade(&cluster))),
            every,
            &handle,
        );
        handle.spawn(quiet::run(
            Arc::downgrade(&cluster),
            every,
            balance_shutdown.clone(),
        ));
        handle.spawn(balance_leaders(
            Arc::downgrade(&cluster),
            balance_shutdown.clone(),
        ));
        super::membership::spawn(&cluster, balance_shutdown);
        tracing::info!(
            node = me,
            groups = held.len(),
            joined = settings.joined,
            "joined the cluster"
        );
        Ok(cluster)
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
    pub fn meta_group(&self) -> GroupId {
        self.spec.groups
    }

    /// Opens this node's replica of `g` (what its log and snapshot hold, or an empty one that
    /// its group's leader fills), and starts following its leadership and membership.
    pub(crate) async fn open_replica(
        self: &Arc<Self>,
        g: GroupId,
    ) -> Result<GroupRaft, StartError> {
        if let Some(r) = self.raft(g) {
            return Ok(GroupRaft::clone(&r));
        }
        let exec = if g == self.meta_group() {
            GroupApplier::Meta(self.meta.clone())
        } else {
            let s = g as usize % self.shards.len().max(1);
            let shard = self.shards.get(s).cloned().ok_or(StartError::NoShards)?;
            GroupApplier::Shard(ShardExecutor::new(shard, self.spec.group_slots(g)))
        };
        let dir = if g == self.meta_group() {
            self.data_dir.join("metadata")
        } else {
            self.data_dir.join(format!("group-{g:04}"))
        };
        let log = self.node_log.group(g);
        let group_log = log.clone();
        let rt = self.runtime_of(g);
        let sm = {
            let snapshot_dir = dir.join("snapshot");
            rt.spawn(async move { GroupStateMachine::open(Arc::new(exec), Some(snapshot_dir)) })
                .await
                .map_err(|error| StartError::GroupTask { group: g, error })?
                .map_err(|error| StartError::Snapshot { group: g, error })?
        };
        let factory = NetFactory(GroupNetworkFactory::new(self.net.clone(), g));
        // Created on the event loop of the shard that owns the group's keys: the group's Raft
        // tasks all run there.
        let config = self.raft_config.clone();
        let me = self.me;
        let raft = rt
            .spawn(async move { GroupRaft::new(me, config, factory, log, sm).await })
            .await
            .map_err(|error| StartError::GroupTask { group: g, error })?
            .map_err(|error| StartError::Raft { group: g, error })?;
        if let Some(gate) = self.write_gates.get(g as usize) {
            gate.open();
        }
        if let Some(slot) = self.groups.get(g as usize) {
            slot.store(Some(Arc::new(raft.clone())));
        }
        let mut metrics = raft.metrics();
        let weak = Arc::downgrade(self);
        let born = self.born;
        rt.spawn(async move {
            let i = g as usize;
            let mut trimming = Trimming::Idle;
            loop {
                let Some(c) = weak.upgrade() else { return };
                let (leader, at, voters, snapshot, purged) = {
                    let m = metrics.borrow_watched();
                    let mem = m.membership_config.membership();
                    // Voters and learners alike have a node entry.
                    let member = mem.get_node(&me).is_some();
                    let leader = local_leader(me, m.current_leader, m.state, member);
                    let at = match (leader, &m.last_quorum_acked) {
                        (l, Some(t)) if l == me => {
                            let since = born.elapsed().saturating_sub(t.elapsed());
                            u64::try_from(since.as_millis()).unwrap_or(u64::MAX).max(1)
                        }
                        _ => 0,
                    };
                    // The metrics change with every append; the voters almost never do, so
                    // they are compared in place and copied only when they differ. openraft
                    // gathers them into a new set on every `voter_ids`: that is left to a
                    // joint configuration, which lasts only while a replica moves.
                    let stored = c.voters[i].load();
                    let changed = match mem.get_joint_config().as_slice() {
                        [one] => !one.is_empty() && !stored.iter().eq(one.iter()),
                        _ => {
                            mem.voter_ids().next().is_some()
                                && !stored.iter().copied().eq(mem.voter_ids())
                        }
                    };
                    (
                        leader,
                        at,
                        changed.then(|| mem.voter_ids().collect::<Vec<NodeId>>()),
                        m.snapshot.map(|l| l.index),
                        m.purged.map(|l| l.index),
                    )
                };
                c.quorum_acked[i].store(at, Ordering::Relaxed);
                let before = c.leaders[i].swap(leader, Ordering::Relaxed);
                if leader != 0 && leader != before {
                    c.leader_changes[i].fetch_add(1, Ordering::Relaxed);
                }
                if let Some(voters) = voters {
                    c.quiet.set_replicas(g, voters.clone());
                    c.voters[i].store(Arc::new(voters));
                }
                let trim = trim_step(&mut trimming, snapshot, purged, || {
                    group_log.mem_bytes() > c.log_share
                });
                let raft = if trim == Trim::Nothing {
                    None
                } else {
                    c.raft(g)
                };
                drop(c);
                // Errors mean the group's Raft stopped: the next wait for metrics ends.
                match (trim, raft) {
                    (Trim::Snapshot, Some(r)) => drop(r.trigger().snapshot().await),
                    (Trim::Purge(upto), Some(r)) => drop(r.trigger().purge_log(upto).await),
                    _ => {}
                }
                if metrics.changed().await.is_err() {
                    if let Some(c) = weak.upgrade() {
                        c.leaders[i].store(0, Ordering::Relaxed);
                        c.quorum_acked[i].store(0, Ordering::Relaxed);
                    }
                    return;
                }
            }
        });
        Ok(raft)
    }

    /// Stops this node's replica of `g` (a move took it elsewhere): its Raft stops and its
    /// keys leave the shard.
    pub(crate) async fn drop_replica(&self, g: GroupId) {
        let Some(slot) = self.groups.get(g as usize) else {
            return;
        };
        if slot.load().is_none() {
            return;
        }
        self.settle_pending(g).await;
        let Some(raft) = slot.swap(None) else { return };
        let rt = self.runtime_of(g);
        let _ = rt
            .spawn(async move {
                let _ = raft.shutdown().await;
            })
            .await;
        self.leaders[g as usize].store(0, Ordering::Relaxed);
        self.quorum_acked[g as usize].store(0, Ordering::Relaxed);
        if g < self.meta_group() {
            let s = g as usize % self.shards.len().max(1);
            if let Some(shard) = self.shards.get(s) {
                // A partition at a time: the shard serves its other groups in between.
                for part in 0..crate::store::Store::partitions() {
                    let slots = self.spec.group_slots(g);
                    if shard.clear_part(slots, part).await.is_err() {
                        tracing::warn!(group = g, "could not clear the keys of a moved group");
                        break;
                    }
                }
            }
        }
        // Its log and last snapshot stay: should the group come back to this node, the
        // replica starts from them as any replica that fell behind does.
        tracing::info!(group = g, "replica moved away");
    }

    /// Refuses new writes to `g` on this node, then waits, up to the bound of a write's wait
    /// for its fate, until no write proposed here for it waits any more. A write proposed
    /// while this replica led the group may be in the log of the replicas that keep it, and
    /// commit there: this replica, a follower still reachable by the group's leader, then
    /// applies it and the write gets its own reply. Stopping the Raft under it would answer
    /// `-TRYAGAIN` to a write that may be applied, and a client that retries would have it
    /// applied twice.
    async fn settle_pending(&self, g: GroupId) {
        let Some(gate) = self.write_gates.get(g as usize) else {
            return;
        };
        gate.close();
        let settled = gate
            .settled(fate_bound(self.write_timeout) + FATE_POLL)
            .await;
        if !settled {
            tracing::warn!(
                group = g,
                "a write proposed here still waits as its replica stops"
            );
        }
    }

    /// The members of the cluster now (removed ones left out): from the metadata once the
    /// cluster is formed, the start-up description before.
    pub fn nodes(&self) -> Vec<NodeSpec> {
        let meta = self.meta.get();
        if meta.is_bootstrapped() {
            meta.current().map(|m| m.node.clone()).collect()
        } else {
            self.spec.nodes.clone()
        }
    }

    /// A member's addresses.
    pub fn node(&self, id: NodeId) -> Option<NodeSpec> {
        let meta = self.meta.get();
        match meta.members.get(&id) {
            Some(m) => Some(m.node.clone()),
            None => self.spec.node(id).cloned(),
        }
    }

    /// The metadata as applied here.
    pub fn metadata(&self) -> Arc<MetaState> {
        self.meta.get()
    }

    /// Group `g`'s voters: as this node's replica sees them, or as the metadata says for a
    /// group this node holds no replica of.
    pub fn voters(&self, g: GroupId) -> Vec<NodeId> {
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
    pub fn is_removed(&self) -> bool {
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

    /// Whether this node was created with the cluster (not joined later).
    pub(crate) fn founder(&self) -> bool {
        !self.joined
    }

    pub(crate) fn data_dir(&self) -> &std::path::Path {
        &self.data_dir
    }

    pub fn group_of_slot(&self, slot: u16) -> GroupId {
        self.spec.group_of_slot(slot)
    }

    /// The group's leader as last seen, if any: as this node's replica sees it, or, for a
    /// group without a replica here or whose replica knows of no leader, as the leader's pings
    /// said lately. A replica that knows of none is often one being filled (a learner a move
    /// is bringing up, which hears from the leader only once it is caught up) or one the group
    /// no longer counts: the group has its leader meanwhile, and this node must not call the
    /// slots unserved (`CLUSTER INFO` would say `fail`, and clients would get `-CLUSTERDOWN`).
    pub fn leader(&self, g: GroupId) -> Option<NodeId> {
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
    pub fn leads(&self, g: GroupId) -> bool {
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
    pub fn serving_leader(&self, g: GroupId) -> Option<NodeId> {
        match self.leader(g) {
            Some(l) if l == self.me => self.leads(g).then_some(l),
            Some(l) => self.is_up(l).then_some(l),
            None => None,
        }
    }

    /// Whether a majority of `g`'s replicas (this node counted) were heard from recently.
    fn majority_up(&self, g: GroupId) -> bool {
        let replicas = self.voters(g);
        let up = replicas.iter().filter(|&&id| self.is_up(id)).count();
        up * 2 > replicas.len()
    }

    /// Turns the evening out of leaderships on or off (for maintenance, or while moving
    /// leaderships by hand).
    pub fn set_balancing(&self, on: bool) {
        self.balancing.store(on, Ordering::Relaxed);
    }

    /// Makes a client's change to the script cache on every other member that is up, and
    /// waits (at most `SCRIPTS_WAIT` each, all at once) until they made it: a client that
    /// loaded a script through this node then finds it on whichever node leads its keys. A
    /// member that is down or does not answer in time misses it, and its clients get
    /// `NOSCRIPT` and load the script again, as after a Redis failover.
    pub(crate) async fn share_scripts(&self, change: ScriptsChange) {
        let mut calls = tokio::task::JoinSet::new();
        for n in self.nodes() {
            if n.id == self.me || !self.is_up(n.id) {
                continue;
            }
            let net = self.net.clone();
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

    /// A script cache change another member shares (see `share_scripts`).
    fn apply_scripts(&self, change: ScriptsChange) {
        match change {
            ScriptsChange::Load(body) => {
                if body.len() <= MAX_SCRIPT_BYTES {
                    let body = bytes::Bytes::from(body);
                    self.scripts.insert(sha1_hex(&body), body);
                }
            }
            ScriptsChange::Flush => self.scripts.clear(),
        }
    }

    /// Whether node `id` is this node, or was heard from recently.
    pub fn is_up(&self, id: NodeId) -> bool {
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

    /// What the Raft log's entries held in memory weigh over all groups (their records' size
    /// on disk), and the bound on it (`ClusterSettings::log_memory`).
    pub fn log_memory(&self) -> (u64, u64) {
        (self.node_log.mem_bytes(), self.log_limit)
    }

    /// (log entries, commands in them) that this node's shards gathered and proposed: how
    /// well the shards batch.
    pub fn proposals(&self) -> (u64, u64) {
        (
            self.entries_proposed.load(Ordering::Relaxed),
            self.commands_proposed.load(Ordering::Relaxed),
        )
    }

    /// Per group this node holds a replica of, what the metrics show of it.
    pub fn group_metrics(&self) -> Vec<GroupMetrics> {
        let mut out = Vec::new();
        for (i, slot) in self.groups.iter().enumerate() {
            let Some(raft) = slot.load_full() else {
                continue;
            };
            let m = raft.metrics();
            let m = m.borrow_watched();
            let committed = m.local_committed.as_ref().map_or(0, |l| l.index);
            let applied = m.last_applied.as_ref().map_or(0, |l| l.index);
            out.push(GroupMetrics {
                group: i as GroupId,
                meta: i == self.spec.groups as usize,
                leader: m.state == openraft::ServerState::Leader,
                term: m.current_term,
                committed,
                applied,
                leader_changes: self.leader_changes[i].load(Ordering::Relaxed),
                proposals: self.group_proposals[i].load(Ordering::Relaxed),
            });
        }
        out
    }

    pub fn faults(&self) -> &Arc<Faults> {
        self.net.faults()
    }

    pub fn network(&self) -> &Network {
        &self.net
    }

    /// `g`'s replica on this node. Hand its leadership over with `transfer_leader`, not
    /// through the Raft handle, so that a quiet group is woken first.
    pub fn raft(&self, g: GroupId) -> Option<Arc<GroupRaft>> {
        self.groups.get(g as usize).and_then(|r| r.load_full())
    }

    pub(crate) fn quiet(&self) -> &Quiet {
        &self.quiet
    }

    /// How many groups this node leads quietly (idle, not heartbeating) now.
    pub fn quiet_groups(&self) -> usize {
        self.quiet.quiet_led()
    }

    /// Whether this node leads `g` quietly now.
    pub fn is_quiet(&self, g: GroupId) -> bool {
        self.quiet.is_quiet_led(g)
    }

    /// How many times a group led here was woken from quiet (by a write, a leadership
    /// transfer, or a follower that did not promise).
    pub fn quiet_wakes(&self) -> u64 {
        self.quiet.wakes()
    }

    /// How many groups this node follows with its election timer off (their leader is quiet).
    pub fn silenced_groups(&self) -> usize {
        self.quiet.silenced()
    }

    /// Hands the leadership of `g`, which this node leads, to replica `to`; a quiet group is
    /// woken and stops serving on its followers' promises first.
    pub async fn transfer_leader(&self, g: GroupId, to: NodeId) -> Result<(), TransferError> {
        let raft = self.raft(g).ok_or(TransferError::NoReplica(g))?;
        self.quiet.before_transfer(g, &raft);
        raft.trigger()
            .transfer_leader(to)
            .await
            .map_err(TransferError::Raft)
    }

    /// Runs a shard's gathered batch through group `g`: proposed here when this node leads
    /// it (the shard that gathered it answers its clients when it applies the entry, and this
    /// returns None), forwarded to the leader when forwarding is on (this returns the
    /// leader's replies), otherwise refused with the leader to ask.
    pub async fn replicate(
        &self,
        g: GroupId,
        origin: Origin,
        cmds: Vec<KeyCmd>,
    ) -> Result<Option<Vec<Reply>>, ProposeError> {
        if self.is_removed() {
            // Serves nothing, but sends clients whose slot map is stale to a member that
            // holds the group, so they see only -MOVED.
            let meta = self.metadata();
            let to = meta.voters.get(g as usize).and_then(|v| {
                v.iter().copied().find(|&id| {
                    id != self.me
                        && meta.state_of(id) == Some(crate::cluster::meta::MemberState::Active)
                })
            });
            return Err(to.map_or(ProposeError::Removed, ProposeError::Moved));
        }
        let leader = match self.serving_leader(g) {
            Some(l) => Some(l),
            None => self.settled_leader(g).await,
        };
        let first = match leader {
            Some(l) if l == self.me && !self.forward => {
                return self.commit(g, Some(origin), cmds).await.map(|_| None);
            }
            Some(l) if !self.forward => return Err(ProposeError::Moved(l)),
            Some(l) => l,
            None => return Err(ProposeError::ClusterDown),
        };
        // A client of a forwarding node cannot follow -MOVED, so follow the redirects here
        // (the leadership was moving).
        self.send_to_leader(g, first, Some(origin), cmds).await
    }

    /// Runs `cmds` through group `g` on `target`, its leader as far as this node knows:
    /// proposed here when that is this node (with an `origin`, the shard that gathered them
    /// answers its clients as it applies the entry, and this returns None), forwarded
    /// otherwise (this returns the leader's replies). Follows up to three redirects: a
    /// redirect means the batch was refused before it entered the log, so sending it again
    /// cannot apply it twice. A batch whose leader could not be reached at all fails with
    /// `TryAgain::NotSent`.
    pub(crate) async fn send_to_leader(
        &self,
        g: GroupId,
        mut target: NodeId,
        origin: Option<Origin>,
        cmds: Vec<KeyCmd>,
    ) -> Result<Option<Vec<Reply>>, ProposeError> {
        for _ in 0..3 {
            let result = if target == self.me {
                let replies = self.commit(g, origin, cmds.clone()).await;
                replies.map(|r| origin.is_none().then_some(r))
            } else {
                // The leader may wait for the write's fate past its write timeout.
                let ttl = fate_bound(self.write_timeout) + Duration::from_millis(200);
                match self
                    .net
                    .call(target, g, Rpc::Forward(cmds.clone()), ttl)
                    .await
                {
                    Ok(RpcOk::Forward(replies)) => Ok(Some(replies)),
                    Ok(_) => Err(ProposeError::TryAgain(TryAgain::UnexpectedAnswer)),
                    Err(CallError::Peer(PeerError::Refused(e))) => Err(e),
                    Err(e @ CallError::CannotConnect(..)) => {
                        return Err(ProposeError::TryAgain(TryAgain::NotSent(e.to_string())));
                    }
                    Err(e) => Err(ProposeError::TryAgain(TryAgain::CallFailed(e.to_string()))),
                }
            };
            match result {
                // Refused before it entered the log (a redirect, possibly to the node just
                // asked, once the leadership has settled): safe to send again.
                Err(ProposeError::Moved(l)) => target = l,
                other => return other,
            }
        }
        Err(ProposeError::TryAgain(TryAgain::LeadershipMoving(g)))
    }

    /// The error reply a Redis Cluster client acts on, for a command on `slot` that group
    /// could not take.
    pub fn error_reply(&self, slot: u16, e: &ProposeError) -> String {
        match e {
            ProposeError::Moved(leader) => match self.node(*leader) {
                Some(n) => format!("MOVED {slot} {}", n.client_addr()),
                None => "CLUSTERDOWN The cluster is down".to_string(),
            },
            ProposeError::ClusterDown => "CLUSTERDOWN The cluster is down".to_string(),
            ProposeError::TryAgain(why) => format!("TRYAGAIN {why}"),
            ProposeError::Removed => {
                format!(
                    "ERR node {} was removed from the cluster; it serves nothing",
                    self.me
                )
            }
        }
    }

    /// Proposes commands forwarded by another node; the replies travel back through Raft.
    pub async fn propose_local(
        &self,
        g: GroupId,
        cmds: Vec<KeyCmd>,
    ) -> Result<Vec<Reply>, ProposeError> {
        self.commit(g, None, cmds).await
    }

    /// Proposes on this node, which must lead the group; the leader stamps its time.
    async fn commit(
        &self,
        g: GroupId,
        origin: Option<Origin>,
        cmds: Vec<KeyCmd>,
    ) -> Result<Vec<Reply>, ProposeError> {
        // Counted before the replica is looked up: a replica that starts leaving after this
        // waits for the write (see `settle_pending`).
        let (_pending, leaving) = match self.write_gates.get(g as usize) {
            Some(gate) => {
                let (w, leaving) = gate.enter();
                (Some(w), leaving)
            }
            None => (None, false),
        };
        let Some(raft) = self.raft(g).filter(|_| !leaving) else {
            return match self.leader(g) {
                Some(l) => Err(ProposeError::Moved(l)),
                None => Err(ProposeError::ClusterDown),
            };
        };
        self.quiet.on_write(self, g, &raft).await;
        if self.leader(g) == Some(self.me) && !self.leads(g) {
            // Leader by its own count but without a lease: either just elected (the lease
            // comes with the first acknowledged heartbeat) or cut off from its majority, in
            // which case another node may be leading already.
            match self.settled_leader(g).await {
                Some(l) if l == self.me => {}
                Some(l) => return Err(ProposeError::Moved(l)),
                None => return Err(ProposeError::ClusterDown),
            }
        }
        if let Some(n) = self.group_proposals.get(g as usize) {
            n.fetch_add(1, Ordering::Relaxed);
        }
        if origin.is_some() {
            self.entries_proposed.fetch_add(1, Ordering::Relaxed);
            self.commands_proposed
                .fetch_add(cmds.len() as u64, Ordering::Relaxed);
        }
        let proposal = Proposal::new(self.clock.now_ns(), origin, cmds);
        let write = raft.client_write(proposal);
        match wait_for_fate(write, self.write_timeout, || self.majority_up(g)).await {
            Ok(Ok(resp)) => {
                let Applied(replies) = resp.data;
                Ok(replies)
            }
            Ok(Err(e)) => match e.api_error() {
                // Refused before it entered the log: nothing was applied.
                Some(ClientWriteError::ForwardToLeader(f)) => match f.leader_id {
                    Some(l) if l != self.me => Err(ProposeError::Moved(l)),
                    // The leadership is moving (a transfer, or an election under way). Once
                    // it has settled, send the client there, even back here: the write never
                    // entered the log, so repeating it cannot apply it twice.
                    _ => match self.settled_leader(g).await {
                        Some(l) => Err(ProposeError::Moved(l)),
                        None => Err(ProposeError::ClusterDown),
                    },
                },
                Some(ClientWriteError::LogEntryDiscarded(_)) => {
                    let settled = origin.is_some() && self.settle_discarded(&raft).await;
                    Err(ProposeError::TryAgain(TryAgain::Discarded { settled }))
                }
                _ => Err(ProposeError::TryAgain(TryAgain::Raft(e.to_string()))),
            },
            Err(waited) => Err(ProposeError::TryAgain(TryAgain::NotCommitted {
                group: g,
                waited,
            })),
        }
    }

    /// Waits, at most `write_timeout`, until this replica has applied as far as its log now
    /// reaches, after the entry of a write proposed here was discarded from its log (another
    /// leader's log replaced it, or a snapshot covered it). Such an entry may still commit
    /// through a replica that kept it; it can only commit at the index it had, which the log
    /// reached. Once this replica has applied that far, the entry was either applied here, and
    /// the shard that gathered it answered its clients with the replies, or it never will be:
    /// the `-TRYAGAIN` the clients get otherwise is then exact, and a client that retries (as
    /// Redis Cluster clients do on their own) cannot have the write applied twice. (Unless a
    /// snapshot sent by the new leader carried the entry, which the apply never sees; a
    /// replica that just proposed is rarely so far behind.) False when the wait ran out and the
    /// write's fate is still unknown.
    ///
    /// The log is read again once applied that far: a replica that found its log in conflict
    /// with the new leader's may have cut it back before taking the leader's entries, so the
    /// first reading can fall short of the discarded entry; the leader's entries then follow
    /// within a round trip, and the wait goes on to where they reach.
    async fn settle_discarded(&self, raft: &GroupRaft) -> bool {
        let deadline = tokio::time::Instant::now() + self.write_timeout;
        let mut upto = raft.metrics().borrow_watched().last_log_index;
        for _ in 0..2 {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if raft
                .wait(Some(left))
                .applied_index_at_least(upto, "a discarded write settles")
                .await
                .is_err()
            {
                return false;
            }
            let now = raft.metrics().borrow_watched().last_log_index;
            if now <= upto {
                return true;
            }
            upto = now;
        }
        true
    }

    /// Stops every group. Their tasks run on the shards' event loops, which end after this.
    pub async fn shutdown(&self) {
        let rafts: Vec<Arc<GroupRaft>> = self.groups.iter().filter_map(|r| r.load_full()).collect();
        let done = self.handle.spawn(async move {
            for r in rafts {
                let _ = r.shutdown().await;
            }
        });
        let _ = done.await;
    }
}

/// One group's writes on this node: how many wait for their fate, and whether the replica
/// is leaving (its top bit). Both live in one word, so a write that counts itself learns in
/// the same step whether the replica was leaving, and a replica that starts leaving after
/// that step sees the write counted.
#[derive(Default)]
struct WriteGate(AtomicU32);

/// The bit of a `WriteGate` that says the replica is leaving.
const LEAVING: u32 = 1 << 31;

impl WriteGate {
    /// Counts a write until the guard drops; true with it when the replica is leaving.
    fn enter(&self) -> (PendingWrite<'_>, bool) {
        let before = self.0.fetch_add(1, Ordering::AcqRel);
        (PendingWrite(&self.0), before & LEAVING != 0)
    }

    /// The replica is leaving: writes that come now are told so.
    fn close(&self) {
        self.0.fetch_or(LEAVING, Ordering::AcqRel);
    }

    /// A replica is here again.
    fn open(&self) {
        self.0.fetch_and(!LEAVING, Ordering::AcqRel);
    }

    /// Waits until no write is counted, looking every `FATE_POLL`, for at most `bound`. False
    /// when the bound ran out first.
    async fn settled(&self, bound: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            if self.0.load(Ordering::Acquire) & !LEAVING == 0 {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(FATE_POLL).await;
        }
    }
}

/// A write that waits for its fate, counted in its `WriteGate` while it does.
struct PendingWrite<'a>(&'a AtomicU32);

impl Drop for PendingWrite<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long a proposal waits for a group without a serving leader to get one: longer than
/// an election takes, so a move or a failover on the majority's side costs a pause, not an
/// error.
const LEADER_SETTLE: Duration = Duration::from_millis(700);

/// A write whose group's majority is in reach waits at most this long for its fate (see
/// `wait_for_fate`).
const FATE_WAIT: Duration = Duration::from_secs(2);

/// How often a write past its write timeout looks again whether its group is in reach.
const FATE_POLL: Duration = Duration::from_millis(20);

/// How often leaders look at the spread of leaderships.
const BALANCE_EVERY: Duration = Duration::from_millis(500);
/// Most leaderships one node hands over per look, so moves stay few at a time.
const MOVES_PER_TURN: usize = 2;

/// Keeps leaderships spread evenly over the nodes that are up: a node that leads more than
/// one group beyond the least-loaded replica of a group it leads hands that group over (a
/// leader transfer, to a replica that has caught up). Nodes only ever give leaderships away,
/// never take them, so two nodes cannot pull one group back and forth; counts converge to
/// floor(G/N) or ceil(G/N) per node, after start-up and again after a failed node returns.
async fn balance_leaders(cluster: std::sync::Weak<Cluster>, mut shutdown: Shutdown) {
    let mut tick = super::ticker(BALANCE_EVERY);
    while super::next_tick(&mut tick, &mut shutdown).await {
        let Some(c) = cluster.upgrade() else { return };
        if !c.balancing.load(Ordering::Relaxed) {
            continue;
        }
        // Only full members take leaderships: not a node that is joining or being drained.
        let meta = c.metadata();
        let mut counts: BTreeMap<NodeId, usize> = c
            .nodes()
            .iter()
            .filter(|n| c.is_up(n.id))
            .filter(|n| {
                !meta.is_bootstrapped()
                    || meta.state_of(n.id) == Some(crate::cluster::meta::MemberState::Active)
            })
            .map(|n| (n.id, 0))
            .collect();
        for g in 0..c.spec.groups {
            if let Some(l) = c.serving_leader(g)
                && let Some(n) = counts.get_mut(&l)
            {
                *n += 1;
            }
        }
        let mut moved = 0;
        for g in 0..c.spec.groups {
            if moved >= MOVES_PER_TURN {
                break;
            }
            if !c.leads(g) {
                continue;
            }
            let Some(raft) = c.raft(g) else { continue };
            let mine = counts.get(&c.me).copied().unwrap_or(0);
            let target = c
                .voters(g)
                .into_iter()
                .filter(|&id| id != c.me && caught_up(&raft, id))
                .filter_map(|id| counts.get(&id).map(|&n| (n, id)))
                .min();
            // Looked at again before each move, so that once balancing is turned off no new
            // move starts.
            if let Some((theirs, to)) = target
                && mine > theirs + 1
                && c.balancing.load(Ordering::Relaxed)
                && c.transfer_leader(g, to).await.is_ok()
            {
                moved += 1;
                if let Some(n) = counts.get_mut(&c.me) {
                    *n -= 1;
                }
                if let Some(n) = counts.get_mut(&to) {
                    *n += 1;
                }
            }
        }
    }
}

/// Whether replica `id` holds everything the leader `raft` has in its log.
pub(crate) fn caught_up(raft: &GroupRaft, id: NodeId) -> bool {
    let m = raft.metrics();
    let m = m.borrow_watched();
    m.replication
        .as_ref()
        .and_then(|r| r.get(&id).cloned().flatten())
        .map(|l| l.index())
        .is_some_and(|i| Some(i) >= m.last_log_index)
}

/// Listening on the configured host name may not work inside a container, where the name
/// resolves to an address of another interface; listen on every interface then.
pub(crate) fn bind_host(host: &str) -> &str {
    if host.parse::<std::net::IpAddr>().is_ok() {
        host
    } else {
        "0.0.0.0"
    }
}

/// Serves peers' requests; holds the cluster weakly so a stopped node can be dropped.
struct PeerHandler(std::sync::Weak<Cluster>);

impl Handler for PeerHandler {
    async fn handle(&self, group: GroupId, rpc: Rpc) -> Result<RpcOk, PeerError> {
        let cluster = self.0.upgrade().ok_or(PeerError::ShuttingDown)?;
        let raft = || cluster.raft(group).ok_or(PeerError::NoReplica(group));
        if cluster.is_removed() {
            return Err(PeerError::NoReplica(group));
        }
        let raft_err =
            |e: openraft::error::RaftError<TypeConfig, _>| PeerError::Raft(e.to_string());
        match rpc {
            Rpc::Ping(ping) => {
                cluster.note_leads(ping.from, &ping.leads);
                Ok(RpcOk::Ping(cluster.quiet.on_ping(&cluster, &ping)))
            }
            Rpc::Scripts(change) => {
                cluster.apply_scripts(change);
                Ok(RpcOk::Scripts)
            }
            Rpc::Forward(cmds) => cluster
                .propose_local(group, cmds)
                .await
                .map(RpcOk::Forward)
                .map_err(PeerError::Refused),
            Rpc::Append(r) => {
                let raft = raft()?;
                let res = raft.append_entries(r).await;
                cluster.quiet.after_append(group, &raft, res.as_ref().ok());
                res.map(RpcOk::Append).map_err(raft_err)
            }
            Rpc::Vote(r) => {
                let raft = raft()?;
                cluster
                    .quiet
                    .may_vote(group, &r)
                    .map_err(PeerError::VoteRefused)?;
                cluster.quiet.before_vote(group, &r);
                let res = raft.vote(r).await;
                cluster.quiet.after_vote(group, &raft);
                res.map(RpcOk::Vote).map_err(raft_err)
            }
            Rpc::PreVote(r) => {
                let raft = raft()?;
                cluster
                    .quiet
                    .may_vote(group, &r)
                    .map_err(PeerError::VoteRefused)?;
                let res = raft.pre_vote(r).await;
                cluster.quiet.after_vote(group, &raft);
                res.map(RpcOk::Vote).map_err(raft_err)
            }
            Rpc::Snapshot { vote, snapshot } => {
                let GroupSnapshotWire { meta, data } = snapshot;
                raft()?
                    .install_full_snapshot(
                        vote,
                        openraft::storage::Snapshot {
                            meta,
                            snapshot: data,
                        },
                    )
                    .await
                    .map(RpcOk::Snapshot)
                    .map_err(|e| PeerError::Raft(e.to_string()))
            }
            Rpc::TransferLeader(r) => {
                let raft = raft()?;
                cluster.quiet.on_transfer(group, &raft);
                raft.handle_transfer_leader(r)
                    .await
                    .map(RpcOk::TransferLeader)
                    .map_err(|e| PeerError::Raft(e.to_string()))
            }
        }
    }
}

/// The longest a write waits for its fate: `FATE_WAIT`, or the write timeout if that is longer.
/// A node forwarding a write to its leader waits as long, and a little more.
fn fate_bound(write_timeout: Duration) -> Duration {
    write_timeout.max(FATE_WAIT)
}

/// Waits for a proposed write's fate: for `write_timeout`, then on for as long as `in_reach`
/// (a majority of the group's replicas were heard from lately), until `fate_bound` from the
/// start. The error is how long it waited.
///
/// Past `write_timeout` the entry may be in the log, and the only reply left is `-TRYAGAIN`,
/// which cluster clients retry on their own: if the entry then commits, the write is applied
/// twice behind its client's back. While the group's majority is in reach, its leader (this
/// node, or the one a transfer or an election just made) settles the entry with its next
/// appends: it commits (and is answered with its reply), or the leader's log replaces it (and
/// the discard is settled, see `settle_discarded`). So a slow commit on a loaded cluster, or
/// one caught in a leadership move, is answered late rather than applied twice. A node cut
/// off from its group's majority answers at `write_timeout`.
async fn wait_for_fate<F: std::future::Future>(
    write: F,
    write_timeout: Duration,
    in_reach: impl Fn() -> bool,
) -> Result<F::Output, Duration> {
    tokio::pin!(write);
    let start = tokio::time::Instant::now();
    let hard = start + fate_bound(write_timeout);
    let mut until = start + write_timeout;
    loop {
        if let Ok(r) = tokio::time::timeout_at(until, &mut write).await {
            return Ok(r);
        }
        let now = tokio::time::Instant::now();
        if now >= hard || !in_reach() {
            return Err(now - start);
        }
        until = (now + FATE_POLL).min(hard);
    }
}

#[cfg(test)]
mod tests {
    use super::{
        FATE_POLL, FATE_WAIT, TRIM_RETRY, Trim, Trimming, WriteGate, local_leader, takes_claim,
        trim_step, wait_for_fate,
    };
    use openraft::ServerState;
    use std::cell::Cell;
    use std::time::Duration;

    const WRITE_TIMEOUT: Duration = Duration::from_millis(500);

    /// A write that commits after `after`.
    async fn commits_after(after: Duration) -> &'static str {
        tokio::time::sleep(after).await;
        "applied"
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_moved_away_waits_for_its_pending_writes() {
        static GATE: WriteGate = WriteGate(std::sync::atomic::AtomicU32::new(0));
        let write = tokio::spawn(async {
            let (_w, leaving) = GATE.enter();
            assert!(!leaving);
            commits_after(Duration::from_millis(300)).await
        });
        tokio::task::yield_now().await;
        GATE.close();
        // A write that comes once the replica is leaving is told so, and counted meanwhile.
        let (late, leaving) = GATE.enter();
        assert!(leaving);
        drop(late);
        let t0 = tokio::time::Instant::now();
        assert!(GATE.settled(FATE_WAIT).await);
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(300), "{waited:?}");
        assert!(
            waited <= Duration::from_millis(300) + FATE_POLL,
            "{waited:?}"
        );
        assert!(matches!(write.await, Ok("applied")));
        // Nothing pending: no wait at all.
        let t1 = tokio::time::Instant::now();
        assert!(GATE.settled(FATE_WAIT).await);
        assert_eq!(t1.elapsed(), Duration::ZERO);
        // A replica here again takes writes.
        GATE.open();
        assert!(!GATE.enter().1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_never_settles_holds_its_replica_only_so_long() {
        let gate = WriteGate::default();
        let _w = gate.enter();
        gate.close();
        let t0 = tokio::time::Instant::now();
        assert!(!gate.settled(FATE_WAIT).await);
        let waited = t0.elapsed();
        assert!(
            waited >= FATE_WAIT && waited <= FATE_WAIT + FATE_POLL,
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_commit_while_the_group_is_in_reach_gets_its_reply() {
        let t0 = tokio::time::Instant::now();
        let r = wait_for_fate(commits_after(WRITE_TIMEOUT * 3), WRITE_TIMEOUT, || true).await;
        assert_eq!(r, Ok("applied"));
        assert_eq!(t0.elapsed(), WRITE_TIMEOUT * 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_cut_off_from_its_group_gives_up_at_the_write_timeout() {
        let t0 = tokio::time::Instant::now();
        let r = wait_for_fate(commits_after(WRITE_TIMEOUT * 3), WRITE_TIMEOUT, || false).await;
        assert_eq!(r, Err(WRITE_TIMEOUT));
        assert_eq!(t0.elapsed(), WRITE_TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_gives_up_once_its_group_is_out_of_reach() {
        let t0 = tokio::time::Instant::now();
        let out_of_reach_at = t0 + WRITE_TIMEOUT + Duration::from_millis(300);
        let asked = Cell::new(0);
        let in_reach = || {
            asked.set(asked.get() + 1);
            tokio::time::Instant::now() < out_of_reach_at
        };
        let r = wait_for_fate(commits_after(FATE_WAIT), WRITE_TIMEOUT, in_reach).await;
        let waited = r.expect_err("the group went out of reach before the commit");
        assert!(
            waited >= WRITE_TIMEOUT + Duration::from_millis(300)
                && waited <= WRITE_TIMEOUT + Duration::from_millis(320),
            "gave up after {waited:?}"
        );
        assert!(asked.get() > 1, "asked {} times", asked.get());
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_in_reach_waits_no_longer_than_the_bound() {
        let r = wait_for_fate(commits_after(FATE_WAIT * 2), WRITE_TIMEOUT, || true).await;
        assert_eq!(r, Err(FATE_WAIT));
        // A write timeout beyond the bound is the bound.
        let long = FATE_WAIT * 3;
        let r = wait_for_fate(commits_after(long * 2), long, || true).await;
        assert_eq!(r, Err(long));
    }

    #[tokio::test(start_paused = true)]
    async fn a_log_over_its_share_snapshots_then_purges_what_the_snapshot_covers() {
        let mut st = Trimming::Idle;
        assert_eq!(
            trim_step(&mut st, Some(10), Some(5), || false),
            Trim::Nothing
        );
        assert_eq!(
            trim_step(&mut st, Some(10), Some(5), || true),
            Trim::Snapshot
        );
        // While the snapshot is made, nothing more is asked, however heavy the log.
        assert_eq!(
            trim_step(&mut st, Some(10), Some(5), || true),
            Trim::Nothing
        );
        assert_eq!(
            trim_step(&mut st, Some(40), Some(5), || true),
            Trim::Purge(40)
        );
        // The purge is put off for a while (a replication still reads those entries).
        tokio::time::advance(TRIM_RETRY / 2).await;
        assert_eq!(
            trim_step(&mut st, Some(40), Some(5), || true),
            Trim::Nothing
        );
        assert_eq!(
            trim_step(&mut st, Some(40), Some(40), || false),
            Trim::Nothing
        );
        assert_eq!(st, Trimming::Idle);
    }

    #[tokio::test(start_paused = true)]
    async fn a_step_that_does_not_happen_is_asked_for_again() {
        let mut st = Trimming::Idle;
        assert_eq!(trim_step(&mut st, None, None, || true), Trim::Snapshot);
        tokio::time::advance(TRIM_RETRY - Duration::from_millis(1)).await;
        assert_eq!(trim_step(&mut st, None, None, || true), Trim::Nothing);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(trim_step(&mut st, None, None, || true), Trim::Snapshot);
        assert_eq!(trim_step(&mut st, Some(7), None, || true), Trim::Purge(7));
        tokio::time::advance(TRIM_RETRY).await;
        // Given up; under its share by now, the log is left alone.
        assert_eq!(
            trim_step(&mut st, Some(7), Some(3), || false),
            Trim::Nothing
        );
        assert_eq!(st, Trimming::Idle);
    }

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
