//! Bringing a node's part of the cluster up: its peer listener, its log, the parts that share
//! what it knows of the groups, its replicas (initialising a new cluster's groups), and the
//! tasks that keep it in step with its peers.

use crate::clock::Clock;
use crate::cluster::balance::Balancer;
use crate::cluster::executor::{GroupExecutor, SharedExecutor};
use crate::cluster::groups::{Groups, GroupsInit, run_quiet};
use crate::cluster::log_store::NodeLog;
use crate::cluster::membership::Membership;
use crate::cluster::meta::{MetaState, MetaStore, RulesHook};
use crate::cluster::peer::{PeerHandler, QuietPinger};
use crate::cluster::quiet::{Quiet, QuietTimings};
use crate::cluster::replicas::{ReplicaSet, ReplicaSetInit};
use crate::cluster::settings::{ClusterSettings, bind_host};
use crate::cluster::spec::NodeSpec;
use crate::cluster::transport::{self, Faults, Network};
use crate::cluster::typ::{GroupId, NodeId};
use crate::cluster::writes::Writes;
use crate::error::StartError;
use crate::shutdown::Shutdown;
use openraft::impls::BasicNode;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The parts of a node's cluster, each sharing `groups`.
pub(crate) struct Parts {
    pub groups: Arc<Groups>,
    pub writes: Arc<Writes>,
    pub replicas: Arc<ReplicaSet>,
    pub membership: Arc<Membership>,
    pub balancer: Arc<Balancer>,
    /// The node found its data folder when it started (it ran before).
    pub restarted: bool,
}

/// What the node runs on: its shards (which apply the groups' entries) and their event loops.
pub(crate) struct Host<'a, S> {
    pub shards: &'a [S],
    pub runtimes: &'a [tokio::runtime::Handle],
    pub clock: Arc<dyn Clock>,
    pub rules: Option<RulesHook>,
}

/// Builds the node's parts from its settings; opens no replica yet. Also hands back the
/// bound peer listener, served once the replicas are open.
pub(crate) async fn build<S: GroupExecutor + Clone>(
    settings: &ClusterSettings,
    host: Host<'_, S>,
    shutdown: &Shutdown,
) -> Result<(Parts, std::net::TcpListener), StartError> {
    settings
        .spec
        .validate()
        .map_err(|e| StartError::Spec(e.to_string()))?;
    let me = settings.node_id;
    let my_spec = settings
        .spec
        .node(me)
        .cloned()
        .ok_or(StartError::NotInCluster(me))?;
    let handle = host.runtimes.first().cloned().ok_or(StartError::NoShards)?;
    if host.shards.is_empty() {
        return Err(StartError::NoShards);
    }
    let peers: Vec<(NodeId, String)> = settings
        .spec
        .nodes
        .iter()
        .map(|n| (n.id, n.peer_addr()))
        .collect();
    let net = Network::new(
        me,
        &peers,
        Arc::new(Faults::default()),
        shutdown.clone(),
        settings.security.clone(),
    );
    let listener = peer_listener(&my_spec)?;
    let raft_config = raft_config(settings)?;
    // A node that ran before may have made promises for quiet groups it no longer remembers
    // (see `quiet`).
    let restarted = settings.data_dir.exists();
    let node_log = open_log(&handle, settings).await?;

    let meta_group = settings.spec.groups;
    let voters: Vec<Vec<NodeId>> = (0..=meta_group)
        .map(|g| first_voters(settings, g))
        .collect();
    let quiet = Quiet::new(
        me,
        QuietTimings::new(
            settings.quiet_after,
            settings.heartbeat_ms,
            settings.election_timeout_ms.0,
        ),
        voters.clone(),
        restarted,
    );
    let groups = Arc::new(Groups::new(GroupsInit {
        me,
        spec: settings.spec.clone(),
        voters,
        election_timeout_ms: settings.election_timeout_ms,
        quiet,
        net,
        meta: Arc::new(MetaStore::new(host.rules)),
        handle,
        runtimes: host.runtimes.to_vec(),
    }));
    let writes = Arc::new(Writes::new(
        groups.clone(),
        settings.forward,
        settings.write_timeout,
        host.clock,
    ));
    let replicas = Arc::new(ReplicaSet::new(ReplicaSetInit {
        writes: writes.clone(),
        node_log,
        log_limit: settings.log_memory,
        raft_config,
        data_dir: settings.data_dir.clone(),
        shards: host
            .shards
            .iter()
            .map(|s| Arc::new(s.clone()) as SharedExecutor)
            .collect(),
    }));
    let membership = Arc::new(Membership::new(
        replicas.clone(),
        writes.clone(),
        settings.data_dir.clone(),
        settings.joined,
    ));
    let balancer = Arc::new(Balancer::new(groups.clone(), settings.balance_leaders));
    let parts = Parts {
        groups,
        writes,
        replicas,
        membership,
        balancer,
        restarted,
    };
    Ok((parts, listener))
}

