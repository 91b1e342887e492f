//! How a node takes part in a cluster: its id and the members, where its Raft data lives, and
//! the timings and switches of its groups.

use crate::cluster::spec::ClusterSpec;
use crate::cluster::transport;
use crate::cluster::typ::NodeId;
use crate::cmd::ScriptCache;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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
    /// How long a write may wait for its group to commit when the group's majority is out of
    /// reach, before the client gets `-UNKNOWN` (in reach, it waits up to `FATE_WAIT`).
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

/// Listening on the configured host name may not work inside a container, where the name
/// resolves to an address of another interface; listen on every interface then.
pub(crate) fn bind_host(host: &str) -> &str {
    if host.parse::<std::net::IpAddr>().is_ok() {
        host
    } else {
        "0.0.0.0"
    }
}
