//! A node's part of the cluster: the Raft groups it holds a replica of, who leads each group,
//! and proposing clients' commands to a group.
//!
//! Raft runs on its own multi-threaded runtime, apart from the shard threads: a group's log,
//! replication and elections must keep going while the shards are busy serving clients. A
//! committed entry reaches the keys through the shard that owns the group (`ShardExecutor`).

use crate::clock::Clock;
use crate::cluster::log_store::FileLogStore;
use crate::cluster::spec::ClusterSpec;
use crate::cluster::state_machine::{Executor, GroupStateMachine};
use crate::cluster::transport::{self, Faults, GroupSnapshotWire, Handler, Network, Rpc, RpcOk};
use crate::cluster::typ::{Applied, GroupId, NodeId, Proposal, TypeConfig};
use crate::cmd::keyed::{KeyCmd, Reply};
use crate::shard::{ShardHandle, ShardMsg};
use crate::store::Record;
use openraft::error::ClientWriteError;
use openraft::impls::BasicNode;
use openraft::network::RaftNetworkFactory;
use openraft::type_config::async_runtime::WatchReceiver;
use openraft_multi::{GroupNetworkAdapter, GroupNetworkFactory};
use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, watch};

/// How one node joins a cluster.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    pub node_id: NodeId,
    pub spec: ClusterSpec,
    /// Raft logs, votes and snapshots live here, one folder per group.
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
}

impl ClusterSettings {
    pub fn new(node_id: NodeId, spec: ClusterSpec, data_dir: PathBuf) -> ClusterSettings {
        ClusterSettings {
            node_id,
            spec,
            data_dir,
            forward: false,
            fsync: false,
            heartbeat_ms: 100,
            election_timeout_ms: (400, 700),
            write_timeout: Duration::from_millis(500),
        }
    }
}

/// Applies a group's committed entries on the shard thread that owns the group's keys.
pub struct ShardExecutor {
    shard: ShardHandle,
    slots: (u16, u16),
}

fn gone() -> io::Error {
    io::Error::other("shard stopped")
}

impl Executor for ShardExecutor {
    async fn apply(&self, batches: Vec<(u64, Vec<KeyCmd>)>) -> io::Result<Vec<Vec<Reply>>> {
        let (reply, rx) = oneshot::channel();
        self.shard
            .send(ShardMsg::ApplyAt { batches, reply })
            .await
            .map_err(|_| gone())?;
        rx.await.map_err(|_| gone())
    }

    async fn export(&self, now: u64) -> io::Result<Vec<Record>> {
        let (reply, rx) = oneshot::channel();
        self.shard
            .send(ShardMsg::Export {
                slots: self.slots,
                now,
                reply,
            })
            .await
            .map_err(|_| gone())?;
        rx.await.map_err(|_| gone())
    }

    async fn import(&self, records: Vec<Record>) -> io::Result<()> {
        let (reply, rx) = oneshot::channel();
        self.shard
            .send(ShardMsg::Import {
                slots: self.slots,
                records,
                reply,
            })
            .await
            .map_err(|_| gone())?;
        rx.await.map_err(|_| gone())
    }
}

pub type GroupRaft = openraft::Raft<TypeConfig, GroupStateMachine<ShardExecutor>>;

/// Builds each group's network client: every group shares the node's one `Network`.
#[derive(Clone)]
pub struct NetFactory(GroupNetworkFactory<Network, GroupId>);

impl RaftNetworkFactory<TypeConfig> for NetFactory {
    type Network = GroupNetworkAdapter<TypeConfig, GroupId, Network>;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Self::Network {
        GroupNetworkAdapter::new(self.0.factory.clone(), target, self.0.group_id)
    }
}

/// Why a proposal was not applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProposeError {
    /// Another node leads the group.
    Moved(NodeId),
    /// No leader is known (no quorum, or an election is under way).
    ClusterDown,
    /// The group did not commit in time, or lost its leader meanwhile; retry.
    TryAgain(String),
}

pub struct Cluster {
    pub me: NodeId,
    pub spec: ClusterSpec,
    groups: Vec<Option<GroupRaft>>,
    leaders: Arc<Vec<AtomicU64>>,
    net: Network,
    clock: Arc<dyn Clock>,
    forward: bool,
    write_timeout: Duration,
    runtime: Mutex<Option<RuntimeGuard>>,
    handle: tokio::runtime::Handle,
}

/// Owns the Raft runtime. Dropping a runtime blocks, which tokio forbids inside async code
/// (where a node is started and stopped), so it is always shut down in the background.
struct RuntimeGuard(Option<tokio::runtime::Runtime>);

