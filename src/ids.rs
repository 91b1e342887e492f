//! The identities the cluster gives its parts: a node's and a Raft group's. Plain integers in a
//! base module, so that any layer (commands, settings, the Raft types) can name them without
//! depending on the cluster.

/// Identifies a Raft group (a fixed range of hash slots).
pub type GroupId = u32;
/// Identifies a node of the cluster.
pub type NodeId = u64;