/// Binds the port peers connect to.
fn peer_listener(my_spec: &NodeSpec) -> Result<std::net::TcpListener, StartError> {
    let addr = format!("{}:{}", bind_host(&my_spec.host), my_spec.peer_port);
    let l = match std::net::TcpListener::bind(&addr) {
        Ok(l) => l,
        Err(error) => return Err(StartError::ListenPeers { addr, error }),
    };
    l.set_nonblocking(true).map_err(StartError::Socket)?;
    Ok(l)
}

/// The Raft settings every group of the node runs with.
fn raft_config(settings: &ClusterSettings) -> Result<Arc<openraft::Config>, StartError> {
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
    Ok(Arc::new(config.validate().map_err(StartError::RaftConfig)?))
}

/// Opens the node's one log for every group, so one write (and fsync) carries them all.
async fn open_log(
    handle: &tokio::runtime::Handle,
    settings: &ClusterSettings,
) -> Result<NodeLog, StartError> {
    let dir = settings.data_dir.join("raft-log");
    let fsync = settings.fsync;
    handle
        .spawn(async move { NodeLog::open(Some(dir), fsync).map_err(StartError::Log) })
        .await
        .map_err(StartError::ClusterTask)?
}

/// A new cluster's first placement of `g`; a joining node learns its groups from the
/// metadata.
fn first_voters(settings: &ClusterSettings, g: GroupId) -> Vec<NodeId> {
    let spec = &settings.spec;
    if settings.joined {
        Vec::new()
    } else if g == spec.groups {
        spec.nodes.iter().map(|n| n.id).collect()
    } else {
        spec.placement(g)
    }
}

/// Opens the replicas this node holds, the metadata group's first: it says which groups this
/// node holds now (a restarted node may hold others than it was created with). Returns the
/// data groups held.
pub(crate) async fn open_replicas(
    parts: &Parts,
    settings: &ClusterSettings,
) -> Result<Vec<GroupId>, StartError> {
    let me = settings.node_id;
    let meta_group = settings.spec.groups;
    parts.replicas.open_replica(meta_group).await?;
    if parts.restarted {
        // The metadata replays from the node's own log and snapshot.
        parts
            .membership
            .await_meta(MetaState::is_bootstrapped, Duration::from_secs(2))
            .await;
    }
    let known = parts.groups.metadata();
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
                first_voters(settings, g).contains(&me)
            }
        })
        .collect();
    for &g in &held {
        parts.replicas.open_replica(g).await?;
    }
    Ok(held)
}

/// Every replica of a new cluster proposes the same initial membership, so a group forms even
/// if some replicas start late; a restarted replica is already initialised and this is
/// refused harmlessly.
pub(crate) async fn initialize_groups(groups: &Groups, settings: &ClusterSettings) {
    let me = settings.node_id;
    let spec = &settings.spec;
    let meta_group = spec.groups;
    for g in (0..meta_group).chain([meta_group]) {
        let Some(raft) = groups.raft(g) else {
            continue;
        };
        let placement = first_voters(settings, g);
        if !placement.contains(&me) {
            continue;
        }
        let members: BTreeMap<NodeId, BasicNode> = placement
            .iter()
            .filter_map(|id| spec.node(*id).map(|n| (*id, BasicNode::new(n.peer_addr()))))
            .collect();
        let rt = groups.runtime_of(g);
        let first = placement.first() == Some(&me);
        let done = rt.spawn(async move {
            if !raft.is_initialized().await.unwrap_or(true) {
                let _ = raft.initialize(members).await;
                if first {
                    // The first replica campaigns first, so leaders start out spread; the
                    // balancer evens them out from there.
                    let _ = raft.trigger().elect(false).await;
                }
            }
        });
        let _ = done.await;
    }
}

/// Starts serving peers and the node's periodic tasks: pings, quiet groups, the balancer and
/// membership changes.
pub(crate) fn spawn_tasks(
    parts: &Parts,
    listener: std::net::TcpListener,
    scripts: Arc<crate::cmd::ScriptCache>,
    shutdown: Shutdown,
) {
    let groups = &parts.groups;
    let handle = groups.event_loop();
    let handler = Arc::new(PeerHandler::new(&parts.writes, scripts));
    let served_net = groups.net.clone();
    let serve_shutdown = shutdown.clone();
    handle.spawn(async move {
        match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => transport::serve(l, handler, served_net, serve_shutdown).await,
            Err(e) => tracing::error!("peer listener: {e}"),
        }
    });
    let every = groups.quiet().timings().interval;
    transport::ping_peers(
        &groups.net,
        Arc::new(QuietPinger(Arc::downgrade(groups))),
        every,
        &handle,
    );
    handle.spawn(run_quiet(Arc::downgrade(groups), every, shutdown.clone()));
    handle.spawn(Balancer::run(
        Arc::downgrade(&parts.balancer),
        shutdown.clone(),
    ));
    parts.membership.spawn(shutdown);
}