impl RuntimeGuard {
    fn handle(&self) -> tokio::runtime::Handle {
        match &self.0 {
            Some(rt) => rt.handle().clone(),
            None => tokio::runtime::Handle::current(),
        }
    }
}

impl Drop for RuntimeGuard {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl Cluster {
    /// Opens (or creates) this node's replicas and joins the cluster. A group's replicas
    /// initialise it the first time; a restart finds the group in its log and does not.
    pub async fn start(
        settings: ClusterSettings,
        shards: &[ShardHandle],
        shard_of_group: impl Fn(GroupId) -> usize,
        clock: Arc<dyn Clock>,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Arc<Cluster>, String> {
        settings.spec.validate()?;
        let me = settings.node_id;
        let my_spec = settings
            .spec
            .node(me)
            .cloned()
            .ok_or_else(|| format!("node {me} is not in the cluster description"))?;
        let runtime = RuntimeGuard(Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name(format!("raft-{me}"))
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start the Raft runtime: {e}"))?,
        ));
        let handle = runtime.handle();
        let faults = Arc::new(Faults::default());
        let peers: Vec<(NodeId, String)> = settings
            .spec
            .nodes
            .iter()
            .map(|n| (n.id, n.peer_addr()))
            .collect();
        let net = Network::new(me, &peers, faults.clone(), shutdown.clone());
        let leaders: Arc<Vec<AtomicU64>> = Arc::new(
            (0..settings.spec.groups)
                .map(|_| AtomicU64::new(0))
                .collect(),
        );

        let listener = {
            let addr = format!("{}:{}", bind_host(&my_spec.host), my_spec.peer_port);
            let l = std::net::TcpListener::bind(&addr)
                .map_err(|e| format!("cannot listen for peers on {addr}: {e}"))?;
            l.set_nonblocking(true).map_err(|e| e.to_string())?;
            l
        };

        let config = openraft::Config {
            cluster_name: "bucketd".into(),
            heartbeat_interval: settings.heartbeat_ms,
            election_timeout_min: settings.election_timeout_ms.0,
            election_timeout_max: settings.election_timeout_ms.1,
            ..Default::default()
        };
        let config = Arc::new(
            config
                .validate()
                .map_err(|e| format!("invalid Raft settings: {e}"))?,
        );

        let mut plans = Vec::new();
        for g in 0..settings.spec.groups {
            let placement = settings.spec.placement(g);
            if placement.contains(&me) {
                let exec = ShardExecutor {
                    shard: shards[shard_of_group(g)].clone(),
                    slots: settings.spec.group_slots(g),
                };
                plans.push((g, placement, exec));
            }
        }
        let spec = settings.spec.clone();
        let data_dir = settings.data_dir.clone();
        let fsync = settings.fsync;
        let net2 = net.clone();
        let leaders2 = leaders.clone();
        let shutdown_rb = shutdown.clone();
        let setup = handle.spawn(async move {
            let mut rafts: Vec<(GroupId, GroupRaft, Vec<NodeId>)> = Vec::new();
            for (g, placement, exec) in plans {
                let dir = data_dir.join(format!("group-{g:04}"));
                let log = FileLogStore::open(Some(dir.join("log")), fsync)
                    .map_err(|e| format!("group {g}: log: {e}"))?;
                let sm = GroupStateMachine::open(Arc::new(exec), Some(dir.join("snapshot")))
                    .map_err(|e| format!("group {g}: snapshot: {e}"))?;
                let factory = NetFactory(GroupNetworkFactory::new(net2.clone(), g));
                let raft = GroupRaft::new(me, config.clone(), factory, log, sm)
                    .await
                    .map_err(|e| format!("group {g}: {e}"))?;
                rafts.push((g, raft, placement));
            }
            for (g, raft, placement) in &rafts {
                let members: BTreeMap<NodeId, BasicNode> = placement
                    .iter()
                    .filter_map(|id| spec.node(*id).map(|n| (*id, BasicNode::new(n.peer_addr()))))
                    .collect();
                // Every replica proposes the same initial membership, so the group forms even if
                // some replicas start late; a restarted replica is already initialised and this
                // is refused harmlessly.
                if !raft.is_initialized().await.unwrap_or(true) {
                    let _ = raft.initialize(members).await;
                    if placement.first() == Some(&me) {
                        // The preferred replica campaigns first, so leaders start out spread.
                        let _ = raft.trigger().elect(false).await;
                    }
                }
                let mut metrics = raft.metrics();
                let leaders = leaders2.clone();
                let g = *g as usize;
                tokio::spawn(async move {
                    loop {
                        let leader = metrics.borrow_watched().current_leader.unwrap_or(0);
                        leaders[g].store(leader, Ordering::Relaxed);
                        if metrics.changed().await.is_err() {
                            leaders[g].store(0, Ordering::Relaxed);
                            return;
                        }
                    }
                });
            }
            let rebalance: Vec<(GroupRaft, NodeId)> = rafts
                .iter()
                .filter_map(|(_, raft, placement)| placement.first().map(|p| (raft.clone(), *p)))
                .filter(|(_, preferred)| *preferred != me)
                .collect();
            tokio::spawn(rebalance_leaders(me, rebalance, shutdown_rb));
            Ok::<_, String>(rafts)
        });
        let rafts = setup
            .await
            .map_err(|e| format!("cluster setup failed: {e}"))??;
        let mut groups: Vec<Option<GroupRaft>> = (0..settings.spec.groups).map(|_| None).collect();
        for (g, raft, _) in rafts {
            groups[g as usize] = Some(raft);
        }
        let cluster = Arc::new(Cluster {
            me,
            spec: settings.spec.clone(),
            groups,
            leaders,
            net,
            clock,
            forward: settings.forward,
            write_timeout: settings.write_timeout,
            runtime: Mutex::new(Some(runtime)),
            handle: handle.clone(),
        });
        let handler = Arc::new(PeerHandler(Arc::downgrade(&cluster)));
        handle.spawn(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => transport::serve(l, handler, faults, shutdown).await,
                Err(e) => tracing::error!("peer listener: {e}"),
            }
        });
        tracing::info!(
            node = me,
            groups = cluster.groups.iter().filter(|g| g.is_some()).count(),
            "joined the cluster"
        );
        Ok(cluster)
    }

    pub fn group_of_slot(&self, slot: u16) -> GroupId {
        self.spec.group_of_slot(slot)
    }

    /// The group's leader as last seen, if any.
    pub fn leader(&self, g: GroupId) -> Option<NodeId> {
        match self
            .leaders
            .get(g as usize)
            .map(|l| l.load(Ordering::Relaxed))
        {
            Some(0) | None => None,
            Some(id) => Some(id),
        }
    }

    pub fn faults(&self) -> &Arc<Faults> {
        self.net.faults()
    }

    pub fn network(&self) -> &Network {
        &self.net
    }

    pub fn raft(&self, g: GroupId) -> Option<&GroupRaft> {
        self.groups.get(g as usize).and_then(Option::as_ref)
    }

    /// Runs `cmds` through group `g`: proposed here when this node leads it, forwarded to the
    /// leader when forwarding is on, otherwise refused with the leader to ask.
    pub async fn propose(&self, g: GroupId, cmds: Vec<KeyCmd>) -> Result<Vec<Reply>, ProposeError> {
        let first = match self.leader(g) {
            Some(l) if l == self.me && !self.forward => return self.propose_local(g, cmds).await,
            Some(l) if !self.forward => return Err(ProposeError::Moved(l)),
            Some(l) => l,
            None => return Err(ProposeError::ClusterDown),
        };
        // A client of a forwarding node cannot follow -MOVED, so follow one redirect here (the
        // leadership was moving). A redirect means the batch was refused before it entered the
        // log, so sending it again cannot apply it twice.
        let mut target = first;
        for _ in 0..2 {
            let result = if target == self.me {
                self.propose_local(g, cmds.clone()).await
            } else {
                let ttl = self.write_timeout + Duration::from_millis(200);
                match self
                    .net
                    .call(target, g, Rpc::Forward(cmds.clone()), ttl)
                    .await
                {
                    Ok(RpcOk::Forward(replies)) => Ok(replies),
                    Ok(_) => Err(ProposeError::TryAgain("unexpected forward reply".into())),
                    Err(e) => Err(parse_remote_error(&e)),
                }
            };
            match result {
                Err(ProposeError::Moved(l)) if l != target => target = l,
                Err(ProposeError::Moved(_)) => break,
                other => return other,
            }
        }
        Err(ProposeError::TryAgain(format!(
            "the leadership of group {g} is moving; retry"
        )))
    }

    /// Proposes on this node, which must lead the group; the leader stamps its time.
    pub async fn propose_local(
        &self,
        g: GroupId,
        cmds: Vec<KeyCmd>,
    ) -> Result<Vec<Reply>, ProposeError> {
        let Some(raft) = self.raft(g) else {
            return match self.leader(g) {
                Some(l) => Err(ProposeError::Moved(l)),
                None => Err(ProposeError::ClusterDown),
            };
        };
        let proposal = Proposal {
            ts: self.clock.now_ns(),
            cmds,
        };
        match tokio::time::timeout(self.write_timeout, raft.client_write(proposal)).await {
            Ok(Ok(resp)) => {
                let Applied(replies) = resp.data;
                Ok(replies)
            }
            Ok(Err(e)) => match e.api_error() {
                // Refused before it entered the log: nothing was applied.
                Some(ClientWriteError::ForwardToLeader(f)) => match f.leader_id {
                    Some(l) if l != self.me => Err(ProposeError::Moved(l)),
                    _ => Err(ProposeError::ClusterDown),
                },
                Some(ClientWriteError::LogEntryDiscarded(_)) => Err(ProposeError::TryAgain(
                    "the leader changed before this write committed; it may or may not have been applied"
                        .into(),
                )),
                _ => Err(ProposeError::TryAgain(e.to_string())),
            },
            Err(_) => Err(ProposeError::TryAgain(format!(
                "group {g} did not commit within {} ms",
                self.write_timeout.as_millis()
            ))),
        }
    }

    /// Stops every group and the Raft runtime.
    pub async fn shutdown(&self) {
        let rafts: Vec<GroupRaft> = self.groups.iter().flatten().cloned().collect();
        let done = self.handle.spawn(async move {
            for r in rafts {
                let _ = r.shutdown().await;
            }
        });
        let _ = done.await;
        // Dropping the guard shuts the runtime down in the background.
        drop(
            self.runtime
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
    }
}

