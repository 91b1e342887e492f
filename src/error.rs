//! Why a node could not start: its settings, its listeners, its threads, its data directory
//! or its cluster description. The binary prints the message and exits.

use std::fmt;
use std::io;
use std::path::PathBuf;

// A leaf: this module names nothing of the crate, so every layer may report through it. The
// ids are those of `crate::ids`, by their integer types; a variant made with an id of another
// type would not compile.
type GroupId = u32;
type NodeId = u64;

/// Why a node could not start. The messages are the ones an operator reads, so each says what
/// was being done and with what (a path, an address, a group).
#[derive(Debug)]
pub enum StartError {
    /// The `--config` file could not be read.
    ReadConfig { path: PathBuf, error: io::Error },
    /// The `--config` file is not valid TOML or names an unknown setting.
    ParseConfig {
        path: PathBuf,
        error: Box<toml::de::Error>,
    },
    /// A setting's value is not valid (a size, a cluster flag), in the words of its parser.
    Setting(String),
    /// `--shards` is 0 or more than 1024.
    ShardCount(usize),
    /// `--node-id` was given without `--cluster-nodes`.
    NodeIdWithoutNodes,
    /// `--cluster-nodes` was given without `--node-id`.
    NoNodeId,
    /// `--node-id` names no node of `--cluster-nodes`.
    NodeIdNotListed(NodeId),
    /// The cluster description is not valid, in the words of its checks.
    Spec(String),
    /// The node starting is not in the cluster description.
    NotInCluster(NodeId),
    /// The rules file could not be loaded, in the words of its loader.
    Rules(String),
    /// The rate limit service's configuration could not be loaded, or the service has none.
    Rls(String),
    /// The client listener could not be bound.
    Listen { addr: String, error: io::Error },
    /// The peer listener could not be bound.
    ListenPeers { addr: String, error: io::Error },
    /// A socket that was bound could not be set up.
    Socket(io::Error),
    /// A node needs at least one shard.
    NoShards,
    /// A shard's event loop could not be built.
    ShardRuntime { shard: usize, error: io::Error },
    /// A shard's thread could not be started.
    ShardThread(io::Error),
    /// A shard stopped before the node had started.
    ShardStopped,
    /// The Raft timings are not valid.
    RaftConfig(openraft::ConfigError),
    /// The node's Raft log could not be opened.
    Log(io::Error),
    /// A group's snapshot could not be opened.
    Snapshot { group: GroupId, error: io::Error },
    /// A group's Raft could not be started (openraft's error).
    Raft {
        group: GroupId,
        error: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The task starting a group's Raft failed.
    GroupTask {
        group: GroupId,
        error: tokio::task::JoinError,
    },
    /// The task starting the cluster failed.
    ClusterTask(tokio::task::JoinError),
    /// The node could not join the cluster it was pointed at.
    Join(String),
    /// A standalone node's snapshot of its keys could not be read: the node does not start
    /// empty instead.
    Dump { path: PathBuf, reason: String },
    /// A TLS setting or file is not usable (the message names the file).
    Tls(String),
    /// The cluster secret could not be read, or is empty.
    ClusterSecret(String),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::ReadConfig { path, error } => {
                write!(f, "cannot read config {}: {error}", path.display())
            }
            StartError::ParseConfig { path, error } => {
                write!(f, "invalid config {}: {error}", path.display())
            }
            StartError::Setting(e)
            | StartError::Spec(e)
            | StartError::Rules(e)
            | StartError::Rls(e)
            | StartError::Tls(e)
            | StartError::ClusterSecret(e) => f.write_str(e),
            StartError::Join(e) => write!(f, "cannot join the cluster: {e}"),
            StartError::ShardCount(0) => f.write_str("shards must be at least 1"),
            StartError::ShardCount(_) => f.write_str("shards must be at most 1024"),
            StartError::NodeIdWithoutNodes => f.write_str("--node-id needs --cluster-nodes"),
            StartError::NoNodeId => {
                f.write_str("cluster mode needs --node-id (this node's id in --cluster-nodes)")
            }
            StartError::NodeIdNotListed(id) => write!(f, "node id {id} is not in --cluster-nodes"),
            StartError::NotInCluster(id) => {
                write!(f, "node {id} is not in the cluster description")
            }
            StartError::Listen { addr, error } => write!(f, "cannot listen on {addr}: {error}"),
            StartError::ListenPeers { addr, error } => {
                write!(f, "cannot listen for peers on {addr}: {error}")
            }
            StartError::ShardThread(e) => write!(f, "cannot start shard thread: {e}"),
            StartError::Socket(e) => write!(f, "{e}"),
            StartError::NoShards => f.write_str("a node needs at least one shard"),
            StartError::ShardRuntime { shard, error } => {
                write!(f, "cannot start shard {shard}'s event loop: {error}")
            }
            StartError::ShardStopped => f.write_str("a shard stopped during start-up"),
            StartError::RaftConfig(e) => write!(f, "invalid Raft settings: {e}"),
            StartError::Log(e) => write!(f, "raft log: {e}"),
            StartError::Snapshot { group, error } => {
                write!(f, "group {group}: snapshot: {error}")
            }
            StartError::Raft { group, error } => write!(f, "group {group}: {error}"),
            StartError::GroupTask { group, error } => write!(f, "group {group}: {error}"),
            StartError::ClusterTask(e) => write!(f, "cluster setup failed: {e}"),
            StartError::Dump { path, reason } => write!(
                f,
                "cannot load the snapshot {}: {reason}; move it away to start with no keys",
                path.display()
            ),
        }
    }
}

/// The message already says the cause, so `source` adds nothing to it.
impl std::error::Error for StartError {}
