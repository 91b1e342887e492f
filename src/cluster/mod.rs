//! Cluster mode: hash slots split over a fixed number of Raft groups, each replicated on R
//! nodes.

pub mod state_machine;
pub mod typ;