/// Hands leadership of a group back to its preferred replica once that replica has caught up,
/// so that after elections and restarts the leaders (and the write load) stay spread over the
/// nodes as placement intended.
async fn rebalance_leaders(
    me: NodeId,
    groups: Vec<(GroupRaft, NodeId)>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(1000));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        for (raft, preferred) in &groups {
            let m = raft.metrics().borrow_watched().clone();
            if m.current_leader != Some(me) {
                continue;
            }
            let matched = m
                .replication
                .as_ref()
                .and_then(|r| r.get(preferred).cloned().flatten())
                .map(|l| l.index());
            if matched.is_some() && matched >= m.last_log_index {
                let _ = raft.trigger().transfer_leader(*preferred).await;
            }
        }
    }
}

/// Listening on the configured host name may not work inside a container, where the name
/// resolves to an address of another interface; listen on every interface then.
fn bind_host(host: &str) -> &str {
    if host.parse::<std::net::IpAddr>().is_ok() {
        host
    } else {
        "0.0.0.0"
    }
}

fn parse_remote_error(e: &str) -> ProposeError {
    if let Some(rest) = e.strip_prefix("MOVED ")
        && let Ok(id) = rest.trim().parse()
    {
        return ProposeError::Moved(id);
    }
    if e.starts_with("CLUSTERDOWN") {
        return ProposeError::ClusterDown;
    }
    ProposeError::TryAgain(e.to_string())
}

/// Serves peers' requests; holds the cluster weakly so a stopped node can be dropped.
struct PeerHandler(std::sync::Weak<Cluster>);

impl Handler for PeerHandler {
    async fn handle(&self, group: GroupId, rpc: Rpc) -> Result<RpcOk, String> {
        let cluster = self.0.upgrade().ok_or("node is shutting down")?;
        if let Rpc::Forward(cmds) = rpc {
            return match cluster.propose_local(group, cmds).await {
                Ok(r) => Ok(RpcOk::Forward(r)),
                Err(ProposeError::Moved(l)) => Err(format!("MOVED {l}")),
                Err(ProposeError::ClusterDown) => Err("CLUSTERDOWN".into()),
                Err(ProposeError::TryAgain(m)) => Err(m),
            };
        }
        let raft = cluster
            .raft(group)
            .ok_or_else(|| format!("no replica of group {group} here"))?;
        match rpc {
            Rpc::Append(r) => raft
                .append_entries(r)
                .await
                .map(RpcOk::Append)
                .map_err(|e| e.to_string()),
            Rpc::Vote(r) => raft
                .vote(r)
                .await
                .map(RpcOk::Vote)
                .map_err(|e| e.to_string()),
            Rpc::PreVote(r) => raft
                .pre_vote(r)
                .await
                .map(RpcOk::Vote)
                .map_err(|e| e.to_string()),
            Rpc::Snapshot { vote, snapshot } => {
                let GroupSnapshotWire { meta, data } = snapshot;
                raft.install_full_snapshot(
                    vote,
                    openraft::storage::Snapshot {
                        meta,
                        snapshot: data,
                    },
                )
                .await
                .map(RpcOk::Snapshot)
                .map_err(|e| e.to_string())
            }
            Rpc::TransferLeader(r) => raft
                .handle_transfer_leader(r)
                .await
                .map(RpcOk::TransferLeader)
                .map_err(|e| e.to_string()),
            Rpc::Forward(_) => Err("unreachable".into()),
        }
    }
}
